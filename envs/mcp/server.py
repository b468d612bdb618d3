"""The tool simulator over MCP: the 30 tools fail for any MCP client exactly as they fail in the envs.

``build_server()`` returns an ``mcp`` SDK low-level ``Server`` (it takes the registry's JSON Schemas as
they are, where ``MCPServer`` would derive schemas from Python signatures). It serves:

* the 30 tools, each with its registry input schema plus one required argument, ``episode``;
* ``tool_search``, ``tool_info`` (free lookups, no episode needed), ``start_task`` (opens an episode and
  returns its handle), ``finish`` (the completion signal; returns the evaluator's level) and
  ``episode_status`` (trace, progress and level so far);
* resources: the tool registry JSON, the task library listing and one task per id.

Episode state is keyed on an explicit handle: stdio and the default (2026-07-28) protocol mode carry no
session id, and a handle lets one client run many episodes at once. Every call goes through
``resilibench.core.text.toolbox.call_tool`` on the shared ``Episode`` core, so no rule of the world lives here.
"""

from __future__ import annotations

__all__ = [
    "SERVER_NAME", "EPISODE_ARGUMENT", "DEFAULT_SESSION_IDLE_TIMEOUT", "DEFAULT_MAX_SESSIONS",
    "MAX_TURN_LIMIT", "LOOPBACK_HOSTS", "TOOLS_URI", "TASKS_URI", "TASK_URI_PREFIX", "TASK_URI_TEMPLATE",
    "BAD_ARGUMENTS", "UNKNOWN_TOOL", "UNKNOWN_EPISODE", "UNKNOWN_TASK", "EPISODE_ENDED", "OUT_OF_TURNS",
    "API_ERROR", "SEARCH_HINT", "INSTRUCTIONS", "ResiliBenchMCP", "build_server", "malformed_replies",
    "serve_stdio", "loopback_security", "serve_http",
]

import json
import logging
import socket
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import anyio
import httpx2 as httpx
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from resilibench.errors import InputError
from resilibench.version import __version__

from ...core.config import WorldConfig
from ...core.evaluator import evaluate
from ...core.registry import ToolRegistry, default_registry, schema_problem
from ...core.simulator import FINISHED, Episode, env_episode
from ...core.tasks.library import SPLITS, Task
from ...core.text.toolbox import (
    SEARCH_METHODS,
    UnknownToolError,
    call_tool,
    describe_text,
    describe_tool,
    end_text,
    feedback_text,
    progress_text,
    resolve_tool,
    search_text,
    search_tools,
)
from ...core.world import load_tasks
from ..real_api.client import HttpExecutor
from ..real_api.live_apis import RealApi
from ..real_api.serving import (
    DEFAULT_EPISODE_IDLE_TIMEOUT,
    DEFAULT_MAX_EPISODES,
    DEFAULT_MAX_EPISODES_PER_CLIENT,
    MAX_SEED,
    EpisodeTable,
    ServerLimits,
    UnknownEpisodeError,
    is_loopback,
    start_episode,
    uvicorn_config,
)

logger = logging.getLogger(__name__)

SERVER_NAME = "resilibench"
EPISODE_ARGUMENT = "episode"
# Streamable HTTP sessions (clients of protocol versions up to 2025-11-25 open one; each holds about 37 KB):
# an idle one is closed after DEFAULT_SESSION_IDLE_TIMEOUT seconds (the client re-initializes; episodes
# live on under their handles), and at most DEFAULT_MAX_SESSIONS are open (a new one beyond gets 503).
DEFAULT_SESSION_IDLE_TIMEOUT = 300.0
DEFAULT_MAX_SESSIONS = 1_000
MAX_TURN_LIMIT = 100
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

TOOLS_URI = "resilibench://tools"
TASKS_URI = "resilibench://tasks"
TASK_URI_PREFIX = "resilibench://tasks/"
TASK_URI_TEMPLATE = TASK_URI_PREFIX + "{task_id}"

# Error codes of the server itself; a call answered with one of them changes no episode, except
# OUT_OF_TURNS, which ends the episode (as a tool action after the last turn does in ResiliBench-v1).
BAD_ARGUMENTS = "BAD_ARGUMENTS"
UNKNOWN_TOOL = "UNKNOWN_TOOL"
UNKNOWN_EPISODE = "UNKNOWN_EPISODE"
UNKNOWN_TASK = "UNKNOWN_TASK"
EPISODE_ENDED = "EPISODE_ENDED"
OUT_OF_TURNS = "OUT_OF_TURNS"
API_ERROR = "API_ERROR"  # real-API mode: the tool service refused to open the episode, or is unreachable

