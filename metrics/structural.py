"""Exact structural metrics between a predicted and a reference workflow, through one node alignment.

All metrics see the two workflows through an ``Alignment`` (``metrics.alignment.align``): a
one-to-one map pi from aligned predicted steps to aligned reference steps. ``u ~> v`` means a directed
path from u to v in the workflow's whole DAG (unaligned steps included). Shared conventions:

- two empty workflows score 1 everywhere; one empty and one not score 0;
- a cyclic workflow (``Workflow.repairs.cyclic``: read leniently from a graph with a cycle or a
  self-loop) scores 0 everywhere: no order executes it;
- F1 is the harmonic mean of precision and recall, 0 when both are 0.

Definitions (proofs and examples in docs/metrics/structural.md):

- chain F1: the predicted chain is the prediction's execution order (its topological order, ties by
  node index). l = the longest subsequence of that chain whose aligned reference steps appear in the
  same order in some topological order of the reference; p = l/|Vp|, r = l/|Vg|. Computed without
  enumerating orders: l = largest set of aligned steps with no pair ordered against the reference's
  reachability = a maximum antichain of a partial order, found by bipartite matching (Dilworth).
- reachability F1 (RobustFlow eq. 6-7, over whole workflows): R(W) = {(u, u)} | {(u, v) : u ~> v}
  over every step of W (each step reaches itself); the prediction's pairs are carried into reference
  indices through pi (a pair with an unaligned step is never shared); p = |shared| / |R(pred)|,
  r = |shared| / |R(ref)|. Neither set is empty, so no convention is needed and workflows sharing one
  step score about 1/n, not 1.
- MCIS F1 (WorkflowPerturb B.2): k = the size of the largest set S of aligned pairs on which the
  alignment is an isomorphism of induced subgraphs (for pairs (u, x), (v, y) in S: u -> v is an edge
  of the prediction iff x -> y is an edge of the reference); p = k/|Vp|, r = k/|Vg|. Exact within a
  search budget; past it, ``Score.exact`` is False and k lies in [size, size_upper].
- Kendall tau: tau-b of the two workflows' reachability orders on the aligned steps (for chains, the
  plain Kendall tau of WorkflowPerturb B.5); with no ordered aligned pair in either workflow it is 1
  only when every step of both workflows is aligned, else 0.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MCIS_BUDGET", "Score", "chain_f1", "reachability_f1", "mcis_f1", "kendall_tau",
    "structural_details", "structural_scores",
]

import sys
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from ..core.workflow import Workflow
from .alignment import Alignment, NodeEmbedder, align, execution_order

DEFAULT_MCIS_BUDGET = 100_000  # search calls per MCIS before it reports bounds (seconds, not minutes)


class _OutOfBudget(Exception):
    """Raised inside the MCIS search when its budget of calls is spent."""


@dataclass(frozen=True)
class Score:
    """Precision, recall and F1, plus the matched size behind them (chain length l, MCIS size k, or
    shared reachability pairs).

    ``exact`` is False only for an MCIS whose search ran out of budget: then ``size`` is the largest
    common subgraph found (a lower bound, and what precision, recall and F1 are computed from), and
    ``size_upper`` and ``f1_upper`` are upper bounds on the exact k and F1."""

    precision: float
    recall: float
    f1: float
    size: int = 0
    exact: bool = True
    size_upper: int | None = None
    f1_upper: float | None = None

    @property
    def f1_bounds(self) -> tuple[float, float]:
        """(lowest, highest) F1 the exact answer can have: (f1, f1) when exact."""
        if self.exact:
            return (self.f1, self.f1)
        assert self.f1_upper is not None  # an inexact score carries its upper bound
        return (self.f1, self.f1_upper)

    @classmethod
    def from_counts(cls, shared: int, n_pred: int, n_ref: int) -> Score:
        """p = shared/n_pred, r = shared/n_ref (1 for an empty side); F1 = 2 shared/(n_pred + n_ref), the
        harmonic mean written so that equal inputs give bit-identical outputs."""
        precision = shared / n_pred if n_pred else 1.0
        recall = shared / n_ref if n_ref else 1.0
        return cls(precision, recall, 2 * shared / (n_pred + n_ref) if n_pred + n_ref else 1.0, shared)


@dataclass(frozen=True, eq=False)
class _Graph:
    """A workflow's structure as boolean matrices: ``edge[u, v]`` and ``reach[u, v]`` (u ~> v)."""

    edge: np.ndarray
    reach: np.ndarray
    rank: tuple[int, ...]  # position of each node in the execution order
    ordered_pairs: int  # number of (u, v) with u ~> v


