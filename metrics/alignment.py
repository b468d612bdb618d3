"""Node alignment between a predicted and a reference workflow (RobustFlow eq. 4 and the matching after it).

Every structural metric compares two workflows through one alignment: a one-to-one map from some
predicted steps to some reference steps. Steps are compared by a similarity in [0, 1]:

- both steps name a tool: 1.0 if it is the same tool, else 0.0 (a different tool is a different step,
  however alike the wording; no embedding is computed);
- otherwise: 1.0 for identical texts, else the cosine similarity of the texts' sentence embeddings
  (a step without text is read as its tool's operation phrase, see ``node_text``).

Similarities are rounded to 4 decimals (so float noise cannot flip a decision), pairs below ``beta``
are pruned, and a maximum-weight bipartite matching on what is left gives the alignment. Ties are broken
by a stated rule (see ``align``), so the result is a function of the two workflows alone.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_BETA", "DECIMALS", "NodeEmbedder", "default_embedder", "Alignment", "node_text",
    "similarity_matrix", "execution_order", "match", "align",
]

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..core.registry import OPERATION_PHRASES, default_registry
from ..core.workflow import Node, Workflow

DEFAULT_BETA = 0.6
DECIMALS = 4  # similarities are rounded to this many decimals before pruning and matching
_SCALE = 10**DECIMALS
_EXACT_LIMIT = 2**50  # composite matching weights stay below this, so float64 sums are exact integers


class NodeEmbedder:
    """Sentence similarity of step texts, with embeddings cached per text.

    ``backend``: "semantic" (sentence-transformers with the local all-MiniLM-L6-v2; needs the ``embed``
    extra), "lexical" (cosine of stemmed token sets; deterministic, no model), or "auto" (semantic when
    the extra is installed, else lexical with a warning). ``self.backend`` names what is in use.
    """

    def __init__(self, backend: str = "auto", *, batch_size: int = 64) -> None:
        if backend not in ("auto", "semantic", "lexical"):
            raise ValueError(f"embedder backend must be 'auto', 'semantic' or 'lexical', got {backend!r}")
        from ..core.matching import LexicalMatcher, load_embedding_model

        self.model = None
        self.batch_size = batch_size
        self._cache: dict[str, np.ndarray] = {}
        self._lexical = LexicalMatcher()
        if backend != "lexical":
            try:
                self.model = load_embedding_model()
            except ImportError as exc:
                if backend == "semantic":
                    raise
                warnings.warn(f"{exc}; aligning workflow steps by lexical similarity instead", stacklevel=2)
        self.backend = "all-MiniLM-L6-v2" if self.model is not None else "lexical"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm embeddings, one row per text; only texts not seen before are encoded (in batches)."""
        if self.model is None:
            raise RuntimeError("the lexical backend has no embeddings; use similarity()")
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            vectors = self.model.encode(missing, batch_size=self.batch_size, normalize_embeddings=True,
                                        convert_to_numpy=True, show_progress_bar=False)
            self._cache.update(zip(missing, np.asarray(vectors, dtype=np.float64), strict=True))
        if not texts:
            return np.zeros((0, 0))
        return np.stack([self._cache[t] for t in texts])

    def similarity(self, a: Sequence[str], b: Sequence[str]) -> np.ndarray:
        """``len(a) x len(b)`` similarities in [0, 1]; identical texts score exactly 1."""
        if not a or not b:
            return np.zeros((len(a), len(b)))
        if self.model is None:
            sims = self._lexical.similarity(a, b)
        else:
            vectors = self.encode(list(a) + list(b))
            sims = vectors[: len(a)] @ vectors[len(a):].T
        sims = np.clip(sims, 0.0, 1.0)
        sims[np.asarray(a, dtype=object)[:, None] == np.asarray(b, dtype=object)[None, :]] = 1.0
        return sims


@cache
def default_embedder() -> NodeEmbedder:
    """The shared "auto" embedder (loaded on first use, so tool-only workflows never load a model)."""
    return NodeEmbedder("auto")


@dataclass(frozen=True, eq=False)
class Alignment:
    """A one-to-one map between predicted and reference steps.

    ``pairs``: (pred index, ref index, similarity), sorted by pred index. ``similarity``: the full
    ``|Vp| x |Vg|`` matrix (rounded, before pruning). ``beta``: the pruning threshold used.
    """

    pairs: tuple[tuple[int, int, float], ...]
    similarity: np.ndarray
    beta: float

    @property
    def n_pred(self) -> int:
        return self.similarity.shape[0]

    @property
    def n_ref(self) -> int:
        return self.similarity.shape[1]

    @property
    def mapping(self) -> dict[int, int]:
        """pred index -> ref index."""
        return {p: r for p, r, _ in self.pairs}

    @property
    def weight(self) -> float:
        return float(sum(s for _, _, s in self.pairs))

    def check(self, pred: Workflow, ref: Workflow) -> None:
        """Raise ValueError unless this alignment was made for workflows of these sizes."""
        if (self.n_pred, self.n_ref) != (len(pred.nodes), len(ref.nodes)):
            raise ValueError(f"alignment is for {self.n_pred} x {self.n_ref} nodes, "
                             f"got workflows of {len(pred.nodes)} and {len(ref.nodes)}")


