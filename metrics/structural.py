"""Exact structural metrics between a predicted and a reference workflow, through one node alignment.

All metrics see the two workflows through an ``Alignment`` (``metrics.alignment.align``): a
one-to-one map pi from aligned predicted steps to aligned reference steps. ``u ~> v`` means a directed
path from u to v in the workflow's whole DAG (unaligned steps included). Shared conventions:

- two empty workflows score 1 everywhere; one empty and one not score 0;
- F1 is the harmonic mean of precision and recall, 0 when both are 0.

Definitions (proofs and examples in docs/metrics.md):

- chain F1: the predicted chain is the prediction's execution order (its topological order, ties by
  node index). l = the longest subsequence of that chain whose aligned reference steps appear in the
  same order in some topological order of the reference; p = l/|Vp|, r = l/|Vg|. Computed without
  enumerating orders: l = largest set of aligned steps with no pair ordered against the reference's
  reachability = a maximum antichain of a partial order, found by bipartite matching (Dilworth).
- reachability F1 (RobustFlow eq. 6-7): R_pred = {(pi(u), pi(v)) : u ~> v in the prediction},
  R_ref = {(x, y) : x ~> y in the reference}, both over aligned steps only; p = |R_pred & R_ref| /
  |R_pred|, r = |R_pred & R_ref| / |R_ref|, an empty set giving 1 (nothing claimed, nothing missed).
  With no aligned step (and non-empty workflows) the score is 0.
- MCIS F1 (WorkflowPerturb B.2): k = the size of the largest set S of aligned pairs on which the
  alignment is an isomorphism of induced subgraphs (for pairs (u, x), (v, y) in S: u -> v is an edge
  of the prediction iff x -> y is an edge of the reference); p = k/|Vp|, r = k/|Vg|.
- Kendall tau: tau-b of the two workflows' reachability orders on the aligned steps (for chains, the
  plain Kendall tau of WorkflowPerturb B.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from resilibench.metrics.alignment import Alignment, NodeEmbedder, align, execution_order
from resilibench.metrics.workflow import Workflow


@dataclass(frozen=True)
class Score:
    """Precision, recall and F1, plus the matched size behind them (chain length l, MCIS size k, or
    shared reachability pairs)."""

    precision: float
    recall: float
    f1: float
    size: int = 0

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
    return _Graph(edge, reach, tuple(rank))


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

    @property
    def aligned(self) -> int:
        return len(self.edge_pred)

    def fixed(self) -> Score | None:
        """The score of the degenerate cases: 1 for two empty workflows, 0 when one is empty."""
        if self.n_pred and self.n_ref:
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
    return _View(len(pred.nodes), len(ref.nodes), gp.edge[pp], gr.edge[rr], gp.reach[pp], gr.reach[rr])


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
    fixed = view.fixed()
    if fixed is not None:
        return fixed
    if not view.aligned:
        return Score(0.0, 0.0, 0.0)
    shared = int(np.count_nonzero(view.reach_pred & view.reach_ref))
    return Score.from_counts(shared, int(np.count_nonzero(view.reach_pred)), int(np.count_nonzero(view.reach_ref)))


def _bits(x: int):
    """The indices of the set bits of ``x``, lowest first."""
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


def _max_independent_set(vertices: int, neighbours: list[int]) -> int:
    """Size of a maximum independent set of the graph induced by the bitset ``vertices``.

    Branch and reduce: a vertex of degree <= 1 is always in some maximum set (take it); a vertex of degree
    2 in a triangle likewise; a vertex v of degree 2 with non-adjacent neighbours u, w is folded (u, v, w
    become one vertex adjacent to N(u) | N(w), and the answer grows by 1); components are solved apart;
    otherwise branch on a vertex of maximum degree (leave it out, or take it and drop its neighbours).
    ``neighbours`` is copied before the first fold, so sibling branches never see each other's folds.
    """
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
        return (taken + _max_independent_set(component, neighbours)
                + _max_independent_set(vertices & ~component, neighbours))
    v = max(_bits(vertices), key=lambda x: (neighbours[x] & vertices).bit_count())
    return taken + max(_max_independent_set(vertices & ~(1 << v), neighbours),
                       1 + _max_independent_set(vertices & ~(neighbours[v] | 1 << v), neighbours))


def _mcis(view: _View) -> Score:
    """k = the largest set of aligned pairs on which the induced edges of both workflows agree.

    Two pairs conflict when the edges between them differ; k is a maximum independent set of this
    conflict graph (a maximum clique of the compatible pairs). Every conflict involves an edge of one of
    the workflows, so the conflict graph is sparse and the reductions above do most of the work.
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
        size = _max_independent_set((1 << size) - 1, neighbours)
    return Score.from_counts(size, view.n_pred, view.n_ref)


