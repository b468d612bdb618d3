"""The MCP fault proxy: any MCP server's tools, failing as the world's tools fail (docs/envs/proxy.md).

``FaultProxy`` stands between MCP clients and an upstream MCP server (a command over stdio, a streamable-HTTP
URL, or a recording of one). It lists the upstream's tools unchanged, forwards its resources and prompts
untouched (no fault), and forwards each tool call after drawing its outcome by the world's own rules: ``core.processes.sample_outcome`` (rate limits, outages, latency and
timeouts, the success formula) with the simulator's stream wiring (``core.simulator.call_uniforms``),
exactly as the simulator draws a call of a tool without dependencies. The mapping of an upstream tool:

* it is a live tool (``live_apis.live_tool``): it fails with ``LIVE_ERRORS``, its base success is
  ``processes.tool_base_success[name]`` (the world's per-tool reliability, by the upstream's tool name) or
  else ``failure.base_success``; the formula's covariates are (0, 0, the failures its session has seen);
* each client session (the stdio client; an HTTP client's ``Mcp-Session-Id``) is an episode: its own turns
  (one per call), draws and process state per tool. Session k (numbered from 0 in the order of their first
  call) plays seed ``env_episode(seed, k, 1)[1]``, the k-th episode of an env seeded ``seed``: the same
  seed and the same calls (and upstream answers) give the same faults;
* a failed call is an MCP tool error ``Error: CODE: what happened`` (the same in ``_meta[FAULT_META]``, no
  structured content: clients check that against the tool's output schema) shown by the fault table's kind
  (``http_faults.fault_of``): a TIMEOUT forwards the call and withholds the answer ``slow_seconds``, a
  SCHEMA_MISMATCH forwards it and returns its answer cut short, every other failure never reaches the
  upstream (a rate-limit refusal says how many calls it lasts). A success is the upstream's own answer,
  after the drawn latency times ``time_scale``.

``faults=False`` forwards every call untouched: its call log measures the upstream itself. ``record``
keeps the upstream's tool list and answers (JSON lines); ``ReplayUpstream`` answers from such a file.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_UPSTREAM_TIMEOUT", "DEFAULT_MAX_SESSIONS", "FAULT_META", "NOT_RECORDED", "UPSTREAM_GONE", "UpstreamError",
    "Upstream", "LiveUpstream", "ReplayUpstream", "Session", "FaultProxy", "serve_proxy",
]

import contextlib
import dataclasses
import json
import os
import shlex
import socket
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from resilibench.errors import InputError

from ...core import stream as rs
from ...core.config import WorldConfig
from ...core.processes import CallOutcome, ToolState, sample_outcome, tool_bases
from ...core.registry import ToolRegistry
from ...core.simulator import call_uniforms, env_episode, stage_keys, success_probability
from ..mcp.server import serve_http, serve_stdio
from ..real_api import http_faults as hf
from ..real_api.call_log import CallLogRow, write_rows
from ..real_api.client import LOG_RUN, HttpOutcome
from ..real_api.live_apis import LOST_SESSION, live_tool, mcp_failure, mcp_outcome
from ..real_api.service import DEFAULT_SLOW_SECONDS

DEFAULT_UPSTREAM_TIMEOUT = 60.0
DEFAULT_MAX_SESSIONS = 10_000  # sessions kept; beyond, the least recently used one is forgotten
FAULT_META = "resilibench/fault"  # the ``_meta`` key of a tool error's code, description, session, turn
NOT_RECORDED = "NOT_RECORDED"  # replay: no answer recorded for the call
UPSTREAM_GONE = "the upstream MCP server is gone"
_GRACE_SECONDS = 0.5  # once the upstream has gone, how long the proxy goes on answering before it stops
_STDIO = "stdio"  # the session key of the stdio client (and of HTTP requests without a session id)
_SESSION_HEADER = "mcp-session-id"
_R = TypeVar("_R", bound=types.Result)

# What each fault says, beside its code.
_SAYS = {
    hf.RATE_LIMIT_ERROR: "rate limited",
    hf.SERVICE_UNAVAILABLE: "the service is unavailable",
    hf.TIMEOUT: "no answer before the deadline",
    hf.NETWORK_ERROR: "the connection dropped before an answer",
    hf.SCHEMA_MISMATCH: "the answer came back malformed",
}


# The upstream's resources and prompts, forwarded unchanged when it has them (no fault is drawn for them):
# (capability, the proxy server's handler, request, result).
_FORWARDED: tuple[tuple[str, str, Callable[..., types.Request[Any, Any]], type[types.Result]], ...] = (
    ("resources", "on_list_resources", types.ListResourcesRequest, types.ListResourcesResult),
    ("resources", "on_list_resource_templates", types.ListResourceTemplatesRequest, types.ListResourceTemplatesResult),
    ("resources", "on_read_resource", types.ReadResourceRequest, types.ReadResourceResult),
    ("prompts", "on_list_prompts", types.ListPromptsRequest, types.ListPromptsResult),
    ("prompts", "on_get_prompt", types.GetPromptRequest, types.GetPromptResult),
)


class UpstreamError(RuntimeError):
    """The upstream MCP server cannot be started or reached, or it went away while serving."""


def _error(code: str, description: str, **data: Any) -> types.CallToolResult:
    """A tool error: text ``Error: CODE: description`` (``serve mcp``'s), the same in ``_meta[FAULT_META]``
    (not in the structured content, which clients check against the upstream tool's output schema)."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"Error: {code}: {description}")],
                                _meta={FAULT_META: {"code": code, "description": description, **data}}, is_error=True)


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def _call_key(tool: str, arguments: dict[str, Any]) -> str:
    return json.dumps([tool, arguments], sort_keys=True)


# --- upstreams ------------------------------------------------------------------------------------------


class Upstream(ABC):
    """Where calls go: ``tools``, ``server_info``, ``instructions`` and ``capabilities`` once entered
    (``async with``), and ``call(tool, arguments, session)``, the upstream's ``CallToolResult`` (it may raise
    what ``mcp_failure`` reads: the SDK's ``MCPError``, a lost session). ``forward`` answers the other
    requests of the capabilities it has (resources, prompts); by default it has tools only."""

    tools: list[types.Tool]
    server_info: types.Implementation
    instructions: str | None = None
    capabilities = types.ServerCapabilities()

    async def __aenter__(self) -> Upstream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @abstractmethod
    async def call(self, tool: str, arguments: dict[str, Any], session: Session) -> types.CallToolResult:
        """The upstream's answer to one call of ``tool`` in a client's ``session``."""

    async def forward(self, request: types.Request[Any, Any], result: type[types.Result]) -> types.Result:
        """The upstream's answer to a request other than a tool call, unchanged (its error raised as is)."""
        raise MCPError(types.METHOD_NOT_FOUND, f"{type(self).__name__} answers tool calls only, not {request.method}")


class LiveUpstream(Upstream):
    """An MCP server reached with the SDK's client: ``server`` is a command line (a list: launched over
    stdio, in this process's environment, its stderr on ours), a streamable-HTTP URL, or an ``mcp`` server
    object (in memory). ``timeout``: seconds a call may take (a slower one is the upstream's TIMEOUT)."""

    def __init__(self, server: Sequence[str] | str | Any, timeout: float = DEFAULT_UPSTREAM_TIMEOUT):
        from mcp import StdioServerParameters

        if isinstance(server, list | tuple):
            if not server or not all(isinstance(a, str) for a in server):
                raise InputError("command", f"the upstream command must be a non-empty list of strings, got {server!r}")
            self.where = shlex.join(server)
            self._server: Any = StdioServerParameters(command=server[0], args=list(server[1:]), env=dict(os.environ))
        else:
            self.where = server if isinstance(server, str) else type(server).__name__
            self._server = server
        self.timeout = float(timeout)
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> LiveUpstream:
        from mcp import Client

        try:
            self._client = await self._stack.enter_async_context(Client(self._server))
            self.tools = await self._list_tools()
        except BaseException as exc:
            await self._stack.aclose()
            if isinstance(exc, Exception | BaseExceptionGroup):
                raise UpstreamError(f"cannot open an MCP session with {self.where}: {_reason(exc)}") from None
            raise
        self.server_info = self._client.server_info or types.Implementation(name="upstream", version="")
        self.capabilities = self._client.server_capabilities
        session = self._client.session  # the handshake's or the discovery's result says the instructions
        self.instructions = getattr(session.initialize_result or session.discover_result, "instructions", None)
        return self

    async def _list_tools(self) -> list[types.Tool]:
        tools, cursor = [], None
        while True:
            page = await self._client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):  # the upstream already gone: nothing left to close
            await self._stack.aclose()

    async def call(self, tool: str, arguments: dict[str, Any], session: Session) -> types.CallToolResult:
        return _unstamped(await self._client.call_tool(tool, arguments, read_timeout_seconds=self.timeout))

    async def forward(self, request: types.Request[Any, Any], result: type[types.Result]) -> types.Result:
        return _unstamped(await self._client.session.send_request(request, result,
                                                                  request_read_timeout_seconds=self.timeout))


