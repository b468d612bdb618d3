"""What an agent can do with the 30 tools through text: search them, read one's schema, call one.

Shared by the text env (``ResiliBenchText-v1``) and the MCP server so both answer the same way. Calls go
through ``call_tool``, which checks arguments with the tool's own schema (``Tool.check_arguments``) and
plays the call on the shared ``Episode``; no rule of the world lives here.
"""

from __future__ import annotations

__all__ = [
    "SEARCH_METHODS", "EXTRA_ERRORS", "UnknownToolError", "SearchSettings", "ToolHit", "search_method",
    "search_tools", "search_tools_many", "TAG_SEARCH_HINT", "FUNCTION_SEARCH_HINT", "resolve_tool", "describe_tool",
    "describe_text", "search_text", "ToolCall", "ParsedMessage", "TAGS", "call_with_arguments", "parse_call",
    "parse_message", "message_completes", "CallResult", "call_output", "default_arguments", "call_tool",
    "progress_text", "no_calls_left", "process_text", "feedback_text", "end_text", "PROTOCOLS", "WORDINGS",
    "SEARCH_FUNCTION", "INFO_FUNCTION", "function_schemas",
]

import difflib
import json
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from resilibench.settings import Settings, setting

from ..config import EvaluatorConfig
from ..evaluator import signals_completion
from ..matching import LexicalMatcher, embed, embedding_installed, tool_text
from ..processes import RATE_LIMIT_ERROR, SERVICE_UNAVAILABLE, TIMEOUT
from ..registry import DEPENDENCY_ERROR, INVALID_INPUT, Tool, ToolRegistry, default_registry
from ..simulator import RETRY_LIMIT_ERROR, CallRecord, Episode
from ..tasks.library import Task

SEARCH_METHODS = ("auto", "semantic", "lexical")

# Descriptions of the error codes that are not in any tool's error list.
EXTRA_ERRORS = {
    DEPENDENCY_ERROR: "Required dependencies have not succeeded yet",
    RETRY_LIMIT_ERROR: "Call limit for this tool reached",
    RATE_LIMIT_ERROR: "Rate limit exceeded",  # the failure processes' codes, for tools that do not list them
    SERVICE_UNAVAILABLE: "Remote service unavailable",
}


class UnknownToolError(KeyError):
    """A tool name that is neither a tool nor an alias; the message lists close matches."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


# --- search -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchSettings(Settings):
    """How an agent's tool searches are answered: the ``method``, and ``k``: how many tools a search shows."""

    method: str = setting("auto", choices=SEARCH_METHODS, help="semantic (MiniLM embeddings), lexical, or auto "
                          "(semantic when the embed extra is installed)")
    k: int = setting(5, bounds=(1, None), help="tools a search shows")


@dataclass(frozen=True)
class ToolHit:
    """One search result: a tool name and its similarity to the query."""

    name: str
    score: float


@cache
def _tool_texts(registry: ToolRegistry) -> tuple[str, ...]:
    return tuple(tool_text(t) for t in registry.tools)


@cache
def _tool_embeddings(registry: ToolRegistry) -> np.ndarray:
    """Unit-norm embeddings of every tool's text, computed once per registry."""
    return embed(_tool_texts(registry))


@lru_cache(maxsize=8)
def _encoded_tools(encoder: Callable[[Sequence[str]], np.ndarray], registry: ToolRegistry) -> np.ndarray:
    """``encoder``'s embeddings of every tool's text, computed once per encoder and registry."""
    return encoder(_tool_texts(registry))


def search_method(method: str = "auto") -> str:
    """The method ``search_tools`` uses for ``method``: 'semantic' or 'lexical' ('auto' picks semantic
    when the embed extra is installed; deciding loads nothing: the model loads at the first semantic search)."""
    if method not in SEARCH_METHODS:
        raise ValueError(f"method must be one of {SEARCH_METHODS}, got {method!r}")
    if method == "auto":
        return "semantic" if embedding_installed() else "lexical"
    return method


