"""Flawed workflows (paper C.3; docs/core/prompts.md): seven flaw types, two injection methods each.

``inject_flaw`` perturbs a plan reproducibly from a seed and records every change it made. Severity is
the share of the eligible positions that are changed (at least one); the positions are a seeded
permutation of the eligible ones, so a higher severity changes a superset of what a lower one changes.
Reordering methods move the steps and keep the plan's edges on their positions (the plan keeps its
shape, its steps are out of place); removals connect a removed step's prerequisites to its dependents;
insertions link the new step after the one before it and before the one after it.

Similar tools come from the cosine similarity of the tools' texts (``core.tasks.library.tool_text``) under the
local sentence-embedding model, or a deterministic lexical similarity when it is not installed. The
embedding model's table for the shared registry ships with the package (``data/tool_similarity.json``, checked
against the model by a test), so injecting a flaw loads no model; other registries' tables and the lexical
one are computed once per process.
"""

from __future__ import annotations

__all__ = [
    "FLAW_TYPES", "FLAW_METHODS", "VALIDATION_OPERATIONS", "UNNEEDED_OPERATIONS", "SIMILAR_CANDIDATES",
    "WRONG_TYPE_VALUES", "FORMATS", "FlawNotApplicable", "FlawInjection", "MATCHERS", "tool_similarity",
    "similar_tools", "applicable_positions", "flaw_applies", "Applier", "APPLIERS", "inject_flaw",
]

import hashlib
import json
import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from typing import Any

import numpy as np

from ..arguments import valid_arguments
from ..matching import embedding_installed, make_matcher, tool_text
from ..registry import OPERATION_PHRASES, ToolRegistry, default_registry, topological_order
from ..workflow import Node, Workflow

FLAW_TYPES = ("order", "tool_misuse", "parameter", "missing_step", "redundant", "logic_discontinuity",
              "semantic_drift")
FLAW_METHODS: dict[str, tuple[str, str]] = {
    "order": ("adjacent_swap", "dependency_violation"),
    "tool_misuse": ("similar_tool", "category_mismatch"),
    "parameter": ("missing_required", "wrong_type"),
    "missing_step": ("middle_removal", "validation_removal"),
    "redundant": ("duplicate_step", "unneeded_insertion"),
    "logic_discontinuity": ("format_mismatch", "unrelated_insertion"),
    "semantic_drift": ("progressive_replacement", "description_drift"),
}
VALIDATION_OPERATIONS = ("validator",)  # quality-assurance steps for ``validation_removal``
UNNEEDED_OPERATIONS = ("logger", "cache", "tracker", "helper", "monitor")  # harmless bookkeeping tools
SIMILAR_CANDIDATES = 3  # a similar tool is drawn from this many nearest ones
# A value of the wrong JSON type for a parameter of each type (``wrong_type``).
WRONG_TYPE_VALUES: dict[str, Any] = {"string": 42, "object": "see the previous step", "number": "fast",
                                     "integer": "three", "boolean": "yes"}
FORMATS = ("json", "csv", "xml", "yaml", "parquet")


class FlawNotApplicable(ValueError):
    """The requested flaw cannot be injected into this workflow (nothing eligible)."""


@dataclass(frozen=True)
class FlawInjection:
    """A flawed workflow, the workflow it came from, and what was changed (position, before, after, reason)."""

    original: Workflow
    workflow: Workflow
    flaw_type: str
    method: str
    severity: float
    seed: int
    changes: tuple[dict, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flaw_type": self.flaw_type,
            "method": self.method,
            "severity": self.severity,
            "seed": self.seed,
            "changes": [dict(c) for c in self.changes],
            "original": self.original.to_dict(),
            "workflow": self.workflow.to_dict(),
        }


# --- tool similarity -----------------------------------------------------------------------------------


MATCHERS = ("auto", "semantic", "lexical")


