"""Call logs: one JSON line per tool call, the one format that the simulator and the real-API client write
and that failure calibration (``resilibench failures fit``) reads.

A row says which call it was (task, episode, turn, tool; rows of the MCP fault proxy, source ``mcp``, name
the upstream server as the task and a client session as the episode), the success formula's inputs at that moment
(``n_uncalled``, ``n_failed``, ``n_history``: see ``Episode.covariates``), what happened (success, error
code) and, for a real call, what the wire showed (HTTP status, latency, error class, Retry-After, the
attempt number; from our tool service also the world's duration and rate-limit wait). Rows of one
episode share ``episode`` and come in turn order.

Crash safety: the writers append an episode's rows in one write once the episode has ended, so a log holds
no rows of an episode that a killed run will play again on resume. A kill during that write can leave a
torn last line (no newline): ``read_rows`` skips it with a warning and the next ``write_rows`` cuts it off.
"""

from __future__ import annotations

__all__ = ["SOURCES", "CallLogRow", "FIELDS", "write_rows", "read_rows", "logged_episodes"]

import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from resilibench.errors import InputError

SOURCES = ("simulator", "http", "mcp")


@dataclass(frozen=True)
class CallLogRow:
    """One tool call as recorded in a call log."""

    source: str  # "simulator", "http" or "mcp" (the MCP fault proxy: an upstream server's tools)
    task_id: str
    episode: str  # identifies the episode within the log (e.g. "<task id>/<seed>")
    turn: int  # 1-based turn of the call in its episode
    tool: str
    n_uncalled: int
    n_failed: int
    n_history: int
    success: bool
    error_code: str | None = None
    status: int | None = None  # HTTP status; None: simulated, or no response (timeout, dropped connection)
    latency_s: float | None = None  # seconds from request to answer (or to the client's timeout)
    error_class: str | None = None  # what the wire showed: "timeout", "rate_limited", "server_error", ...
    retry_after: float | None = None  # the Retry-After of a 429, as sent
    attempt: int = 1  # 1 for the first attempt of an agent's call, 2.. for the client's retries
    # The tool service's own account under failure processes (headers X-Call-Duration, X-Retry-After-Turns):
    # the call's duration in the world and a refusal's further turns refused. None elsewhere.
    world_duration: float | None = None
    wait_turns: int | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise InputError("source", f"source must be one of {SOURCES}, got {self.source!r}")
        if self.success != (self.error_code is None):
            raise InputError("error_code", f"error_code must be null exactly when success is true, got "
                             f"success={self.success} error_code={self.error_code!r}")
        for name in ("task_id", "episode", "tool"):
            if not isinstance(getattr(self, name), str):
                raise InputError(name, f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("error_code", "error_class"):
            if not isinstance(getattr(self, name), str | None):
                raise InputError(name, f"{name} must be a string or null, got {getattr(self, name)!r}")
        if not isinstance(self.success, bool):
            raise InputError("success", f"success must be true or false, got {self.success!r}")
        for name, least, optional in (("turn", 1, False), ("n_uncalled", 0, False), ("n_failed", 0, False),
                                      ("n_history", 0, False), ("attempt", 1, False), ("wait_turns", 0, True),
                                      ("status", 100, True)):
            value = getattr(self, name)
            if optional and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InputError(name, f"{name} must be an integer >= {least}{' or null' if optional else ''}, "
                                 f"got {value!r}")
        for name in ("latency_s", "retry_after", "world_duration"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)
                                      or not math.isfinite(value) or value < 0):
                raise InputError(name, f"{name} must be a finite number >= 0 or null, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = tuple(f.name for f in fields(CallLogRow))


def write_rows(path: str | Path, rows: Iterable[CallLogRow]) -> int:
    """Append rows to a call log (created if missing) in one write, cutting off a torn last line left by
    a killed writer first; returns how many rows."""
    data = "".join(json.dumps(row.to_dict(), sort_keys=True) + "\n" for row in rows).encode("utf-8")
    if not data:
        return 0
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        _cut_torn_tail(descriptor)
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view):]
    finally:
        os.close(descriptor)
    return data.count(b"\n")


def _cut_torn_tail(descriptor: int) -> None:
    """Truncate the file after its last newline when it does not end in one (a line torn by a kill)."""
    size = os.fstat(descriptor).st_size
    if not size or os.pread(descriptor, 1, size - 1) == b"\n":
        return
    end = size
    while end > 0:
        chunk = os.pread(descriptor, min(end, 1 << 16), max(0, end - (1 << 16)))
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = end - len(chunk) + newline + 1
            break
        end -= len(chunk)
    os.ftruncate(descriptor, end)


def logged_episodes(path: str | Path) -> set[str]:
    """The ``episode`` of every row already in the call log at ``path`` (empty when there is none)."""
    return {row.episode for row in read_rows(path)} if Path(path).is_file() else set()


def read_rows(path: str | Path) -> Iterator[CallLogRow]:
    """The rows of a call log. A line that is not a JSON object with the row's fields raises
    ``InputError`` naming the file, the line and the field; a torn last line (no newline: the writer was
    killed) is skipped with a warning."""
    path = Path(path)
    if not path.is_file():
        raise InputError("log", f"call log {path} does not exist")
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
                data = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                if not raw.endswith(b"\n"):
                    warnings.warn(f"{where}: skipped a torn last line (the writer was stopped mid-line)",
                                  stacklevel=2)
                    return
                reason = f"not UTF-8 ({exc.reason})" if isinstance(exc, UnicodeDecodeError) else exc.msg
                raise InputError("log", f"{where}: not a JSON line ({reason})") from None
            if not isinstance(data, dict):
                raise InputError("log", f"{where}: a row must be a JSON object, got {type(data).__name__}")
            unknown = sorted(set(data) - set(FIELDS))
            if unknown:
                raise InputError("log", f"{where}: unknown field(s) {unknown}; accepted: {list(FIELDS)}")
            try:
                yield CallLogRow(**data)
            except TypeError as exc:  # a required field is missing
                raise InputError("log", f"{where}: {exc}") from None
            except InputError as exc:
                raise InputError(exc.field, f"{where}: {exc}") from None