def search_tools(query: str, k: int = 5, registry: ToolRegistry | None = None,
                 method: str = "auto") -> list[ToolHit]:
    """The ``k`` tools whose text is most similar to ``query``, best first (ties by name).

    Semantic search embeds the query with the local MiniLM model (tool embeddings cached); the lexical
    fallback is the task generator's stemmed-token cosine. Scores are rounded to 4 places."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    ranked = _ranking(_clean_query(query), registry or default_registry(), search_method(method))
    return _top(ranked, k)


def search_tools_many(queries: Sequence[str], k: int = 5, registry: ToolRegistry | None = None,
                      method: str = "auto", encoder: Callable[[Sequence[str]], np.ndarray] | None = None
                      ) -> list[list[ToolHit]]:
    """``search_tools`` of every query, the similarities computed in one batch (semantic search embeds
    all queries at once, about three times faster per query than one by one). ``encoder`` (texts to
    unit-norm rows) searches semantically with another embedding model than the shipped MiniLM, such as
    a retriever tuned on train instructions (``robust_train.retriever``); ``method`` is then unused."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    for query in queries:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("every query must be a non-empty string")
    registry = registry or default_registry()
    cleaned = [_clean_query(q) for q in queries]
    if not cleaned:
        return []
    if encoder is None:
        similarities = _similarities(cleaned, registry, search_method(method))
    else:
        similarities = np.asarray(encoder(cleaned) @ _encoded_tools(encoder, registry).T, dtype=np.float64)
    return [_top(_ranked(registry, row), k) for row in similarities]


def _clean_query(query: str) -> str:
    return query.encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> "?" (tokenizers refuse them)


def _top(ranked: tuple[tuple[float, str], ...], k: int) -> list[ToolHit]:
    return [ToolHit(name, -s + 0.0) for s, name in ranked[:k]]


def _similarities(queries: Sequence[str], registry: ToolRegistry, method: str) -> np.ndarray:
    """One row per query: its similarity to every tool's text."""
    if method == "semantic":
        return np.asarray(embed(queries) @ _tool_embeddings(registry).T, dtype=np.float64)
    return LexicalMatcher().similarity(queries, _tool_texts(registry))


def _ranked(registry: ToolRegistry, scores: np.ndarray) -> tuple[tuple[float, str], ...]:
    """(-score, name) of every tool, best first (ties by name), scores rounded to 4 places."""
    return tuple(sorted((-round(float(s), 4), name) for name, s in zip(registry.names, scores, strict=True)))


@lru_cache(maxsize=4096)
def _ranking(query: str, registry: ToolRegistry, method: str) -> tuple[tuple[float, str], ...]:
    """``_ranked`` of one query; cached because agents repeat their queries."""
    return _ranked(registry, _similarities([query], registry, method)[0])


# --- tool information ---------------------------------------------------------------------------------


TAG_SEARCH_HINT = "search with <tool_search>query</tool_search>"
FUNCTION_SEARCH_HINT = "call tool_search with what you need"


def resolve_tool(name: str, registry: ToolRegistry | None = None, search_hint: str = TAG_SEARCH_HINT) -> int:
    """The id of a tool by name or alias, forgiving case, surrounding quotes and spaces or hyphens for
    underscores; ``UnknownToolError`` listing close matches otherwise, or ``search_hint`` when there are
    none (worded for the front end: the text env's tags by default)."""
    registry = registry or default_registry()
    if not isinstance(name, str):
        raise UnknownToolError(f"tool name must be a string, got {type(name).__name__}")
    key = re.sub(r"[\s\-]+", "_", name.strip().strip("`'\"").strip().lower())
    if key in registry:
        return registry.id_of(key)
    folded = _folded_names(registry).get(key)  # a live API's camelCase names (getFact)
    if folded is not None:
        return folded
    known = list(registry.names) + [a for t in registry.tools for a in t.aliases]
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; {search_hint}"
    raise UnknownToolError(f"unknown tool {name!r}{hint}")