def _unstamped(result: _R) -> _R:
    """``result`` without the ``serverInfo`` stamp the upstream puts on the 2026-07-28 protocol's results: the
    proxy's server stamps the same server info for clients of that protocol, and a client of an older one
    gets the result as the upstream would give it, unstamped."""
    meta = result.meta or {}
    if types.SERVER_INFO_META_KEY not in meta:
        return result
    rest = {key: value for key, value in meta.items() if key != types.SERVER_INFO_META_KEY}
    return result.model_copy(update={"meta": rest or None})


def _reason(exc: BaseException) -> str:
    """The first leaf of an exception (group) in one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ReplayUpstream(Upstream):
    """The upstream as a recording (``FaultProxy(record=...)``) kept it, with no server started: its tool
    list, and for a call the answers recorded for that tool and arguments, the n-th call of a session
    getting the n-th answer that session number recorded (another session's when it recorded none; the
    last one again once they are used up). A call never recorded answers NOT_RECORDED."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.is_file():
            raise InputError("replay", f"recording {path} does not exist")
        self.path = path
        self._answers: dict[str, dict[int, list[dict[str, Any]]]] = {}
        header = None
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                try:
                    row = json.loads(line)
                    if row["record"] == "upstream":
                        header = row
                    else:
                        answers = self._answers.setdefault(_call_key(row["tool"], row["arguments"]), {})
                        answers.setdefault(int(row["session"]), []).append(row)
                except (ValueError, KeyError, TypeError) as exc:
                    raise InputError("replay", f"{path}:{number}: not a line of a proxy recording ({_reason(exc)})"
                                     ) from None
        if header is None:
            raise InputError("replay", f"{path}: no upstream line (tools and server); record one with --record")
        self.tools = [types.Tool.model_validate(t) for t in header["tools"]]
        self.server_info = types.Implementation.model_validate(header["server"])
        self.instructions = header.get("instructions")

    async def call(self, tool: str, arguments: dict[str, Any], session: Session) -> types.CallToolResult:
        key = _call_key(tool, arguments)
        by_session = self._answers.get(key)
        if not by_session:
            return _error(NOT_RECORDED, f"{self.path} recorded no call of {tool} with these arguments")
        answers = by_session.get(session.number) or next(iter(by_session.values()))
        n = session.replayed.get(key, 0)
        session.replayed[key] = n + 1
        row = answers[min(n, len(answers) - 1)]
        if "error" in row:
            raise _Recorded(row["error"]["class"], row["error"]["description"])
        return types.CallToolResult.model_validate(row["result"])


