"""Call logs: one JSON line per tool call, the one format that the simulator and the real-API client write
and that failure calibration (``resilibench failures fit``) reads.

A row says which call it was (task, episode, turn, tool; rows of the MCP fault proxy, source ``mcp``, name
the upstream server as the task and a client session as the episode), the success formula's inputs at that moment
(``n_uncalled``, ``n_failed``, ``n_history``: see ``Episode.covariates``), what happened (success, error
code) and, for a real call, what the wire showed (HTTP status, latency, error class, Retry-After, the
attempt number; from our tool service also the world's duration and rate-limit wait). Rows of one
episode share ``episode`` and come in turn order.
"""

from __future__ import annotations

__all__ = ["SOURCES", "CallLogRow", "FIELDS", "write_rows", "read_rows"]

import json
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
        for name in ("turn", "n_uncalled", "n_failed", "n_history", "attempt"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name in ("turn", "attempt") else 0):
                raise InputError(name, f"{name} must be an integer >= {1 if name in ('turn', 'attempt') else 0}, "
                                 f"got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = tuple(f.name for f in fields(CallLogRow))


def write_rows(path: str | Path, rows: Iterable[CallLogRow]) -> int:
    """Append rows to a call log (created if missing), one flushed JSON line each; returns how many."""
    count = 0
    with Path(path).open("a", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row.to_dict(), sort_keys=True) + "\n")
            out.flush()
            count += 1
    return count


def read_rows(path: str | Path) -> Iterator[CallLogRow]:
    """The rows of a call log. A line that is not a JSON object with the row's fields raises
    ``InputError`` naming the file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise InputError("log", f"call log {path} does not exist")
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError("log", f"{where}: not a JSON line ({exc.msg})") from None
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