SEARCH_HINT = "find tools with the tool_search tool (a query saying what the tool should do)"

INSTRUCTIONS = (
    "ResiliBench: simulated tools that fail like real APIs. Call start_task to open an episode; it returns "
    "a handle: pass it as the 'episode' argument of every tool call. Each tool call costs a turn; failures "
    "come back as tool errors carrying an error code. Call finish(episode) when the task is done to get "
    "the result level. tool_search and tool_info are free."
)

_EPISODE_PROPERTY = {"type": "string", "description": "The episode handle that start_task returned."}


# --- results ------------------------------------------------------------------------------------------


def _result(text: str, data: dict[str, Any], error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=data,
                                is_error=error)


def _error(code: str, description: str, **data: Any) -> types.CallToolResult:
    """A tool error of the server: text ``Error: CODE: description`` and the same in structured form
    (the shape of a failed tool call's ``error``)."""
    return _result(f"Error: {code}: {description}", {"error": {"code": code, "description": description}, **data},
                   error=True)


def _status(episode: Episode, handle: str) -> dict[str, Any]:
    """Where an episode stands: trace, progress, turns, and its level (or the level ``finish`` would
    give now)."""
    done = sum(episode.succeeded[t] for t in episode.required)
    data: dict[str, Any] = {
        EPISODE_ARGUMENT: handle,
        "task_id": episode.task.instance_id,
        "trace": [r.to_dict() for r in episode.trace],
        "progress": {"required_done": done, "required_total": len(episode.required)},
        "turns_used": episode.turns_used,
        "turns_left": episode.turns_left,
        "done": episode.done,
        "end_reason": episode.end_reason,
    }
    if episode.evaluation is not None:
        data["level"] = episode.evaluation.level
        data["evaluation"] = episode.evaluation.to_dict()
    else:
        preview = evaluate(episode.task, episode.trace, True, FINISHED, episode.config.evaluator, episode.registry)
        data["level_if_finished"] = preview.level
    return data