class _Recorded(Exception):
    """A call whose recording holds no answer but a failure (a timeout, a lost session)."""

    def __init__(self, error_class: str, description: str):
        super().__init__(description)
        self.error_class, self.description = error_class, description


# --- sessions -------------------------------------------------------------------------------------------


@dataclass
class Session:
    """One client session's episode: its number and seed, its turns (calls), success-formula draws and
    failures so far, and each tool's process state (whether its last call found it down, the last turn of
    its rate-limit block), as ``Episode`` keeps them."""

    number: int
    seed: int
    turns: int = 0
    draws: int = 0
    failures: int = 0
    down: dict[str, bool | None] = field(default_factory=dict)
    blocked_until: dict[str, int] = field(default_factory=dict)
    replayed: dict[str, int] = field(default_factory=dict)  # replay: answers given per call key

    def __post_init__(self) -> None:
        self.key = rs.key(self.seed)
        self.stage_keys = stage_keys(self.key)

    def draw(self, tool: str, base: float, codes: Sequence[str], config: WorldConfig) -> tuple[int, CallOutcome]:
        """(turn, outcome) of a call of ``tool`` now: the simulator's draw of a tool without dependencies
        (``Episode._call_with_processes``), the formula at (0, 0, failures so far)."""
        turn = self.turns = self.turns + 1
        p = success_probability(base, 0, 0, self.failures, config.failure)
        state = ToolState(self.down.get(tool), max(self.blocked_until.get(tool, 0) - turn + 1, 0))
        uniform = call_uniforms(self.key, self.stage_keys, turn, self.draws)
        outcome = sample_outcome(config.processes, state, p, codes, uniform)
        if outcome.drew:
            self.draws += 1
        self.down[tool] = outcome.state.down
        self.blocked_until[tool] = turn + outcome.state.blocked
        return turn, outcome


