"""Robust workflow generation: instruction perturbations and their cluster datasets, the generator's answer
format, SFT and weighted DPO (TRL + PEFT), ScPO, the robustness table, small generators built from scratch,
and GRPO training of LLM agents. Names are imported on first use (training loads torch and TRL only then)."""

__all__ = [
    "PERTURBATION_TYPES", "ClusterRecord", "DemoSettings", "GRPOSettings", "GeneratorFormat", "LoraSettings",
    "PreferenceSettings", "RobustnessTable", "SFTSettings", "ScPOSettings", "Variant", "build_causal_lm",
    "build_clusters", "execution_score", "load_clusters", "merge_adapter", "parse_workflow", "robustness_table",
    "run_demo", "run_scpo", "train_grpo", "train_preferences", "train_sft", "workflow_text", "write_clusters",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .clusters import ClusterRecord, build_clusters, load_clusters, write_clusters
    from .evaluation import RobustnessTable, robustness_table
    from .generator import GeneratorFormat, execution_score, parse_workflow, workflow_text
    from .grpo import GRPOSettings, train_grpo
    from .instructions import PERTURBATION_TYPES, Variant
    from .pipeline import DemoSettings, run_demo
    from .scpo import ScPOSettings, run_scpo
    from .scratch import build_causal_lm
    from .training import (
        LoraSettings,
        PreferenceSettings,
        SFTSettings,
        merge_adapter,
        train_preferences,
        train_sft,
    )


__getattr__, __dir__ = lazy_exports(__name__, {
    ".clusters": ("ClusterRecord", "build_clusters", "load_clusters", "write_clusters"),
    ".evaluation": ("RobustnessTable", "robustness_table"),
    ".generator": ("GeneratorFormat", "execution_score", "parse_workflow", "workflow_text"),
    ".grpo": ("GRPOSettings", "train_grpo"),
    ".instructions": ("PERTURBATION_TYPES", "Variant"),
    ".pipeline": ("DemoSettings", "run_demo"),
    ".scpo": ("ScPOSettings", "run_scpo"),
    ".scratch": ("build_causal_lm",),
    ".training": ("LoraSettings", "PreferenceSettings", "SFTSettings", "merge_adapter", "train_preferences",
                  "train_sft"),
})
