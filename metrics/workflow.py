"""The one ``Workflow`` type: nodes (a tool name and/or a step text) and directed dependency edges.

Shared by workflow prompts, flaw injection, metrics, WorkflowGen-v0 and the generator's outputs. It
converts to and from JSON, networkx and a numbered plan, and has a canonical form for exact comparison.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
        return {name: json.loads(value) for name, value in self.params}

    @property
    def label(self) -> str:
        """The text used to compare nodes: the step text, else the tool name."""
        return self.text or (self.tool or "")


@dataclass(frozen=True)
class Workflow:
    """A DAG of steps; ``edges`` are (prerequisite index, dependent index) pairs."""

    nodes: tuple[Node, ...]
    edges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.nodes)
        for a, b in self.edges:
            if not (0 <= a < n and 0 <= b < n):
                raise ValueError(f"edge ({a}, {b}) refers to a node outside [0, {n})")
            if a == b:
                raise ValueError(f"self-loop on node {a}")
        if len(set(self.edges)) != len(self.edges):
            raise ValueError("duplicate edges")
        if not nx.is_directed_acyclic_graph(self.to_networkx()):
            raise ValueError(f"workflow has a cycle: {nx.find_cycle(self.to_networkx())}")

    # --- constructors --------------------------------------------------------------------------------

    @classmethod
    def chain(cls, tools: Sequence[str], texts: Sequence[str] | None = None) -> Workflow:
        """A linear workflow: each step depends on the previous one."""
        texts = texts or [""] * len(tools)
        nodes = tuple(Node(t, x) for t, x in zip(tools, texts, strict=True))
        return cls(nodes, tuple((i, i + 1) for i in range(len(nodes) - 1)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workflow:
        """From ``{"nodes": [{"tool":..., "text":...}], "edges": [[a, b], ...]}``."""
        if not isinstance(data, dict) or "nodes" not in data:
            raise ValueError("workflow JSON must be an object with 'nodes' (and optional 'edges')")
        nodes = []
        for i, n in enumerate(data["nodes"]):
            if isinstance(n, str):
                nodes.append(Node(tool=n))
            elif isinstance(n, dict):
                arguments = n.get("arguments") or {}
                if not isinstance(arguments, dict):
                    raise ValueError(f"node {i}: 'arguments' must be an object, got {arguments!r}")
                nodes.append(Node.make(n.get("tool"), n.get("text", ""), arguments))
            else:
                raise ValueError(f"node {i} must be a tool name or an object with 'tool'/'text'/'arguments'")
        edges = []
        for e in data.get("edges", []):
            if not (isinstance(e, list | tuple) and len(e) == 2 and all(isinstance(x, int) for x in e)):
                raise ValueError(f"edge {e!r} must be a pair of node indices")
            edges.append((int(e[0]), int(e[1])))
        return cls(tuple(nodes), tuple(edges))

    @classmethod
    def from_json(cls, text: str) -> Workflow:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"workflow is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_networkx(cls, graph: nx.DiGraph) -> Workflow:
        """From a DiGraph whose nodes carry optional ``tool`` and ``text`` attributes."""
        order = list(graph.nodes)
        index = {n: i for i, n in enumerate(order)}
        nodes = tuple(Node.make(graph.nodes[n].get("tool"), graph.nodes[n].get("text", ""),
                                graph.nodes[n].get("arguments")) for n in order)
        return cls(nodes, tuple((index[a], index[b]) for a, b in graph.edges))

    @classmethod
    def from_plan(cls, plan: str) -> Workflow:
        """Parse a numbered plan as written by ``to_plan`` (``N. tool: text args={...} (after 1, 2)``)."""
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
            nodes.append(Node.make(m.group(2), m.group(3), arguments))
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
        graph = nx.DiGraph()
        for i, n in enumerate(self.nodes):
            graph.add_node(i, tool=n.tool, text=n.text, arguments=n.arguments)
        graph.add_edges_from(self.edges)
        return graph

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
        return list(nx.lexicographical_topological_sort(self.to_networkx()))

    def canonical(self) -> Workflow:
        """The canonical form: nodes in the topological order that breaks ties by (tool, text, then
        canonical predecessors), edges sorted. Equal canonical forms mean the same labelled DAG up to
        renumbering for workflows whose equal-labelled nodes have distinct predecessor sets."""
        graph = self.to_networkx()
        placed: dict[int, int] = {}
        remaining = set(range(len(self.nodes)))
        indegree = {i: graph.in_degree(i) for i in remaining}
        while remaining:
            ready = [i for i in remaining if indegree[i] == 0]
            best = min(
                ready,
                key=lambda i: (
                    self.nodes[i].tool or "",
                    self.nodes[i].text,
                    self.nodes[i].params,
                    sorted(placed[p] for p in graph.predecessors(i)),
                    i,
                ),
            )
            placed[best] = len(placed)
            remaining.remove(best)
            for s in graph.successors(best):
                indegree[s] -= 1
        order = sorted(placed, key=placed.get)
        nodes = tuple(self.nodes[i] for i in order)
        edges = tuple(sorted((placed[a], placed[b]) for a, b in self.edges))
        return Workflow(nodes, edges)

    def canonical_key(self) -> str:
        """A string key of the canonical form (for exact vote counting)."""
        return self.canonical().to_json()

