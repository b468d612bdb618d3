"""The tool registry: 30 tools (6 categories x 5 operations), their schemas, errors and dependencies.

Everything here is data built once, deterministically, from the tables below. The dependency graph is
resolved from semantic-role rules into concrete tool names and checked to be acyclic; the simulator,
the bounds and every front end read it from here and nowhere else.
"""

from __future__ import annotations

__all__ = [
    "CATEGORIES", "ROLES", "ROLE_ALIASES", "DEPENDENCY_RULES", "COMMON_ERRORS", "CATEGORY_ERRORS",
    "DEPENDENCY_ERROR", "INVALID_INPUT", "OPERATION_PHRASES", "CATEGORY_PHRASES", "RETURN_VALUES",
    "topological_order", "Parameter", "Tool", "schema_problem", "role_of", "ToolRegistry", "default_registry",
    "named_tools",
]

import heapq
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cache, cached_property, lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx


CATEGORIES: dict[str, tuple[str, ...]] = {
    "data_processing": ("parser", "transformer", "validator", "aggregator", "filter"),
    "file_operations": ("reader", "writer", "scanner", "compressor", "converter"),
    "network": ("fetcher", "poster", "monitor", "validator", "router"),
    "computation": ("calculator", "analyzer", "optimizer", "simulator", "predictor"),
    "integration": ("connector", "authenticator", "mapper", "queue", "scheduler"),
    "utility": ("logger", "cache", "notifier", "tracker", "helper"),
}

# Semantic roles group operations across categories (aliases name operations that do not exist as tools).
ROLES: dict[str, tuple[str, ...]] = {
    "source": ("reader", "fetcher", "scanner", "authenticator"),
    "processor": ("parser", "transformer", "validator", "analyzer", "calculator"),
    "aggregator": ("aggregator",),
    "output": ("writer", "poster", "notifier"),
    "utility": ("logger", "cache", "tracker", "monitor"),
}
ROLE_ALIASES: dict[str, tuple[str, ...]] = {
    "aggregator": ("combiner", "merger"),
    "writer": ("exporter",),
}

# Dependency rules by operation: each entry is a list of groups; a tool needs one tool from every group,
# the first operation of a group that resolves (see ``_resolve_group``). "parser and/or reader" is one group.
DEPENDENCY_RULES: dict[str, tuple[tuple[str, ...], ...]] = {
    "transformer": (("parser", "reader"),),
    "validator": (("parser", "transformer"),),
    "analyzer": (("parser",), ("aggregator",)),
    "calculator": (("parser",), ("validator",)),
    "aggregator": (ROLES["processor"],),
    "writer": (("aggregator",) + ROLES["processor"],),
    "poster": (("aggregator",) + ROLES["processor"],),
    "notifier": (("aggregator",) + ROLES["processor"],),
}

COMMON_ERRORS: tuple[tuple[str, str], ...] = (
    ("INVALID_INPUT", "Input validation failed"),
    ("OPERATION_FAILED", "Operation could not be completed"),
    ("TIMEOUT", "Operation timed out"),
)
CATEGORY_ERRORS: dict[str, tuple[tuple[str, str], ...]] = {
    "data_processing": (("SCHEMA_MISMATCH", "Data does not match the expected schema"),),
    "file_operations": (
        ("FILE_NOT_FOUND", "Specified file not found"),
        ("PERMISSION_DENIED", "Insufficient permissions"),
    ),
    "network": (
        ("NETWORK_ERROR", "Network request failed"),
        ("RATE_LIMIT_ERROR", "Rate limit exceeded"),
    ),
    "computation": (
        ("CALCULATION_ERROR", "Computation produced an invalid result"),
        ("OVERFLOW", "Numeric overflow"),
    ),
    "integration": (
        ("AUTHENTICATION_FAILED", "Credentials were rejected"),
        ("SERVICE_UNAVAILABLE", "Remote service unavailable"),
    ),
    "utility": (("RESOURCE_EXHAUSTED", "Resource limit reached"),),
}
# Reserved for strict-dependency mode: never drawn at random, never in a tool's error list.
DEPENDENCY_ERROR = "DEPENDENCY_ERROR"
# Every tool's error list holds it; a front end that rejects a call's arguments answers with it (no draw).
INVALID_INPUT = "INVALID_INPUT"

