"""The 30 tools as an HTTP service whose faults are real: slow answers, 429 + Retry-After, 5xx, dropped
connections, malformed bodies and 4xx, each produced by the world's own draws.

``ToolService`` is a Starlette app (``.app``):

* ``POST /tools/{name}``: a tool call, its JSON arguments as the body. It is played with
  ``toolbox.call_tool`` on an ``Episode`` (arguments checked with the tool's schema) and its result is
  rendered through the fault table ``envs.real_api.http_faults``: a success is a 200 with the tool's output, a
  failure the fault of its error code. The header ``X-Episode`` names the episode (``POST /episodes``);
  without it the call goes to the service's default episode (a fixed task, restarted when it ends).
* ``POST /episodes`` ``{"task_id", "seed", "config"?}``: opens an episode of the task with that episode
  seed; ``config`` (a world config as a dict) is checked against the service's world (its ``rules`` are
  the client's to choose). A client that plays the same task and seed therefore meets the simulator's
  outcomes exactly (``tool_client.HttpExecutor`` does).
* ``GET /openapi.json``: OpenAPI 3.1, one operation per tool (request body: the tool's JSON Schema).
* ``GET /health``.

Requests the service cannot play (unknown tool or episode, a bad ``X-Episode-Replay``) get a 4xx with
``{"error": {"code", "field", "description"}}`` and change no episode. ``serve_tools`` runs the app under
uvicorn (``serving.uvicorn_config``: httptools' parser, the server's limits, and a way to drop a connection),
``running_service`` in a background thread.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_SLOW_SECONDS", "DEFAULT_RETRY_AFTER", "UNKNOWN_TOOL", "UNKNOWN_EPISODE",
    "UNKNOWN_TASK", "BAD_REQUEST", "CONFIG_MISMATCH", "EPISODE_ENDED", "OUT_OF_TURNS", "REPLAY_MISMATCH",
    "ServiceError", "ToolService", "openapi_document", "serve_tools", "url_of",
    "running_service",
]

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from resilibench.errors import ConfigError, InputError
from resilibench.settings import from_dict
from resilibench.version import __version__

from ...core.config import WorldConfig
from ...core.registry import INVALID_INPUT, ToolRegistry, default_registry
from ...core.simulator import EnvEpisodes, Episode, task_seed
from ...core.tasks.library import Task
from ...core.text.toolbox import UnknownToolError, call_tool, resolve_tool
from ...core.world import load_tasks
from . import http_faults as hf
from .client import DURATION_HEADER, EPISODE_HEADER, REPLAY_HEADER, WAIT_TURNS_HEADER
from .serving import (
    DEFAULT_EPISODE_IDLE_TIMEOUT,
    DEFAULT_MAX_EPISODES,
    DEFAULT_MAX_EPISODES_PER_CLIENT,
    DROP_EXTENSION,
    EpisodeTable,
    ServerLimits,
    UnknownEpisodeError,
    bind_socket,
    is_loopback,
    seed_problem,
    uvicorn_config,
)

DEFAULT_SLOW_SECONDS = 2.0
DEFAULT_RETRY_AFTER = 1.0

# Codes of the service's own errors (requests it cannot play).
UNKNOWN_TOOL, UNKNOWN_EPISODE, UNKNOWN_TASK = "UNKNOWN_TOOL", "UNKNOWN_EPISODE", "UNKNOWN_TASK"
BAD_REQUEST, CONFIG_MISMATCH, EPISODE_ENDED = "BAD_REQUEST", "CONFIG_MISMATCH", "EPISODE_ENDED"
OUT_OF_TURNS, REPLAY_MISMATCH = "OUT_OF_TURNS", "REPLAY_MISMATCH"


class ServiceError(Exception):
    """A request the service answers with an HTTP error and no change to any episode."""

    def __init__(self, status: int, code: str, field: str, description: str, **extra: Any):
        super().__init__(description)
        self.status, self.code, self.field, self.description, self.extra = status, code, field, description, extra

    def response(self) -> JSONResponse:
        error = {"code": self.code, "field": self.field, "description": self.description}
        return JSONResponse({"error": error, **self.extra}, self.status)


class _Dropped(Response):
    """No response at all: the connection is closed (needs the protocol of ``serve_tools``)."""

    def __init__(self) -> None:
        super().__init__()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        drop = scope.get("extensions", {}).get(DROP_EXTENSION)
        if drop is None:
            raise RuntimeError("dropping a connection needs the server of serve_tools/running_service")
        drop()
        while (await receive())["type"] != "http.disconnect":  # returns once the server saw the close
            pass


class ToolService:
    """The tool service of one world: ``tasks`` (default: the shipped library), ``config`` (the world),
    ``registry``; the default episode plays ``task_id`` (default: the first test task) from run seed
    ``seed``; a TIMEOUT answers after ``slow_seconds``, a 429 says ``Retry-After: retry_after`` seconds
    (per turn of the wait, under the rate-limit process). Under the latency process a call answers after
    its drawn duration times ``time_scale`` (0: at once; the episode's time budget counts the drawn
    duration either way).
    ``host`` (when given and a loopback address) accepts only Host headers that name this machine, as a
    guard against DNS rebinding (``serve tools`` gives it). ``max_episodes``, ``max_episodes_per_client``
    (a client: its network address) and ``episode_idle_timeout`` (seconds) bound the episode table
    (``serving.EpisodeTable``)."""

    def __init__(self, tasks: Sequence[Task] | None = None, config: WorldConfig | None = None,
                 registry: ToolRegistry | None = None, task_id: str | None = None, seed: int = 0,
                 slow_seconds: float = DEFAULT_SLOW_SECONDS, retry_after: float = DEFAULT_RETRY_AFTER,
                 max_episodes: int = DEFAULT_MAX_EPISODES, host: str | None = None, time_scale: float = 1.0,
                 max_episodes_per_client: int = DEFAULT_MAX_EPISODES_PER_CLIENT,
                 episode_idle_timeout: float | None = DEFAULT_EPISODE_IDLE_TIMEOUT):
        self.tasks = list(tasks) if tasks is not None else load_tasks()
        if not self.tasks:
            raise InputError("tasks", "the task library is empty")
        self.tasks_by_id = {t.instance_id: t for t in self.tasks}
        self.config = config or WorldConfig()
        self.registry = registry or default_registry()
        for name, value in (("slow_seconds", slow_seconds), ("retry_after", retry_after), ("time_scale", time_scale)):
            if not 0 <= value < float("inf"):
                unit = "" if name == "time_scale" else " of seconds"
                raise InputError(name, f"must be a finite number{unit} >= 0, got {value!r}")
        self.slow_seconds, self.retry_after, self.time_scale = float(slow_seconds), float(retry_after), float(time_scale)
        if task_id is None:
            task_id = next((t for t in self.tasks if t.split == "test"), self.tasks[0]).instance_id
        if task_id not in self.tasks_by_id:
            raise InputError("task_id", f"no task {task_id!r} in the library")
        self.default_task = self.tasks_by_id[task_id]
        self.episodes = EpisodeTable(max_episodes, max_episodes_per_client, episode_idle_timeout)
        self._default_seeds, self._default_env_seed = EnvEpisodes(), task_seed(task_id, seed)
        self._default_handle: str | None = None
        self._configs: dict[Any, WorldConfig] = {}
        self.openapi = openapi_document(self.registry)
        middleware = []
        if host is not None and is_loopback(host):
            names = [f"[{host}]" if ":" in host else host, "127.0.0.1", "localhost", "[::1]"]
            middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(dict.fromkeys(names))))
        self.app = Starlette(routes=[
            Route("/tools/{name}", self._tool, methods=["POST"]),
            Route("/episodes", self._open_episode, methods=["POST"]),
            Route("/episodes/{handle}", self._episode_state, methods=["GET"]),
            Route("/openapi.json", self._openapi, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
        ], middleware=middleware)

    # --- episodes -------------------------------------------------------------------------------------

    def _default_episode(self) -> str:
        """The handle of the default episode, started anew when the last one has ended or used its turns."""
        handle = self._default_handle
        if handle is not None and handle in self.episodes:
            with self.episodes.use(handle) as episode:
                if not episode.done and episode.turns_left > 0:
                    return handle
        seed = self._default_env_seed if self._default_handle is None else None
        _, episode_seed = self._default_seeds.next(seed, 1)
        episode = Episode.start(self.default_task, episode_seed, self.config, self.registry)
        self._default_handle = self.episodes.add(episode)
        return self._default_handle

    def _client_world(self, data: Any) -> WorldConfig:
        """The world of a client's episode: the service's, with the client's rules; 409 when another
        section differs (the outcomes would not be the client's simulator's)."""
        if data is None:
            return self.config
        if not isinstance(data, dict):
            raise ServiceError(422, BAD_REQUEST, "config", "config must be a JSON object (a world config)")
        try:
            client = from_dict(WorldConfig, data)
        except ConfigError as exc:
            raise ServiceError(422, BAD_REQUEST, f"config.{exc.field}", exc.message) from None
        for section in (f.name for f in fields(WorldConfig)):
            if section != "rules" and getattr(client, section) != getattr(self.config, section):
                raise ServiceError(409, CONFIG_MISMATCH, f"config.{section}",
                                   f"the service's world differs in section {section!r}: "
                                   f"{getattr(self.config, section)}")
        if client.rules not in self._configs:
            if len(self._configs) >= 256:  # clients choose rules: keep the cache bounded
                self._configs.clear()
            self._configs[client.rules] = self.config.replace(rules=client.rules)
        return self._configs[client.rules]

    async def _episode_state(self, request: Request) -> Response:
        """An episode's clock and state: turns used, time used, end reason and level (once ended)."""
        handle = request.path_params["handle"]
        try:
            with self.episodes.use(handle) as episode:
                return JSONResponse({"episode": handle, "turns_used": episode.turns_used,
                                     "time_used": episode.time_used, "end_reason": episode.end_reason,
                                     "level": episode.evaluation and episode.evaluation.level})
        except UnknownEpisodeError:
            return ServiceError(404, UNKNOWN_EPISODE, "handle", f"unknown episode {handle!r}").response()

    async def _open_episode(self, request: Request) -> Response:
        try:
            data = await _json_object(request)
            task_id, seed = data.get("task_id"), data.get("seed", 0)
            if not isinstance(task_id, str):
                raise ServiceError(422, BAD_REQUEST, "task_id", "task_id (a string) is required")
            if task_id not in self.tasks_by_id:
                example = self.tasks[0].instance_id
                raise ServiceError(404, UNKNOWN_TASK, "task_id", f"no task {task_id!r} here (ids look like {example})")
            problem = seed_problem(seed)
            if problem is not None:
                raise ServiceError(422, BAD_REQUEST, "seed", problem)
            config = self._client_world(data.get("config"))
        except ServiceError as exc:
            return exc.response()
        episode = Episode.start(self.tasks_by_id[task_id], seed, config, self.registry)
        handle = self.episodes.add(episode, client=request.client.host if request.client else "")
        return JSONResponse({"episode": handle, "task_id": task_id, "seed": episode.seed,
                             "turn_limit": config.rules.turn_limit, "description": episode.task.description}, 201)

    # --- tool calls -----------------------------------------------------------------------------------

    async def _tool(self, request: Request) -> Response:
        name = request.path_params["name"]
        body = await request.body()
        try:
            name = self.registry.names[resolve_tool(name, self.registry, "see GET /openapi.json")]
        except UnknownToolError as exc:
            return ServiceError(404, UNKNOWN_TOOL, "name", str(exc)).response()
        arguments, problem = None, None  # no body: a call without arguments, played as is
        try:
            arguments = json.loads(body) if body.strip() else None
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            problem = f"{name}: the request body is not JSON ({type(exc).__name__}: {str(exc)[:200]})"
        handle = request.headers.get(EPISODE_HEADER)
        try:
            replay = _replay_calls(request.headers.get(REPLAY_HEADER), self.registry)
            handle = handle or self._default_episode()
            with self.episodes.use(handle) as episode:
                for tool, code in replay:
                    self._check_playable(episode, handle)
                    record = episode.call(tool, invalid_input=code == INVALID_INPUT)
                    if record.probability is not None or record.error_code != code:
                        raise ServiceError(409, REPLAY_MISMATCH, REPLAY_HEADER,
                                           f"the client answered {tool} with {code or 'success'} without a request; "
                                           f"this episode answered {record.error_code or 'success'}")
                self._check_playable(episode, handle)
                result = call_tool(episode, name, arguments, problem)
                output = {**result.output, "episode": handle}
                if episode.evaluation is not None:
                    output["level"] = episode.evaluation.level
        except UnknownEpisodeError:
            return ServiceError(404, UNKNOWN_EPISODE, EPISODE_HEADER, f"unknown episode {handle!r}: no such id, or it "
                                "was evicted (finished episodes first); open one with POST /episodes").response()
        except ServiceError as exc:
            return exc.response()
        headers = {EPISODE_HEADER: handle}
        record = result.record
        if record.duration is not None:  # failure processes on: the mirrored episode keeps this clock
            headers[DURATION_HEADER] = repr(record.duration)
            if record.retry_after is not None:
                headers[WAIT_TURNS_HEADER] = str(record.retry_after)
        fault = None if record.success else hf.fault_of(str(record.error_code))
        if record.duration and self.time_scale and (fault is None or fault.kind != hf.SLOW):
            await asyncio.sleep(record.duration * self.time_scale)  # the latency process, for real
        if fault is None:
            return JSONResponse(output, 200, headers)
        return await self._fault(fault, output, headers, record.retry_after)

    @staticmethod
    def _check_playable(episode: Episode, handle: str) -> None:
        if episode.evaluation is not None:
            raise ServiceError(409, EPISODE_ENDED, EPISODE_HEADER, f"episode {handle} has ended "
                               f"({episode.end_reason}); open a new one", level=episode.evaluation.level)
        if episode.turns_left == 0:
            evaluation = episode.end_out_of_turns()
            raise ServiceError(409, OUT_OF_TURNS, EPISODE_HEADER, f"episode {handle} has used all "
                               f"{episode.turns_used} turns; the call was not played", level=evaluation.level)

    async def _fault(self, fault: hf.Fault, output: dict[str, Any], headers: dict[str, str],
                     wait_turns: int | None = None) -> Response:
        """The response (or its absence) that shows a failed call's fault. A refusal of the rate-limit
        process (``wait_turns`` further turns refused) says ``Retry-After: (wait_turns + 1) * retry_after``
        seconds: ``retry_after`` per turn until the tool answers again."""
        if fault.kind == hf.DROP:
            return _Dropped()
        if fault.kind == hf.MALFORMED:
            text = json.dumps(output)
            return Response(text[: len(text) // 2], fault.status or 200, headers, "application/json")
        if fault.kind == hf.SLOW:
            await asyncio.sleep(self.slow_seconds)
        if fault.status == 429:
            headers["Retry-After"] = f"{self.retry_after * (1 + (wait_turns or 0)):g}"
        return JSONResponse(output, fault.status or 500, headers)

    # --- documents ------------------------------------------------------------------------------------

    async def _openapi(self, request: Request) -> Response:
        return JSONResponse(self.openapi)

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__, "tools": len(self.registry),
                             "episodes": len(self.episodes), "default_task": self.default_task.instance_id})


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.body())
    except (ValueError, RecursionError):
        raise ServiceError(400, BAD_REQUEST, "body", "the request body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ServiceError(400, BAD_REQUEST, "body", f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _replay_calls(header: str | None, registry: ToolRegistry) -> list[tuple[str, str | None]]:
    """The calls of ``X-Episode-Replay``: a JSON list of [tool, error code or null]."""
    if header is None:
        return []
    try:
        data = json.loads(header)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, list) or not all(
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0] in registry
            and (item[1] is None or isinstance(item[1], str)) for item in data):
        raise ServiceError(400, BAD_REQUEST, REPLAY_HEADER,
                           "must be a JSON list of [tool name, error code or null] pairs")
    return [(tool, code) for tool, code in data]


