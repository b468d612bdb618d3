"""What the two servers of the world share: episodes held by handle, episode starts, seeds, sockets, and
the HTTP server's limits.

The MCP server (``resilibench.envs.mcp``) and the HTTP tool service (``resilibench.envs.real_api.service``)
both keep many clients' episodes in an ``EpisodeTable``, listen on a socket from ``bind_socket`` and,
over HTTP, run under uvicorn with ``uvicorn_config``: httptools' parser behind a protocol that bounds
connections, header and body read times and sizes (``ServerLimits``) and can drop a connection on purpose.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_EPISODES", "DEFAULT_MAX_EPISODES_PER_CLIENT", "DEFAULT_EPISODE_IDLE_TIMEOUT", "MAX_SEED",
    "seed_problem", "start_episode", "UnknownEpisodeError", "EpisodeTable", "is_loopback", "bind_socket",
    "DROP_EXTENSION", "ServerLimits", "limited_protocol", "uvicorn_config",
]

import asyncio
import ipaddress
import logging
import resource
import secrets
import socket
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from resilibench.errors import InputError

from ...core.config import WorldConfig
from ...core.registry import ToolRegistry
from ...core.simulator import Episode, run_episode_seed
from ...core.stream import M64
from ...core.tasks.library import Task

DEFAULT_MAX_EPISODES = 10_000
DEFAULT_MAX_EPISODES_PER_CLIENT = 1_000
DEFAULT_EPISODE_IDLE_TIMEOUT = 3600.0
MAX_SEED = M64  # seeds are integers in [0, 2**64): the world's stream keys on 64 bits


def seed_problem(seed: Any) -> str | None:
    """Why ``seed`` is not a seed a server accepts (None when it is): an integer in [0, MAX_SEED]. A larger
    one would silently play the episode of its value modulo 2**64."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        return f"seed must be an integer in [0, 2**64 - 1], got {seed!r}"
    return None


def start_episode(task: Task, seed: int, config: WorldConfig | None = None,
                  registry: ToolRegistry | None = None) -> Episode:
    """The episode of ``task`` for run seed ``seed``: the stream ``ResiliBench-v1`` meets when reset with
    ``task_seed(task_id, seed)``, as ``resilibench run`` and the bounds do (paired across front ends,
    independent across tasks: `simulator.run_episode_seed`)."""
    return Episode.start(task, run_episode_seed(task.instance_id, seed), config, registry)