@cache
def _folded_names(registry: ToolRegistry) -> dict[str, int]:
    """Tool ids by name and alias written as ``resolve_tool`` reads a request: lower case, underscores."""
    return {n.lower(): registry.id_of(n) for t in registry.tools for n in (t.name, *t.aliases)}


def describe_tool(name: str, registry: ToolRegistry | None = None) -> dict[str, Any]:
    """A tool's schema as JSON-ready data: name, description, parameters, input schema, returns,
    errors, dependencies (and category, operation, role, aliases)."""
    registry = registry or default_registry()
    tool = registry.tools[resolve_tool(name, registry)]
    data = tool.to_dict()
    return {
        "name": tool.name,
        "description": tool.description,
        "category": tool.category,
        "operation": tool.operation,
        "role": tool.role,
        "aliases": list(tool.aliases),
        "parameters": data["parameters"],
        "input_schema": data["input_schema"],
        "returns": [dict(r) for r in tool.returns],
        "errors": [dict(e) for e in tool.errors],
        "dependencies": list(tool.dependencies),
    }


def describe_text(info: dict[str, Any], score: float | None = None) -> str:
    """A tool description (``describe_tool``'s dict) as the text an agent reads."""
    lines = [info["name"], f"  Category: {info['category']}", f"  Description: {info['description']}"]
    if score is not None:
        lines.append(f"  Relevance: {score:.2f}")
    lines.append("  Parameters:" if info["parameters"] else "  Parameters: none")
    for p in info["parameters"]:
        extra = "REQUIRED" if p["required"] else f"OPTIONAL, default={json.dumps(p['default'])}"
        allowed = f", one of {p['constraints']['enum']}" if "enum" in p["constraints"] else ""
        lines.append(f"  - {p['name']} ({p['type']}{allowed}): {p['description']} [{extra}]")
    lines.append("  Returns:")
    lines += [f"  - {r['name']} ({r['type']}): {r['description']}" for r in info["returns"]]
    lines.append("  Possible errors:")
    lines += [f"  - {e['code']}: {e['description']}" for e in info["errors"]]
    lines.append(f"  Requires: {', '.join(info['dependencies']) or 'nothing'}")
    return "\n".join(lines)


def search_text(query: str, hits: list[ToolHit], registry: ToolRegistry | None = None) -> str:
    """Search results as the text an agent reads: every hit with its description and relevance."""
    registry = registry or default_registry()
    head = f"Tool search results for {query!r}: {', '.join(h.name for h in hits)}"
    body = [f"{i}. " + describe_text(describe_tool(h.name, registry), h.score) for i, h in enumerate(hits, 1)]
    return "\n".join([head, *body])


# --- parsing assistant messages -----------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A ``<tool_call>`` as written: the name, the JSON arguments if any, and what was wrong with them."""

    name: str
    arguments: dict | None
    problem: str | None


@dataclass(frozen=True)
class ParsedMessage:
    """Everything understood in one assistant message."""

    searches: tuple[str, ...]
    infos: tuple[str, ...]
    calls: tuple[ToolCall, ...]
    completes: bool

    @property
    def has_tags(self) -> bool:
        return bool(self.searches or self.infos or self.calls)

    def to_dict(self) -> dict[str, Any]:
        return {
            "searches": list(self.searches),
            "infos": list(self.infos),
            "calls": [{"name": c.name, "arguments": c.arguments, "problem": c.problem} for c in self.calls],
            "completes": self.completes,
        }