@lru_cache(maxsize=8192)
def _graph(workflow: Workflow) -> _Graph:
    n = len(workflow.nodes)
    successors: list[list[int]] = [[] for _ in range(n)]
    for a, b in workflow.edges:
        successors[a].append(b)
    order = execution_order(workflow)
    bits = [0] * n  # reachable set of each node as an int bitset, filled in reverse topological order
    for u in reversed(order):
        for v in successors[u]:
            bits[u] |= (1 << v) | bits[v]
    width = (n + 7) // 8
    reach = np.zeros((n, n), dtype=bool)
    if n:
        packed = np.frombuffer(b"".join(b.to_bytes(width, "little") for b in bits), dtype=np.uint8)
        reach = np.unpackbits(packed.reshape(n, width), axis=1, count=n, bitorder="little").astype(bool)
    edge = np.zeros((n, n), dtype=bool)
    if workflow.edges:
        a, b = np.array(workflow.edges).T
        edge[a, b] = True
    rank = [0] * n
    for position, node in enumerate(order):
        rank[node] = position
    for array in (edge, reach):
        array.setflags(write=False)
    return _Graph(edge, reach, tuple(rank), int(np.count_nonzero(reach)))


@dataclass(frozen=True, eq=False)
class _View:
    """Both workflows restricted to the aligned steps, listed in the prediction's execution order:
    entry [i, j] of each matrix is about the i-th and j-th aligned pair."""

    n_pred: int
    n_ref: int
    edge_pred: np.ndarray
    edge_ref: np.ndarray
    reach_pred: np.ndarray
    reach_ref: np.ndarray
    ordered_pred: int  # u ~> v pairs in the whole prediction
    ordered_ref: int
    cyclic: bool

    @property
    def aligned(self) -> int:
        return len(self.edge_pred)

    def fixed(self) -> Score | None:
        """The score of the degenerate cases: 1 for two empty workflows, 0 when one is empty or cyclic."""
        if self.n_pred and self.n_ref and not self.cyclic:
            return None
        return Score(1.0, 1.0, 1.0) if not self.n_pred and not self.n_ref else Score(0.0, 0.0, 0.0)


def _view(pred: Workflow, ref: Workflow, alignment: Alignment | None) -> _View:
    if pred.nodes and ref.nodes:
        alignment = alignment if alignment is not None else align(pred, ref)
        alignment.check(pred, ref)
        pairs = alignment.pairs
    else:
        pairs = ()
    gp, gr = _graph(pred), _graph(ref)
    rank = gp.rank
    ordered = sorted(pairs, key=lambda pair: rank[pair[0]])
    ps = np.array([p for p, _, _ in ordered], dtype=np.int64)
    rs = np.array([r for _, r, _ in ordered], dtype=np.int64)
    pp, rr = (ps[:, None], ps), (rs[:, None], rs)
    return _View(len(pred.nodes), len(ref.nodes), gp.edge[pp], gr.edge[rr], gp.reach[pp], gr.reach[rr],
                 gp.ordered_pairs, gr.ordered_pairs, pred.repairs.cyclic or ref.repairs.cyclic)


def _max_bipartite_matching(adjacency: list[list[int]], n_right: int) -> int:
    """Size of a maximum matching (augmenting paths; the graphs here have at most a few hundred nodes)."""
    owner = [-1] * n_right

    def augment(u: int, seen: list[bool]) -> bool:
        for v in adjacency[u]:
            if not seen[v]:
                seen[v] = True
                if owner[v] < 0 or augment(owner[v], seen):
                    owner[v] = u
                    return True
        return False

    return sum(augment(u, [False] * n_right) for u in range(len(adjacency)) if adjacency[u])


def _chain(view: _View) -> Score:
    """l = the most aligned steps whose order in the predicted chain no reference path contradicts.

    Aligned steps in chain order s_1..s_m conflict when i < j and pi(s_j) ~> pi(s_i) in the reference.
    "i conflicts-before j" is the intersection of two partial orders, so it is a partial order, and l is
    its largest antichain: m minus a maximum matching between left and right copies (Dilworth's theorem
    with Fulkerson's reduction to bipartite matching).
    """
    fixed = view.fixed()
    if fixed is not None:
        return fixed
    conflict = np.triu(view.reach_ref.T, k=1)
    length = view.aligned
    if conflict.any():
        length -= _max_bipartite_matching([np.flatnonzero(row).tolist() for row in conflict], length)
    return Score.from_counts(length, view.n_pred, view.n_ref)