# --- OpenAPI ---------------------------------------------------------------------------------------------

_JSON_TYPES = {"string": "string", "number": "number", "boolean": "boolean", "object": "object"}
_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "description"], "properties": {
        "code": {"type": "string"}, "description": {"type": "string"}, "field": {"type": "string"}}}},
}
_ERROR_RESPONSES = {
    "401": "Authentication failed (AUTHENTICATION_FAILED)",
    "403": "Permission denied (PERMISSION_DENIED)",
    "404": "Unknown tool or episode, or FILE_NOT_FOUND",
    "409": "The episode has ended or used its turns",
    "422": "Invalid arguments (INVALID_INPUT)",
    "429": "Rate limited (RATE_LIMIT_ERROR); retry after Retry-After seconds",
    "500": "The tool failed (its error code in the body)",
    "503": "Service unavailable (SERVICE_UNAVAILABLE)",
    "504": "Timed out (TIMEOUT): the answer comes only after the service's slow delay",
}


def openapi_document(registry: ToolRegistry | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the tools: one POST operation per tool (operationId = tool name), its
    request body the tool's JSON Schema, its responses the tool's output and every fault the service
    shows. The service's own routes (/episodes, /health) are not tools and are not listed."""
    registry = registry or default_registry()
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    paths: dict[str, Any] = {}
    for tool in registry.tools:
        output = {"type": "object", "properties": {
            r["name"]: {"type": _JSON_TYPES.get(r["type"], "object"), "description": r["description"]}
            for r in tool.returns}, "required": ["success"]}
        responses: dict[str, Any] = {"200": {"description": "The tool's output",
                                             "content": {"application/json": {"schema": output}}}}
        for status, text in _ERROR_RESPONSES.items():
            responses[status] = {"description": text, "content": error}
        responses["429"]["headers"] = {"Retry-After": {"description": "seconds to wait",
                                                       "schema": {"type": "number"}}}
        paths[f"/tools/{tool.name}"] = {"post": {
            "operationId": tool.name,
            "summary": tool.description,
            "tags": [tool.category],
            "parameters": [{"name": EPISODE_HEADER, "in": "header", "required": False,
                            "description": "episode id from POST /episodes (default: the service's episode)",
                            "schema": {"type": "string"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": tool.input_schema()}}},
            "responses": responses,
            "x-error-codes": list(tool.error_codes),
        }}
    return {"openapi": "3.1.0",
            "info": {"title": "ResiliBench tool service", "version": __version__,
                     "description": "The 30 simulated tools over HTTP, failing as the world draws."},
            "paths": paths, "components": {"schemas": {"Error": _ERROR_SCHEMA}}}


# --- running it -----------------------------------------------------------------------------------------


def _server(service: ToolService, on_ready: Callable[[], None] | None, log_level: str,
            limits: ServerLimits | None, parser: str = "httptools") -> uvicorn.Server:
    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if on_ready is not None:
                on_ready()

    return ReadyServer(uvicorn_config(service.app, limits, parser, log_level=log_level, lifespan="off",
                                      timeout_graceful_shutdown=1))


def serve_tools(service: ToolService, sock: socket.socket, on_ready: Callable[[], None] | None = None,
                log_level: str = "warning", limits: ServerLimits | None = None) -> None:
    """Serve ``service`` on a bound socket (``serving.bind_socket``) until interrupted (Ctrl-C stops it
    cleanly), within ``limits`` (default ``ServerLimits()``); ``on_ready`` is called once it accepts
    connections."""
    _server(service, on_ready, log_level, limits).run(sockets=[sock])


def url_of(sock: socket.socket) -> str:
    """The base URL of a service listening on ``sock``."""
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


@contextmanager
def running_service(service: ToolService, host: str = "127.0.0.1", port: int = 0,
                    limits: ServerLimits | None = None, parser: str = "httptools") -> Iterator[str]:
    """Serve ``service`` in a background thread (port 0: a free one; ``limits`` and ``parser`` as
    ``serving.uvicorn_config`` takes them) and yield its base URL; the server stops when the block ends."""
    sock = bind_socket(host, port)
    server = _server(service, None, "warning", limits, parser)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="tool-service", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the tool service did not start (see the log above)")
            time.sleep(0.01)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        if thread.is_alive():
            print("resilibench: the tool service thread did not stop within 10 s", file=sys.stderr)