TAGS = ("tool_search", "tool_info", "tool_call")
_OPEN = re.compile(r"<\s*(tool_search|tool_info|tool_call)\s*>", re.IGNORECASE)
# A fence with its language tag; a word right after the backticks is a tag only when a line break follows.
_FENCE = re.compile(r"```(?:[A-Za-z0-9_+-]*[ \t]*(?=\r?\n))?")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _tag_contents(text: str) -> list[tuple[str, str]]:
    """(tag, content) pairs in order. A tag without its closing tag runs to the next opening tag or the
    end of the message (generation often stops right before the closing tag)."""
    opens = list(_OPEN.finditer(text))
    out = []
    for i, match in enumerate(opens):
        tag = match.group(1).lower()
        end = opens[i + 1].start() if i + 1 < len(opens) else len(text)
        segment = text[match.end():end]
        close = re.search(rf"<\s*/\s*{tag}\s*>", segment, re.IGNORECASE)
        out.append((tag, segment[: close.start()] if close else segment))
    return out


def _clean(content: str) -> str:
    """Content without code fences and surrounding whitespace or backticks."""
    return _FENCE.sub("", content).strip().strip("`").strip()


def _load_json(text: str, leading: bool = False) -> tuple[Any, str | None]:
    """(value, None) for valid JSON, else (None, what was wrong); with ``leading`` the JSON value at the
    start of ``text``, whatever text follows it. Numbers past Python's integer-digit limit and nesting
    past the recursion limit are malformed JSON here, not exceptions."""
    try:
        if leading:
            return json.JSONDecoder().raw_decode(text)[0], None
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"malformed JSON arguments ({exc.msg} at position {exc.pos})"
    except ValueError:  # Python's integer string conversion limit
        return None, "malformed JSON arguments (a number has too many digits)"
    except RecursionError:
        return None, "malformed JSON arguments (nested too deeply)"


def call_with_arguments(name: str, arguments: Any) -> ToolCall:
    """A call of ``name`` with ``arguments`` as written: None or blank (none given), a JSON text or an
    object; malformed JSON or a non-object is the call's ``problem``."""
    if isinstance(arguments, str):
        if not arguments.strip():
            return ToolCall(name, None, None)
        arguments, problem = _load_json(arguments)
        if problem is not None:
            return ToolCall(name, None, problem)
    if isinstance(arguments, dict):
        try:
            json.dumps(arguments)
        except (TypeError, ValueError) as exc:  # a Python object that JSON cannot carry, or a cycle
            return ToolCall(name, None, f"arguments must hold JSON values only: {exc}")
    if arguments is None or isinstance(arguments, dict):
        return ToolCall(name, arguments, None)
    return ToolCall(name, None, f"arguments must be a JSON object, got {type(arguments).__name__}")


def parse_call(content: str) -> ToolCall:
    """``name``, ``name {json}``, ``name({json})`` or ``{"name": ..., "arguments": {...}}`` -> ToolCall.
    Text after the JSON arguments, or prose after a name without arguments, is not part of the call."""
    content = _clean(content)
    if content.startswith("{"):
        data, _ = _load_json(content, leading=True)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            return call_with_arguments(data["name"].strip(), data.get("arguments", data.get("parameters")))
    match = _NAME.match(content)
    if not match:
        return ToolCall("", None, "no tool name: write <tool_call>tool_name {\"argument\": value}</tool_call>")
    name, rest = match.group(0), _clean(content[match.end():])
    if rest.startswith("("):
        rest = rest[1:].strip()
    if not rest.startswith(("{", "[")):
        return ToolCall(name, None, None)  # no arguments (what follows the name is prose)
    arguments, problem = _load_json(rest, leading=True)
    return call_with_arguments(name, arguments) if problem is None else ToolCall(name, None, problem)


def parse_message(text: str, config: EvaluatorConfig | None = None) -> ParsedMessage:
    """Parse an assistant message: its searches, info requests, tool calls (in order) and whether it
    signals completion (``signals_completion`` with the phrases of ``config``)."""
    if not isinstance(text, str):
        raise TypeError(f"message must be a string, got {type(text).__name__}")
    searches: list[str] = []
    infos: list[str] = []
    calls: list[ToolCall] = []
    for tag, content in _tag_contents(text):
        if tag == "tool_search":
            searches.append(_clean(content))
        elif tag == "tool_info":
            infos.append(_clean(content))
        else:
            calls.append(parse_call(content))
    return ParsedMessage(tuple(searches), tuple(infos), tuple(calls), message_completes(text, config))


