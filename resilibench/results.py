"""Helpers for long runs: provenance metadata, incremental JSONL rows that survive a crash, atomic JSON.

A results JSONL file is a log of rows, one JSON object a line, flushed as each row is produced. Metadata
records (``{"__metadata__": {...}}``: config, seeds, package versions, git revision, timestamp) mark
where each invocation began, so every file says what produced its rows. ``read_jsonl`` reads a file back
for resuming; a truncated last line (a crash mid-write) is dropped with a warning and, with
``repair=True``, the file is rewritten without it.
"""

from __future__ import annotations

__all__ = [
    "METADATA_KEY", "CORE_PACKAGES", "OPTIONAL_PACKAGES", "package_versions", "git_revision", "run_metadata",
    "to_jsonable", "dumps_row", "write_text_atomic", "write_json_atomic", "JsonlContents", "read_jsonl",
    "JsonlWriter", "LEVEL_NAMES", "INFRA_ERROR", "wilson_interval", "check_level_rows", "level_stats",
    "summarize_levels", "plot_full_success", "new_figure", "save_figure", "json_diff",
]

import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

METADATA_KEY = "__metadata__"
CORE_PACKAGES = ("resilibench", "numpy", "gymnasium", "scipy", "networkx")
OPTIONAL_PACKAGES = ("torch", "ray", "transformers")


# --- metadata -----------------------------------------------------------------------------------------


def package_versions(packages: Iterable[str] = CORE_PACKAGES, optional: Iterable[str] = OPTIONAL_PACKAGES
                     ) -> dict[str, str]:
    """Installed versions of ``packages`` ("not installed" when missing) and of the ``optional`` ones
    that are importable. Nothing is imported: heavy packages (torch) cost no start-up time."""
    versions: dict[str, str] = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    for name in optional:
        try:
            if importlib.util.find_spec(name) is not None:
                versions[name] = importlib.metadata.version(name)
        except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
            continue
    return versions


def git_revision(path: str | Path | None = None) -> dict[str, Any]:
    """``git rev-parse HEAD`` of the source tree holding this package (and whether it has uncommitted
    changes); ``"unknown"`` when the package is not inside its own git checkout or git is missing."""
    package_dir = Path(path) if path is not None else Path(__file__).resolve().parent
    unknown = {"revision": "unknown", "dirty": None}

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True, text=True,
                                 timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    # Only trust a checkout whose root holds the package (not, say, a repository around a venv).
    if top is None or Path(top).resolve() != package_dir.parent.resolve():
        return unknown
    revision = git("rev-parse", "HEAD")
    if revision is None:
        return unknown
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"revision": revision, "dirty": None if status is None else bool(status)}


