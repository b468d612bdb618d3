"""``RunDirectory``: the one way a long job (benchmark run, evaluation, calibration, dataset build,
training) owns its output directory.

    run = RunDirectory("runs/quick", identity={"world": ..., "tasks_sha256": ...}, key=("planner", "task_id", "seed"))
    with run.session(resume=True):             # lock; check the identity; read the rows already there
        todo = [job for job in jobs if key_of(job) not in run.done()]
        run.open_results(run_metadata(config, seeds))
        for job in todo:
            run.write(play(job))               # one JSONL line, flushed: a crash loses at most this row
        run.write_summary(summarize(run.rows()))   # atomic: readers see the old file or the new one

What it guarantees:

- identity: the configuration recorded in the directory (the metadata records of the results file, the
  summary's metadata, the meta file) must match ``identity``, else ``ConfigChanged`` lists the differences;
  rows of an unknown configuration are refused too; ``resume=False`` starts afresh instead;
- one writer: a lock file (``filelock``) held for the session; a second writer gets ``DirectoryBusy``;
- crash tolerance: a torn last line is dropped with a warning and the file repaired (``results.read_jsonl``);
- resume: ``done()`` holds the keys of the rows already written;
- interrupts: Ctrl-C closes the files (every row written so far is kept) and raises ``RunInterrupted``
  with a message saying where the rows are and how to resume.
"""

from __future__ import annotations

__all__ = [
    "LOCK_FILE", "START_AFRESH", "check_directory", "blocking_ancestor", "recorded_identity", "RunDirectory",
]

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from resilibench.errors import ConfigChanged, DirectoryBusy, RunDirectoryError, RunInterrupted
from resilibench.results import (
    LEVEL_NAMES,
    JsonlContents,
    JsonlWriter,
    check_level_rows,
    json_diff,
    read_jsonl,
    to_jsonable,
    write_json_atomic,
)

LOCK_FILE = ".lock"
START_AFRESH = "use another directory, or start afresh without resuming"


def check_directory(path: str | Path, field: str = "output_dir") -> Path:
    """``path`` as a Path when a directory can be made or used there, else ``RunDirectoryError``."""
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise RunDirectoryError(f"{directory} exists and is not a directory", field)
    blocking = blocking_ancestor(directory)
    if blocking is not None:
        raise RunDirectoryError(f"{blocking} is not a directory, so {directory} cannot be created", field)
    return directory


def blocking_ancestor(path: Path) -> Path | None:
    """The nearest existing path above ``path`` when it is not a directory (nothing can be made below)."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def recorded_identity(config: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The values of ``keys`` in a recorded run config; ``tasks_sha256``, when not recorded as such, is read
    from ``tasks.sha256`` (the task library's description)."""
    return {key: (config.get("tasks") or {}).get("sha256") if key == "tasks_sha256" and key not in config
            else config.get(key) for key in keys}