@cache
def tool_similarity(matcher: str = "auto", registry: ToolRegistry | None = None) -> np.ndarray:
    """Cosine similarity of the tool texts of ``registry`` (default: the shared one; a live API's has its
    own tools), rounded to 4 places so ties are stable, once per process, registry and matcher: 'auto'
    (the embedding model when the embed extra is installed, else lexical), 'semantic' or 'lexical'. The
    embedding model's table of the shared registry is read from the shipped file (when its tool texts are
    the registry's), so no model loads for it."""
    if matcher not in MATCHERS:
        raise ValueError(f"matcher must be one of {MATCHERS}, got {matcher!r}")
    texts = [tool_text(t) for t in (registry or default_registry()).tools]
    semantic = matcher == "semantic" or (matcher == "auto" and embedding_installed())
    if semantic:
        shipped = _shipped_similarity()
        if shipped["texts_sha256"] == texts_digest(texts):
            return np.array(shipped["similarity"], dtype=np.float64)
    return np.round(make_matcher("semantic" if semantic else "lexical").similarity(texts, texts), 4)


def texts_digest(texts: Iterable[str]) -> str:
    """SHA-256 of tool texts, one per line: what the shipped similarity table was computed from."""
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


@cache
def _shipped_similarity() -> dict[str, Any]:
    return json.loads((resources.files("resilibench.core.text") / "data" / "tool_similarity.json").read_text())


def similar_tools(tool: int, exclude: Iterable[int] = (), registry: ToolRegistry | None = None,
                  matcher: str = "auto") -> list[int]:
    """Other tools ranked by similarity to ``tool`` (ties by name), leaving out ``exclude``."""
    registry = registry or default_registry()
    sims = tool_similarity(matcher, None if registry is default_registry() else registry)[tool]
    excluded = set(exclude)
    others = [t for t in range(len(registry)) if t != tool and t not in excluded]
    return sorted(others, key=lambda t: (-sims[t], registry.names[t]))


# --- helpers on workflows ------------------------------------------------------------------------------


def _node_dict(node: Node | None) -> dict | None:
    return None if node is None else {"tool": node.tool, "text": node.text, "arguments": node.arguments}


def _change(position: int, before: Node | None, after: Node | None, reason: str) -> dict:
    return {"position": position, "before": _node_dict(before), "after": _node_dict(after), "reason": reason}


def _tool_ids(workflow: Workflow, registry: ToolRegistry) -> list[int | None]:
    return [registry.id_of(n.tool) if n.tool is not None and n.tool in registry else None for n in workflow.nodes]


def _step_tool(workflow: Workflow, index: int, registry: ToolRegistry) -> int:
    """The id of the tool of step ``index``, an eligible step of a method that needs one."""
    tool = _tool_ids(workflow, registry)[index]
    assert tool is not None, f"step {index + 1} calls no tool of the registry"
    return tool


def _plan_hints(workflow: Workflow) -> dict[str, Any]:
    """Argument values already in the plan, by parameter name (first occurrence), as hints for new steps."""
    hints: dict[str, Any] = {}
    for node in workflow.nodes:
        for name, value in node.arguments.items():
            hints.setdefault(name, value)
    return hints


def _with_node(workflow: Workflow, index: int, node: Node) -> Workflow:
    nodes = list(workflow.nodes)
    nodes[index] = node
    return Workflow(tuple(nodes), workflow.edges)


def _insert(workflow: Workflow, index: int, node: Node, break_flow: bool = False) -> Workflow:
    """Insert ``node`` at ``index``, linked after the step before it and before the step after it; with
    ``break_flow`` the direct link between those two steps is removed (the flow goes through the new step)."""
    n = len(workflow.nodes)
    edges = {(a + (a >= index), b + (b >= index)) for a, b in workflow.edges}
    if break_flow:
        edges.discard((index - 1, index + 1))
    links = ([(index - 1, index)] if index > 0 else []) + ([(index, index + 1)] if index < n else [])
    for link in links:  # a plan numbered against its edges could make a link close a cycle: skip it then
        if sum(1 for _ in topological_order(n + 1, [*edges, link])) == n + 1:  # nodes on a cycle are left out
            edges.add(link)
    nodes = workflow.nodes[:index] + (node,) + workflow.nodes[index:]
    return Workflow(nodes, tuple(sorted(edges)))