# --- the proxy ------------------------------------------------------------------------------------------


class FaultProxy:
    """The proxy of ``upstream`` in the world ``config`` (default: the paper's values) from run seed
    ``seed`` (module docstring). ``faults=False``: no draw, every call forwarded. ``call_log``: a call log
    (``real_api.call_log``), one row per call; ``record``: a recording for ``ReplayUpstream``;
    ``slow_seconds``: how long a TIMEOUT withholds its answer; ``time_scale``: the drawn latency is slept
    times this (0: not at all). Use ``async with proxy:`` (it enters the upstream), then serve
    ``proxy.server``."""

    def __init__(self, upstream: Upstream, config: WorldConfig | None = None, seed: int = 0, *, faults: bool = True,
                 call_log: str | Path | None = None, record: str | Path | None = None,
                 slow_seconds: float = DEFAULT_SLOW_SECONDS, time_scale: float = 1.0,
                 max_sessions: int = DEFAULT_MAX_SESSIONS):
        for name, value in (("slow_seconds", slow_seconds), ("time_scale", time_scale)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise InputError(name, f"must be a finite number >= 0, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InputError("seed", f"must be an integer >= 0, got {seed!r}")
        if record is not None and isinstance(upstream, ReplayUpstream):
            raise InputError("record", "a replay has no upstream to record: give record or replay, not both")
        self.upstream, self.config, self.seed, self.faults = upstream, config or WorldConfig(), seed, faults
        self.call_log = None if call_log is None else Path(call_log)
        self.record = None if record is None else Path(record)
        self.slow_seconds, self.time_scale = float(slow_seconds), float(time_scale)
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self._opened = 0
        self.gone: str | None = None  # why the upstream went away, once it has
        self.stopped = anyio.Event()  # set when the upstream has gone: serving ends

    async def __aenter__(self) -> FaultProxy:
        await self.upstream.__aenter__()
        try:
            self._setup()
        except BaseException:
            await self.upstream.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.upstream.__aexit__(*exc)

    def _setup(self) -> None:
        upstream = self.upstream
        self.tools = {t.name: t for t in upstream.tools}
        self.registry = ToolRegistry(tuple(live_tool(t.name, t.description or "", ()) for t in upstream.tools))
        self.bases = dict(zip(self.registry.names, tool_bases(self.config.processes, self.config.failure,
                                                              self.registry), strict=True))
        self.upstream_name = upstream.server_info.name
        if self.record is not None:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            self._write_record({"record": "upstream", "server": _dump(upstream.server_info),
                                "instructions": upstream.instructions, "tools": [_dump(t) for t in upstream.tools]},
                               mode="w")
        info = upstream.server_info
        forwarded: dict[str, Any] = {handler: self._forwarder(request, result)
                                     for capability, handler, request, result in _FORWARDED
                                     if getattr(upstream.capabilities, capability) is not None}
        self.server: Server = Server(info.name, version=info.version, title=info.title, description=info.description,
                                     website_url=info.website_url, icons=info.icons, instructions=upstream.instructions,
                                     on_list_tools=self._list_tools, on_call_tool=self._call_tool, **forwarded)

    def _forwarder(self, request: Callable[..., types.Request[Any, Any]],
                   result: type[types.Result]) -> Callable[..., Any]:
        """A handler passing the client's ``request`` to the upstream and its answer back, both unchanged."""

        async def forward(ctx: Any, params: Any) -> types.Result:
            return await self.upstream.forward(request(params=params), result)

        return forward

    def handshake_only(self) -> None:
        """Answer ``server/discover`` with the handshake-era versions only, so that a client negotiating
        the protocol opens a session (``Mcp-Session-Id``): over HTTP the stateless 2026-07-28 protocol
        carries nothing that tells one client's calls from another's."""

        async def discover(ctx: Any, params: Any) -> types.DiscoverResult:
            return types.DiscoverResult(supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
                                        capabilities=self.server.get_capabilities(protocol_version=ctx.protocol_version),
                                        instructions=self.upstream.instructions)

        self.server.add_request_handler("server/discover", types.RequestParams, discover)

    # --- sessions ---------------------------------------------------------------------------------------

    def session(self, key: str) -> Session:
        """The session of ``key``, opened at its first call (the next number, its seed)."""
        session = self.sessions.get(key)
        if session is None:
            number = self._opened
            self._opened += 1
            session = self.sessions[key] = Session(number, env_episode(self.seed, number, 1)[1])
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        self.sessions.move_to_end(key)
        return session

    @staticmethod
    def _session_key(ctx: Any) -> str:
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None)
        return (headers.get(_SESSION_HEADER) if headers is not None else None) or _STDIO

    # --- handlers ---------------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(self.tools.values()))

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await self.call(params.name, dict(params.arguments or {}), self._session_key(ctx))

    async def call(self, tool: str, arguments: dict[str, Any], session_key: str = _STDIO) -> types.CallToolResult:
        """One call of ``tool`` from the client session ``session_key``: drawn, forwarded, logged."""
        if self.gone is not None:
            return _error(hf.NETWORK_ERROR, f"{UPSTREAM_GONE} ({self.gone})")
        if tool not in self.tools:  # the upstream answers what it answers to a tool it does not list
            return (await self._forward(tool, arguments, self.session(session_key)))[0]
        session = self.session(session_key)
        start = time.perf_counter()
        outcome = None
        if self.faults:
            turn, outcome = session.draw(tool, self.bases[tool], self.registry[tool].error_codes, self.config)
        else:
            turn = session.turns = session.turns + 1
        covariates = (0, 0, session.failures)
        if outcome is not None and not outcome.success:
            session.failures += 1
            result = await self._fault(tool, arguments, session, outcome)
            fault = hf.fault_of(str(outcome.error_code))
            self._log(session, turn, tool, covariates, HttpOutcome(
                tool, False, outcome.error_code, None, time.perf_counter() - start, fault.error_class,
                retry_after=outcome.retry_after), outcome)
            return result
        if outcome is not None and outcome.duration and self.time_scale:
            await anyio.sleep(outcome.duration * self.time_scale)  # the latency process, for real
        result, seen = await self._forward(tool, arguments, session)
        if not seen.success:
            session.failures += 1
        self._log(session, turn, tool, covariates, dataclasses.replace(seen, latency_s=time.perf_counter() - start),
                  outcome)
        return result

    async def _fault(self, tool: str, arguments: dict[str, Any], session: Session,
                     outcome: CallOutcome) -> types.CallToolResult:
        """The tool error of a failed draw, shown as the fault table's kind says."""
        code = str(outcome.error_code)
        fault = hf.fault_of(code)
        says = _SAYS.get(code, "")
        data: dict[str, Any] = {"session": session.number, "turn": session.turns}
        if fault.kind == hf.SLOW:  # served, but answered only after the deadline
            await self._forward(tool, arguments, session)
            await anyio.sleep(self.slow_seconds)
            return _error(code, f"{tool}: {says}: the call was sent but its answer was withheld", **data)
        if fault.kind == hf.MALFORMED:
            result, _ = await self._forward(tool, arguments, session)
            text = "".join(getattr(c, "text", "") for c in result.content)
            return _error(code, f"{tool}: {says}: {text[: len(text) // 2]!r}", **data)
        if code == hf.RATE_LIMIT_ERROR:
            wait = outcome.retry_after or 0
            data["retry_after"] = wait
            then = (f"its next {wait} call(s) in this session are refused too; retry after {wait} more call(s)"
                    if wait else "the limit lifts after this call; retry now")
            return _error(code, f"{tool}: {says}: {then}", **data)
        if code == hf.SERVICE_UNAVAILABLE:
            return _error(code, f"{tool}: {says} (an outage): the call was not served", **data)
        says = next((e["description"] for e in self.registry[tool].errors if e["code"] == code), code)
        return _error(code, f"{tool}: {says}: the call was not served", **data)

    async def _forward(self, tool: str, arguments: dict[str, Any],
                       session: Session) -> tuple[types.CallToolResult, HttpOutcome]:
        """The upstream's answer (a tool error when it gave none) and what it showed; recorded."""
        codes = self.registry[tool].error_codes if tool in self.registry else ()
        start = time.perf_counter()
        try:
            result = await self.upstream.call(tool, arguments, session)
        except _Recorded as exc:
            seen = HttpOutcome(tool, False, hf.code_of(exc.error_class), None, 0.0, exc.error_class,
                               description=exc.description)
            return _error(str(seen.error_code), f"{tool}: {exc.description}"), seen
        except (MCPError, *LOST_SESSION) as exc:
            seen = mcp_failure(tool, exc, time.perf_counter() - start)
            self._write_call(session, tool, arguments, error={"class": seen.error_class,
                                                             "description": seen.description})
            if isinstance(exc, LOST_SESSION) or "connection closed" in str(exc).lower():
                self._lose_upstream(_reason(exc))
                return _error(hf.NETWORK_ERROR, f"{tool}: {UPSTREAM_GONE} ({self.gone})"), seen
            return _error(str(seen.error_code), f"{tool}: {seen.description}"), seen
        self._write_call(session, tool, arguments, result=_dump(result))
        return result, mcp_outcome(tool, result, time.perf_counter() - start, codes)

    def _lose_upstream(self, why: str) -> None:
        self.gone = why
        self.stopped.set()

    # --- files ------------------------------------------------------------------------------------------

    def _write_record(self, row: dict[str, Any], mode: str = "a") -> None:
        assert self.record is not None
        with self.record.open(mode, encoding="utf-8") as out:
            out.write(json.dumps(row, sort_keys=True) + "\n")

    def _write_call(self, session: Session, tool: str, arguments: dict[str, Any], **answer: Any) -> None:
        if self.record is not None:
            self._write_record({"record": "call", "session": session.number, "turn": session.turns, "tool": tool,
                                "arguments": arguments, **answer})

    def _log(self, session: Session, turn: int, tool: str, covariates: tuple[int, int, int], shown: HttpOutcome,
             outcome: CallOutcome | None) -> None:
        """One call-log row: what the client met; with faults on, the world's account too (the drawn
        duration, a refusal's wait in turns), so the fit reads it in the world's terms."""
        if self.call_log is None:
            return
        write_rows(self.call_log, [CallLogRow(
            "mcp", self.upstream_name, f"{self.upstream_name}/{LOG_RUN}/session-{session.number}/{session.seed}", turn,
            tool, *covariates, shown.success, shown.error_code, None, round(shown.latency_s, 6), shown.error_class,
            None if outcome is None else outcome.retry_after, 1, None if outcome is None else outcome.duration,
            None if outcome is None else outcome.retry_after)])


# --- serving --------------------------------------------------------------------------------------------


async def serve_proxy(proxy: FaultProxy, sock: socket.socket | None = None,
                      on_ready: Callable[[], None] | None = None, **http: Any) -> None:
    """Enter the upstream and serve ``proxy`` over stdio (no ``sock``) or streamable HTTP on ``sock``
    (``serve mcp``'s transports; ``http``: ``serve_http``'s session options) until the client closes
    stdin, the server is interrupted, or the upstream goes away (``UpstreamError``)."""
    async with proxy:
        if sock is not None:
            proxy.handshake_only()
        async with anyio.create_task_group() as group:

            async def stop_when_gone() -> None:
                await proxy.stopped.wait()
                await anyio.sleep(_GRACE_SECONDS)  # the answers saying so go out first
                group.cancel_scope.cancel()

            async def serve() -> None:
                if sock is None:
                    await serve_stdio(proxy.server)
                else:
                    await serve_http(proxy.server, sock, on_ready=on_ready, **http)
                group.cancel_scope.cancel()

            group.start_soon(stop_when_gone)
            group.start_soon(serve)
            if sock is None and on_ready is not None:
                on_ready()
    if proxy.gone is not None:
        raise UpstreamError(f"{UPSTREAM_GONE}: {proxy.gone}")
