"""What the two servers of the world share: episodes held by handle, episode starts, sockets.

The MCP server (``resilibench.envs.mcp``) and the HTTP tool service (``resilibench.envs.real_api.service``)
both keep many clients' episodes in an ``EpisodeTable`` and listen on a socket from ``bind_socket``.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_EPISODES", "start_episode", "UnknownEpisodeError", "EpisodeTable", "is_loopback",
    "bind_socket",
]

import ipaddress
import secrets
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...core.config import WorldConfig
from ...core.registry import ToolRegistry
from ...core.simulator import Episode, run_episode_seed
from ...core.tasks.library import Task

DEFAULT_MAX_EPISODES = 10_000


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


class EpisodeTable:
    """Episodes by handle, shared by every client of one server; thread safe and bounded.

    Handles are random (``ep-`` and 16 hex digits), so one client cannot guess another's. Beyond
    ``max_episodes`` a new episode evicts the least recently used finished episode or, when every
    episode is still running, the least recently used running one (an abandoned client must not block
    new ones). An evicted handle answers UNKNOWN_EPISODE."""

    def __init__(self, max_episodes: int = DEFAULT_MAX_EPISODES):
        if not isinstance(max_episodes, int) or max_episodes < 1:
            raise ValueError(f"max_episodes must be a positive integer, got {max_episodes!r}")
        self.max_episodes = max_episodes
        self._running: OrderedDict[str, Episode] = OrderedDict()
        self._finished: OrderedDict[str, Episode] = OrderedDict()
        self._executors: dict[str, Any] = {}  # real-API mode: each episode's HttpExecutor
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._running) + len(self._finished)

    def __contains__(self, handle: object) -> bool:
        return handle in self._running or handle in self._finished

    def add(self, episode: Episode, executor: Any = None) -> str:
        """Store a new episode (with the ``HttpExecutor`` that plays its calls in real-API mode); returns its
        handle."""
        with self._lock:
            handle = f"ep-{secrets.token_hex(8)}"
            while handle in self:  # 64 random bits: a clash is all but impossible
                handle = f"ep-{secrets.token_hex(8)}"
            while len(self) >= self.max_episodes:
                evicted, _ = (self._finished or self._running).popitem(last=False)
                self._executors.pop(evicted, None)
            (self._finished if episode.done else self._running)[handle] = episode
            if executor is not None:
                self._executors[handle] = executor
        return handle

    def executor(self, handle: str) -> Any:
        """The real-API executor of the episode of ``handle`` (None in simulator mode)."""
        return self._executors.get(handle)

    @contextmanager
    def use(self, handle: str) -> Iterator[Episode]:
        """The episode of ``handle``, held under the table's lock (so calls on it never interleave; do
        not await inside); it becomes the most recently used, and moves to the finished ones once it
        has ended."""
        with self._lock:
            for table in (self._running, self._finished):
                episode = table.get(handle)
                if episode is not None:
                    table.move_to_end(handle)
                    break
            else:
                raise UnknownEpisodeError(
                    f"unknown episode {handle!r}: no such handle, or it was evicted (the server keeps "
                    f"{self.max_episodes} episodes and evicts finished ones first); open one with start_task")
            try:
                yield episode
            finally:
                if episode.done and handle in self._running:
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
