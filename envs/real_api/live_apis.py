"""Live APIs: tools registered from an OpenAPI document or an MCP server's tool list, and task files.

A live API becomes a ``ToolRegistry`` like the simulated one, so every front end, the prompts and the
evaluator work on it unchanged:

* ``openapi_tools(document)``: each operation (or the chosen ones) is a ``Tool`` named by its
  ``operationId``, with its path, query and JSON body parameters as the input schema, and an ``Endpoint``
  (method, URL template, where each argument goes) that the HTTP client calls;
* ``mcp_tools(tool_list)``: each entry of an MCP server's ``tools/list`` result (name, description,
  inputSchema) is a ``Tool``; calls go through an MCP client session (``McpToolClient``);
* ``read_task_file(path)``: a YAML task file (the paper's sequential real-world workflows are the model):
  tasks as ordered tool steps with descriptions, arguments and dependencies between the steps.

``load_live_api(task_file)`` puts them together: the task file names its API (an OpenAPI document or URL,
our own tool service's base URL, or an MCP server) and the result, a ``LiveApi``, holds the registry (the
steps' dependencies become the tools' dependencies), the ``Task`` objects and the endpoints; front ends
take it as their ``api`` option (``api_client`` makes the client). Bad files raise ``InputError`` naming
the field (``tasks[2].steps[0].tool``).
"""

from __future__ import annotations

__all__ = [
    "LIVE_CATEGORY", "LIVE_TASK_TYPE", "DEFAULT_MIN_COVERAGE", "HTTP_METHODS", "LIVE_ERRORS", "LOST_SESSION",
    "schema_parameters", "live_tool", "load_document", "openapi_tools", "mcp_tools", "McpToolClient", "mcp_outcome",
    "mcp_failure",
    "mcp_live_api", "TASK_FILE_KEYS", "API_KEYS", "TASK_KEYS", "STEP_KEYS", "TaskFile", "SHIPPED_TASK_FILES",
    "task_file_path", "read_task_file", "task_workflow", "LiveApi", "RealApi", "live_registry",
    "service_openapi_url", "load_live_api", "expand_headers", "MAX_DOCUMENT_BYTES", "MAX_SCHEMA_NODES",
]

import dataclasses
import json
import os
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import anyio

from resilibench.errors import InputError
from resilibench.outbound import ResponseTooLarge, fetch, http_client, origin

from ...core.config import WorldConfig
from ...core.registry import CATEGORY_ERRORS, COMMON_ERRORS, Parameter, Tool, ToolRegistry
from ...core.tasks.library import COMPLEXITIES, Task
from ...core.workflow import Node, Workflow
from . import http_faults as hf
from .client import Endpoint, HttpOutcome, ToolClient, check_headers
from .http_faults import FAULTS

LIVE_CATEGORY = "live_api"
LIVE_TASK_TYPE = "live_workflow"  # the task type of a task file's tasks unless it names another
DEFAULT_MIN_COVERAGE = 0.6
HTTP_METHODS = ("get", "put", "post", "delete", "patch")
_DESCRIPTIONS = dict(COMMON_ERRORS) | {c: d for errors in CATEGORY_ERRORS.values() for c, d in errors}
# What a live call can fail with: the common codes and every code the wire can show (envs.real_api.http_faults).
LIVE_ERRORS: tuple[tuple[str, str], ...] = COMMON_ERRORS + tuple(
    (code, _DESCRIPTIONS[code]) for code in FAULTS if code not in dict(COMMON_ERRORS))
# What a call over a lost MCP session raises (a closed or broken stream, the OS).
LOST_SESSION: tuple[type[BaseException], ...] = (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError,
                                                 anyio.EndOfStream)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_FETCH_TIMEOUT = 30.0  # seconds, in all, to fetch an OpenAPI document
MAX_DOCUMENT_BYTES = 10 * 2**20
MAX_SCHEMA_NODES = 100_000  # values of one path item once its $refs are followed
_VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


# --- JSON Schema -> tool parameters ---------------------------------------------------------------------


class _Resolver:
    """Follows the local ``$ref`` (``#/components/...``) of one document, nested ones too. A schema that
    refers to itself (a tree of comments) is cut where it recurs: that part accepts any value. Each
    reference is resolved once (the result shared where it recurs), and all that the document's
    references expand to may hold at most ``MAX_SCHEMA_NODES`` values: a small document whose references
    fan out is refused, naming where it passed the limit."""

    def __init__(self, document: Mapping[str, Any]):
        self.document = document
        self.memo: dict[tuple[str, tuple[str, ...]], tuple[Any, int]] = {}
        self.expanded = 0

    def __call__(self, node: Any, where: str) -> Any:
        value, size = self._walk(node, (), where)
        self.expanded += size
        if self.expanded > MAX_SCHEMA_NODES:
            raise InputError(where, f"{where}: the document's $refs expand to more than {MAX_SCHEMA_NODES:,} values")
        return value

    def _walk(self, node: Any, following: tuple[str, ...], where: str) -> tuple[Any, int]:
        if isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/"):
                raise InputError(where, f"{where}: only local $ref (#/...) are supported, got {ref!r:.80}")
            if ref in following:
                return {}, 1
            key = (ref, following)
            if key not in self.memo:
                target: Any = self.document
                for part in ref[2:].split("/"):
                    part = part.replace("~1", "/").replace("~0", "~")
                    if not isinstance(target, dict) or part not in target:
                        raise InputError(where, f"{where}: $ref {ref} points nowhere")
                    target = target[part]
                self.memo[key] = self._walk(target, (*following, ref), where)
            return self.memo[key]
        if isinstance(node, dict):
            items = {k: self._walk(v, following, where) for k, v in node.items()}
            return self._sized({k: v for k, (v, _) in items.items()}, 1 + sum(n for _, n in items.values()), where)
        if isinstance(node, list):
            values = [self._walk(v, following, where) for v in node]
            return self._sized([v for v, _ in values], 1 + sum(n for _, n in values), where)
        return node, 1

    def _sized(self, value: Any, size: int, where: str) -> tuple[Any, int]:
        if self.expanded + size > MAX_SCHEMA_NODES:
            raise InputError(where, f"{where}: the document's $refs expand to more than {MAX_SCHEMA_NODES:,} values")
        return value, size