def _reachability(view: _View) -> Score:
    """Pairs of the reflexive-transitive closures: each aligned step shares its own pair, and aligned
    (u, v) is shared when u ~> v in both workflows."""
    fixed = view.fixed()
    if fixed is not None:
        return fixed
    shared = view.aligned + int(np.count_nonzero(view.reach_pred & view.reach_ref))
    return Score.from_counts(shared, view.n_pred + view.ordered_pred, view.n_ref + view.ordered_ref)


def _bits(x: int):
    """The indices of the set bits of ``x``, lowest first."""
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


def _max_independent_set(vertices: int, neighbours: list[int], budget: list[int]) -> int:
    """Size of a maximum independent set of the graph induced by the bitset ``vertices``.

    Branch and reduce: a vertex of degree <= 1 is always in some maximum set (take it); a vertex of degree
    2 in a triangle likewise; a vertex v of degree 2 with non-adjacent neighbours u, w is folded (u, v, w
    become one vertex adjacent to N(u) | N(w), and the answer grows by 1); components are solved apart;
    otherwise branch on a vertex of maximum degree (leave it out, or take it and drop its neighbours).
    ``neighbours`` is copied before the first fold, so sibling branches never see each other's folds.
    Each call spends one unit of ``budget[0]``; at zero the search stops with ``_OutOfBudget``.
    """
    budget[0] -= 1
    if budget[0] < 0:
        raise _OutOfBudget
    taken, owned, progress = 0, False, True
    while progress and vertices:
        progress = False
        for v in _bits(vertices):
            if not vertices >> v & 1:
                continue
            around = neighbours[v] & vertices
            degree = around.bit_count()
            if degree == 2:
                u, w = _bits(around)
                if not neighbours[u] >> w & 1:
                    if not owned:
                        neighbours, owned = list(neighbours), True
                    merged = (neighbours[u] | neighbours[w]) & vertices & ~(around | 1 << v)
                    for x in _bits(merged):
                        neighbours[x] |= 1 << v
                    neighbours[v] = merged
                    vertices &= ~around
                    taken, progress = taken + 1, True
                    continue
            elif degree > 2:
                continue
            vertices &= ~(around | 1 << v)
            taken, progress = taken + 1, True
    if not vertices:
        return taken
    component = frontier = vertices & -vertices
    while frontier:
        low = frontier & -frontier
        frontier ^= low
        grown = neighbours[low.bit_length() - 1] & vertices & ~component
        component |= grown
        frontier |= grown
    if component != vertices:
        return (taken + _max_independent_set(component, neighbours, budget)
                + _max_independent_set(vertices & ~component, neighbours, budget))
    v = max(_bits(vertices), key=lambda x: (neighbours[x] & vertices).bit_count())
    return taken + max(_max_independent_set(vertices & ~(1 << v), neighbours, budget),
                       1 + _max_independent_set(vertices & ~(neighbours[v] | 1 << v), neighbours, budget))


def _independent_set_bounds(conflict: np.ndarray) -> tuple[int, int]:
    """(lower, upper) bounds on the maximum independent set of a conflict graph: a greedy set (take a
    vertex of least remaining degree, drop its neighbours) and n minus a maximum matching (each matched
    edge keeps at least one of its ends out of any independent set)."""
    import networkx as nx

    adjacency = [set(np.flatnonzero(row).tolist()) for row in conflict]
    remaining, lower = set(range(len(adjacency))), 0
    while remaining:
        v = min(remaining, key=lambda x: (len(adjacency[x] & remaining), x))
        remaining -= adjacency[v] | {v}
        lower += 1
    graph = nx.Graph()
    graph.add_edges_from((int(a), int(b)) for a, b in zip(*np.nonzero(np.triu(conflict, k=1)), strict=True))
    return lower, len(adjacency) - len(nx.max_weight_matching(graph, maxcardinality=True))


def _mcis(view: _View, budget: int | None = DEFAULT_MCIS_BUDGET) -> Score:
    """k = the largest set of aligned pairs on which the induced edges of both workflows agree.

    Two pairs conflict when the edges between them differ; k is a maximum independent set of this
    conflict graph (a maximum clique of the compatible pairs). Every conflict involves an edge of one of
    the workflows, so the conflict graph is sparse and the reductions above do most of the work. When
    ``budget`` search calls do not settle it (None: no limit), the score reports bounds instead.
    """
    fixed = view.fixed()
    if fixed is not None:
        return fixed
    same = view.edge_pred == view.edge_ref
    conflict = ~(same & same.T)
    size = view.aligned
    if conflict.any():
        weights = [1 << j for j in range(size)]
        neighbours = [sum(w for w, c in zip(weights, row, strict=True) if c) for row in conflict.tolist()]
        try:
            size = _max_independent_set((1 << size) - 1, neighbours, [budget if budget is not None else sys.maxsize])
        except _OutOfBudget:
            lower, upper = _independent_set_bounds(conflict)
            found = Score.from_counts(lower, view.n_pred, view.n_ref)
            if lower == upper:
                return found
            return replace(found, exact=False, size_upper=upper,
                           f1_upper=Score.from_counts(upper, view.n_pred, view.n_ref).f1)
    return Score.from_counts(size, view.n_pred, view.n_ref)


