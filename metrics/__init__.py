"""Workflow metrics: node alignment, the exact structural scores of ``Workflow`` graphs
(``resilibench.core.workflow``), lexical and semantic scores, the LLM judge, the robustness risk, and the
perturbations and calibration of every metric. Names are imported on first use, so the lexical, semantic
and judge metrics load their heavier libraries only when used.
"""

__all__ = [
    "Alignment", "BertScore", "BertScorer", "CalibrationSettings", "Cluster", "GoldenSet", "Judge", "NodeEmbedder",
    "Perturbation", "RiskReport", "Score", "Verdict", "WorkflowScorer", "align", "bertscore", "bleu", "chain_f1",
    "gleu", "golden_workflows", "kendall_tau", "lexical_scores", "mcis_f1", "parse_verdict",
    "perturbation_rng", "plan_calibration", "reachability_f1", "robustness_risk", "similarity_matrix",
    "score_items", "structural_details", "structural_scores", "workflow_text",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .alignment import Alignment, NodeEmbedder, align, similarity_matrix
    from .calibration import CalibrationSettings, WorkflowScorer, plan_calibration, score_items
    from .judge import Judge, Verdict, parse_verdict
    from .lexical import bleu, gleu, lexical_scores, workflow_text
    from .perturb import GoldenSet, Perturbation, golden_workflows, perturbation_rng
    from .robustness import Cluster, RiskReport, robustness_risk
    from .semantic import BertScore, BertScorer, bertscore
    from .structural import (
        Score,
        chain_f1,
        kendall_tau,
        mcis_f1,
        reachability_f1,
        structural_details,
        structural_scores,
    )


__getattr__, __dir__ = lazy_exports(__name__, {
    ".alignment": ("Alignment", "NodeEmbedder", "align", "similarity_matrix"),
    ".calibration": ("CalibrationSettings", "WorkflowScorer", "plan_calibration", "score_items"),
    ".judge": ("Judge", "Verdict", "parse_verdict"),
    ".lexical": ("bleu", "gleu", "lexical_scores", "workflow_text"),
    ".perturb": ("GoldenSet", "Perturbation", "golden_workflows", "perturbation_rng"),
    ".robustness": ("Cluster", "RiskReport", "robustness_risk"),
    ".semantic": ("BertScore", "BertScorer", "bertscore"),
    ".structural": ("Score", "chain_f1", "kendall_tau", "mcis_f1", "reachability_f1", "structural_details",
                    "structural_scores"),
})