def schema_parameters(schema: Any, where: str) -> tuple[Parameter, ...]:
    """The parameters of an object JSON Schema: one per property, its ``type``, ``description`` and
    ``default`` kept apart and every other keyword kept as a constraint, so ``Tool.input_schema`` gives the
    schema back."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise InputError(where, f"{where}: an input schema must be a JSON Schema of type object, got {schema!r:.80}")
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise InputError(where, f"{where}: properties must be a mapping and required a list")
    strange = [name for name in properties if not isinstance(name, str)]
    if strange:
        raise InputError(f"{where}.properties", f"{where}: property names must be strings, got {strange[0]!r:.80}")
    return tuple(_parameter(name, prop, name in required, f"{where}.properties.{name}")
                 for name, prop in properties.items())


def _parameter(name: str, prop: Any, required: bool, where: str) -> Parameter:
    if not isinstance(prop, dict):
        raise InputError(where, f"{where}: a property schema must be a mapping, got {prop!r:.80}")
    branches = prop.get("anyOf", prop.get("oneOf", []))
    if not isinstance(branches, list):
        raise InputError(where, f"{where}: anyOf and oneOf must be lists, got {branches!r:.80}")
    kind = _schema_type(prop.get("type") or next((b["type"] for b in branches if isinstance(b, dict) and "type" in b),
                                                 "string"), where)
    constraints = {k: v for k, v in prop.items() if k not in ("type", "description", "default")}
    return Parameter(name, kind, str(prop.get("description", "")), required, prop.get("default"), constraints)


def _schema_type(kind: Any, where: str) -> Any:
    """A property's JSON Schema ``type``: a name, or a list of names (``["string", "null"]``)."""
    if not isinstance(kind, str) and not (isinstance(kind, list) and all(isinstance(k, str) for k in kind)):
        raise InputError(f"{where}.type", f"{where}.type must be a JSON Schema type name, got {kind!r:.80}")
    return kind


def live_tool(name: str, description: str, parameters: Sequence[Parameter], version: str = "1.0.0",
              category: str = LIVE_CATEGORY, codes: Sequence[str] | None = None) -> Tool:
    """A live API's tool: returns ``success``, ``data`` (the response body) and ``metadata``; fails with
    ``codes`` (an operation's ``x-error-codes``, as our tool service lists them) or else ``LIVE_ERRORS``; no
    semantic role (the evaluator then counts the last required tool as the output)."""
    errors = LIVE_ERRORS if not codes else tuple((str(c), _DESCRIPTIONS.get(str(c), str(c))) for c in codes)
    return Tool(
        name=name, description=description or name.replace("_", " "), parameters=tuple(parameters),
        returns=({"name": "success", "type": "boolean", "description": "Whether the call succeeded"},
                 {"name": "data", "type": "object", "description": "The response body"},
                 {"name": "metadata", "type": "object", "description": "Call metadata"}),
        errors=tuple({"code": c, "description": d} for c, d in errors),
        dependencies=(), dependency_metadata={"level": 0, "execution_order": 0, "category": category},
        metadata={"category": category, "operation": name, "version": version},
        canonical_name=name, aliases=(), role=None)


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(where, f"{where}: a tool name must be letters, digits and underscores, starting with a "
                         f"letter, got {name!r}")
    return name


# --- OpenAPI --------------------------------------------------------------------------------------------


def _typed(container: Mapping[str, Any], key: str, kind: type, where: str,
           default: Any = None) -> Any:
    """``container[key]`` (``default`` when absent or null) when it is a ``kind``; InputError naming
    ``where.key`` otherwise."""
    value = container.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        expected = {dict: "a mapping", list: "a list", str: "a string"}[kind]
        raise InputError(f"{where}.{key}", f"{where}.{key} must be {expected}, got {value!r:.80}")
    return value