def _remove(workflow: Workflow, index: int) -> Workflow:
    """Remove a step; its prerequisites become prerequisites of its dependents."""
    preds = [a for a, b in workflow.edges if b == index]
    succs = [b for a, b in workflow.edges if a == index]
    edges = {e for e in workflow.edges if index not in e} | {(a, b) for a in preds for b in succs}
    shifted = {(a - (a > index), b - (b > index)) for a, b in edges}
    return Workflow(workflow.nodes[:index] + workflow.nodes[index + 1 :], tuple(sorted(shifted)))


def _move(workflow: Workflow, source: int, target: int) -> Workflow:
    """Move the step at ``source`` to ``target``; edges stay on their positions."""
    order = list(range(len(workflow.nodes)))
    order.insert(target, order.pop(source))
    return Workflow(tuple(workflow.nodes[i] for i in order), workflow.edges)


# --- eligibility -----------------------------------------------------------------------------------------


def _prerequisite(workflow: Workflow, index: int, registry: ToolRegistry) -> int | None:
    """The earliest earlier step whose tool the tool of step ``index`` depends on (registry dependencies,
    which stay true however the plan's steps are moved)."""
    tools = _tool_ids(workflow, registry)
    tool = tools[index]
    if tool is None:
        return None
    deps = set(registry.dependency_ids[tool])
    earlier = [i for i in range(index) if tools[i] in deps]
    return earlier[0] if earlier else None


def _required_params(workflow: Workflow, index: int, registry: ToolRegistry) -> list[str]:
    """Required parameters of step ``index``'s tool that its node's arguments set."""
    node = workflow.nodes[index]
    if node.tool is None or node.tool not in registry or not node.params:
        return []
    return [p.name for p in registry[node.tool].parameters if p.required and p.name in node.arguments]


@lru_cache(maxsize=4096)
def _eligible(workflow: Workflow, method: str, registry: ToolRegistry, matcher: str) -> tuple[int, ...]:
    """The positions where ``method`` applies (``applicable_positions``), kept per value: every injection
    asks for them again, on the same few plans."""
    return tuple(_eligible_positions(workflow, method, registry, matcher))


def _eligible_positions(workflow: Workflow, method: str, registry: ToolRegistry, matcher: str) -> list[int]:
    n = len(workflow.nodes)
    tool_at = {i: t for i, t in enumerate(_tool_ids(workflow, registry)) if t is not None}
    in_plan = set(tool_at.values())
    tool_steps = list(tool_at)
    if method == "adjacent_swap":
        return [i for i in range(n - 1) if workflow.nodes[i].tool != workflow.nodes[i + 1].tool]
    if method == "dependency_violation":
        return [i for i in range(n) if _prerequisite(workflow, i, registry) is not None]
    if method == "similar_tool":
        return [i for i, t in tool_at.items() if similar_tools(t, in_plan, registry, matcher)]
    if method == "category_mismatch":
        return [i for i, t in tool_at.items() if _other_category_tools(t, in_plan, registry)]
    if method == "missing_required":  # the node keeps other arguments, so the call still carries some
        return [i for i in range(n) if _required_params(workflow, i, registry) and len(workflow.nodes[i].params) > 1]
    if method == "wrong_type":
        return [i for i in range(n) if _required_params(workflow, i, registry)]
    if method == "middle_removal":
        return list(range(1, n - 1))
    if method == "validation_removal":
        return [i for i, t in tool_at.items() if registry.tools[t].operation in VALIDATION_OPERATIONS]
    if method == "duplicate_step":
        return tool_steps
    if method == "unneeded_insertion":
        return list(range(1, n + 1)) if n and _unneeded_tools(in_plan, registry) else []
    if method == "format_mismatch":
        return [i for i in range(1, n) if "input_format" in workflow.nodes[i].arguments]
    if method == "unrelated_insertion":
        return list(range(1, n)) if _unrelated_tools(in_plan, registry, matcher) else []
    if method in ("progressive_replacement", "description_drift"):  # a drift needs a tool outside the plan
        return tool_steps if len(in_plan) < len(registry) else []
    raise AssertionError(method)


def _other_category_tools(tool: int, exclude: set[int], registry: ToolRegistry) -> list[int]:
    category = registry.tools[tool].category
    return [t for t in range(len(registry)) if registry.tools[t].category != category and t not in exclude]