# --- the server ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _MetaTool:
    """A tool of the server itself (not a simulated one): its schema and its handler."""

    description: str
    schema: dict[str, Any]
    handler: Callable[..., types.CallToolResult]  # (arguments) or, per_client, (arguments, client)
    in_thread: bool = False  # run off the event loop (tool search may load an embedding model)
    per_client: bool = False  # the handler takes the asking client's name (``_client_of``) too

    @cached_property
    def schema_json(self) -> str:
        return json.dumps(self.schema, sort_keys=True)

    @cached_property
    def integer_arguments(self) -> frozenset[str]:
        return frozenset(k for k, v in self.schema["properties"].items() if v.get("type") == "integer")

    def integers_as_int(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Schema-checked arguments with integer ones as ints: JSON Schema counts 10.0 as an integer, and
        the handler (and every cache keyed on an argument) must see one value for one number."""
        return {k: int(v) if k in self.integer_arguments and isinstance(v, float) else v
                for k, v in arguments.items()}


class ResiliBenchMCP:
    """The MCP front end: the handlers and the episode table behind one ``Server`` (``.server``).

    * ``tasks``: the task library (default: the shipped one); ``config``: the world (default: paper
      values; ``start_task`` sets strict dependencies and may set the turn limit); ``registry``: the tools.
    * ``max_episodes``, ``max_episodes_per_client``, ``episode_idle_timeout`` (seconds): the bounds of the
      handle table (``serving.EpisodeTable``; a client is an HTTP session, or a network address when
      the client opened none, or the one stdio client); ``search``: the tool search method ("auto",
      "semantic", "lexical"; auto = semantic when the embed extra is installed).
    * ``api``: real-API mode, a ``RealApi`` as the text env takes it: each episode's calls go over HTTP
      (to our tool service, whose episode mirrors it, or to a live API, whose tools and tasks it serves).
    """

    def __init__(self, tasks: Sequence[Task] | None = None, config: WorldConfig | None = None,
                 registry: ToolRegistry | None = None, max_episodes: int = DEFAULT_MAX_EPISODES,
                 search: str = "auto", api: RealApi | None = None,
                 max_episodes_per_client: int = DEFAULT_MAX_EPISODES_PER_CLIENT,
                 episode_idle_timeout: float | None = DEFAULT_EPISODE_IDLE_TIMEOUT):
        if search not in SEARCH_METHODS:
            raise ValueError(f"search must be one of {SEARCH_METHODS}, got {search!r}")
        live = api and api.live
        if live is not None:  # its tools, tasks and task types unless given
            config, registry = live.world_config(config), registry or live.registry
            tasks = live.tasks if tasks is None else tasks
        self.tasks = list(tasks) if tasks is not None else load_tasks()
        if not self.tasks:
            raise ValueError("the task library is empty")
        self.tasks_by_id = {t.instance_id: t for t in self.tasks}
        self.config = config or WorldConfig()
        self.registry = registry or default_registry()
        self.search = search
        # Real-API mode: calls go over HTTP through one client shared by every episode (None: simulated).
        self.client = None if api is None else api.client(self.registry)
        self.episodes = EpisodeTable(max_episodes, max_episodes_per_client, episode_idle_timeout)
        self._configs: dict[tuple[bool, int], WorldConfig] = {}
        self._meta = self._meta_tools()
        clashes = sorted(n for n in self._meta if n in self.registry)
        if clashes or any(EPISODE_ARGUMENT in t.input_schema()["properties"] for t in self.registry.tools):
            raise ValueError(f"registry clashes with the server's own tools or the '{EPISODE_ARGUMENT}' argument")
        self.schemas = {name: meta.schema for name, meta in self._meta.items()}
        self.schemas.update({t.name: self._tool_schema(t.input_schema()) for t in self.registry.tools})
        self.tool_list = [types.Tool(name=name, description=meta.description, input_schema=meta.schema)
                          for name, meta in self._meta.items()]
        self.tool_list += [types.Tool(name=t.name, description=t.description, input_schema=self.schemas[t.name])
                           for t in self.registry.tools]
        self.server: Server = Server(
            SERVER_NAME,
            version=__version__,
            instructions=INSTRUCTIONS,
            get_tool_input_schema=self.schemas.get,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
        )

    # --- schemas ------------------------------------------------------------------------------------

    @staticmethod
    def _tool_schema(schema: dict[str, Any]) -> dict[str, Any]:
        """A registry tool's input schema with the ``episode`` handle added (first, and required)."""
        return {**schema, "properties": {EPISODE_ARGUMENT: _EPISODE_PROPERTY, **schema["properties"]},
                "required": [EPISODE_ARGUMENT, *schema["required"]]}

    def _meta_tools(self) -> dict[str, _MetaTool]:
        episode_only = {"type": "object", "properties": {EPISODE_ARGUMENT: _EPISODE_PROPERTY},
                        "required": [EPISODE_ARGUMENT], "additionalProperties": False}
        n_tools = len(self.registry)
        return {
            "tool_search": _MetaTool(
                "Find tools by what they do: the k tools most similar to the query, with their descriptions, "
                "parameters, errors and dependencies. Free: costs no turn.",
                {"type": "object", "properties": {
                    "query": {"type": "string", "minLength": 1, "description": "What the tool should do."},
                    "k": {"type": "integer", "minimum": 1, "maximum": n_tools, "default": 5,
                          "description": "How many tools to return."}},
                 "required": ["query"], "additionalProperties": False},
                self._tool_search, in_thread=True),
            "tool_info": _MetaTool(
                "A tool's full description: parameters, returns, possible errors and dependencies. Free.",
                {"type": "object", "properties": {"name": {"type": "string", "description": "Tool name."}},
                 "required": ["name"], "additionalProperties": False},
                self._tool_info),
            "start_task": _MetaTool(
                "Open an episode of a task and get its handle. The same task_id and seed always give the "
                "same failures. Without task_id a task of the split is drawn from the seed.",
                {"type": "object", "properties": {
                    "task_id": {"type": "string", "description": "A task id of the library (see the "
                                "resilibench://tasks resource); default: drawn from the split by the seed."},
                    "seed": {"type": "integer", "minimum": 0, "maximum": MAX_SEED, "default": 0,
                             "description": "Run seed: fixes every random outcome of the episode."},
                    "split": {"type": "string", "enum": [*SPLITS, "all"], "default": "test",
                              "description": "Where a task is drawn from when task_id is not given."},
                    "strict_dependencies": {"type": "boolean", "default": True, "description": (
                        "true: calling a tool before its dependencies succeeded fails with DEPENDENCY_ERROR; "
                        "false: it only lowers the success probability.")},
                    "turn_limit": {"type": "integer", "minimum": 1, "maximum": MAX_TURN_LIMIT,
                                   "default": self.config.rules.turn_limit,
                                   "description": "Tool calls allowed in the episode."}},
                 "additionalProperties": False},
                # Against a real API it opens the service's episode over HTTP: off the event loop.
                self._start_task, in_thread=self.client is not None, per_client=True),
            "finish": _MetaTool(
                "Signal that the task is complete (free). Ends the episode and returns its result level: "
                "full_success, partial_success or failure.",
                episode_only, self._finish),
            "episode_status": _MetaTool(
                "An episode's trace, progress, turns left, and its level (or the level finish would give now).",
                episode_only, self._episode_status),
        }

    # --- MCP handlers -------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tool_list)

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        name, arguments = params.name, dict(params.arguments or {})
        meta = self._meta.get(name)
        if meta is None:
            if self.client is not None:  # a real call blocks: off the event loop
                return await anyio.to_thread.run_sync(self._simulated_call, name, arguments)
            return self._simulated_call(name, arguments)
        problem = schema_problem(name, meta.schema_json, arguments)
        if problem is not None:
            return _error(BAD_ARGUMENTS, problem)
        arguments = meta.integers_as_int(arguments)
        call = partial(meta.handler, arguments, *([_client_of(ctx)] if meta.per_client else []))
        if meta.in_thread:
            return await anyio.to_thread.run_sync(call)
        return call()

    async def _list_resources(self, ctx: Any, params: types.PaginatedRequestParams | None
                              ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=TOOLS_URI, name="tool-registry", mime_type="application/json",
                           description="The 30 tools: schemas, errors, roles and the dependency graph."),
            types.Resource(uri=TASKS_URI, name="task-library", mime_type="application/json",
                           description=f"The {len(self.tasks)} tasks: id, type, complexity, split, "
                           f"required-tool count (each task in full at {TASK_URI_TEMPLATE})."),
        ])

    async def _list_resource_templates(self, ctx: Any, params: types.PaginatedRequestParams | None
                                       ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(uri_template=TASK_URI_TEMPLATE, name="task", mime_type="application/json",
                                   description="One task of the library in full, by task id."),
        ])

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == TOOLS_URI:
            text = self._registry_json
        elif uri == TASKS_URI:
            text = self._library_json
        elif uri.startswith(TASK_URI_PREFIX) and uri[len(TASK_URI_PREFIX):] in self.tasks_by_id:
            text = json.dumps(self.tasks_by_id[uri[len(TASK_URI_PREFIX):]].to_dict(), sort_keys=True)
        else:
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {uri!r}; resources: {TOOLS_URI}, {TASKS_URI}, "
                           f"{TASK_URI_TEMPLATE} with a task id of {TASKS_URI}", {"uri": uri})
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=text, mime_type="application/json")])

    @cached_property
    def _registry_json(self) -> str:
        return self.registry.to_json()

    @cached_property
    def _library_json(self) -> str:
        rows = [{"task_id": t.instance_id, "task_type": t.task_type, "complexity": t.complexity, "split": t.split,
                 "required_tools_count": len(t.required_tools)} for t in self.tasks]
        return json.dumps({"count": len(rows), "task_uri_template": TASK_URI_TEMPLATE, "tasks": rows})

    # --- the simulated tools ------------------------------------------------------------------------

    def _simulated_call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One of the 30 tools on the episode named by the ``episode`` argument; the rest of the arguments
        are checked with the tool's schema by ``call_tool`` (INVALID_INPUT without a draw when they fail)."""
        try:
            resolve_tool(name, self.registry, SEARCH_HINT)
        except UnknownToolError as exc:
            return _error(UNKNOWN_TOOL, str(exc))
        handle = arguments.pop(EPISODE_ARGUMENT, None)
        if not isinstance(handle, str):
            return _error(BAD_ARGUMENTS, f"{name}: argument '{EPISODE_ARGUMENT}' is required: the handle that "
                          "start_task returned")
        try:
            with self.episodes.use(handle) as episode:
                if episode.done:
                    return self._ended(episode, handle)
                if episode.turns_left == 0:
                    evaluation = episode.end_out_of_turns()
                    return _error(OUT_OF_TURNS, f"all {episode.turns_used} turns are used; the call was not "
                                  f"played. {end_text(episode)}", episode=handle, level=evaluation.level)
                result = call_tool(episode, name, arguments, executor=self.episodes.executor(handle))
                data = {EPISODE_ARGUMENT: handle, **result.output}
                if episode.evaluation is not None:
                    data["level"] = episode.evaluation.level
                return _result(feedback_text(result, episode), data, error=not result.record.success)
        except UnknownEpisodeError as exc:
            return _error(UNKNOWN_EPISODE, str(exc))

    @staticmethod
    def _ended(episode: Episode, handle: str) -> types.CallToolResult:
        assert episode.evaluation is not None  # an ended episode is graded
        return _error(EPISODE_ENDED, f"{end_text(episode)} Open a new episode with start_task.", episode=handle,
                      level=episode.evaluation.level)

    # --- the server's own tools ---------------------------------------------------------------------

    def _tool_search(self, arguments: dict[str, Any]) -> types.CallToolResult:
        query, k = arguments["query"], arguments.get("k", 5)
        if not query.strip():
            return _error(BAD_ARGUMENTS, "tool_search: argument 'query' must not be blank")
        hits = search_tools(query, k, self.registry, self.search)
        return _result(search_text(query, hits, self.registry),
                       {"query": query, "results": [{"name": h.name, "score": h.score} for h in hits]})

    def _tool_info(self, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            tool_id = resolve_tool(arguments["name"], self.registry, SEARCH_HINT)
        except UnknownToolError as exc:
            return _error(UNKNOWN_TOOL, str(exc))
        info = describe_tool(self.registry.names[tool_id], self.registry)
        return _result(describe_text(info), info)

    def _world(self, strict_dependencies: bool, turn_limit: int) -> WorldConfig:
        """The server's config with an episode's rules (cached: few distinct pairs exist)."""
        key = (strict_dependencies, turn_limit)
        config = self._configs.get(key)
        if config is None:
            rules = {"strict_dependencies": strict_dependencies, "turn_limit": turn_limit}
            config = self._configs[key] = self.config.replace(rules=rules)
        return config

    def _start_task(self, arguments: dict[str, Any], client: str = "") -> types.CallToolResult:
        seed = arguments.get("seed", 0)
        task_id = arguments.get("task_id")
        if task_id is None:
            split = arguments.get("split", "test")
            pool = [t for t in self.tasks if split == "all" or t.split == split]
            if not pool:
                return _error(UNKNOWN_TASK, f"start_task: no task of split {split!r} in this library; "
                              f"splits here: {sorted({t.split for t in self.tasks})}")
            # The task ResiliBench-v1 (on that split) draws when reset with this seed.
            task = pool[env_episode(seed, 0, len(pool))[0]]
        else:
            task = self.tasks_by_id.get(task_id)
            if task is None:
                examples = ", ".join(t.instance_id for t in self.tasks[:3])
                return _error(UNKNOWN_TASK, f"start_task: argument 'task_id': no task {task_id!r} in the library "
                              f"(ids look like {examples}; see the {TASKS_URI} resource)")
        config = self._world(arguments.get("strict_dependencies", True),
                             arguments.get("turn_limit", self.config.rules.turn_limit))
        episode = start_episode(task, seed, config, self.registry)
        try:  # against our tool service this opens the service's episode of the same task and seed
            # A server resumes nothing and its clients may leave episodes unfinished: each call is logged at once.
            executor = None if self.client is None else HttpExecutor(self.client, episode, whole_episodes=False)
        except InputError as exc:
            return _error(API_ERROR, f"start_task: {exc.message}")
        except httpx.HTTPError as exc:  # the service is unreachable or answered no HTTP
            return _error(API_ERROR, f"start_task: the tool service did not answer ({type(exc).__name__}: {exc})")
        handle = self.episodes.add(episode, executor, client)
        data = {
            EPISODE_ARGUMENT: handle,
            "task_id": task.instance_id,
            "task_type": task.task_type,
            "complexity": task.complexity,
            "description": task.description,
            "required_tools_count": len(task.required_tools),
            "turn_limit": config.rules.turn_limit,
            "max_calls_per_tool": episode.max_calls,
            "strict_dependencies": config.rules.strict_dependencies,
            "seed": seed,
        }
        text = (f"Episode {handle} started: task {task.instance_id} ({task.task_type}).\n"
                f"Task: {task.description}\n"
                f"It needs {len(task.required_tools)} tools; you have {config.rules.turn_limit} tool calls, "
                f"at most {episode.max_calls} per tool. Pass episode=\"{handle}\" to every tool call and call "
                f"finish when the task is done.")
        return _result(text, data)

    def _finish(self, arguments: dict[str, Any]) -> types.CallToolResult:
        handle = arguments[EPISODE_ARGUMENT]
        try:
            with self.episodes.use(handle) as episode:
                if episode.done:
                    return self._ended(episode, handle)
                evaluation = episode.finish()
                data = {EPISODE_ARGUMENT: handle, "level": evaluation.level, "evaluation": evaluation.to_dict(),
                        "turns_used": episode.turns_used}
                return _result(f"{end_text(episode)} {progress_text(episode)}", data)
        except UnknownEpisodeError as exc:
            return _error(UNKNOWN_EPISODE, str(exc))

    def _episode_status(self, arguments: dict[str, Any]) -> types.CallToolResult:
        handle = arguments[EPISODE_ARGUMENT]
        try:
            with self.episodes.use(handle) as episode:
                data = _status(episode, handle)
                lines = [f"Episode {handle}: task {episode.task.instance_id}."]
                lines += [f"turn {r.turn}: {r.tool} -> {'ok' if r.success else r.error_code}" for r in episode.trace]
                lines.append(progress_text(episode))
                lines.append(end_text(episode) if episode.done else
                             f"Running; finishing now would give {data['level_if_finished']}.")
                return _result("\n".join(lines), data)
        except UnknownEpisodeError as exc:
            return _error(UNKNOWN_EPISODE, str(exc))


def build_server(tasks: Sequence[Task] | None = None, config: WorldConfig | None = None,
                 registry: ToolRegistry | None = None, max_episodes: int = DEFAULT_MAX_EPISODES,
                 search: str = "auto", api: RealApi | None = None,
                 max_episodes_per_client: int = DEFAULT_MAX_EPISODES_PER_CLIENT,
                 episode_idle_timeout: float | None = DEFAULT_EPISODE_IDLE_TIMEOUT) -> Server:
    """The MCP server of the tool simulator (see ``ResiliBenchMCP`` for the arguments). Connect a client
    in memory with ``mcp.Client(build_server())``, or serve it with ``serve_stdio`` / ``serve_http``."""
    return ResiliBenchMCP(tasks, config, registry, max_episodes, search, api, max_episodes_per_client,
                          episode_idle_timeout).server


def _client_of(ctx: Any) -> str:
    """Who asks, for the per-client episode quota: the HTTP session, else the network address (the
    protocol's session-less mode), else the one client of stdio."""
    request = getattr(ctx, "request", None)
    if request is None:
        return "stdio"
    session = request.headers.get("mcp-session-id")
    if session:
        return f"session {session}"
    return f"address {request.client.host}" if request.client else "address ?"


# --- transports ---------------------------------------------------------------------------------------


def _request_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


_BAD_ID = ("a request id must be a string or an integer (JSON-RPC 2.0 allows null only in a response, and "
           "MCP not even there)")


def malformed_replies(line: str) -> list[types.JSONRPCError] | None:
    """None when ``line`` is a JSON-RPC message the SDK reads; else the JSON-RPC 2.0 errors that answer
    it: a parse error (id null) for text that is not JSON; an invalid-request error for JSON that is no
    message, one per request id it carries (a batch's too: MCP has no batches) or one with id null when
    it carries none or one that is no request id (null, 1.5, {}); nothing for a malformed response (a
    response is never answered)."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        first = exc.errors()[0]
    else:  # the SDK reads a request whose id is null, 1.5 or {} as a notification: it would go unanswered
        if isinstance(message, types.JSONRPCNotification) and "id" in json.loads(line):
            return [types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
                code=types.INVALID_REQUEST, message=f"Invalid request: {_BAD_ID}"))]
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return [types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
            code=types.PARSE_ERROR, message=f"Parse error: {first['msg']}"))]
    if isinstance(data, dict) and "method" not in data and ("result" in data or "error" in data):
        return []
    if isinstance(data, list):
        reason = "batches are not supported: send one JSON-RPC message per line"
    elif first["type"] == "json_invalid":  # JSON the SDK's parser refuses: too deep, a lone surrogate
        reason = f"the server cannot read this JSON ({first['msg']})"
    else:
        reason = 'not a JSON-RPC 2.0 message: it needs "jsonrpc": "2.0", a string "method" and, for a request, an "id"'
    items = data if isinstance(data, list) else [data]
    ids = [item["id"] for item in items if isinstance(item, dict) and _request_id(item.get("id"))]
    return [types.JSONRPCError(jsonrpc="2.0", id=i, error=types.ErrorData(
        code=types.INVALID_REQUEST, message=f"Invalid request: {reason}")) for i in ids or [None]]


class _AnsweredLines:
    """stdin lines for the SDK's stdio transport, which drops a malformed message without a word (its
    client then waits until its own timeout): such a line is answered here (``malformed_replies``)
    through the transport's write stream, logged on stderr, and not passed on."""

    def __init__(self, lines: AsyncIterable[str]):
        self._lines = lines
        self._replies: Any = None
        self._attached = anyio.Event()

    def answer_through(self, write_stream: Any) -> None:
        """Send replies on (a clone of) the transport's write stream, once it exists."""
        self._replies = write_stream.clone()
        self._attached.set()

    async def __aiter__(self) -> AsyncIterator[str]:
        try:
            async for line in self._lines:
                if not line.strip():  # framing noise, not a message
                    continue
                replies = malformed_replies(line)
                if replies is None:
                    yield line
                    continue
                logger.warning("malformed JSON-RPC message on stdin, %s: %.200r",
                               "answered with an error" if replies else "a response, not answered", line)
                await self._attached.wait()
                for reply in replies:
                    await self._replies.send(SessionMessage(reply))
        finally:
            if self._replies is not None:
                self._replies.close()


