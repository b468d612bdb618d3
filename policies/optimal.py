"""The optimal planner: the policy of bound (iii), which reaches the exact optimal full-success probability."""

from __future__ import annotations

__all__ = ["OptimalPlanner"]

import numpy as np

from ..core.bounds import exact_bound
from ..core.config import WorldConfig
from ..core.simulator import Episode
from ..core.tasks.library import Task


class OptimalPlanner:
    """Follows the bound-(iii) policy; FINISHes once full success is reached or no longer possible. It reads
    the episode, so it needs neither randomness nor the observation."""

    name = "optimal"

    def __init__(self, config: WorldConfig | None = None):
        self.config = config or WorldConfig()

    def reset(self, task: Task, rng: np.random.Generator | None) -> None:
        self.bound = exact_bound(task, self.config)
        self.rng = rng

    def act(self, episode: Episode, observation: np.ndarray | None) -> int:
        tool = self.bound.next_tool(episode)
        return len(episode.registry) if tool is None else tool