def _unneeded_tools(exclude: set[int], registry: ToolRegistry) -> list[int]:
    return [t for t in range(len(registry)) if registry.tools[t].operation in UNNEEDED_OPERATIONS
            and not registry.dependency_ids[t] and t not in exclude]


def _unrelated_tools(in_plan: set[int], registry: ToolRegistry, matcher: str) -> list[int]:
    """Tools of categories the plan does not use, least similar to the plan's tools first."""
    used = {registry.tools[t].category for t in in_plan}
    candidates = [t for t in range(len(registry)) if registry.tools[t].category not in used]
    if not in_plan:
        return candidates
    sims = tool_similarity(matcher, None if registry is default_registry() else registry)
    return sorted(candidates, key=lambda t: (max(sims[t][p] for p in in_plan), registry.names[t]))


def applicable_positions(workflow: Workflow, flaw_type: str, method: str,
                         registry: ToolRegistry | None = None, matcher: str = "auto") -> list[int]:
    """Positions of ``workflow`` where ``method`` of ``flaw_type`` applies: the step changed (or moved,
    removed, duplicated), the index a new step takes (insertions), or the first step of a drift."""
    _check_method(flaw_type, method)
    return list(_eligible(workflow, method, registry or default_registry(), matcher))


def flaw_applies(workflow: Workflow, flaw_type: str, registry: ToolRegistry | None = None,
                 matcher: str = "auto") -> bool:
    """Whether ``inject_flaw`` can inject ``flaw_type`` into ``workflow`` (some method has an eligible
    position): it depends on the plan only, not on the seed or the severity."""
    _check_method(flaw_type, None)
    registry = registry or default_registry()
    return any(_usable(workflow, m, None, registry, matcher) for m in FLAW_METHODS[flaw_type])