_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`", re.DOTALL)
_QUOTED = re.compile(r'"[^"\n]*"|\u201c[^\u201d\n]*\u201d|(?<![A-Za-z])\'[^\'\n]*\'(?![A-Za-z])')
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
# Words that make a sentence a rule, a condition or a plan about completion rather than a statement of it.
_NOT_A_STATEMENT = re.compile(r"\b(?:when|once|if|after|until|before|unless|say|says|saying|write|reply|respond|"
                              r"indicate|should|must|will|would|not|n't)\b", re.IGNORECASE)


def message_completes(text: str, config: EvaluatorConfig | None = None) -> bool:
    """Whether an assistant message states, in its own words, that the task is complete: a sentence
    with a completion phrase (``signals_completion``) outside code, backticks and quotes, that is not a
    rule, a condition, a plan, a negation or a question ("When the task is done, say ...", "I will say
    ...", "task complete?")."""
    text = _QUOTED.sub(" ", _CODE.sub(" ", text))
    return any(signals_completion(sentence, config) and not _NOT_A_STATEMENT.search(sentence)
               and not sentence.rstrip().endswith("?") for sentence in _SENTENCE_END.split(text))


# --- calling a tool -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallResult:
    """A played call: the episode's record, the argument problem (if the call was rejected for its
    arguments) and the payload an agent sees."""

    record: CallRecord
    message: str | None
    output: dict[str, Any]


def _digest(*parts: str) -> int:
    return zlib.crc32(":".join(parts).encode())


def _simulated_value(spec: dict[str, str], tool: Tool, episode: Episode) -> Any:
    """A deterministic value for one return field of a successful call (a function of task and tool
    only, so a replayed call returns the same result)."""
    task = episode.task
    digest = _digest(task.instance_id, tool.name, spec["name"])
    source = task.inputs.get("source", "input")
    fmt = task.inputs.get("output_format", task.expected_outputs.get("metadata", {}).get("output_format", "json"))
    if spec["type"] == "boolean":
        return True
    if spec["type"] == "number":
        return round(1 + digest % 100_000 / 100, 2)
    if spec["type"] == "string":
        if spec["name"] == "destination":
            return f"output/{task.instance_id}.{fmt}"
        if spec["name"] == "route":
            return f"route-{digest % 16}"
        return f"{spec['name'].removesuffix('_id')}_{digest:08x}"
    return {"source": source, "records": 10 + digest % 990, "format": fmt, "content": spec["description"]}


def _error_description(tool: Tool, code: str) -> str:
    for error in tool.errors:
        if error["code"] == code:
            return error["description"]
    return EXTRA_ERRORS.get(code, code)


def call_output(episode: Episode, result_record: CallRecord, message: str | None = None,
                real: Any = None) -> dict[str, Any]:
    """The payload of a played call: the result (the real response body ``real`` of a real-API call as
    ``data``, else the simulated result shaped by the tool's ``returns``) or the error, unmet dependencies,
    progress and turns left."""
    tool = episode.registry[result_record.tool]
    if result_record.success:
        if real is not None:
            output: dict[str, Any] = {"data": real}
        else:
            output = {r["name"]: _simulated_value(r, tool, episode) for r in tool.returns
                      if r["name"] not in ("success", "metadata")}
        output = {"success": True, **output, "metadata": {
            "tool": tool.name, "category": tool.category, "operation": tool.operation,
            "version": tool.metadata["version"], "replayed": result_record.replayed}}
    else:
        code = result_record.error_code
        assert code is not None  # a failed call has its error code
        description = message if message is not None else _error_description(tool, code)
        output = {"success": False, "error": {"code": code, "description": description}}
    done = sum(episode.succeeded[t] for t in episode.required)
    output["unmet_dependencies"] = list(result_record.unmet_dependencies)
    output["progress"] = {"required_done": done, "required_total": len(episode.required)}
    output["turns_left"] = episode.turns_left
    if result_record.duration is not None:  # failure processes on
        output["duration"], output["retry_after"] = result_record.duration, result_record.retry_after
        output["time_left"] = episode.time_left
    output["episode_end"] = episode.end_reason
    return output


def default_arguments(task: Task, tool: Tool) -> dict[str, Any]:
    """What a call to a live API sends when the agent gave no arguments (the simulator, and our tool
    service, play such a call as it is): the task's own arguments for the tool (a task file's step
    ``arguments``), else arguments valid under the tool's schema filled from the task's inputs, else none."""
    from ..arguments import task_hints, valid_arguments

    given = task.metadata.get("arguments", {}).get(tool.name) if isinstance(task.metadata, dict) else None
    if isinstance(given, dict):
        return dict(given)
    try:
        return valid_arguments(tool, task_hints(task))
    except ValueError:  # a live tool whose schema the defaults do not fit: the API answers
        return {}


def call_tool(episode: Episode, name: str, arguments: dict | None = None,
              problem: str | None = None, executor: Any = None) -> CallResult:
    """Call a tool by name on ``episode`` (the one way a front end calls a tool).

    An unknown name raises ``UnknownToolError`` before anything happens (no turn is spent). Given
    ``arguments`` are checked with the tool's schema; a failed check, or a ``problem`` the caller
    already found (malformed JSON), makes the call an INVALID_INPUT failure without a draw whose
    message names the argument. Without arguments the call is played as is.

    ``executor``: real-API mode (the ``envs.real_api.client.HttpExecutor`` of this episode). Where the
    simulator would draw, the tool is called for real with the arguments (none given: as they are to our
    tool service, which plays such a call as the simulator does, else ``default_arguments``); a success
    shows the real response body, a failure what the wire said."""
    tool_id = resolve_tool(name, episode.registry)
    tool = episode.registry.tools[tool_id]
    if problem is None and arguments is not None:
        problem = tool.check_arguments(arguments)
    if executor is None:
        record, real, wire = episode.call(tool_id, invalid_input=problem is not None), None, None
    else:
        sent = len(executor.outcomes)
        if arguments is None and not executor.mirror:  # our tool service plays an argument-less call as is
            arguments = default_arguments(episode.task, tool)
        record = executor.call(tool_id, arguments, invalid_input=problem is not None)
        real, wire = _real_result(executor, sent, record)
    message = wire or (problem if record.error_code == INVALID_INPUT and problem is not None else None)
    return CallResult(record, message, call_output(episode, record, message, real))


def _real_result(executor: Any, sent: int, record: CallRecord) -> tuple[Any, str | None]:
    """(response body of a successful real call, else None; what the wire said of a failed one, else None).
    A replay shows the body of the tool's earlier success; a call answered without a request, neither."""
    if record.replayed:
        earlier = [o.output for o in executor.outcomes if o.success and o.tool == record.tool]
        return (earlier[-1] if earlier else None), None
    if len(executor.outcomes) == sent:
        return None, None
    outcome = executor.outcomes[-1]
    if outcome.success:
        return (outcome.output if outcome.output is not None else {}), None
    status = f"HTTP {outcome.status}" if outcome.status is not None else "no response"
    return None, f"{outcome.description or outcome.error_class} ({status})"


def progress_text(episode: Episode) -> str:
    """'k/n required tools done; t turns left' (and the time left, with a time budget)."""
    done = sum(episode.succeeded[t] for t in episode.required)
    time_left = episode.time_left
    time = "" if time_left is None else f"; {time_left:g} s of time left"
    return f"Progress: {done}/{len(episode.required)} required tools done; {episode.turns_left} turns left{time}."


def no_calls_left(episode: Episode) -> str:
    """Why no call is possible any more: 'No turns left', or 'No time left' once a time budget is spent."""
    return "No time left" if episode.time_left == 0 else "No turns left"


def process_text(record: CallRecord, episode: Episode) -> str | None:
    """What a failure process did to a call, in words (None when none did): a rate-limit refusal and its
    wait, an outage, a timeout and the time it cost."""
    if record.error_code == RATE_LIMIT_ERROR and record.retry_after is not None:
        if record.retry_after == 0:
            return "Rate limited; it answers again from the next turn."
        turns = "turn" if record.retry_after == 1 else "turns"
        return f"Rate limited; retry after {record.retry_after} {turns}."
    if record.error_code == SERVICE_UNAVAILABLE and record.probability is None and record.duration is not None:
        return "The service is unavailable (an outage); it may stay down for a while."
    if record.error_code == TIMEOUT and record.probability is None and record.duration is not None:
        return f"The call timed out after {record.duration:g} s; {episode.time_used:g} s of call time used so far."
    return None


def feedback_text(result: CallResult, episode: Episode) -> str:
    """The feedback an agent reads after a call: result or error (code and description), dependency
    problems, progress and turns left, and the end of the episode if it ended."""
    record, output = result.record, result.output
    if record.success:
        payload = {k: v for k, v in output.items() if k not in ("unmet_dependencies", "progress", "turns_left",
                                                                 "episode_end", "duration", "retry_after",
                                                                 "time_left")}
        again = " (already succeeded earlier; returning the earlier result)" if record.replayed else ""
        lines = [f"{record.tool} executed successfully{again}.",
                 "Output: " + json.dumps(payload, sort_keys=True)]
    else:
        error = output["error"]
        lines = [f"{record.tool} failed.", f"Error: {error['code']}: {error['description']}"]
        if record.error_code == RETRY_LIMIT_ERROR:
            lines.append(f"This tool may be called at most {episode.max_calls} times in this task.")
        process = process_text(record, episode)
        if process is not None:
            lines.append(process)
    if record.unmet_dependencies:
        lines.append("Dependency problems:")
        for dep in record.unmet_dependencies:
            state = "failed so far" if episode.calls[episode.registry.id_of(dep)] else "not executed yet"
            lines.append(f"- {dep} must succeed first ({state})")
        lines.append("Recommendation: execute the required dependencies first, then retry this tool.")
    lines.append(progress_text(episode))
    if episode.done:
        lines.append(end_text(episode))
    return "\n".join(lines)


def end_text(episode: Episode) -> str:
    """One line on how the episode ended and its level."""
    if episode.end_reason is None:
        raise ValueError("the episode has not ended")
    level = episode.evaluation.level if episode.evaluation is not None else "unknown"
    return f"Episode ended ({episode.end_reason.replace('_', ' ')}); result: {level}."


# --- native tool calling ------------------------------------------------------------------------------

PROTOCOLS = ("tags", "tools")  # how an agent uses tools: tags in its text, or native function calls
# How a prompt words the tag protocol: "plain" (default) writes no live example request, "paper" is the
# paper's wording with its example searches written as tags (decision 91, docs/decisions/text_protocol_and_prompts.md).
WORDINGS = ("plain", "paper")
SEARCH_FUNCTION, INFO_FUNCTION = "tool_search", "tool_info"


def function_schemas(registry: ToolRegistry | None = None) -> list[dict[str, Any]]:
    """The tools as OpenAI-style function schemas (``{"type": "function", "function": {...}}``):
    ``tool_search`` and ``tool_info``, then every tool with its input JSON Schema."""
    registry = registry or default_registry()

    def function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}

    def one_string(field: str, description: str) -> dict[str, Any]:
        return {"type": "object", "properties": {field: {"type": "string", "description": description}},
                "required": [field], "additionalProperties": False}

    return [
        function(SEARCH_FUNCTION, "Find tools for a need: the closest tools with their parameters and relevance.",
                 one_string("query", "what you need, in a few words")),
        function(INFO_FUNCTION, "Read one tool's parameters, returns, errors and dependencies.",
                 one_string("name", "the tool's name")),
        *(function(t.name, t.description, t.input_schema()) for t in registry.tools),
    ]
