"""Workflow metrics: the shared ``Workflow`` type, node alignment and the exact structural scores.

Lexical, semantic, judge, robustness and calibration metrics live in their own modules
(``resilibench.metrics.lexical`` ...) because they load heavier libraries.
"""

from resilibench.metrics.alignment import Alignment, NodeEmbedder, align, similarity_matrix
from resilibench.metrics.structural import (
    Score,
    chain_f1,
    kendall_tau,
    mcis_f1,
    reachability_f1,
    structural_details,
    structural_scores,
)
from resilibench.metrics.workflow import Node, Repairs, Workflow

__all__ = [
    "Alignment",
    "Node",
    "NodeEmbedder",
    "Repairs",
    "Score",
    "Workflow",
    "align",
    "chain_f1",
    "kendall_tau",
    "mcis_f1",
    "reachability_f1",
    "similarity_matrix",
    "structural_details",
    "structural_scores",
]
