"""Heuristic planners: random legal, in-order with retries, dependency-aware in-order."""

from __future__ import annotations

__all__ = ["RandomLegalPlanner", "InOrderPlanner", "DependencyAwarePlanner", "HEURISTICS"]

from collections.abc import Callable

import numpy as np

from ..core.planner import Planner
from ..core.simulator import Episode
from ..core.tasks.library import Task


class RandomLegalPlanner:
    """Uniform over the legal actions (tools and FINISH)."""

    name = "random_legal"

    def reset(self, task: Task, rng: np.random.Generator) -> None:
        self.rng = rng

    def act(self, episode: Episode, observation: np.ndarray | None) -> int:
        legal = np.flatnonzero(episode.action_mask)
        return int(legal[self.rng.integers(len(legal))])


class InOrderPlanner:
    """Calls the required tools in their listed order, retrying a failed tool while it is legal;
    FINISHes when every required tool has succeeded or the next one can no longer be called."""

    name = "in_order"

    def reset(self, task: Task, rng: np.random.Generator) -> None:
        self.rng = rng

    def next_tool(self, episode: Episode) -> int | None:
        """The tool to call next, or None to finish."""
        if episode.next_required >= len(episode.required):
            return None
        tool = episode.required[episode.next_required]
        return tool if episode.action_mask[tool] else None

    def act(self, episode: Episode, observation: np.ndarray | None) -> int:
        tool = self.next_tool(episode)
        return len(episode.registry) if tool is None else tool


class DependencyAwarePlanner(InOrderPlanner):
    """In order, but first calls any not-yet-successful dependency (transitively, prerequisites first)
    of the next required tool, so no call pays the uncalled- or failed-dependency penalty."""

    name = "dependency_aware"

    def next_tool(self, episode: Episode) -> int | None:
        target = super().next_tool(episode)
        if target is None:
            return None
        return self._first_unmet(episode, target)

    def _first_unmet(self, episode: Episode, tool: int) -> int:
        for dep in episode.registry.dependency_ids[tool]:
            if not episode.succeeded[dep] and episode.action_mask[dep]:
                return self._first_unmet(episode, dep)
        return tool


# Factories of the planners by name (``ppo.evaluation.registered_planner`` adds one while a block runs).
HEURISTICS: dict[str, Callable[[], Planner]] = {
    p.name: p for p in (RandomLegalPlanner, InOrderPlanner, DependencyAwarePlanner)}
