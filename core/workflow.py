"""The one ``Workflow`` type: nodes (a tool name and/or a step text) and directed dependency edges.

Shared by workflow prompts, flaw injection, metrics, WorkflowGen-v1 and the generator's outputs. It
converts to and from JSON, networkx and a numbered plan, and has a canonical form for exact comparison.
"""

from __future__ import annotations

__all__ = ["Node", "STRING_STEPS", "SENTINELS", "Repairs", "Workflow"]

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .registry import topological_order

if TYPE_CHECKING:
    import networkx as nx


@dataclass(frozen=True)
class Node:
    """A workflow step: the tool it calls (if any), its text, and the arguments it passes to the tool.

    ``params`` holds the arguments as sorted ``(name, JSON text)`` pairs so that nodes stay hashable and
    compare exactly; build a node from a dict with ``Node.make`` and read the dict back with ``arguments``.
    """

    tool: str | None = None
    text: str = ""
    params: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.tool is None and not self.text:
            raise ValueError("a workflow node needs a tool name or a text")
        names = [name for name, _ in self.params]
        if names != sorted(set(names)) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"node params must be (name, JSON text) pairs with unique names, sorted: {self.params!r}")

    @classmethod
    def make(cls, tool: str | None = None, text: str = "", arguments: dict[str, Any] | None = None) -> Node:
        """A node whose arguments come as a dict of JSON-serialisable values."""
        try:
            params = tuple(sorted((name, json.dumps(value, sort_keys=True)) for name, value in (arguments or {}).items()))
        except TypeError as exc:
            raise ValueError(f"node arguments must be JSON-serialisable: {exc}") from None
        return cls(tool, text, params)

    @property
    def arguments(self) -> dict[str, Any]:
        return {name: _json_value(value) for name, value in self.params}

    @property
    def label(self) -> str:
        """The text used to compare nodes: the step text, else the tool name."""
        return self.text or (self.tool or "")


_json_scalar = lru_cache(maxsize=4096)(json.loads)


def _json_value(text: str) -> Any:
    """A parameter's value from its JSON text: a scalar's parse is kept (immutable, and read at every
    ``arguments``), a list or an object is parsed afresh so that callers may change it."""
    return json.loads(text) if text[:1] in "[{" else _json_scalar(text)


STRING_STEPS = ("tool", "text")  # how a plain JSON string in a workflow's node list is read
SENTINELS = ("START", "END")  # WorFBench's and RobustFlow's begin and end markers: not steps
_TOOL_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")  # snake_case with an underscore: file_operations_reader
def _edge_pairs(data: dict[str, Any]) -> list[tuple[int, int]]:
    """The ``edges`` of a workflow's JSON, checked: a list of [from, to] pairs of node indices."""
    edges = data.get("edges", [])
    if not isinstance(edges, list):
        raise ValueError(f"workflow 'edges' must be a list of [from, to] pairs, got {type(edges).__name__}")
    for e in edges:
        if not (isinstance(e, list | tuple) and len(e) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in e)):
            raise ValueError(f"edge {e!r} must be a pair of node indices")
    return [(e[0], e[1]) for e in edges]


@dataclass(frozen=True)
class Repairs:
    """What ``Workflow.lenient`` removed from a malformed graph to make it a DAG.

    ``duplicates``: repeated edges (harmless, dropped). ``self_loops`` and ``cycle_edges``: edges that
    made the graph cyclic; a cycle edge is an edge inside a strongly connected component that points
    back against the listing (from a later step to an earlier one). A workflow with either is
    ``cyclic``: no order executes it, and the structural metrics score it 0 (docs/metrics/structural.md).
    """

    duplicates: tuple[tuple[int, int], ...] = ()
    self_loops: tuple[tuple[int, int], ...] = ()
    cycle_edges: tuple[tuple[int, int], ...] = ()

    @property
    def cyclic(self) -> bool:
        return bool(self.self_loops or self.cycle_edges)

    def __bool__(self) -> bool:
        return bool(self.duplicates or self.cyclic)

    def to_dict(self) -> dict[str, list[list[int]]]:
        return {name: [list(e) for e in getattr(self, name)] for name in ("duplicates", "self_loops", "cycle_edges")
                if getattr(self, name)}