OPERATION_PHRASES: dict[str, str] = {
    "parser": "parse raw input into a structured format",
    "transformer": "transform data from one format or shape into another",
    "validator": "validate data against a schema and report violations",
    "aggregator": "aggregate, combine and merge records into summaries",
    "filter": "filter records that match given criteria",
    "reader": "read and retrieve data from files",
    "writer": "write and export results to a file destination",
    "scanner": "scan directories and files to discover content",
    "compressor": "compress and decompress files and archives",
    "converter": "convert files between formats",
    "fetcher": "fetch data from a remote network endpoint or API",
    "poster": "post and send data to a remote network endpoint",
    "monitor": "monitor the health and status of network services",
    "router": "route requests between network endpoints",
    "calculator": "calculate numeric results from structured data",
    "analyzer": "analyze data and compute statistics and insights",
    "optimizer": "optimize parameters to improve an objective",
    "simulator": "simulate a process or model over time",
    "predictor": "predict future values from historical data",
    "connector": "connect to external systems and services",
    "authenticator": "authenticate and obtain access credentials for a service",
    "mapper": "map fields between schemas of different systems",
    "queue": "queue messages and jobs for asynchronous processing",
    "scheduler": "schedule jobs to run at given times",
    "logger": "log events and messages for auditing",
    "cache": "cache intermediate results for reuse",
    "notifier": "notify users or systems about results",
    "tracker": "track progress and state of running work",
    "helper": "provide general helper utilities",
}
CATEGORY_PHRASES: dict[str, str] = {
    "data_processing": "structured data records",
    "file_operations": "files on local or shared storage",
    "network": "network services and HTTP APIs",
    "computation": "numeric computation",
    "integration": "integration with external systems",
    "utility": "supporting utilities",
}

# Operation-specific return values beside the universal ``success`` and ``metadata``.
RETURN_VALUES: dict[str, tuple[str, str, str]] = {
    "reader": ("data", "object", "Retrieved data"),
    "fetcher": ("data", "object", "Fetched response data"),
    "scanner": ("data", "object", "Discovered items"),
    "parser": ("data", "object", "Parsed data"),
    "transformer": ("data", "object", "Transformed data"),
    "converter": ("data", "object", "Converted data"),
    "mapper": ("data", "object", "Mapped data"),
    "filter": ("data", "object", "Filtered records"),
    "aggregator": ("data", "object", "Aggregated data"),
    "validator": ("valid", "boolean", "Whether the data is valid"),
    "calculator": ("result", "number", "Calculated value"),
    "analyzer": ("result", "object", "Analysis results"),
    "optimizer": ("result", "object", "Optimised parameters"),
    "simulator": ("result", "object", "Simulation results"),
    "predictor": ("result", "object", "Predictions"),
    "writer": ("destination", "string", "Where the output was written"),
    "poster": ("response", "object", "Remote response"),
    "notifier": ("delivered", "boolean", "Whether the notification was delivered"),
    "compressor": ("size", "number", "Size of the result in bytes"),
    "authenticator": ("token", "string", "Access token"),
    "connector": ("connection_id", "string", "Connection identifier"),
    "queue": ("job_id", "string", "Queued job identifier"),
    "scheduler": ("job_id", "string", "Scheduled job identifier"),
    "logger": ("entry_id", "string", "Log entry identifier"),
    "cache": ("hit", "boolean", "Whether the value was cached"),
    "tracker": ("status", "object", "Tracked status"),
    "monitor": ("status", "object", "Service status"),
    "router": ("route", "string", "Chosen route"),
    "helper": ("result", "object", "Helper result"),
}

_SOURCE_OPS = {"reader", "parser", "scanner", "fetcher"}
_FORMAT_OPS = {"transformer", "converter", "mapper"}
_DATA_OPS = {"validator", "aggregator", "filter", "poster", "writer"}
_SCHEMA_OPS = {"validator", "mapper", "parser", "aggregator"}
_DESTINATION_OPS = {"writer", "poster", "notifier", "router"}
_FORMATS = ["json", "csv", "xml", "yaml", "parquet"]