def _kendall(view: _View) -> float:
    """tau-b from reachability counts: a DAG never has both u ~> v and v ~> u, so the sum of
    s_pred * s_ref over ordered pairs is (#pairs ordered alike) - (#pairs ordered oppositely)."""
    fixed = view.fixed()
    if fixed is not None:
        return fixed.f1
    ordered_p, ordered_g = int(np.count_nonzero(view.reach_pred)), int(np.count_nonzero(view.reach_ref))
    if not ordered_p and not ordered_g:  # no evidence either way: agreement only if nothing is left out
        return float(view.aligned == view.n_pred == view.n_ref)
    if not ordered_p or not ordered_g:
        return 0.0
    alike = np.count_nonzero(view.reach_pred & view.reach_ref)
    opposite = np.count_nonzero(view.reach_pred & view.reach_ref.T)
    return float((alike - opposite) / np.sqrt(float(ordered_p) * float(ordered_g)))


def chain_f1(pred: Workflow, ref: Workflow, alignment: Alignment | None = None) -> Score:
    """Node chain F1: p = l/|Vp|, r = l/|Vg| (exact, without enumerating topological orders)."""
    return _chain(_view(pred, ref, alignment))


def reachability_f1(pred: Workflow, ref: Workflow, alignment: Alignment | None = None) -> Score:
    """RobustFlow's graph F1 over whole workflows: pairs of the reflexive-transitive closures (each step
    reaches itself; paths through unaligned steps count), the prediction's carried through the
    alignment."""
    return _reachability(_view(pred, ref, alignment))


def mcis_f1(pred: Workflow, ref: Workflow, alignment: Alignment | None = None,
            budget: int | None = DEFAULT_MCIS_BUDGET) -> Score:
    """Graph F1 by maximum common induced subgraph (WorkflowPerturb): p = k/|Vp|, r = k/|Vg|. Exact
    unless the search needs more than ``budget`` calls (None: no limit); then ``exact`` is False and
    the score carries bounds (``Score.f1_bounds``)."""
    return _mcis(_view(pred, ref, alignment), budget)


def kendall_tau(pred: Workflow, ref: Workflow, alignment: Alignment | None = None) -> float:
    """Kendall tau-b between the two workflows' orders on the aligned steps.

    A pair of aligned steps is ordered (+1/-1) in a workflow when a path joins them, tied (0) otherwise;
    tau = sum(s_pred * s_ref) / sqrt(#ordered in pred * #ordered in ref). For chains this is Kendall's
    tau. Degenerate cases: no ordered aligned pair in either workflow (no aligned step, one aligned
    step, antichains): 1 when every step of both workflows is aligned (two empty workflows included),
    else 0; ordered pairs in only one of them: 0.
    """
    return _kendall(_view(pred, ref, alignment))


def structural_details(pred: Workflow, ref: Workflow, alignment: Alignment | None = None,
                       embedder: NodeEmbedder | None = None,
                       mcis_budget: int | None = DEFAULT_MCIS_BUDGET) -> dict[str, Score | float]:
    """Every structural metric from one alignment: ``chain``, ``reachability`` and ``mcis`` as
    ``Score`` objects, and ``kendall_tau``."""
    if alignment is None and pred.nodes and ref.nodes:
        alignment = align(pred, ref, embedder=embedder)
    view = _view(pred, ref, alignment)
    return {"chain": _chain(view), "reachability": _reachability(view), "mcis": _mcis(view, mcis_budget),
            "kendall_tau": _kendall(view)}


def structural_scores(pred: Workflow, ref: Workflow, alignment: Alignment | None = None,
                      embedder: NodeEmbedder | None = None,
                      mcis_budget: int | None = DEFAULT_MCIS_BUDGET) -> dict[str, float]:
    """``structural_details`` flattened: ``{name}_precision/_recall/_f1`` for chain, reachability and
    mcis, and ``kendall_tau`` (an MCIS past its budget gives its lower bound here; see the details)."""
    out: dict[str, float] = {}
    for name, value in structural_details(pred, ref, alignment, embedder, mcis_budget).items():
        if isinstance(value, Score):
            out |= {f"{name}_precision": value.precision, f"{name}_recall": value.recall, f"{name}_f1": value.f1}
        else:
            out[name] = value
    return out