@dataclass(frozen=True)
class Workflow:
    """A DAG of steps; ``edges`` are (prerequisite index, dependent index) pairs.

    Construction is strict (a cycle, a self-loop or a duplicate edge raises ValueError); predictions to be
    scored go through ``lenient``, which repairs them and records what it removed in ``repairs``.
    """

    nodes: tuple[Node, ...]
    edges: tuple[tuple[int, int], ...] = ()
    repairs: Repairs = field(default=Repairs(), compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.nodes)
        for a, b in self.edges:
            if not (0 <= a < n and 0 <= b < n):
                raise ValueError(f"edge ({a}, {b}) refers to a node outside [0, {n})")
            if a == b:
                raise ValueError(f"self-loop on node {a}")
        if len(set(self.edges)) != len(self.edges):
            raise ValueError("duplicate edges")
        if self.edges and sum(1 for _ in topological_order(n, self.edges)) < n:  # nodes on a cycle are left out
            import networkx as nx  # imported where used: 0.15 s, and most workflows never need it

            raise ValueError(f"workflow has a cycle: {nx.find_cycle(self.to_networkx())}")

    # --- constructors --------------------------------------------------------------------------------

    @classmethod
    def lenient(cls, nodes: Sequence[Node], edges: Sequence[tuple[int, int]]) -> Workflow:
        """A workflow from a possibly malformed graph: duplicate edges and self-loops are dropped, and so
        are the edges that close a cycle (inside a strongly connected component, those pointing from a
        later step back to an earlier one); ``repairs`` records each. Edges outside the node range still
        raise ValueError."""
        nodes, seen = tuple(nodes), set()
        kept, duplicates, loops = [], [], []
        for a, b in edges:
            edge = (int(a), int(b))
            if edge in seen:
                duplicates.append(edge)
            elif edge[0] == edge[1]:
                loops.append(edge)
            else:
                seen.add(edge)
                kept.append(edge)
        import networkx as nx

        graph = nx.DiGraph()  # not nx.DiGraph(kept): that conversion imports pandas and scipy to rule them out
        graph.add_edges_from(kept)
        component = {v: i for i, c in enumerate(nx.strongly_connected_components(graph)) for v in c}
        back = [(a, b) for a, b in kept if component[a] == component[b] and a > b]
        dropped = set(back)
        return cls(nodes, tuple(e for e in kept if e not in dropped), Repairs(tuple(duplicates), tuple(loops), tuple(back)))

    @classmethod
    def chain(cls, tools: Sequence[str], texts: Sequence[str] | None = None) -> Workflow:
        """A linear workflow: each step depends on the previous one."""
        texts = texts or [""] * len(tools)
        nodes = tuple(Node(t, x) for t, x in zip(tools, texts, strict=True))
        return cls(nodes, tuple((i, i + 1) for i in range(len(nodes) - 1)))

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, string_steps: str | None = "tool", lenient: bool = False) -> Workflow:
        """From ``{"nodes": [{"tool":..., "text":...}], "edges": [[a, b], ...]}``.

        ``string_steps``: how a node given as a plain string is read: "tool" (a tool name), "text" (a step
        text, compared by meaning), or None (refused, so that neither reading happens silently).
        ``lenient``: repair a malformed graph (see ``lenient``) instead of raising.
        """
        if string_steps not in (*STRING_STEPS, None):
            raise ValueError(f"string_steps must be one of {', '.join(STRING_STEPS)} or None, got {string_steps!r}")
        if not isinstance(data, dict) or "nodes" not in data:
            raise ValueError("workflow JSON must be an object with 'nodes' (and optional 'edges')")
        if not isinstance(data["nodes"], list):
            raise ValueError("workflow 'nodes' must be a list")
        nodes = []
        for i, n in enumerate(data["nodes"]):
            if isinstance(n, str):
                if string_steps is None:
                    raise ValueError(f"node {i} is a plain string {n!r}: say whether plain strings are tool names "
                                     "or step texts (string steps: tool or text), or write {\"tool\": ...} or "
                                     "{\"text\": ...}")
                nodes.append(Node(tool=n) if string_steps == "tool" else Node(text=n))
            elif isinstance(n, dict):
                arguments = n.get("arguments") or {}
                if not isinstance(arguments, dict):
                    raise ValueError(f"node {i}: 'arguments' must be an object, got {arguments!r}")
                nodes.append(Node.make(n.get("tool"), n.get("text", ""), arguments))
            else:
                raise ValueError(f"node {i} must be a tool name or an object with 'tool'/'text'/'arguments'")
        edges = [(int(a), int(b)) for a, b in _edge_pairs(data)]
        return cls.lenient(nodes, edges) if lenient else cls(tuple(nodes), tuple(edges))

    @classmethod
    def from_json(cls, text: str, **options: Any) -> Workflow:
        """From JSON text; ``options`` as for ``from_dict``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"workflow is not valid JSON: {exc}") from None
        return cls.from_dict(data, **options)

    @classmethod
    def from_graph(cls, data: dict[str, Any], *, lenient: bool = True) -> Workflow:
        """From RobustFlow's (and WorFBench's parsed) graph: ``{"nodes": ["START", text, ..., "END"],
        "edges": [[i, j], ...]}`` with node texts and edges by list index. START and END are markers,
        not steps: they and their edges are dropped."""
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise ValueError("a graph must be an object with 'nodes' (a list of step texts) and 'edges'")
        texts = data["nodes"]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("graph 'nodes' must be step texts (strings)")
        index: dict[int, int] = {}
        for i, text in enumerate(texts):
            if text.strip() not in SENTINELS:
                index[i] = len(index)
        nodes = [Node(text=texts[i].strip()) for i in index]
        edges = []
        for e in _edge_pairs(data):
            if not all(0 <= x < len(texts) for x in e):
                raise ValueError(f"edge {list(e)} refers to a node outside [0, {len(texts)})")
            if e[0] in index and e[1] in index:
                edges.append((index[e[0]], index[e[1]]))
        return cls.lenient(nodes, edges) if lenient else cls(tuple(nodes), tuple(edges))

    @classmethod
    def from_worfbench(cls, answer: str, *, lenient: bool = True) -> Workflow:
        """From WorFBench's answer text: ``Node:`` then numbered steps (``1: text`` or ``1. text``), then
        ``Edge:`` (or ``Edges:``) with pairs ``(START,1) (1,2) ... (n,END)``. Steps are texts; START and
        END are markers, not steps. The steps are the lines numbered 1, 2, ... right after ``Node:``; the
        first other line ends them (models often add prose with numbered lines of its own). Without an
        ``Edge:`` line, the edges are the pairs written after the steps (10 of WorFBench's released gold
        answers announce them in Markdown or prose: ``- **Edge**: (START, 1), (1, 2)``). An edge naming a
        step that is not listed raises ValueError."""
        if not isinstance(answer, str):
            raise ValueError(f"a WorFBench answer must be text, got {type(answer).__name__}")
        marker = re.search(r"^\s*Edges?\s*:", answer, flags=re.M | re.I)
        head = answer[:marker.start()] if marker else answer
        start = re.search(r"^\s*Nodes?\s*:", head, flags=re.M | re.I)
        if not start:
            raise ValueError("a WorFBench answer starts with 'Node:' and its numbered steps")
        steps: list[str] = []
        steps_end = start.end()
        for line in head[start.end():].splitlines(keepends=True):
            step = re.fullmatch(r"\s*(\d+)\s*[:.]\s*(.+?)\s*", line)
            if step and int(step.group(1)) == len(steps) + 1:
                steps.append(step.group(2))
            elif step and not steps:
                raise ValueError(f"WorFBench steps must be numbered from 1; got {step.group(1)} first")
            elif line.strip():
                break
            steps_end += len(line)
        tail = answer[marker.end():] if marker else answer[steps_end:]
        edges = []
        for a, b in re.findall(r"\(\s*(\d+|START)\s*,\s*(\d+|END)\s*\)", tail, flags=re.I):
            if a.upper() == "START" or b.upper() == "END":
                continue
            if not (1 <= int(a) <= len(steps) and 1 <= int(b) <= len(steps)):
                raise ValueError(f"edge ({a},{b}) names a step outside 1..{len(steps)}")
            edges.append((int(a) - 1, int(b) - 1))
        nodes = [Node(text=text) for text in steps]
        return cls.lenient(nodes, edges) if lenient else cls(tuple(nodes), tuple(edges))

    @classmethod
    def from_networkx(cls, graph: nx.DiGraph) -> Workflow:
        """From a DiGraph whose nodes carry optional ``tool`` and ``text`` attributes."""
        order = list(graph.nodes)
        index = {n: i for i, n in enumerate(order)}
        nodes = tuple(Node.make(graph.nodes[n].get("tool"), graph.nodes[n].get("text", ""),
                                graph.nodes[n].get("arguments")) for n in order)
        return cls(nodes, tuple((index[a], index[b]) for a, b in graph.edges))

    @classmethod
    def from_plan(cls, plan: str, tools: Collection[str] | None = None) -> Workflow:
        """Parse a numbered plan as written by ``to_plan`` (``N. tool: text args={...} (after 1, 2)``).

        A ``name:`` prefix is a tool name when ``name`` is in ``tools`` or, without ``tools``, when it is
        snake_case with an underscore (``file_operations_reader``); otherwise it is part of the step text
        (``1. Calculate: the total`` is the text "Calculate: the total")."""
        pattern = re.compile(r"^\s*(\d+)\.\s*(?:([A-Za-z_][\w]*)\s*:)?\s*(.*?)\s*(?:args=(\{.*\}))?"
                             r"\s*(?:\(after ([\d,\s]+)\))?\s*$")
        nodes, edges = [], []
        for line in plan.strip().splitlines():
            if not line.strip():
                continue
            m = pattern.match(line)
            if not m:
                raise ValueError(f"plan line not understood: {line!r}")
            number = int(m.group(1))
            if number != len(nodes) + 1:
                raise ValueError(f"plan steps must be numbered 1, 2, ...; got {number} at step {len(nodes) + 1}")
            try:
                arguments = json.loads(m.group(4)) if m.group(4) else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"step {number}: arguments are not valid JSON: {exc}") from None
            tool, text = m.group(2), m.group(3)
            if tool is not None and not (tool in tools if tools is not None else _TOOL_NAME.fullmatch(tool)):
                named = re.match(r"^\s*\d+\.\s*(.*?:)", line)
                assert named is not None  # the line has a ``name:`` prefix (group 2 of the pattern)
                prefix = named.group(1)
                tool, text = None, f"{prefix} {text}".strip()
            nodes.append(Node.make(tool, text, arguments))
            for prev in (m.group(5) or "").replace(" ", "").split(","):
                if prev:
                    edges.append((int(prev) - 1, number - 1))
        return cls(tuple(nodes), tuple(edges))

    # --- conversions ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; a node's ``arguments`` appear only when it has some."""
        nodes = [{"tool": n.tool, "text": n.text} | ({"arguments": n.arguments} if n.params else {})
                 for n in self.nodes]
        return {"nodes": nodes, "edges": [list(e) for e in self.edges]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def to_networkx(self) -> nx.DiGraph:
        import networkx as nx

        graph = nx.DiGraph()
        for i, n in enumerate(self.nodes):
            graph.add_node(i, tool=n.tool, text=n.text, arguments=n.arguments)
        graph.add_edges_from(self.edges)
        return graph

    def to_worfbench(self) -> str:
        """WorFBench's answer text: ``Node:`` with ``i: label`` lines, then ``Edge:`` with every edge and the
        START/END edges of steps without prerequisites / dependents (read back by ``from_worfbench``)."""
        has_pred = {b for _, b in self.edges}
        has_succ = {a for a, _ in self.edges}
        edges = [f"(START,{i + 1})" for i in range(len(self.nodes)) if i not in has_pred]
        edges += [f"({a + 1},{b + 1})" for a, b in self.edges]
        edges += [f"({i + 1},END)" for i in range(len(self.nodes)) if i not in has_succ]
        lines = ["Node:", *(f"{i + 1}: {n.label}" for i, n in enumerate(self.nodes)), "Edge: " + " ".join(edges)]
        return "\n".join(lines)

    def to_plan(self) -> str:
        """A numbered plan, one step a line, prerequisites named as ``(after i, j)``."""
        preds: dict[int, list[int]] = {i: [] for i in range(len(self.nodes))}
        for a, b in self.edges:
            preds[b].append(a)
        lines = []
        for i, n in enumerate(self.nodes):
            head = f"{i + 1}. " + (f"{n.tool}: " if n.tool else "") + n.text
            if n.params:
                head = head.rstrip() + " args=" + json.dumps(n.arguments, sort_keys=True)
            after = f" (after {', '.join(str(p + 1) for p in sorted(preds[i]))})" if preds[i] else ""
            lines.append(head.rstrip() + after)
        return "\n".join(lines)

    # --- structure -----------------------------------------------------------------------------------

    @property
    def tools(self) -> tuple[str | None, ...]:
        return tuple(n.tool for n in self.nodes)

    def topological_order(self) -> list[int]:
        """A topological order, ties broken by node index."""
        return list(topological_order(len(self.nodes), self.edges))

    def canonical(self) -> Workflow:
        """The canonical form: nodes in the topological order that breaks ties by (tool, text, then
        canonical predecessors), edges sorted. Equal canonical forms mean the same labelled DAG up to
        renumbering for workflows whose equal-labelled nodes have distinct predecessor sets."""
        predecessors: list[list[int]] = [[] for _ in self.nodes]
        for a, b in self.edges:
            predecessors[b].append(a)
        placed: dict[int, int] = {}
        for i in topological_order(len(self.nodes), self.edges, key=lambda i: (
                self.nodes[i].tool or "", self.nodes[i].text, self.nodes[i].params,
                sorted(placed[p] for p in predecessors[i]), i)):
            placed[i] = len(placed)
        order = list(placed)  # placed in order
        nodes = tuple(self.nodes[i] for i in order)
        edges = tuple(sorted((placed[a], placed[b]) for a, b in self.edges))
        return Workflow(nodes, edges)

    def canonical_key(self) -> str:
        """A string key of the canonical form (for exact vote counting)."""
        return self.canonical().to_json()

