"""Planners of the planner MDP: heuristics, the optimal policy, the runner of ``resilibench run``, RLlib PPO
(``policies.ppo``) and self-play on the adversarial game. Names are imported on first use (PPO and
self-play need the ``rl`` extra)."""

__all__ = [
    "HEURISTICS", "PLANNER_NAMES", "DependencyAwarePlanner", "InOrderPlanner", "OptimalPlanner",
    "RandomLegalPlanner", "SelfPlayConfig", "SelfPlayResult", "format_report", "make_planner", "run_episode",
    "run_jobs", "run_selfplay",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .heuristics import HEURISTICS, DependencyAwarePlanner, InOrderPlanner, RandomLegalPlanner
    from .optimal import OptimalPlanner
    from .runner import PLANNER_NAMES, make_planner, run_episode, run_jobs
    from .selfplay import SelfPlayConfig, SelfPlayResult, format_report, run_selfplay


__getattr__, __dir__ = lazy_exports(__name__, {
    ".heuristics": ("HEURISTICS", "DependencyAwarePlanner", "InOrderPlanner", "RandomLegalPlanner"),
    ".optimal": ("OptimalPlanner",),
    ".runner": ("PLANNER_NAMES", "make_planner", "run_episode", "run_jobs"),
    ".selfplay": ("SelfPlayConfig", "SelfPlayResult", "format_report", "run_selfplay"),
})