class RunDirectory:
    """A long job's directory: ``results`` (JSONL rows, each with the fields of ``key``), ``summary``
    (JSON, written atomically) and optionally ``meta`` (a JSON ``run_metadata`` record), under one lock.

    ``identity`` holds what must match to add rows to the directory (compared with the recorded run config
    by ``recorded_identity``); dotted paths in ``may_change`` may differ (e.g. a training's iteration cap).
    ``logs`` names other JSONL files of the job (their records, too, need a known configuration).
    ``level_fields``: rows must carry these fields and a ``level`` of ``levels`` (``results.check_level_rows``).
    ``stale`` names files (plots) deleted with the summary when a session starts afresh. ``restart`` is the
    advice the errors end with.
    """

    def __init__(self, path: str | Path, identity: dict[str, Any] | None = None, *, key: Sequence[str] = (),
                 results: str = "results.jsonl", summary: str | None = "summary.json", meta: str | None = None,
                 logs: Sequence[str] = (), stale: Sequence[str] = (), may_change: Sequence[str] = (),
                 level_fields: Sequence[str] | None = None, levels: Sequence[str] = LEVEL_NAMES,
                 field: str = "output_dir",
                 restart: str = START_AFRESH):
        self.path = check_directory(path, field)
        self.identity = to_jsonable(identity or {})
        self.key = tuple(key)
        self.results_path = self.path / results
        self.summary_path = self.path / summary if summary else None
        self.meta_path = self.path / meta if meta else None
        self.logs = tuple(logs)
        self.stale = tuple(stale)
        self.may_change = tuple(may_change)
        self.level_fields = level_fields
        self.levels = tuple(levels)
        self.field = field
        self.restart = restart
        self.existing = JsonlContents()
        self.new_rows: list[dict[str, Any]] = []
        self._writers: list[JsonlWriter] = []
        self._results_writer: JsonlWriter | None = None
        self._resume = True

    def __repr__(self) -> str:
        return f"RunDirectory({str(self.path)!r})"

    def _error(self, message: str) -> RunDirectoryError:
        return RunDirectoryError(f"{self.path}: {message}", self.field)

    # --- identity -------------------------------------------------------------------------------------

    def check(self, repair: bool = False) -> JsonlContents:
        """The results already in the directory, after checking that they come from ``identity`` (cheap:
        callers may check before loading a model). ``repair`` cuts a torn last line off the file."""
        try:
            existing = read_jsonl(self.results_path, repair=repair)
        except ValueError as exc:
            raise self._error(f"{exc}; {self.restart}") from None
        recorded = [(self.results_path.name, m.get("config") or {}) for m in existing.metadata]
        for path, required in ((self.summary_path, False), (self.meta_path, True)):
            if path is not None and path.is_file():
                config = self._recorded_config(path, required)
                if config is not None:
                    recorded.append((path.name, config))
        if not existing.metadata and not (self.meta_path is not None and self.meta_path.is_file()):
            used = [p.name for p in (self.results_path, *(self.path / n for n in self.logs))
                    if p.is_file() and p.stat().st_size > 0]
            if used:
                missing = f"{self.meta_path.name} is missing" if self.meta_path else "no metadata record"
                raise self._error(f"{used[0]} has records but {missing}, so their config is unknown; "
                                  f"{self.restart}")
        for where, config in recorded:
            differences = [d for d in json_diff(recorded_identity(config, list(self.identity)), self.identity)
                           if not any(d == p or d.startswith((f"{p}:", f"{p}.")) for p in self.may_change)]
            if differences:
                shown = "; ".join(differences[:3]) + (f"; and {len(differences) - 3} more"
                                                      if len(differences) > 3 else "")
                raise ConfigChanged(f"{self.path}: {where} was produced with a different config ({shown}); "
                                    f"refusing to mix results: {self.restart}", differences, self.field)
        if self.level_fields is not None:
            try:
                check_level_rows(existing.rows, self.level_fields, str(self.results_path), existing.row_lines,
                                 self.levels)
            except ValueError as exc:
                raise self._error(f"{exc}; fix or remove the row, or start afresh without resuming") from None
        return existing

    def _recorded_config(self, path: Path, required: bool) -> dict[str, Any] | None:
        """The run config of a summary (``{"metadata": {"config": ...}}``) or meta file (``{"config": ...}``);
        None for a summary that records none, ``RunDirectoryError`` for a meta file without one."""
        try:
            data = json.loads(path.read_text())
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("metadata", data), dict):
            config = data.get("metadata", data).get("config")
            if isinstance(config, dict):
                return config
        if required or data is None:
            raise self._error(f"{path.name} is not a ResiliBench record (no run config); {self.restart}")
        return None

    # --- the session ----------------------------------------------------------------------------------

    @contextmanager
    def session(self, resume: bool = True) -> Iterator[RunDirectory]:
        """Hold the directory's lock for a run: with ``resume`` check the identity and read the rows already
        there (``existing``, ``done()``); else delete the summary, meta and ``stale`` files and let the first
        writer start each file afresh. On exit the files are closed; Ctrl-C becomes ``RunInterrupted``."""
        from filelock import FileLock, Timeout

        self.path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path / LOCK_FILE, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise DirectoryBusy(f"{self.path}: another process is writing there (lock {lock.lock_file}); wait "
                                "for it or use another directory", self.field) from None
        self._resume, self.new_rows = resume, []
        try:
            if resume:
                self.existing = self.check(repair=True)
            else:
                self.existing = JsonlContents()
                for name in (self.summary_path, self.meta_path, *(self.path / n for n in self.stale)):
                    if name is not None:
                        name.unlink(missing_ok=True)
            yield self
        except KeyboardInterrupt as exc:
            if isinstance(exc, RunInterrupted):
                raise
            self.close()
            raise RunInterrupted(f"interrupted after {len(self.new_rows)} new rows; every finished row is saved "
                                 f"in {self.path}: rerun the same command to resume") from None
        finally:
            self.close()
            lock.release()

    def close(self) -> None:
        """Close (and sync) every writer of the session."""
        for writer in self._writers:
            writer.close()
        self._writers, self._results_writer = [], None

    # --- rows -----------------------------------------------------------------------------------------

    def writer(self, name: str, metadata: dict[str, Any] | None = None) -> JsonlWriter:
        """An appending writer on ``name`` (the whole file is rewritten when the session started afresh),
        closed with the session; ``metadata`` is written first as a metadata record."""
        writer = JsonlWriter(self.path / name, metadata=metadata, resume=self._resume)
        self._writers.append(writer)
        return writer

    def open_results(self, metadata: dict[str, Any]) -> None:
        """Open the results file for ``write``, recording ``metadata`` (``results.run_metadata``) first."""
        self._results_writer = self.writer(self.results_path.name, metadata)

    def write(self, row: dict[str, Any]) -> None:
        """Append one row to the results file (flushed at once)."""
        if self._results_writer is None:
            raise RuntimeError("open_results(metadata) first")
        self._results_writer.write(row)
        self.new_rows.append(row)

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row.get(f) for f in self.key)

    def done(self) -> set[tuple[Any, ...]]:
        """The keys of the rows already in the directory when the session began."""
        return {self.key_of(row) for row in self.existing.rows}

    def rows(self) -> list[dict[str, Any]]:
        """The rows already there and the new ones, each key once (the first row written wins)."""
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in [*self.existing.rows, *self.new_rows]:
            by_key.setdefault(self.key_of(row), row)
        return list(by_key.values())

    # --- summaries ------------------------------------------------------------------------------------

    def write_summary(self, data: Any) -> Path:
        """Write the summary JSON atomically."""
        if self.summary_path is None:
            raise RuntimeError(f"{self!r} has no summary file")
        return write_json_atomic(self.summary_path, data)

    def write_meta(self, metadata: dict[str, Any]) -> Path:
        """Write the meta file (a ``run_metadata`` record, checked on the next resume) atomically."""
        if self.meta_path is None:
            raise RuntimeError(f"{self!r} has no meta file")
        return write_json_atomic(self.meta_path, metadata)