async def serve_stdio(server: Server) -> None:
    """Serve one client over stdin/stdout until it closes the connection; a malformed JSON-RPC line gets
    its JSON-RPC error (see ``malformed_replies``) instead of silence."""
    from mcp.server.stdio import stdio_server

    with open(sys.stdin.fileno(), encoding="utf-8", errors="replace", closefd=False) as stdin:
        lines = _AnsweredLines(anyio.wrap_file(stdin))
        # The SDK declares an AsyncFile but only iterates over its lines.
        async with stdio_server(stdin=lines) as (read_stream, write_stream):  # pyright: ignore[reportArgumentType]
            lines.answer_through(write_stream)
            await server.run(read_stream, write_stream, server.create_initialization_options())


def loopback_security(host: str) -> TransportSecuritySettings:
    """DNS-rebinding protection for a loopback server: only Host and Origin headers that name this
    machine (``host`` itself, 127.0.0.1, localhost, ::1) are accepted."""
    names = dict.fromkeys([f"[{host}]" if ":" in host else host, "127.0.0.1", "localhost", "[::1]"])
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[f"{n}:*" for n in names],
                                     allowed_origins=[f"http://{n}:*" for n in names])


async def serve_http(server: Server, sock: socket.socket, log_level: str = "warning",
                     on_ready: Callable[[], None] | None = None,
                     session_idle_timeout: float = DEFAULT_SESSION_IDLE_TIMEOUT,
                     max_sessions: int = DEFAULT_MAX_SESSIONS, limits: ServerLimits | None = None) -> None:
    """Serve streamable HTTP at ``/mcp`` on a bound socket (``bind_socket``) until interrupted; on a
    loopback address with DNS-rebinding protection (``loopback_security``). ``on_ready`` is called once
    the server accepts connections; ``session_idle_timeout`` (seconds) and ``max_sessions`` bound the
    HTTP sessions (see ``DEFAULT_SESSION_IDLE_TIMEOUT``; the SDK raises ValueError naming a bad one),
    ``limits`` the connections and requests (``serving.ServerLimits``; default its defaults)."""
    import uvicorn

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if on_ready is not None:
                on_ready()

    host = sock.getsockname()[0]
    security = loopback_security(host) if is_loopback(host) else None
    app = server.streamable_http_app(host=host, transport_security=security, max_sessions=max_sessions,
                                     session_idle_timeout=session_idle_timeout)
    config = uvicorn_config(app, limits, log_level=log_level, lifespan="on")
    await ReadyServer(config).serve(sockets=[sock])