def load_document(source: str | Path, base: Path | None = None) -> tuple[dict[str, Any], str | None]:
    """(the OpenAPI document, the URL it came from or None) of a file (JSON or YAML; a relative path is
    relative to ``base``, the task file's folder, and must stay inside it) or an http(s) URL (fetched
    then, within ``_FETCH_TIMEOUT`` seconds in all and ``MAX_DOCUMENT_BYTES``)."""
    text_source = str(source)
    if text_source.startswith(("http://", "https://")):
        import httpx2 as httpx

        try:
            with http_client(_FETCH_TIMEOUT) as client:
                reply = fetch(client, "GET", text_source, timeout=_FETCH_TIMEOUT, max_bytes=MAX_DOCUMENT_BYTES)
        except (httpx.HTTPError, httpx.InvalidURL, ResponseTooLarge) as exc:
            raise InputError("openapi", f"cannot fetch the OpenAPI document {text_source}: "
                             f"{type(exc).__name__}: {exc}") from None
        if reply.status != 200:
            raise InputError("openapi", f"cannot fetch the OpenAPI document {text_source}: HTTP {reply.status}")
        text, url = reply.content.decode("utf-8", "replace"), text_source
    else:
        path = _local_path(text_source, base)
        if not path.is_file():
            raise InputError("openapi", f"OpenAPI document {path} does not exist")
        if path.stat().st_size > MAX_DOCUMENT_BYTES:
            raise InputError("openapi", f"OpenAPI document {path} is over {MAX_DOCUMENT_BYTES:,} bytes")
        text, url = path.read_text(encoding="utf-8", errors="replace"), None
    try:
        from resilibench.safe_yaml import load_yaml

        document = json.loads(text) if text.lstrip().startswith("{") else load_yaml(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError (PyYAML would read 1e-06 as a string)
        raise InputError("openapi", f"cannot parse the OpenAPI document {text_source}: "
                         f"{str(exc).splitlines()[0]}") from None
    if not isinstance(document, dict) or not str(document.get("openapi", "")).startswith("3"):
        raise InputError("openapi", f"{text_source} is not an OpenAPI 3.x document (no 'openapi: 3.x' field)")
    return document, url


def _local_path(source: str, base: Path | None) -> Path:
    """The file a task file names (``base``: its folder): relative to it and inside it; a path given by
    the user (``base`` None) as it is."""
    if base is None:
        return Path(source)
    path = (base / source).resolve()
    if Path(source).is_absolute() or not path.is_relative_to(base.resolve()):
        raise InputError("openapi", f"a task file names its OpenAPI document by a path relative to its own folder "
                         f"({base}), inside it; got {source!r} (give another document as the openapi argument)")
    return path


def openapi_tools(document: Mapping[str, Any], base_url: str | None = None, operations: Sequence[str] | None = None,
                  document_url: str | None = None, headers: Mapping[str, str] | None = None
                  ) -> tuple[list[Tool], dict[str, Endpoint]]:
    """The tools and endpoints of an OpenAPI 3.x document: one per operation (only ``operations`` when
    given, by operationId). The URL is ``base_url``, else the document's first server (relative to
    ``document_url``), joined with the operation's path; ``headers`` go with every request (credentials).
    A malformed document is refused with an InputError naming the field."""
    sent_headers = check_headers(headers or {}, "headers")
    servers = _typed(document, "servers", list, "openapi", [])
    server = base_url or next((s.get("url") for s in servers if isinstance(s, dict)), None)
    if server is None and document_url is not None:
        server = "/"
    if server is None:
        raise InputError("base_url", "the OpenAPI document names no server: give the API's base URL")
    if not isinstance(server, str):
        raise InputError("servers", f"servers[0].url must be a string, got {server!r:.80}")
    if document_url is not None:
        server = urllib.parse.urljoin(document_url, server)
    version = str(_typed(document, "info", dict, "openapi", {}).get("version", "1.0.0"))
    resolve = _Resolver(document)
    tools, endpoints = [], {}
    for path, raw_item in _typed(document, "paths", dict, "openapi", {}).items():
        item = resolve(raw_item, f"paths.{path}")
        if not isinstance(item, dict):
            raise InputError(f"paths.{path}", f"paths.{path} must be a mapping of methods, got {item!r:.80}")
        for method in HTTP_METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            where = f"paths.{path}.{method}"
            raw_name = str(op.get("operationId") or f"{method}{path}")  # agents write names with underscores
            name = _check_name(re.sub(r"[^A-Za-z0-9_]+", "_", raw_name).strip("_"), f"{where}.operationId")
            if operations is not None and name not in operations:
                continue
            if name in endpoints:
                raise InputError(f"{where}.operationId", f"{where}: operationId {name!r} is used twice")
            parameters, url = _operation_parameters(op, item, resolve, where, method, server.rstrip("/") + str(path))
            description = _typed(op, "description", str, where) or _typed(op, "summary", str, where) or ""
            codes = _typed(op, "x-error-codes", list, where)
            tools.append(live_tool(name, description, parameters, version, codes=codes))
            endpoints[name] = Endpoint(method.upper(), url, sent_headers)
    missing = sorted(set(operations or ()) - set(endpoints))
    if missing:
        raise InputError("operations", f"operation(s) {missing} not in the OpenAPI document; it has "
                         f"{sorted(endpoints) or 'none'}")
    return tools, endpoints


def _operation_parameters(op: dict, item: dict, resolve: _Resolver, where: str, method: str, url: str
                          ) -> tuple[list[Parameter], str]:
    """(the tool's parameters, the endpoint's URL template) of one operation. ``Endpoint`` fills ``{name}``
    from the arguments and sends the others as the query (GET, DELETE) or the JSON body: a required query
    parameter of a body method is written into the URL template; an optional one is left out."""
    parameters: list[Parameter] = []
    query: list[str] = []
    listed = [*_typed(item, "parameters", list, where.rsplit(".", 1)[0], []), *_typed(op, "parameters", list, where, [])]
    for i, raw in enumerate(listed):
        at = f"{where}.parameters[{i}]"
        spec = resolve(raw, at)
        if not isinstance(spec, dict):
            raise InputError(at, f"{at} must be a mapping, got {spec!r:.80}")
        place, name = spec.get("in"), spec.get("name")
        required = bool(spec.get("required")) or place == "path"
        body_method = method not in ("get", "delete")
        if place not in ("path", "query") or (place == "query" and body_method and not required):
            continue  # headers and cookies carry credentials and settings, not an agent's arguments
        name = _check_name(name, f"{at}.name")
        if place == "query" and body_method:
            query.append(f"{name}={{{name}}}")
        description = _typed(spec, "description", str, at)
        schema = {**_typed(spec, "schema", dict, at, {}), **({"description": description} if description else {})}
        parameters.append(_parameter(name, schema, required, at))
    body = resolve(_typed(op, "requestBody", dict, where, {}), f"{where}.requestBody")
    content = _typed(body, "content", dict, f"{where}.requestBody", {})
    schema = _typed(content, "application/json", dict, f"{where}.requestBody.content", {}).get("schema")
    if schema is not None and method not in ("get", "delete"):
        taken = {p.name for p in parameters}
        for parameter in schema_parameters(schema, f"{where}.requestBody"):
            if parameter.name in taken:
                raise InputError(where, f"{where}: argument {parameter.name!r} is both a parameter and a body field")
            parameters.append(parameter)
    return parameters, url + ("?" + "&".join(query) if query else "")


# --- MCP ------------------------------------------------------------------------------------------------


def mcp_tools(tool_list: Sequence[Any], names: Sequence[str] | None = None) -> list[Tool]:
    """Tools from an MCP server's ``tools/list`` result (objects or dicts with ``name``, ``description``,
    ``inputSchema``/``input_schema``); only ``names`` when given."""
    tools = []
    for i, entry in enumerate(tool_list):
        data = entry if isinstance(entry, dict) else entry.model_dump(by_alias=True)
        name = _check_name(data.get("name"), f"tools[{i}].name")
        if names is not None and name not in names:
            continue
        schema = data.get("inputSchema", data.get("input_schema")) or {"type": "object"}
        tools.append(live_tool(name, data.get("description") or "", schema_parameters(schema, f"tools[{i}]")))
    missing = sorted(set(names or ()) - {t.name for t in tools})
    if missing:
        raise InputError("operations", f"tool(s) {missing} not in the MCP server's tool list")
    return tools


class McpToolClient:
    """Calls the tools of an MCP server through one client session, for ``HttpExecutor`` (it has the
    client side that the executor uses: ``request``, ``retry_delay``, ``log``), so a live API served over
    MCP plays exactly like one over HTTP. ``server``: a streamable-HTTP URL, a command line (a list: the
    server over stdio, run in ``cwd``) or an ``mcp`` server object (in memory). A tool result with ``is_error`` fails with
    the code its ``error`` names when the tool has it, else OPERATION_FAILED; no answer within
    ``timeout`` is a TIMEOUT; a lost session a NETWORK_ERROR. Calls are not retried. Close it when done."""

    is_service = False

    def __init__(self, server: Any, *, timeout: float = 10.0, log: str | Path | None = None,
                 registry: ToolRegistry | None = None, cwd: str | Path | None = None):
        import anyio.from_thread
        from mcp import Client, StdioServerParameters

        if isinstance(server, list | tuple):
            if not server or not all(isinstance(a, str) for a in server):
                raise InputError("mcp", f"an MCP server command must be a non-empty list of strings, got {server!r}")
            server = StdioServerParameters(command=server[0], args=list(server[1:]), cwd=cwd)
        self.timeout, self.registry = float(timeout), registry
        self.log = None if log is None else Path(log)
        self._portal_context = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_context.__enter__()
        self._session_context = self._portal.wrap_async_context_manager(Client(server))
        try:
            self._client = self._session_context.__enter__()
        except Exception as exc:
            self._portal_context.__exit__(None, None, None)
            raise InputError("mcp", f"cannot open an MCP session with {server!r}: {exc}") from None
        try:
            self.endpoints = {tool.name: tool for tool in self.list_tools()}  # what the executor may call
        except BaseException:
            self.close()
            raise

    def list_tools(self) -> list[Any]:
        """The server's ``tools/list`` result."""
        return list(self._portal.call(self._client.list_tools).tools)

    def request(self, tool: str, arguments: Mapping[str, Any] | None = None, *, episode: str | None = None,
                headers: Mapping[str, str] | None = None, attempt: int = 1) -> HttpOutcome:
        """One call of ``tool`` as an ``HttpOutcome`` (no HTTP status: the session carries no such thing)."""
        from mcp.shared.exceptions import MCPError  # the SDK loads only where MCP is used

        codes = self.registry[tool].error_codes if self.registry is not None and tool in self.registry else ()
        start = time.perf_counter()
        try:
            result = self._portal.call(lambda: self._client.call_tool(tool, dict(arguments or {}),
                                                                      read_timeout_seconds=self.timeout))
        except (MCPError, *LOST_SESSION) as exc:
            return mcp_failure(tool, exc, time.perf_counter() - start, attempt)
        return mcp_outcome(tool, result, time.perf_counter() - start, codes, attempt)

    def retry_delay(self, outcome: HttpOutcome) -> float | None:
        """None: calls over MCP are not retried."""
        return None

    def close(self) -> None:
        try:
            self._session_context.__exit__(None, None, None)
        finally:
            self._portal_context.__exit__(None, None, None)

    def __enter__(self) -> McpToolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mcp_outcome(tool: str, result: Any, latency: float, codes: Sequence[str] = (), attempt: int = 1) -> HttpOutcome:
    """What an MCP ``CallToolResult`` says as an ``HttpOutcome`` (no HTTP status): a success, or, for a
    result with ``is_error``, the code its ``error`` names when it is one of ``codes``, else OPERATION_FAILED."""
    text = "".join(getattr(c, "text", "") for c in result.content)
    output = result.structured_content if result.structured_content is not None else _json_or_text(text)
    if not result.is_error:
        return HttpOutcome(tool, True, None, None, latency, output=output, body=text, attempt=attempt)
    error = output.get("error") if isinstance(output, dict) else None
    body_code = error.get("code") if isinstance(error, dict) else None
    code = hf.code_of(hf.SERVER_ERROR, None, body_code, codes)
    return HttpOutcome(tool, False, code, None, latency, hf.SERVER_ERROR, output=output, body=text,
                       description=(error or {}).get("description") or text[:200] or "tool error", attempt=attempt)


def mcp_failure(tool: str, exc: BaseException, latency: float, attempt: int = 1) -> HttpOutcome:
    """A call that raised instead of answering, as an ``HttpOutcome``: the SDK's ``MCPError`` of a request
    that timed out (TIMEOUT) or that the server refused (INVALID_INPUT), a lost session (NETWORK_ERROR)."""
    if isinstance(exc, LOST_SESSION):
        error_class, description = hf.CONNECTION, f"the MCP session was lost ({exc!r})"
    else:
        error_class = hf.TIMEOUT_CLASS if "timed out" in str(exc).lower() else hf.CLIENT_ERROR
        description = str(exc)
    return HttpOutcome(tool, False, hf.code_of(error_class), None, latency, error_class, description=description,
                       attempt=attempt)


def _json_or_text(text: str) -> Any:
    """A tool result's text as JSON when it is JSON (servers often answer a JSON text), else as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def mcp_live_api(task_file: str | Path, client: McpToolClient) -> LiveApi:
    """A live API from a task file over the tools an MCP server lists (``client``'s session); call through
    the same client (``api=client`` with this API's ``tasks`` and ``registry``)."""
    spec = read_task_file(task_file)
    registry = live_registry(mcp_tools(list(client.endpoints.values()), spec.api.get("operations")), spec)
    client.registry = registry
    return LiveApi(spec.name, registry, spec.tasks, {}, spec.min_coverage, "mcp")


# --- task files -----------------------------------------------------------------------------------------

TASK_FILE_KEYS = ("name", "description", "api", "min_coverage", "tasks")
API_KEYS = ("openapi", "base_url", "service", "operations", "headers", "mcp")
TASK_KEYS = ("id", "task_type", "description", "inputs", "expected_outputs", "max_retries", "timeout", "complexity",
             "steps")
STEP_KEYS = ("tool", "description", "arguments", "depends_on")


@dataclass(frozen=True)
class TaskFile:
    """A task file as read: its name, the API it names (``api``: openapi / base_url / service /
    operations), the minimum coverage of partial success per task type, the tasks and, per tool, the
    tools its steps depend on."""

    name: str
    path: Path
    api: dict[str, Any]
    min_coverage: dict[str, float]
    tasks: tuple[Task, ...]
    dependencies: dict[str, tuple[str, ...]]

    @property
    def tools(self) -> tuple[str, ...]:
        """Every tool a step names, in first-use order."""
        return tuple(dict.fromkeys(t for task in self.tasks for t in task.required_tools))


def _mapping(value: Any, where: str, keys: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(where, f"{where} must be a mapping, got {value!r:.80}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise InputError(where, f"{where}: unknown field(s) {unknown}; accepted: {list(keys)}")
    return value


SHIPPED_TASK_FILES = ("live_example",)  # task sets in the package's data, by name


def task_file_path(path: str | Path) -> Path:
    """The path of a task file, or of a shipped set named by ``SHIPPED_TASK_FILES``."""
    if not Path(path).is_file() and str(path) in SHIPPED_TASK_FILES:
        return Path(str(resources.files("resilibench.envs.real_api") / "data" / str(path) / "tasks.yaml"))
    return Path(path)


def read_task_file(path: str | Path) -> TaskFile:
    """Read a YAML task file (docs/envs/real_apis.md, "Live APIs"), or a shipped set by name (``live_example``);
    ``InputError`` naming the field at fault."""
    path = task_file_path(path)
    if not path.is_file():
        raise InputError("task_file", f"task file {path} does not exist (shipped sets: "
                         f"{', '.join(SHIPPED_TASK_FILES)})")
    try:
        from resilibench.safe_yaml import load_yaml

        data = load_yaml(path.read_text(encoding="utf-8"))
    except Exception as exc:  # yaml.YAMLError, UnicodeDecodeError
        raise InputError("task_file", f"cannot parse task file {path}: {str(exc).splitlines()[0]}") from None
    data = _mapping(data, "task_file", TASK_FILE_KEYS)
    name = data.get("name") or path.stem
    api = _mapping(data.get("api") or {}, "api", API_KEYS)
    if "operations" in api and not (isinstance(api["operations"], list)
                                    and all(isinstance(o, str) for o in api["operations"])):
        raise InputError("api.operations", "api.operations must be a list of operation names")
    headers = api.get("headers") or {}
    if not isinstance(headers, dict):
        raise InputError("api.headers", "api.headers must map header names to strings")
    check_headers(headers, "api.headers")  # ${VAR} is checked again once expanded (expand_headers)
    for key in ("openapi", "base_url", "service"):
        if key in api and not isinstance(api[key], str):
            raise InputError(f"api.{key}", f"api.{key} must be a string, got {api[key]!r:.80}")
    coverage = data.get("min_coverage", DEFAULT_MIN_COVERAGE)
    if not isinstance(coverage, int | float) or isinstance(coverage, bool) or not 0 <= coverage <= 1:
        raise InputError("min_coverage", f"min_coverage must be a number in [0, 1], got {coverage!r}")
    raw_tasks = data.get("tasks")
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise InputError("tasks", "tasks must be a non-empty list of tasks")
    tasks: list[Task] = []
    dependencies: dict[str, tuple[str, ...]] = {}
    declared_in: dict[str, str] = {}
    for i, raw in enumerate(raw_tasks):
        task, depends = _read_task(raw, f"tasks[{i}]", name)
        if any(t.instance_id == task.instance_id for t in tasks):
            raise InputError(f"tasks[{i}].id", f"tasks[{i}].id: {task.instance_id!r} is used twice")
        for j, tool in enumerate(task.required_tools):
            where = f"tasks[{i}].steps[{j}].depends_on"
            if dependencies.setdefault(tool, depends[tool]) != depends[tool]:
                raise InputError(where, f"{where}: {tool} depends on {list(dependencies[tool])} in task "
                                 f"{declared_in[tool]} but on {list(depends[tool])} here; a tool's dependencies "
                                 "are the same in every task")
            declared_in.setdefault(tool, task.instance_id)
        tasks.append(task)
    min_coverage = {t.task_type: float(coverage) for t in tasks}
    return TaskFile(name, path, api, min_coverage, tuple(tasks), dependencies)


def _read_task(raw: Any, where: str, file_name: str) -> tuple[Task, dict[str, tuple[str, ...]]]:
    """A task of a task file and, per step's tool, the tools it depends on (sorted)."""
    raw = _mapping(raw, where, TASK_KEYS)
    task_id = raw.get("id")
    if not isinstance(task_id, str) or not task_id.strip():
        raise InputError(f"{where}.id", f"{where}.id must be a non-empty string, got {task_id!r}")
    for key, kind in (("description", str), ("inputs", dict), ("expected_outputs", dict)):
        if key in raw and not isinstance(raw[key], kind):
            raise InputError(f"{where}.{key}", f"{where}.{key} must be a {'string' if kind is str else 'mapping'}")
    for key in ("max_retries", "timeout"):
        value = raw.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"{where}.{key}", f"{where}.{key} must be an integer >= 0, got {value!r}")
    steps = raw.get("steps")
    if not isinstance(steps, list) or not steps:
        raise InputError(f"{where}.steps", f"{where}.steps must be a non-empty list of steps")
    tools: list[str] = []
    arguments: dict[str, Any] = {}
    step_texts: list[dict[str, Any]] = []
    depends_on: dict[str, tuple[str, ...]] = {}
    for j, step in enumerate(steps):
        at = f"{where}.steps[{j}]"
        step = _mapping(step, at, STEP_KEYS)
        tool = _check_name(step.get("tool"), f"{at}.tool")
        if tool in tools:
            raise InputError(f"{at}.tool", f"{at}.tool: {tool!r} is already a step of this task")
        depends = step.get("depends_on") or []
        if not isinstance(depends, list) or any(d not in tools for d in depends):
            raise InputError(f"{at}.depends_on", f"{at}.depends_on must list tools of earlier steps "
                             f"({tools or 'none yet'}), got {depends!r}")
        if "arguments" in step and not isinstance(step["arguments"], dict):
            raise InputError(f"{at}.arguments", f"{at}.arguments must be a mapping")
        tools.append(tool)
        depends_on[tool] = tuple(sorted(depends))
        if "arguments" in step:
            arguments[tool] = step["arguments"]
        step_texts.append({"tool": tool, "description": str(step.get("description", "")), "depends_on": depends})
    complexity = raw.get("complexity") or ("easy" if len(tools) <= 2 else "medium" if len(tools) <= 5 else "hard")
    if complexity not in COMPLEXITIES:
        raise InputError(f"{where}.complexity", f"{where}.complexity must be one of {COMPLEXITIES}, got {complexity!r}")
    task_type = raw.get("task_type", LIVE_TASK_TYPE)
    if not isinstance(task_type, str) or not task_type.strip():
        raise InputError(f"{where}.task_type", f"{where}.task_type must be a non-empty string")
    description = raw.get("description") or " Then ".join(s["description"] for s in step_texts if s["description"])
    task = Task(instance_id=task_id, task_type=task_type, description=description, inputs=raw.get("inputs") or {},
                expected_outputs=raw.get("expected_outputs") or {"success": True},
                required_tools=tuple(tools),
                constraints={"timeout": raw.get("timeout", 300), "max_retries": raw.get("max_retries", 3)},
                complexity=complexity,
                metadata={"task_file": file_name, "steps": step_texts, "arguments": arguments},
                original_description=description, split="test")
    return task, depends_on


def task_workflow(task: Task) -> Workflow | None:
    """The plan of a task-file task: its steps in order (with their descriptions and arguments), each after
    the previous one and after the steps it depends on; None for a task of the world's library. The text
    env shows it as the ``optimal`` prompt's plan of a live task (the world's bound (iii) says nothing about
    a live API)."""
    steps = task.metadata.get("steps") if isinstance(task.metadata, dict) else None
    if not steps:
        return None
    arguments = task.metadata.get("arguments", {})
    nodes = tuple(Node.make(s["tool"], s["description"], arguments.get(s["tool"])) for s in steps)
    index = {s["tool"]: i for i, s in enumerate(steps)}
    edges = {(i - 1, i) for i in range(1, len(steps))}
    edges |= {(index[d], index[s["tool"]]) for s in steps for d in s["depends_on"]}
    return Workflow(nodes, tuple(sorted(edges)))


# --- putting it together ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveApi:
    """A registered live API: its tools (``registry``), tasks, endpoints (tool -> ``Endpoint``; empty
    for an MCP server) and the evaluator's minimum coverage for the task file's task types."""

    name: str
    registry: ToolRegistry
    tasks: tuple[Task, ...]
    endpoints: dict[str, Endpoint]
    min_coverage: dict[str, float]
    source: str  # where the tools came from (the OpenAPI document or URL, the MCP server)
    mcp: Any = None  # the MCP server (URL or command) whose session the calls go through; None: HTTP endpoints
    mcp_cwd: Path | None = None  # the folder a command runs in (the task file's)

    def world_config(self, config: WorldConfig | None = None) -> WorldConfig:
        """``config`` (default: the paper's world) with the task file's task types graded: their minimum
        coverage added to the evaluator's table (types it already has keep their value)."""
        config = config or WorldConfig()
        table = {**self.min_coverage, **config.evaluator.min_coverage}
        return config if table == config.evaluator.min_coverage else config.replace(evaluator={"min_coverage": table})


@dataclass(frozen=True)
class RealApi:
    """Real-API mode of a front end (docs/envs/real_apis.md): where its tool calls go, and the settings of the
    client it makes for them.

    ``target``: the base URL of our tool service (``resilibench serve tools``), whose episodes mirror the
    world's; a ``LiveApi`` (its endpoints or its MCP server), whose tools and tasks the front end then
    plays; or a client (``ToolClient``, ``McpToolClient``), used as it is (the front end closes only a
    client it made). ``options`` go to the client a front end makes: ``timeout``, ``max_retries``,
    ``retry_after_cap``, ``log`` (a call-log file, one row per attempt), ...
    """

    target: Any
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.target, str | LiveApi | ToolClient | McpToolClient):
            raise InputError("api", f"api must be a tool service URL, a LiveApi or a ToolClient, got "
                             f"{type(self.target).__name__}")

    @property
    def live(self) -> LiveApi | None:
        """The live API the calls go to (None: our tool service, or a client given as it is)."""
        return self.target if isinstance(self.target, LiveApi) else None

    def client(self, registry: ToolRegistry | None = None) -> Any:
        """The client the calls go through, for ``HttpExecutor``: the given client as it is, else a new one
        for the live API's endpoints or MCP server, or for the tool service at the URL (``registry``: the
        front end's tools)."""
        target, options = self.target, dict(self.options)
        if isinstance(target, ToolClient | McpToolClient):
            return target
        if isinstance(target, LiveApi) and target.mcp is not None:
            return McpToolClient(target.mcp, registry=target.registry, timeout=options.get("timeout", 10.0),
                                 log=options.get("log"), cwd=target.mcp_cwd)
        if isinstance(target, LiveApi):
            return ToolClient(endpoints=target.endpoints, registry=target.registry, **options)
        return ToolClient(base_url=target, registry=registry, **options)


def live_registry(tools: Sequence[Tool], task_file: TaskFile) -> ToolRegistry:
    """The registry of the tools the task file uses, each with the dependencies its steps declare; an
    ``InputError`` naming a step's tool that the API does not have."""
    by_name = {t.name: t for t in tools}
    for i, task in enumerate(task_file.tasks):
        for j, tool in enumerate(task.required_tools):
            if tool not in by_name:
                raise InputError(f"tasks[{i}].steps[{j}].tool", f"tasks[{i}].steps[{j}].tool: {tool!r} is not a tool "
                                 f"of the API; it has {', '.join(sorted(by_name)) or 'none'}")
    used = [by_name[name] for name in task_file.tools]
    import networkx as nx  # only a task file's registry needs it

    deps = task_file.dependencies
    graph = nx.DiGraph()
    graph.add_nodes_from(t.name for t in used)
    graph.add_edges_from((d, t) for t, ds in deps.items() for d in ds)
    order = {n: i for i, n in enumerate(nx.lexicographical_topological_sort(graph))}
    levels = {n: 0 for n in graph}
    for n in nx.topological_sort(graph):
        for s in graph.successors(n):
            levels[s] = max(levels[s], levels[n] + 1)
    return ToolRegistry(tuple(
        dataclasses.replace(t, dependencies=deps.get(t.name, ()), dependency_metadata={
            "level": levels[t.name], "execution_order": order[t.name], "category": t.category})
        for t in used))


def service_openapi_url(base_url: str) -> str:
    """The OpenAPI document of our own tool service (``resilibench serve tools``) at ``base_url``."""
    return base_url.rstrip("/") + "/openapi.json"


def load_live_api(task_file: str | Path, openapi: str | None = None, base_url: str | None = None, *,
                  env: Sequence[str] = (), allow_command: bool = False) -> LiveApi:
    """A live API from a task file: tools from the MCP server the file names (``api.mcp``: a URL, or a
    command line, run only with ``allow_command``) or from the OpenAPI document ``openapi`` (a file or URL;
    default the file's ``api.openapi``, else the document of the tool service at ``base_url`` /
    ``api.service``), calls to ``base_url`` (default the file's ``api.base_url``, else the document's
    server), with the file's ``api.headers``. What a task file may do is the trust model of
    docs/envs/real_apis.md ("What a task file may do"): a header's ``${VAR}`` is read from the environment
    only when ``env`` names ``VAR`` (an unset one is refused), and such a header goes only to an origin
    the file or the caller names (``base_url``), never to one that only the OpenAPI document names."""
    spec = read_task_file(task_file)
    mcp = spec.api.get("mcp")
    if mcp is not None:
        if not isinstance(mcp, str) and not allow_command:
            raise InputError("api.mcp", f"{spec.path}: api.mcp starts the command {mcp!r:.120} with your rights; "
                             "allow it explicitly (allow_command, on the command line --api-allow-command)")
        cwd = None if isinstance(mcp, str) else spec.path.parent  # a command runs in the task file's folder
        with McpToolClient(mcp, cwd=cwd) as client:
            return dataclasses.replace(mcp_live_api(spec.path, client), source=str(mcp), mcp=mcp, mcp_cwd=cwd)
    base_url = base_url or spec.api.get("base_url") or spec.api.get("service")
    source = openapi or spec.api.get("openapi") or (service_openapi_url(base_url) if base_url else None)
    if source is None:
        raise InputError("api", f"{spec.path}: name the API: api.openapi (a document or URL), api.service "
                         "(a tool service's base URL) or api.mcp (an MCP server's URL or command), or give one")
    document, url = load_document(source, None if openapi else spec.path.parent)
    headers, secret = expand_headers(spec.api.get("headers") or {}, env)
    tools, endpoints = openapi_tools(document, base_url, spec.api.get("operations"), url, headers)
    if secret and base_url is None:
        sent_to = sorted({"{}://{}:{}".format(*origin(e.url)) for e in endpoints.values()})
        raise InputError("api.headers", f"{spec.path}: header(s) {secret} carry environment variables and would go "
                         f"to {', '.join(sent_to) or 'no server'}, named only by the OpenAPI document; name the "
                         "API's origin in api.base_url (or give its URL)")
    registry = live_registry(tools, spec)
    return LiveApi(spec.name, registry, spec.tasks, {n: endpoints[n] for n in registry.names}, spec.min_coverage,
                   str(source))


def expand_headers(headers: Mapping[str, str], env: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(the headers with their ``${VAR}`` / ``$VAR`` read from the environment, the names of the headers
    that used one). Only the variables ``env`` names are read; InputError naming the header for any other
    and for an allowed one that is unset (never sent literally)."""
    allowed, out, secret = set(env), {}, []
    for name, value in headers.items():
        where = f"api.headers.{name}"
        used = [m.group(1) if m.group(1) is not None else m.group(2) for m in _VARIABLE.finditer(value)]
        refused = sorted(v for v in set(used) if v not in allowed)
        if refused:
            raise InputError(where, f"{where} uses the environment variable(s) {refused}; a task file reads only "
                             "the variables the user names (env, on the command line --api-env VAR)")
        unset = sorted(v for v in set(used) if v not in os.environ)
        if unset:
            raise InputError(where, f"{where}: environment variable(s) {unset} are not set")
        out[name] = _VARIABLE.sub(lambda m: os.environ[m.group(1) if m.group(1) is not None else m.group(2)], value)
        if used:
            secret.append(name)
    check_headers(out, "api.headers")
    return out, secret