def node_text(node: Node) -> str:
    """The text a step is compared by: its text; else, for a tool of the default registry, the phrase of
    its operation (the text reference workflows carry, e.g. "read and retrieve data from files"); else
    its tool name in words."""
    return node.text or _tool_phrase(node.tool or "")


@cache
def _tool_phrase(name: str) -> str:
    registry = default_registry()
    try:
        return OPERATION_PHRASES[registry.tools[registry.id_of(name)].operation]
    except KeyError:
        return name.replace("_", " ")


def similarity_matrix(pred: Workflow, ref: Workflow, embedder: NodeEmbedder | None = None) -> np.ndarray:
    """``|Vp| x |Vg|`` step similarities in [0, 1], rounded to 4 decimals (rules in the module docstring).

    The embedder (default: the shared "auto" one) is used only for pairs where a step has no tool.
    """
    p_tools, g_tools = [n.tool for n in pred.nodes], [n.tool for n in ref.nodes]
    sims = np.array([[float(a is not None and a == b) for b in g_tools] for a in p_tools]).reshape(
        len(p_tools), len(g_tools))
    text_rows = [i for i, t in enumerate(p_tools) if t is None]
    text_cols = [j for j, t in enumerate(g_tools) if t is None]
    if text_rows or text_cols:
        # Pairs where either step has no tool are compared by text: whole rows and whole columns.
        rows = range(len(p_tools)) if text_cols else text_rows
        cols = range(len(g_tools)) if text_rows else text_cols
        if rows and cols:
            text = (embedder or default_embedder()).similarity(
                [node_text(pred.nodes[i]) for i in rows], [node_text(ref.nodes[j]) for j in cols])
            block = np.ix_(rows, cols)
            by_text = np.array([[p_tools[i] is None or g_tools[j] is None for j in cols] for i in rows])
            sims[block] = np.where(by_text, text, sims[block])
    return np.round(sims, DECIMALS)


@lru_cache(maxsize=8192)
def execution_order(workflow: Workflow) -> tuple[int, ...]:
    """The workflow's topological order, ties broken by the lower node index (``Workflow.topological_order``;
    for a plan listed in execution order it is the node list)."""
    return tuple(workflow.topological_order())


def _ranks(workflow: Workflow) -> np.ndarray:
    rank = np.empty(len(workflow.nodes), dtype=np.int64)
    rank[list(execution_order(workflow))] = np.arange(len(workflow.nodes))
    return rank


def match(similarity: np.ndarray, beta: float, pred_rank: np.ndarray, ref_rank: np.ndarray
          ) -> tuple[tuple[int, int, float], ...]:
    """Maximum-weight matching on the similarities >= beta, with the tie rule of ``align``.

    The three criteria are folded into one integer weight per pair, so one exact assignment solves them
    lexicographically: weight (similarity in units of 1e-4) first, then one per pair, then
    ``(N - rank_pred) * (N - rank_ref)``; every level is scaled above the largest total of the levels
    below it. The last level is dropped for workflows too large for exact float64 sums (over ~160 steps).
    """
    n_p, n_g = similarity.shape
    allowed = similarity >= beta
    if not allowed.any():
        return ()
    n = max(n_p, n_g)
    units = np.rint(similarity * _SCALE).astype(np.int64)
    order_bonus = (n - pred_rank)[:, None] * (n - ref_rank)[None, :]
    pair_unit = n**3 + 1  # exceeds any total of order bonuses (at most n pairs of at most n^2 each)
    weight_unit = (n + 1) * pair_unit
    if n * (_SCALE * weight_unit + pair_unit + n * n) >= _EXACT_LIMIT:
        order_bonus, pair_unit, weight_unit = np.zeros_like(order_bonus), 1, n + 1
    composite = np.where(allowed, units * weight_unit + pair_unit + order_bonus, 0).astype(np.float64)
    rows, cols = linear_sum_assignment(composite, maximize=True)
    return tuple((int(i), int(j), float(similarity[i, j])) for i, j in zip(rows, cols, strict=True)
                 if allowed[i, j])


def align(pred: Workflow, ref: Workflow, *, beta: float = DEFAULT_BETA,
          embedder: NodeEmbedder | None = None) -> Alignment:
    """Align predicted to reference steps: prune similarities below ``beta``, then take the
    maximum-weight bipartite matching.

    Tie rule, applied in this order among matchings of equal total (rounded) similarity: more pairs;
    then the larger sum over pairs of ``(N - a) * (N - b)``, where ``a`` and ``b`` are the steps' ranks in
    their workflows' execution orders and ``N`` the larger workflow size. The last criterion prefers
    earlier steps and never crosses interchangeable steps, so the i-th of several identical steps in
    the prediction aligns with the i-th identical step of the reference (in execution order).
    """
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1], got {beta!r}")
    sims = similarity_matrix(pred, ref, embedder)
    sims.setflags(write=False)
    pairs = match(sims, beta, _ranks(pred), _ranks(ref))
    return Alignment(pairs, sims, beta)