def topological_order(count: int, edges: Iterable[tuple[int, int]], key: Callable[[int], Any] | None = None
                      ) -> Iterator[int]:
    """Nodes ``0 .. count-1`` in a topological order of ``edges`` (``(a, b)``: a before b): of the nodes ready,
    the one with the smallest ``key`` (default: its index) comes first. ``key(i)`` is read when ``i`` becomes
    ready, after all its predecessors were yielded. Nodes on a cycle are left out."""
    successors: list[list[int]] = [[] for _ in range(count)]
    indegree = [0] * count
    for a, b in edges:
        successors[a].append(b)
        indegree[b] += 1
    rank = key or (lambda i: i)
    ready = [(rank(i), i) for i in range(count) if indegree[i] == 0]
    heapq.heapify(ready)
    while ready:
        _, i = heapq.heappop(ready)
        yield i
        for j in successors[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (rank(j), j))


@dataclass(frozen=True)
class Parameter:
    """One input parameter of a tool."""

    name: str
    type: str
    description: str
    required: bool
    default: Any = None
    constraints: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    """A tool of the registry with its full schema (paper app. C.1.1)."""

    name: str
    description: str
    parameters: tuple[Parameter, ...]
    returns: tuple[dict[str, str], ...]
    errors: tuple[dict[str, str], ...]
    dependencies: tuple[str, ...]
    dependency_metadata: dict[str, Any]
    metadata: dict[str, Any]
    canonical_name: str
    aliases: tuple[str, ...]
    role: str | None

    @property
    def category(self) -> str:
        return self.metadata["category"]

    @property
    def operation(self) -> str:
        return self.metadata["operation"]

    @property
    def error_codes(self) -> tuple[str, ...]:
        return tuple(e["code"] for e in self.errors)

    def input_schema(self) -> dict[str, Any]:
        """The MCP-compatible JSON Schema (draft 2020-12) of the tool's inputs."""
        properties: dict[str, Any] = {}
        for p in self.parameters:
            prop: dict[str, Any] = {"type": p.type, "description": p.description, **p.constraints}
            if not p.required and p.default is not None:
                prop["default"] = p.default
            properties[p.name] = prop
        return {
            "type": "object",
            "properties": properties,
            "required": [p.name for p in self.parameters if p.required],
            "additionalProperties": False,
        }

    def check_arguments(self, arguments: Any) -> str | None:
        """Why ``arguments`` break the input schema (one line naming the argument), or None if they fit.

        The one argument check of the world: the text env and the MCP server answer a call whose
        arguments fail it with INVALID_INPUT."""
        return schema_problem(self.name, self._schema_json, arguments)

    @cached_property
    def _schema_json(self) -> str:
        return json.dumps(self.input_schema(), sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        """The tool as plain JSON-ready data, including its input schema."""
        data = asdict(self)
        data["parameters"] = [asdict(p) for p in self.parameters]
        data["input_schema"] = self.input_schema()
        return data


@cache
def _schema_validator(schema_json: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(schema_json))


def schema_problem(tool: str, schema_json: str, arguments: Any) -> str | None:
    """Why ``arguments`` break the JSON Schema ``schema_json`` (text, so validators are cached per schema),
    as one line naming ``tool`` and the argument; None when they fit. Answers are memoised per (schema,
    arguments as JSON): plans and agents repeat the same arguments, and a validation costs ~0.2 ms."""
    if not isinstance(arguments, dict):
        return f"{tool}: arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        text = json.dumps(arguments, sort_keys=True)
    except (TypeError, ValueError):
        text = None
    if text is None or json.loads(text) != arguments:  # not plain JSON (tuples, int keys...): as it is
        return _schema_problem(tool, schema_json, arguments)
    return _memo_schema_problem(tool, schema_json, text)


@lru_cache(maxsize=8192)
def _memo_schema_problem(tool: str, schema_json: str, arguments_json: str) -> str | None:
    return _schema_problem(tool, schema_json, json.loads(arguments_json))


def _schema_problem(tool: str, schema_json: str, arguments: dict) -> str | None:
    errors = sorted(_schema_validator(schema_json).iter_errors(arguments), key=lambda e: list(e.path))
    if not errors:
        return None
    error = errors[0]
    where = f"argument '{error.path[0]}'" if error.path else "arguments"
    accepted = ", ".join(json.loads(schema_json)["properties"]) or "none"
    return f"{tool}: {where}: {error.message} (accepted arguments: {accepted})"


def _parameters(category: str, operation: str) -> tuple[Parameter, ...]:
    params: list[Parameter] = []
    if operation in _SOURCE_OPS:
        params.append(Parameter("source", "string", "Source location or identifier", True))
    if operation in _FORMAT_OPS:
        fmt = {"enum": _FORMATS}
        params.append(Parameter("input_format", "string", "Format of the input data", True, None, fmt))
        params.append(Parameter("output_format", "string", "Desired output format", True, None, fmt))
    if operation in _DATA_OPS:
        params.append(Parameter("data", "object", "Data payload to process or send", True))
    if operation in _SCHEMA_OPS and operation != "parser":
        params.append(Parameter("schema", "object", "Schema to check or map the data against", False, {}))
    if operation in _DESTINATION_OPS:
        params.append(Parameter("destination", "string", "Target location or identifier", True))
    if category == "computation":
        params.append(
            Parameter("precision", "number", "Numerical precision", False, 1e-6, {"exclusiveMinimum": 0})
        )
    if category == "network":
        params.append(Parameter("timeout", "number", "Timeout in seconds", False, 30, {"minimum": 0}))
        params.append(Parameter("retry_count", "integer", "Retries on failure", False, 0, {"minimum": 0}))
    if operation not in _DATA_OPS:  # tools taking a data payload carry their settings in it
        params.append(Parameter("options", "object", "Additional options", False, {}))
    return tuple(params)


def _returns(operation: str) -> tuple[dict[str, str], ...]:
    name, typ, desc = RETURN_VALUES[operation]
    return (
        {"name": "success", "type": "boolean", "description": "Whether the operation succeeded"},
        {"name": name, "type": typ, "description": desc},
        {"name": "metadata", "type": "object", "description": "Operation metadata"},
    )


def role_of(operation: str) -> str | None:
    """The semantic role of an operation, or None for operations outside every role."""
    for role, ops in ROLES.items():
        if operation in ops:
            return role
    return None


def _resolve_group(tool_category: str, group: tuple[str, ...], names: list[str]) -> str:
    """Pick one concrete tool for a dependency group: first operation that exists, own category first."""
    for op in group:
        same = f"{tool_category}_{op}"
        if same in names:
            return same
        for name in names:
            if name.endswith(f"_{op}"):
                return name
    raise ValueError(f"no tool resolves dependency group {group}")


@cache
def _build() -> tuple[Tool, ...]:
    names = [f"{c}_{o}" for c, ops in CATEGORIES.items() for o in ops]
    deps: dict[str, tuple[str, ...]] = {}
    for category, ops in CATEGORIES.items():
        for op in ops:
            name = f"{category}_{op}"
            resolved = [_resolve_group(category, g, names) for g in DEPENDENCY_RULES.get(op, ())]
            deps[name] = tuple(dict.fromkeys(d for d in resolved if d != name))
    index = {n: i for i, n in enumerate(names)}
    edges = [(index[d], index[t]) for t, ds in deps.items() for d in ds]
    ordered = [names[i] for i in topological_order(len(names), edges, key=names.__getitem__)]  # by name when free
    if len(ordered) < len(names):
        raise ValueError(f"dependency rules resolve to a cycle among {sorted(set(names) - set(ordered))}")
    levels = {n: 0 for n in names}
    for n in ordered:
        for t, ds in deps.items():
            if n in ds:
                levels[t] = max(levels[t], levels[n] + 1)
    order = {n: i for i, n in enumerate(ordered)}

    tools = []
    for category, ops in CATEGORIES.items():
        for op in ops:
            name = f"{category}_{op}"
            errors = COMMON_ERRORS + CATEGORY_ERRORS[category]
            tools.append(
                Tool(
                    name=name,
                    description=(
                        f"This tool is designed to {OPERATION_PHRASES[op]}, working with {CATEGORY_PHRASES[category]}."
                    ),
                    parameters=_parameters(category, op),
                    returns=_returns(op),
                    errors=tuple({"code": c, "description": d} for c, d in errors),
                    dependencies=deps[name],
                    dependency_metadata={
                        "level": levels[name],
                        "execution_order": order[name],
                        "category": category,
                    },
                    metadata={"category": category, "operation": op, "version": "1.0.0"},
                    canonical_name=name,
                    aliases=tuple(f"{category}_{a}" for a in ROLE_ALIASES.get(op, ())),
                    role=role_of(op),
                )
            )
    return tuple(tools)


class ToolRegistry:
    """Read-only view of the 30 tools with index lookups used on hot paths."""

    def __init__(self, tools: tuple[Tool, ...]):
        self.tools = tools
        self.names: tuple[str, ...] = tuple(t.name for t in tools)
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        alias_index = {a: self.index[t.name] for t in tools for a in t.aliases}
        self._lookup = {**alias_index, **self.index}
        self.dependency_ids: tuple[tuple[int, ...], ...] = tuple(
            tuple(self.index[d] for d in t.dependencies) for t in tools
        )
        self.output_ids: frozenset[int] = frozenset(i for i, t in enumerate(tools) if t.role == "output")

    def __len__(self) -> int:
        return len(self.tools)

    def __getitem__(self, name_or_id: str | int) -> Tool:
        if isinstance(name_or_id, int):
            return self.tools[name_or_id]
        return self.tools[self.id_of(name_or_id)]

    def __contains__(self, name: str) -> bool:
        return name in self._lookup

    def id_of(self, name: str) -> int:
        """Index of a tool by canonical name or alias; a clear KeyError otherwise."""
        try:
            return self._lookup[name]
        except KeyError:
            raise KeyError(f"unknown tool {name!r}; known tools: {', '.join(self.names)}") from None

    def dependency_graph(self) -> nx.DiGraph:
        """Edges point from a dependency to the tool that needs it."""
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from(self.names)
        graph.add_edges_from((d, t.name) for t in self.tools for d in t.dependencies)
        return graph

    def ancestors(self, tool_id: int) -> frozenset[int]:
        """All tools that ``tool_id`` depends on, directly or transitively."""
        seen: set[int] = set()
        stack = list(self.dependency_ids[tool_id])
        while stack:
            d = stack.pop()
            if d not in seen:
                seen.add(d)
                stack.extend(self.dependency_ids[d])
        return frozenset(seen)

    def to_dict(self) -> dict[str, Any]:
        """The registry as JSON-ready data: tools, roles, rules and the resolved dependency edges."""
        return {
            "version": "1.0.0",
            "tools": {t.name: t.to_dict() for t in self.tools},
            "roles": {k: list(v) for k, v in ROLES.items()},
            "dependency_rules": {k: [list(g) for g in v] for k, v in DEPENDENCY_RULES.items()},
            "dependency_edges": [[d, t.name] for t in self.tools for d in t.dependencies],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


@cache
def default_registry() -> ToolRegistry:
    """The registry every front end shares."""
    return ToolRegistry(_build())


@cache
def _tool_name_pattern(registry: ToolRegistry) -> re.Pattern[str]:
    names = {n for t in registry.tools for n in (t.name, *t.aliases)}
    words = sorted({w for n in names for w in (n, n.replace("_", " "), n.replace("_", "-"))}, key=len, reverse=True)
    return re.compile(r"(?<![a-z])(" + "|".join(re.escape(w) for w in words) + r")(?![a-z])", re.IGNORECASE)


def named_tools(text: str, registry: ToolRegistry | None = None) -> list[str]:
    """Tool names, aliases or names written with spaces or hyphens that occur in ``text``."""
    return [m.group(1) for m in _tool_name_pattern(registry or default_registry()).finditer(text)]