def run_metadata(config: dict[str, Any], seeds: Sequence[int] | None, extra: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """What every results file carries: config, seeds, package versions, Python and platform, git
    revision of the source tree and a UTC timestamp (ISO 8601), plus ``extra``."""
    git = git_revision()
    meta = {
        "config": to_jsonable(config),
        "seeds": None if seeds is None else [int(s) for s in seeds],
        "packages": package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_revision": git["revision"],
        "git_dirty": git["dirty"],
        "command": sys.argv[:],
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if extra:
        meta.update(to_jsonable(extra))
    return meta


# --- JSON ---------------------------------------------------------------------------------------------


_PLAIN = frozenset({str, int, bool, type(None)})


def to_jsonable(value: Any) -> Any:
    """Plain JSON data: numpy scalars and arrays become Python values, tuples lists, NaN/inf None."""
    kind = type(value)  # the exact plain types first (the bulk of a row), then containers, subclasses, the rest
    if kind in _PLAIN:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return to_jsonable(value.tolist())
    raise TypeError(f"cannot write {type(value).__name__} to JSON: {value!r}")


def dumps_row(row: dict[str, Any]) -> str:
    """One compact JSON line (no newline)."""
    return json.dumps(to_jsonable(row), separators=(",", ":"), allow_nan=False)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: readers see the
    old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file ordinary permissions
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, data: Any, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON atomically (temporary file + ``os.replace``); returns the path."""
    text = json.dumps(to_jsonable(data), indent=indent, allow_nan=False) + "\n"
    return write_text_atomic(path, text)


# --- JSONL --------------------------------------------------------------------------------------------


@dataclass
class JsonlContents:
    """A results JSONL file read back: its metadata records and its rows, in file order."""

    metadata: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped_tail: bool = False  # a truncated last line was found (and ignored)
    row_lines: list[int] = field(default_factory=list)  # the line number of each row, for messages


def read_jsonl(path: str | Path, repair: bool = False) -> JsonlContents:
    """Read a results JSONL file; a missing file reads as empty.

    A last line that is unterminated or does not parse is what a crash mid-write leaves: it is ignored
    with a warning, and with ``repair=True`` the file is rewritten (atomically) without it. A bad line
    anywhere else is corruption, not a crash artefact, and raises ValueError naming the line.
    """
    path = Path(path)
    contents = JsonlContents()
    if not path.exists():
        return contents
    data = path.read_bytes()
    lines = data.split(b"\n")
    # ``lines[-1]`` is what follows the last newline: empty for a clean file.
    complete, tail = lines[:-1], lines[-1]
    good: list[bytes] = []
    for number, raw in enumerate(complete, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if number == len(complete) and not tail.strip():
                contents.dropped_tail = True  # the last line is garbled (e.g. a partly flushed write)
                break
            raise ValueError(f"{path}:{number}: not a JSON object line ({exc}); the file is corrupt") from None
        good.append(raw)
        _add(contents, record, number)
    if tail.strip():
        try:
            record = json.loads(tail)
        except ValueError:
            contents.dropped_tail = True
        else:
            # A complete object that only lacks its newline: keep it.
            if isinstance(record, dict):
                good.append(tail)
                _add(contents, record, len(lines))
            else:
                contents.dropped_tail = True
    if contents.dropped_tail:
        action = "rewriting the file without it" if repair else "ignoring it"
        warnings.warn(f"{path}: the last line is truncated (an interrupted write?); {action}",
                      RuntimeWarning, stacklevel=2)
    if repair and (contents.dropped_tail or tail.strip()):  # drop the bad tail, or end the last line
        write_text_atomic(path, b"".join(line + b"\n" for line in good).decode("utf-8"))
    return contents


def _add(contents: JsonlContents, record: dict[str, Any], line: int) -> None:
    if set(record) == {METADATA_KEY}:
        contents.metadata.append(record[METADATA_KEY])
    else:
        contents.rows.append(record)
        contents.row_lines.append(line)


class JsonlWriter:
    """Append rows to a JSONL file one line at a time, flushing each, so a crash loses at most the row
    being written.

    ``resume=True`` keeps the existing rows (repairing a truncated last line); ``resume=False`` starts
    the file afresh. ``metadata``, when given, is written first as a ``{"__metadata__": ...}`` record.
    ``existing`` holds what the file held before this writer appended to it.
    """

    def __init__(self, path: str | Path, metadata: dict[str, Any] | None = None, resume: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.existing = read_jsonl(self.path, repair=True) if resume else JsonlContents()
        self._fh = self.path.open("a" if resume else "w", encoding="utf-8", newline="\n")
        if metadata is not None:
            self._write_line(dumps_row({METADATA_KEY: metadata}))

    def _write_line(self, line: str) -> None:
        try:
            self._fh.write(line + "\n")
            self._fh.flush()
        except OSError as exc:  # a full disk: say which file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None

    def write(self, row: dict[str, Any]) -> None:
        """Append one row and flush it to the operating system."""
        if set(row) == {METADATA_KEY}:
            raise ValueError(f"a row may not consist of the reserved key {METADATA_KEY!r} alone")
        self._write_line(dumps_row(row))

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- summaries of success levels ----------------------------------------------------------------------

LEVEL_NAMES = ("full_success", "partial_success", "failure")
# The level of an eval row whose episode the infrastructure could not play (a request that timed out, a
# prompt longer than the context): counted apart, never in the rates of LEVEL_NAMES.
INFRA_ERROR = "infra_error"


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for the default z); (0, 1) when n = 0.
    Unlike the normal approximation it stays inside [0, 1] and is sensible at rates of 0 and 1."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))  # p inside despite rounding


def check_level_rows(rows: Sequence[dict[str, Any]], fields: Sequence[str] = (), source: str = "rows",
                     lines: Sequence[int] | None = None, levels: Sequence[str] = LEVEL_NAMES) -> None:
    """ValueError naming the first row (``source``:line, or its position) that lacks one of ``fields`` or
    a ``level`` of ``levels``: what a summary of levels needs."""
    for i, row in enumerate(rows):
        where = f"{source}:{lines[i]}" if lines else f"{source} row {i + 1}"
        missing = [f for f in (*fields, "level") if f not in row]
        if missing:
            raise ValueError(f"{where}: the row has no {missing[0]!r} field")
        if row["level"] not in levels:
            raise ValueError(f"{where}: level must be one of {tuple(levels)}, got {row['level']!r}")


def level_stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Episodes, full/partial/failure rates, a 95% interval for full success, and the mean bounds
    (iii) and (ii) of the same rows (so over the same tasks and seeds), with full / bound (iii)."""
    check_level_rows(rows)
    n = len(rows)
    counts = {level: sum(1 for r in rows if r["level"] == level) for level in LEVEL_NAMES}
    stats: dict[str, Any] = {"episodes": n}
    for level in LEVEL_NAMES:
        stats[level] = counts[level] / n if n else None
    stats["full_success_ci95"] = list(wilson_interval(counts["full_success"], n))
    for bound in ("bound_iii", "bound_ii"):
        values = [r[bound] for r in rows if r.get(bound) is not None]
        stats[bound] = sum(values) / len(values) if values else None
    full, bound_iii = stats["full_success"], stats["bound_iii"]
    stats["full_over_bound_iii"] = full / bound_iii if full is not None and bound_iii else None
    return stats


def summarize_levels(rows: Sequence[dict[str, Any]], group: str = "planner", by: str = "task_type",
                     groups: Sequence[str] | None = None, subgroups: Sequence[str] | None = None
                     ) -> dict[str, Any]:
    """``level_stats`` per ``group`` (e.g. planner or model) and per ``group`` x ``by`` (task type).
    ``groups``/``subgroups`` fix the order (default: order of first appearance)."""
    check_level_rows(rows, (group, by))
    groups = list(groups) if groups is not None else list(dict.fromkeys(r[group] for r in rows))
    subgroups = list(subgroups) if subgroups is not None else list(dict.fromkeys(r[by] for r in rows))
    overall, nested = {}, {}
    for g in groups:
        mine = [r for r in rows if r[group] == g]
        overall[g] = level_stats(mine)
        nested[g] = {s: level_stats([r for r in mine if r[by] == s]) for s in subgroups
                     if any(r[by] == s for r in mine)}
    return {"overall": overall, f"by_{by}": nested}


def plot_full_success(overall: dict[str, dict[str, Any]], nested: dict[str, dict[str, dict[str, Any]]],
                      path: str | Path, title: str = "Full success by task type") -> Path:
    """Grouped bars of the full-success rate (with 95% intervals) per subgroup (task type) and group
    (planner), bound (iii) marked as a black line over each group of bars."""
    groups = list(overall)
    subgroups = list(dict.fromkeys(s for g in groups for s in nested[g]))
    columns = [*subgroups, "all"]

    def stats_of(g: str, column: str) -> dict[str, Any] | None:
        return overall[g] if column == "all" else nested[g].get(column)

    width = 0.8 / max(1, len(groups))
    fig, ax = new_figure(figsize=(max(8.0, 1.8 * len(columns)), 4.8))
    for j, g in enumerate(groups):
        xs, heights, lows, highs = [], [], [], []
        for i, column in enumerate(columns):
            st = stats_of(g, column)
            if st is None or st["full_success"] is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            heights.append(st["full_success"])
            lows.append(max(0.0, st["full_success"] - st["full_success_ci95"][0]))
            highs.append(max(0.0, st["full_success_ci95"][1] - st["full_success"]))
        ax.bar(xs, heights, width, yerr=[lows, highs], capsize=2, label=g,
               error_kw={"ecolor": "0.35", "elinewidth": 0.8})
    marked = False
    for i, column in enumerate(columns):
        values = [st["bound_iii"] for g in groups if (st := stats_of(g, column)) and st["bound_iii"] is not None]
        if values:
            ax.hlines(sum(values) / len(values), i - 0.45, i + 0.45, colors="black", linewidths=2,
                      label=None if marked else "bound (iii)")
            marked = True
    ax.set_xticks(range(len(columns)), [c.replace("_", "\n", 1) for c in columns], fontsize=8)
    ax.set_ylim(0, 1.2)
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("full-success rate")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", ncols=min(6, len(groups) + 1), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def new_figure(*grid: int, figsize: tuple[float, float] | None = None, **subplots: Any) -> tuple[Any, Any]:
    """A matplotlib Figure made without pyplot (so no backend is chosen or changed: files are written
    whatever the user's backend) and its axes: ``Figure.subplots(*grid, **subplots)``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **subplots)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write a matplotlib figure atomically (temporary file + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    return path


def json_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += json_diff(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [f"{prefix or '<root>'}: {a!r} -> {b!r}"]