def _kendall(view: _View) -> float:
    """tau-b from reachability counts: a DAG never has both u ~> v and v ~> u, so the sum of
    s_pred * s_ref over ordered pairs is (#pairs ordered alike) - (#pairs ordered oppositely)."""
    fixed = view.fixed()
    if fixed is not None:
        return fixed.f1
    if not view.aligned:
        return 0.0
    ordered_p, ordered_g = int(np.count_nonzero(view.reach_pred)), int(np.count_nonzero(view.reach_ref))
    if not ordered_p and not ordered_g:
        return 1.0
    if not ordered_p or not ordered_g:
        return 0.0
    alike = np.count_nonzero(view.reach_pred & view.reach_ref)
    opposite = np.count_nonzero(view.reach_pred & view.reach_ref.T)
    return float((alike - opposite) / np.sqrt(float(ordered_p) * float(ordered_g)))


def chain_f1(pred: Workflow, ref: Workflow, alignment: Alignment | None = None) -> Score:
    """Node chain F1: p = l/|Vp|, r = l/|Vg| (exact, without enumerating topological orders)."""
    return _chain(_view(pred, ref, alignment))


def reachability_f1(pred: Workflow, ref: Workflow, alignment: Alignment | None = None) -> Score:
    """RobustFlow's graph F1: reachability pairs of the two DAGs on the aligned steps, compared through
    the alignment. Paths through unaligned steps count (``u ~> v`` in the whole workflow)."""
    return _reachability(_view(pred, ref, alignment))


def mcis_f1(pred: Workflow, ref: Workflow, alignment: Alignment | None = None) -> Score:
    """Graph F1 by maximum common induced subgraph (WorkflowPerturb): p = k/|Vp|, r = k/|Vg|."""
    return _mcis(_view(pred, ref, alignment))


def kendall_tau(pred: Workflow, ref: Workflow, alignment: Alignment | None = None) -> float:
    """Kendall tau-b between the two workflows' orders on the aligned steps.

    A pair of aligned steps is ordered (+1/-1) in a workflow when a path joins them, tied (0) otherwise;
    tau = sum(s_pred * s_ref) / sqrt(#ordered in pred * #ordered in ref). For chains this is Kendall's
    tau. Degenerate cases: no aligned step: 1 if both workflows are empty, else 0; no ordered pair in
    either workflow (e.g. a single aligned step): 1; ordered pairs in only one of them: 0.
    """
    return _kendall(_view(pred, ref, alignment))


def structural_scores(pred: Workflow, ref: Workflow, alignment: Alignment | None = None,
                      embedder: NodeEmbedder | None = None) -> dict[str, float]:
    """Every structural metric from one alignment: ``{name}_precision/_recall/_f1`` for chain,
    reachability and mcis, and ``kendall_tau``."""
    if alignment is None and pred.nodes and ref.nodes:
        alignment = align(pred, ref, embedder=embedder)
    view = _view(pred, ref, alignment)
    out: dict[str, float] = {}
    for name, metric in (("chain", _chain), ("reachability", _reachability), ("mcis", _mcis)):
        score = metric(view)
        out |= {f"{name}_precision": score.precision, f"{name}_recall": score.recall, f"{name}_f1": score.f1}
    out["kendall_tau"] = _kendall(view)
    return out