class UnknownEpisodeError(KeyError):
    """A handle that names no open episode."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(eq=False)
class _Entry:
    episode: Episode
    client: str
    executor: Any
    used: float
    lock: threading.Lock = field(default_factory=threading.Lock)


class EpisodeTable:
    """Episodes by handle, shared by every client of one server; thread safe and bounded.

    Handles are random (``ep-`` and 16 hex digits), so one client cannot guess another's. Each episode
    has its own lock: calls on one episode never interleave, and a slow call (a real HTTP request in
    real-API mode) holds up no other episode. Bounds, each evicting finished episodes before running
    ones and the least recently used first (an evicted handle answers UNKNOWN_EPISODE):

    * ``max_per_client``: a client (``add``'s ``client``: the server's name for who asked) holding this
      many episodes makes room among its own, so one client cannot evict every other client's;
    * ``max_episodes``: beyond it, the table makes room among all (an abandoned client must not block
      new ones);
    * ``idle_timeout`` seconds (None: never): an episode unused this long is dropped."""

    def __init__(self, max_episodes: int = DEFAULT_MAX_EPISODES,
                 max_per_client: int = DEFAULT_MAX_EPISODES_PER_CLIENT,
                 idle_timeout: float | None = DEFAULT_EPISODE_IDLE_TIMEOUT):
        for name, value in (("max_episodes", max_episodes), ("max_per_client", max_per_client)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(name, f"must be a positive integer, got {value!r}")
        if idle_timeout is not None and not 0 < idle_timeout < float("inf"):
            raise InputError("idle_timeout", f"must be a positive, finite number of seconds, got {idle_timeout!r}")
        self.max_episodes, self.max_per_client, self.idle_timeout = max_episodes, max_per_client, idle_timeout
        self._running: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._finished: OrderedDict[str, _Entry] = OrderedDict()
        self._per_client: Counter[str] = Counter()
        self._next_expiry = 0.0
        self._lock = threading.Lock()  # guards the tables, never held during a call

    def __len__(self) -> int:
        return len(self._running) + len(self._finished)

    def __contains__(self, handle: object) -> bool:
        return handle in self._running or handle in self._finished

    def _drop(self, handle: str) -> None:
        entry = self._finished.pop(handle, None) or self._running.pop(handle)
        self._per_client[entry.client] -= 1
        if not self._per_client[entry.client]:
            del self._per_client[entry.client]

    def _expire(self, now: float) -> None:
        if self.idle_timeout is None or now < self._next_expiry:
            return
        self._next_expiry = now + min(1.0, self.idle_timeout / 10)  # a look per call would cost each call
        for table in (self._running, self._finished):
            while table and next(iter(table.values())).used < now - self.idle_timeout:
                self._drop(next(iter(table)))

    def add(self, episode: Episode, executor: Any = None, client: str = "") -> str:
        """Store a new episode of ``client`` (with the ``HttpExecutor`` that plays its calls in real-API
        mode); returns its handle."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            handle = f"ep-{secrets.token_hex(8)}"
            while handle in self:  # 64 random bits: a clash is all but impossible
                handle = f"ep-{secrets.token_hex(8)}"
            if self._per_client[client] >= self.max_per_client:
                self._drop(next(h for table in (self._finished, self._running)
                                for h, entry in table.items() if entry.client == client))
            while len(self) >= self.max_episodes:
                self._drop(next(iter(self._finished or self._running)))
            (self._finished if episode.done else self._running)[handle] = _Entry(episode, client, executor, now)
            self._per_client[client] += 1
        return handle

    def executor(self, handle: str) -> Any:
        """The real-API executor of the episode of ``handle`` (None in simulator mode or when it is gone)."""
        entry = self._running.get(handle) or self._finished.get(handle)
        return None if entry is None else entry.executor

    @contextmanager
    def use(self, handle: str) -> Iterator[Episode]:
        """The episode of ``handle``, held under its own lock (so calls on it never interleave; do not
        await inside); it becomes the most recently used, and moves to the finished ones once it has
        ended."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            for table in (self._running, self._finished):
                entry = table.get(handle)
                if entry is not None:
                    table.move_to_end(handle)
                    entry.used = now
                    break
            else:
                raise UnknownEpisodeError(
                    f"unknown episode {handle!r}: no such handle, or it was evicted (the server keeps "
                    f"{self.max_episodes} episodes, {self.max_per_client} per client, and drops finished "
                    "ones first and idle ones); open one with start_task")
        with entry.lock:
            try:
                yield entry.episode
            finally:
                if entry.episode.done:
                    with self._lock:
                        if self._running.get(handle) is entry:
                            self._finished[handle] = self._running.pop(handle)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket bound to (host, port); port 0 picks a free port. OSError when taken.

    The protocol is IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on connections accepted from such a
    socket, and without it every response waits about 40 ms for the client's delayed ACK (Nagle)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


# --- HTTP: uvicorn with limits ----------------------------------------------------------------------------

DROP_EXTENSION = "resilibench.drop_connection"  # scope extension: close the connection without a response
_BACKLOG = 128  # connections the kernel queues before accept; the open files they may take are reserved
_SPARE_FILES = 64  # open files beside the connections: the listening socket, logs, the app's own files
_REFUSALS = {408: b"Request Timeout", 413: b"Content Too Large", 431: b"Request Header Fields Too Large",
             503: b"Service Unavailable"}
_log = logging.getLogger("resilibench.server")


@dataclass(frozen=True)
class ServerLimits:
    """What one HTTP server (``serve tools``, ``serve mcp --transport http``) allows a client:

    * ``max_connections`` open at once; one more is answered 503 and closed (the process's open-file
      limit is raised to fit, or the server refuses to start);
    * ``header_timeout`` seconds for a request's head (from the connection's start or the previous
      response), and at most ``max_header_bytes`` of it: else 408 / 431 and the connection is closed;
    * ``body_timeout`` seconds for its body once the head is in (else 408), and at most
      ``max_body_bytes`` of body: else 413 before the app reads further."""

    max_connections: int = 512
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_body_bytes: int = 1 << 20
    max_header_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_body_bytes", "max_header_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(name, f"must be a positive integer, got {value!r}")
        for name in ("header_timeout", "body_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise InputError(name, f"must be a positive, finite number of seconds, got {value!r}")


class _Throttle(logging.Filter):
    """Lets through the first record of each message, then one per ``interval`` seconds telling how many
    like it were left out: a flood of bad clients writes a few lines, not one (or a traceback) each. A
    record of a client that left mid-request (``ClientDisconnect``) is not news and is left out."""

    def __init__(self, interval: float = 60.0):
        super().__init__()
        self.interval = interval
        self._last: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ClientDisconnect):
            return False
        now = time.monotonic()
        key = str(record.msg)
        last, skipped = self._last.get(key, (-self.interval, 0))
        if now - last < self.interval:
            self._last[key] = (last, skipped + 1)
            return False
        self._last[key] = (now, 0)
        if skipped:
            record.msg = f"{record.msg} ({skipped} more like it in the last {self.interval:g} s not shown)"
        return True


_THROTTLE = _Throttle()


class _Limited:
    """Mixed into uvicorn's HTTP protocols (``limited_protocol``): the ``ServerLimits`` of ``limits``, and
    the scope extension ``DROP_EXTENSION`` (a callable that aborts the connection: ASGI has no message to
    close one without answering)."""

    limits: ServerLimits
    _timer: asyncio.TimerHandle | None = None
    _head_bytes: int | None = None  # bytes of the awaited request head so far; None: not awaiting one
    # uvicorn's protocol provides these:
    app: Any
    cycle: Any
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app = self._guarded(self.app)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.limits.max_connections:
            _log.warning("refusing connections: %d are open, the most this server allows (max_connections)",
                         self.limits.max_connections)
            self._refuse(503)
        else:
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self._head_bytes is not None:
            if self.cycle is cycle:
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.max_header_bytes:
                    self._refuse(431)
                return
            self._head_bytes = None  # the head is in: now its body
            self._arm(self.limits.body_timeout)
        if self.cycle is not None and not self.cycle.more_body:
            self._disarm()  # the request is in: the app's time is its own

    def on_response_complete(self) -> None:
        cycle, pipelined = self.cycle, bool(getattr(self, "pipeline", None))
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self.cycle is cycle and not pipelined:
            self._await_head()
        else:  # the next request's head is in already (pipelined): wait for its body, if any
            self._head_bytes = None
            if self.cycle.more_body:
                self._arm(self.limits.body_timeout)
            else:
                self._disarm()

    def _await_head(self) -> None:
        self._head_bytes = 0
        self._arm(self.limits.header_timeout)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._head_bytes == 0 and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()  # idle between requests: nothing to answer
        else:
            self._refuse(408)

    def _refuse(self, status: int) -> None:
        """Answer ``status`` (unless a response has begun) and close the connection."""
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                                 % (status, _REFUSALS[status]))
        self.transport.close()

    def _guarded(self, app: Any) -> Any:
        limit = self.limits.max_body_bytes

        async def too_large(send: Any) -> None:
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-length", b"0"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": b""})

        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return await app(scope, receive, send)
            scope.setdefault("extensions", {})[DROP_EXTENSION] = self.transport.abort
            length = next((v for k, v in scope["headers"] if k == b"content-length"), b"0")
            if int(length) > limit:  # the parser let only digits through
                return await too_large(send)
            received, refused = 0, False

            async def limited_receive() -> Any:
                nonlocal received, refused
                if refused:
                    return {"type": "http.disconnect"}
                message = await receive()
                received += len(message.get("body", b""))
                if received > limit:  # a chunked body past the limit
                    refused = True
                    await too_large(send)
                    return {"type": "http.disconnect"}
                return message

            async def limited_send(message: Any) -> None:
                if not refused:
                    await send(message)

            cycle = getattr(receive, "__self__", None)  # uvicorn's request-response cycle
            try:
                await app(scope, limited_receive, limited_send)
            except Exception:
                if not (refused or getattr(cycle, "disconnected", False)):
                    raise
                # The client went away mid-request (or was refused): nothing to answer, nothing to report.
                _log.debug("a request ended after its client went away", exc_info=True)

        return guarded


def limited_protocol(limits: ServerLimits, parser: str = "httptools") -> type:
    """uvicorn's HTTP protocol class of ``parser`` ("httptools": the fast one; "h11": pure Python) with
    ``limits`` (see ``_Limited``)."""
    bases = {"httptools": HttpToolsProtocol, "h11": H11Protocol}
    if parser not in bases:
        raise InputError("parser", f"must be one of {sorted(bases)}, got {parser!r}")
    return type(f"Limited{bases[parser].__name__}", (_Limited, bases[parser]), {"limits": limits})


def _open_files_for(limits: ServerLimits) -> None:
    """Raise the process's open-file limit to fit ``limits.max_connections`` (a server out of files can
    accept no one); InputError when the hard limit is too low."""
    needed = limits.max_connections + _BACKLOG + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise InputError("max_connections", f"{limits.max_connections} connections need {needed} open files; "
                             f"this process may open at most {hard} (ulimit -Hn): lower it")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def uvicorn_config(app: Any, limits: ServerLimits | None = None, parser: str = "httptools",
                   **options: Any) -> uvicorn.Config:
    """The uvicorn config of one of the world's servers: ``app`` behind ``limited_protocol(limits,
    parser)``, its logs throttled (``_Throttle``); ``options`` go to ``uvicorn.Config``."""
    limits = limits or ServerLimits()
    _open_files_for(limits)
    for name in ("uvicorn.error", "resilibench.server", "asyncio", "mcp.server.streamable_http"):
        if _THROTTLE not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_THROTTLE)
    return uvicorn.Config(app, http=limited_protocol(limits, parser), backlog=_BACKLOG,
                          h11_max_incomplete_event_size=limits.max_header_bytes, **options)
