"""Robustness risk of a workflow generator over semantic clusters (RobustFlow, section 3.1, eq. 1).

A semantic cluster C(q) is an original instruction q and its perturbed variants q + delta (eq. 3). The
generator's workflow for q is the reference; each variant's workflow is compared with it by a
structural similarity F: W x W -> [0, 1] with F(w, w) = 1. Eq. 1 defines the robustness risk at
perturbation intensity k as the expected discrepancy

    R_k(G) = E_{q ~ Q, delta ~ P_k} [ 1 - F(G(q), G(q + delta)) ].

It is estimated here as the mean over clusters of each cluster's mean discrepancy over its variants
(the inner mean estimates the expectation over delta for that q, the outer one the expectation over
q), so a cluster with more variants does not weigh more. ``by_intensity`` gives R_k per intensity
label; ``risk`` pools every variant. The paper's F are node-chain F1 (F_node, eq. 5) and reachability
F1 (F_graph, eq. 7): ``SIMILARITIES["node"]`` and ``SIMILARITIES["graph"]``.
"""

from __future__ import annotations

__all__ = [
    "Similarity", "TOLERANCE", "SIMILARITIES", "Cluster", "RiskReport", "risk_from_similarities",
    "robustness_risk",
]

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from ..core.workflow import Workflow

# F(reference, variant) -> similarity in [0, 1].
Similarity = Callable[[Workflow, Workflow], float]
TOLERANCE = 1e-9


def _node(reference: Workflow, variant: Workflow) -> float:
    from .structural import chain_f1

    return chain_f1(variant, reference).f1


def _graph(reference: Workflow, variant: Workflow) -> float:
    from .structural import reachability_f1

    return reachability_f1(variant, reference).f1


SIMILARITIES: dict[str, Similarity] = {"node": _node, "graph": _graph}


@dataclass(frozen=True)
class Cluster:
    """An original workflow and the workflows of its variants; ``intensities`` (optional) labels each
    variant with its perturbation intensity k (e.g. "light", "paraphrase")."""

    original: Workflow
    variants: tuple[Workflow, ...]
    intensities: tuple[Hashable, ...] | None = None
    cluster_id: Hashable = None

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError(f"cluster {self.cluster_id!r} has no variants: eq. 1 needs at least one")
        if self.intensities is not None and len(self.intensities) != len(self.variants):
            raise ValueError(f"cluster {self.cluster_id!r}: {len(self.intensities)} intensities for "
                             f"{len(self.variants)} variants")


@dataclass(frozen=True)
class RiskReport:
    """``risk``: R over all variants; ``by_intensity``: R_k per intensity label; ``per_cluster``: each
    cluster's mean discrepancy; ``clusters`` and ``pairs``: how many went in."""

    risk: float
    by_intensity: dict[Hashable, float]
    per_cluster: dict[Hashable, float]
    clusters: int
    pairs: int

    def to_dict(self) -> dict[str, Any]:
        return {"risk": self.risk, "by_intensity": {str(k): v for k, v in self.by_intensity.items()},
                "per_cluster": {str(k): v for k, v in self.per_cluster.items()}, "clusters": self.clusters,
                "pairs": self.pairs}


def _check(value: float, where: str) -> float:
    value = float(value)
    if not -TOLERANCE <= value <= 1 + TOLERANCE:
        raise ValueError(f"{where}: the similarity must lie in [0, 1] (RobustFlow eq. 1), got {value}")
    return min(1.0, max(0.0, value))


def risk_from_similarities(similarities: Mapping[Hashable, Sequence[float]]) -> float:
    """Eq. 1 from precomputed similarities F(original, variant), grouped by cluster: the mean over
    clusters of the mean of 1 - F over the cluster's variants."""
    if not similarities:
        raise ValueError("no clusters: the risk is undefined")
    means = []
    for cluster_id, values in similarities.items():
        if not values:
            raise ValueError(f"cluster {cluster_id!r} has no similarities")
        means.append(fmean(1.0 - _check(v, f"cluster {cluster_id!r}") for v in values))
    return fmean(means)


def robustness_risk(clusters: Iterable[Cluster], similarity: Similarity | str = "node") -> RiskReport:
    """Eq. 1 over ``clusters`` with ``similarity`` (a name in SIMILARITIES or F(reference, variant))."""
    if isinstance(similarity, str):
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {sorted(SIMILARITIES)} or a callable, got {similarity!r}")
        similarity = SIMILARITIES[similarity]
    clusters = list(clusters)
    overall: dict[Hashable, list[float]] = {}
    per_k: dict[Hashable, dict[Hashable, list[float]]] = {}
    for index, cluster in enumerate(clusters):
        key = cluster.cluster_id if cluster.cluster_id is not None else index
        if key in overall:
            raise ValueError(f"duplicate cluster id {key!r}")
        labels = cluster.intensities or (None,) * len(cluster.variants)
        overall[key] = []
        for variant, k in zip(cluster.variants, labels, strict=True):
            f = _check(similarity(cluster.original, variant), f"cluster {key!r}")
            overall[key].append(f)
            if k is not None:
                per_k.setdefault(k, {}).setdefault(key, []).append(f)
    per_cluster = {key: fmean(1.0 - f for f in values) for key, values in overall.items()}
    return RiskReport(
        risk=risk_from_similarities(overall),
        by_intensity={k: risk_from_similarities(groups) for k, groups in per_k.items()},
        per_cluster=per_cluster,
        clusters=len(overall),
        pairs=sum(len(v) for v in overall.values()),
    )
