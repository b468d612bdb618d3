"""The planner interface shared by the env runner, the exact bounds, heuristics and (later) PPO."""

from __future__ import annotations

__all__ = ["Planner"]

from typing import Protocol, runtime_checkable

import numpy as np

from .simulator import Episode
from .tasks.library import Task


@runtime_checkable
class Planner(Protocol):
    """Chooses the next action of a planner episode.

    ``act`` returns a tool id in ``[0, n_tools)`` or ``n_tools`` for FINISH. A planner may read the
    episode state (heuristics, the exact optimal policy) or only the observation (learned policies); the
    observation is None when the caller plays the episode without an env (the exact bounds), and a planner
    that reads it then computes it from the episode.
    """

    name: str

    def reset(self, task: Task, rng: np.random.Generator) -> None:
        """Prepare for a new episode of ``task``; ``rng`` is the planner's own randomness."""

    def act(self, episode: Episode, observation: np.ndarray | None) -> int:
        """The next action."""
        ...
