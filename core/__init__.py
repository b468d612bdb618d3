"""The world and its rules: the world config, worlds and their task libraries, the simulator (``Episode``),
the evaluator, the tool registry, the ``Workflow`` type, the planner interface and plan following.

The names below are imported on first use; ``core.tasks``, ``core.text`` and ``core.bounds`` declare their own.
"""

__all__ = [
    "DEFAULT_WORLD", "LEVELS", "WORLDS", "CallRecord", "Episode", "EpisodeRules", "Evaluation", "EvaluatorConfig",
    "FailureModel", "FailureProcesses", "Node", "PlanFollower", "PlanFollowingPlanner", "Planner", "ShapedReward",
    "Tool", "ToolRegistry", "TrainingDynamics", "Workflow", "World", "WorldConfig", "default_registry", "evaluate",
    "get_task", "get_world", "load_config", "load_tasks", "workflow_success",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .config import (
        EpisodeRules,
        EvaluatorConfig,
        FailureModel,
        FailureProcesses,
        ShapedReward,
        TrainingDynamics,
        WorldConfig,
        load_config,
    )
    from .evaluator import LEVELS, Evaluation, evaluate
    from .plan_follower import PlanFollower, PlanFollowingPlanner, workflow_success
    from .planner import Planner
    from .registry import Tool, ToolRegistry, default_registry
    from .simulator import CallRecord, Episode
    from .workflow import Node, Workflow
    from .world import DEFAULT_WORLD, WORLDS, World, get_task, get_world, load_tasks


__getattr__, __dir__ = lazy_exports(__name__, {
    ".config": ("EpisodeRules", "EvaluatorConfig", "FailureModel", "FailureProcesses", "ShapedReward",
                "TrainingDynamics", "WorldConfig", "load_config"),
    ".evaluator": ("LEVELS", "Evaluation", "evaluate"),
    ".plan_follower": ("PlanFollower", "PlanFollowingPlanner", "workflow_success"),
    ".planner": ("Planner",),
    ".registry": ("Tool", "ToolRegistry", "default_registry"),
    ".simulator": ("CallRecord", "Episode"),
    ".workflow": ("Node", "Workflow"),
    ".world": ("DEFAULT_WORLD", "WORLDS", "World", "get_task", "get_world", "load_tasks"),
})
