"""Workflow metrics: node alignment and the exact structural scores of ``Workflow`` graphs (``resilibench.core.workflow``).

Lexical, semantic, judge, robustness and calibration metrics live in their own modules
(``resilibench.metrics.lexical`` ...) because they load heavier libraries.
"""

from .alignment import Alignment, NodeEmbedder, align, similarity_matrix
from .structural import (
    Score,
    chain_f1,
    kendall_tau,
    mcis_f1,
    reachability_f1,
    structural_details,
    structural_scores,
)

__all__ = [
    "Alignment",
    "NodeEmbedder",
    "Score",
    "align",
    "chain_f1",
    "kendall_tau",
    "mcis_f1",
    "reachability_f1",
    "similarity_matrix",
    "structural_details",
    "structural_scores",
]