# --- the methods ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    """What a method reads besides the plan: the seeded generator, the registry, the tool similarity, the
    argument values for steps a flaw adds (``inject_flaw``'s ``hints``) and the tools of the unflawed plan."""

    rng: np.random.Generator
    registry: ToolRegistry
    matcher: str
    hints: dict[str, Any]
    original: frozenset[int]

    def taken(self, workflow: Workflow) -> set[int]:
        """Tools a replacement may not be: those of the unflawed plan or of ``workflow``."""
        return set(self.original) | {t for t in _tool_ids(workflow, self.registry) if t is not None}

    def pick(self, options: list) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def tool_node(self, workflow: Workflow, tool: int, replaced: Node | None = None) -> Node:
        """A step calling ``tool`` built like a genuine one: the operation's phrase as its text and, when
        the plan carries arguments, valid ones from the hints (then the replaced step's, then the plan's)."""
        spec = self.registry.tools[tool]
        carries = any(n.params for n in workflow.nodes)
        values = {**_plan_hints(workflow), **(replaced.arguments if replaced else {}), **self.hints}
        return Node.make(spec.name, OPERATION_PHRASES[spec.operation], valid_arguments(spec, values) if carries else None)


# A method: (workflow, position in the current workflow, context) -> (new workflow, changes)
Applier = Callable[[Workflow, int, _Context], tuple[Workflow, list[dict]]]


def _adjacent_swap(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    a, b = w.nodes[i], w.nodes[i + 1]
    out = _move(w, i + 1, i)
    return out, [_change(i, a, b, f"swapped steps {i + 1} and {i + 2}"),
                 _change(i + 1, b, a, f"swapped steps {i + 1} and {i + 2}")]


def _dependency_violation(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    target = _prerequisite(w, i, ctx.registry)
    assert target is not None  # an eligible step has a prerequisite
    node = w.nodes[i]
    return _move(w, i, target), [_change(target, w.nodes[target], node,
                                         f"moved step {i + 1} ({node.tool}) before its prerequisite "
                                         f"{w.nodes[target].tool}")]


def _replace_tool(w: Workflow, i: int, new: int, ctx: _Context, reason: str) -> tuple[Workflow, list[dict]]:
    node = ctx.tool_node(w, new, replaced=w.nodes[i])
    return _with_node(w, i, node), [_change(i, w.nodes[i], node, reason)]


def _similar_tool(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    options = similar_tools(_step_tool(w, i, ctx.registry), ctx.taken(w), ctx.registry, ctx.matcher)
    new = ctx.pick(options[:SIMILAR_CANDIDATES])
    return _replace_tool(w, i, new, ctx, f"replaced by the similar tool {ctx.registry.names[new]}")


def _category_mismatch(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    new = ctx.pick(_other_category_tools(_step_tool(w, i, ctx.registry), ctx.taken(w), ctx.registry))
    return _replace_tool(w, i, new, ctx, f"replaced by {ctx.registry.names[new]} from another category")


def _missing_required(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    name = ctx.pick(_required_params(w, i, ctx.registry))
    node = w.nodes[i]
    arguments = {k: v for k, v in node.arguments.items() if k != name}
    new = Node.make(node.tool, node.text, arguments)
    return _with_node(w, i, new), [_change(i, node, new, f"dropped the required parameter '{name}'")]


def _wrong_type(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    """A required argument takes a value of the wrong type: one the plan or the hints hold for another
    parameter (a mix-up, in the plan's own vocabulary), else ``WRONG_TYPE_VALUES``."""
    name = ctx.pick(_required_params(w, i, ctx.registry))
    node = w.nodes[i]
    tool = ctx.registry[_step_tool(w, i, ctx.registry)]
    expected = next(p.type for p in tool.parameters if p.name == name)
    known = {json.dumps(v, sort_keys=True) for v in [*_plan_hints(w).values(), *ctx.hints.values()]}
    wrong = [json.loads(v) for v in sorted(known)
             if tool.check_arguments({**node.arguments, name: json.loads(v)}) is not None]
    value = ctx.pick(wrong) if wrong else WRONG_TYPE_VALUES[expected]
    new = Node.make(node.tool, node.text, {**node.arguments, name: value})
    return _with_node(w, i, new), [_change(i, node, new, f"parameter '{name}' given a value that is not {expected}")]


def _removal(reason: str) -> Applier:
    def apply(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
        return _remove(w, i), [_change(i, w.nodes[i], None, reason.format(step=i + 1, tool=w.nodes[i].tool))]
    return apply


def _duplicate_step(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    node = w.nodes[i]
    return _insert(w, i + 1, node), [_change(i + 1, None, node, f"step {i + 1} ({node.tool}) repeated")]


def _unneeded_insertion(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    options = _unneeded_tools({t for t in _tool_ids(w, ctx.registry) if t is not None}, ctx.registry)
    node = ctx.tool_node(w, ctx.pick(options))
    return _insert(w, i, node), [_change(i, None, node, f"inserted {node.tool}, which the task does not need")]


def _format_mismatch(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    node = w.nodes[i]
    produced = w.nodes[i - 1].arguments.get("output_format", node.arguments["input_format"])
    fmt = ctx.pick([f for f in FORMATS if f != produced and f != node.arguments["input_format"]])
    new = Node.make(node.tool, node.text, {**node.arguments, "input_format": fmt})
    reason = f"step {i + 1} expects {fmt} input but step {i} produces {produced}"
    return _with_node(w, i, new), [_change(i, node, new, reason)]


def _unrelated_insertion(w: Workflow, i: int, ctx: _Context) -> tuple[Workflow, list[dict]]:
    options = _unrelated_tools({t for t in _tool_ids(w, ctx.registry) if t is not None}, ctx.registry, ctx.matcher)
    node = ctx.tool_node(w, ctx.pick(options[:SIMILAR_CANDIDATES]))
    reason = f"inserted the unrelated {node.tool} between steps {i} and {i + 1}, breaking their data flow"
    return _insert(w, i, node, break_flow=True), [_change(i, None, node, reason)]


APPLIERS: dict[str, Applier] = {
    "adjacent_swap": _adjacent_swap,
    "dependency_violation": _dependency_violation,
    "similar_tool": _similar_tool,
    "category_mismatch": _category_mismatch,
    "missing_required": _missing_required,
    "wrong_type": _wrong_type,
    "middle_removal": _removal("removed the intermediate step {step} ({tool})"),
    "validation_removal": _removal("removed the validation step {step} ({tool})"),
    "duplicate_step": _duplicate_step,
    "unneeded_insertion": _unneeded_insertion,
    "format_mismatch": _format_mismatch,
    "unrelated_insertion": _unrelated_insertion,
}


def _drift(w: Workflow, positions: list[int], ctx: _Context, rename: bool) -> tuple[Workflow, list[dict]]:
    """Progressive drift over ``positions`` (in order): step i becomes the tool most similar to the
    previous step's replacement (the first: to its own tool) among the tools in neither the original nor
    the current plan, T_i = argmax_t S(t, T_{i-1}) (1 - F(t, T^orig)). ``rename``: swap the tools; otherwise only
    the step texts drift to the replacements' operations while the tools stay."""
    registry = ctx.registry
    changes = []
    previous = None
    for i in positions:
        anchor = _step_tool(w, i, registry) if previous is None else previous
        candidates = similar_tools(anchor, ctx.taken(w), registry, ctx.matcher)
        if not candidates:  # a small registry (a live API's) has run out of spare tools: the drift stops here
            break
        new = candidates[0]
        node = w.nodes[i]
        if rename:
            after = ctx.tool_node(w, new, replaced=node)
            reason = f"drifted to {registry.names[new]} (nearest to {registry.names[anchor]})"
        else:
            tool = registry.tools[new]  # a live API's tool has no operation phrase: its description
            after = Node(node.tool, OPERATION_PHRASES.get(tool.operation, tool.description), node.params)
            reason = f"text drifted to the operation of {registry.names[new]} (nearest to {registry.names[anchor]})"
        w = _with_node(w, i, after)
        changes.append(_change(i, node, after, reason))
        previous = new
    return w, changes


# --- injection -------------------------------------------------------------------------------------------


def _check_method(flaw_type: str, method: str | None) -> None:
    if flaw_type not in FLAW_METHODS:
        raise ValueError(f"flaw_type must be one of {FLAW_TYPES}, got {flaw_type!r}")
    if method is not None and method not in FLAW_METHODS[flaw_type]:
        raise ValueError(f"method for flaw_type {flaw_type!r} must be one of {FLAW_METHODS[flaw_type]}, got {method!r}")


def _rng(seed: int, *labels: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(x.encode()) for x in labels)])


def inject_flaw(
    workflow: Workflow,
    flaw_type: str,
    *,
    method: str | None = None,
    severity: float = 0.5,
    seed: int = 0,
    position: int | None = None,
    registry: ToolRegistry | None = None,
    matcher: str = "auto",
    hints: dict[str, Any] | None = None,
) -> FlawInjection:
    """Inject one flaw type into ``workflow``.

    ``severity`` in (0, 1]: share of the eligible positions changed (at least one). ``method`` None: the
    first applicable of the type's two methods in a seeded order. ``position`` pins the first change
    (an adversary's choice); it must be one of ``applicable_positions``. Raises ``FlawNotApplicable`` when
    nothing is eligible, ``ValueError`` for an unknown type or method or a severity out of range.
    ``matcher`` picks the tool similarity (``tool_similarity``); 'auto' depends on the installed extras,
    so pass 'semantic' or 'lexical' to reproduce an injection on any install. ``hints``: argument values
    (by parameter name) for the steps a flaw adds or swaps in and for wrong-type values, e.g. the task's
    (``core.text.prompts.task_hints``), so that those steps carry what a genuine step of the tool carries;
    by default the values the plan already holds."""
    _check_method(flaw_type, method)
    if matcher not in MATCHERS:
        raise ValueError(f"matcher must be one of {MATCHERS}, got {matcher!r}")
    if isinstance(severity, bool) or not isinstance(severity, int | float) or not 0.0 < severity <= 1.0:
        raise ValueError(f"severity must be a number in (0, 1], got {severity!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    registry = registry or default_registry()
    seed = int(seed)
    if method is None:
        methods = list(FLAW_METHODS[flaw_type])
        _rng(seed, flaw_type).shuffle(methods)
        usable = [m for m in methods if _usable(workflow, m, position, registry, matcher)]
        if not usable:
            raise FlawNotApplicable(
                f"no method of flaw type {flaw_type!r} {FLAW_METHODS[flaw_type]} applies to this "
                f"{len(workflow.nodes)}-step workflow" + (f" at position {position}" if position is not None else "")
                + _hint(flaw_type, workflow))
        method = usable[0]
    eligible = _eligible(workflow, method, registry, matcher)
    if not eligible:
        raise FlawNotApplicable(f"flaw {flaw_type}/{method} does not apply to this {len(workflow.nodes)}-step "
                                f"workflow (no eligible position)" + _hint(flaw_type, workflow))
    if position is not None and position not in eligible:
        raise FlawNotApplicable(f"flaw {flaw_type}/{method} does not apply at position {position}; "
                                f"applicable positions: {list(eligible)}")
    rng = _rng(seed, flaw_type, method)
    ctx = _Context(rng, registry, matcher, dict(hints or {}),
                   frozenset(t for t in _tool_ids(workflow, registry) if t is not None))
    order = [int(i) for i in rng.permutation(eligible)]
    if position is not None:
        order.remove(position)
        order.insert(0, position)
    count = max(1, math.floor(severity * len(eligible) + 0.5))
    if method in ("progressive_replacement", "description_drift"):
        start = order[0]
        run = [i for i in eligible if i >= start] + [i for i in eligible if i < start]
        flawed, changes = _drift(workflow, run[:count], ctx, rename=method == "progressive_replacement")
    else:
        flawed, changes = _apply_each(workflow, order[:count], method, ctx)
    return FlawInjection(workflow, flawed, flaw_type, method, float(severity), seed, tuple(changes))


# How each method changes the list of steps (for following the chosen original steps to their index).
_EFFECTS = {"adjacent_swap": "swap", "dependency_violation": "move", "middle_removal": "remove",
            "validation_removal": "remove", "duplicate_step": "insert", "unneeded_insertion": "insert",
            "unrelated_insertion": "insert"}


def _apply_each(workflow: Workflow, positions: list[int], method: str, ctx: _Context) -> tuple[Workflow, list[dict]]:
    """Apply a method at each chosen original position, in order, following each original step to its
    current index (earlier changes move steps). A position no longer eligible is skipped, and so is a change
    that could undo an earlier one: a swap of a step already swapped, a move of a moved step's prerequisite."""
    registry = ctx.registry
    ids: list[int | None] = list(range(len(workflow.nodes)))  # original index of each current step (None: new)
    moved: set[int | None] = set()
    moved_tools: set[str] = set()
    changes: list[dict] = []
    w = workflow
    effect = _EFFECTS.get(method, "replace")
    for original in positions:
        current = ids.index(original) if original < len(workflow.nodes) else len(ids)
        if current not in _eligible(w, method, registry, ctx.matcher):
            continue
        if effect == "swap" and {ids[current], ids[current + 1]} & moved:
            continue
        if effect == "move" and w.nodes[current].tool in {d for t in moved_tools for d in registry[t].dependencies}:
            continue  # moving the prerequisite of a moved step could put it back in order
        w, made = APPLIERS[method](w, current, ctx)
        changes.extend(made)
        if effect == "swap":
            moved |= {ids[current], ids[current + 1]}
            ids[current], ids[current + 1] = ids[current + 1], ids[current]
        elif effect == "move":
            moved_tools.add(w.nodes[made[0]["position"]].tool)
            ids.insert(made[0]["position"], ids.pop(current))
        elif effect == "remove":
            ids.pop(current)
        elif effect == "insert":
            ids.insert(made[0]["position"], None)
    return w, changes


def _usable(workflow: Workflow, method: str, position: int | None, registry: ToolRegistry, matcher: str) -> bool:
    eligible = _eligible(workflow, method, registry, matcher)
    return bool(eligible) and (position is None or position in eligible)


def _hint(flaw_type: str, workflow: Workflow) -> str:
    if flaw_type in ("parameter", "logic_discontinuity") and not any(n.params for n in workflow.nodes):
        return "; the plan carries no arguments (fill them with core.text.prompts.with_arguments)"
    return ""

