"""Heuristic planners: random legal, in-order with retries, dependency-aware in-order, and process-aware
(dependency-aware, reading the trace's error codes and Retry-After)."""

from __future__ import annotations

__all__ = ["RandomLegalPlanner", "InOrderPlanner", "DependencyAwarePlanner", "ProcessAwarePlanner", "HEURISTICS"]

from collections.abc import Callable

import numpy as np

from ..core.planner import Planner
from ..core.processes import RATE_LIMIT_ERROR, tool_bases
from ..core.simulator import CallRecord, Episode
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


class ProcessAwarePlanner(DependencyAwarePlanner):
    """Dependency-aware, plus what a user writes once tools fail like services: it reads the trace, and
    while the tool it wants is blocked by a rate limit (its last call was refused with a Retry-After that
    has not passed), or when calling it again would end the episode (one more failure of the same tool in
    a row is the repetition limit), it spends the turn on another call instead:

    1. a useful one: the first unmet dependency (prerequisites first) of a later required tool, which that
       tool needs anyway and which does not touch the required order;
    2. else a harmless one: a tool the task does not require, never called and without dependencies, the
       most reliable first (a success resets the failure streak; its failure only counts as a failure).

    A tool that the trace shows blocked is never chosen; with no such call left it calls the tool anyway.
    Without failure processes it plays like ``DependencyAwarePlanner`` except at the repetition limit."""

    name = "process_aware"

    def next_tool(self, episode: Episode) -> int | None:
        target = super().next_tool(episode)
        if target is None:
            return None
        turn = episode.turns_used + 1
        last = _last_calls(episode.trace)
        names = episode.registry.names
        blocked = {t for t, record in last.items() if _blocks(record, turn)}
        streak_ends = (episode.last_tool == target and not episode.succeeded[target]
                       and episode.same_tool_streak >= episode.config.rules.max_same_tool_failures - 1)
        if names[target] not in blocked and not streak_ends:
            return target
        free = [t for t in range(len(names)) if episode.action_mask[t] and names[t] not in blocked and t != target]
        for choice in (self._useful(episode, free), self._harmless(episode, free)):
            if choice is not None:
                return choice
        return target

    def _useful(self, episode: Episode, free: list[int]) -> int | None:
        """The first unmet dependency among ``free`` of a required tool after the next one."""
        required = episode.required
        for tool in required[episode.next_required + 1:]:
            if episode.succeeded[tool]:
                continue
            first = self._first_unmet(episode, tool)
            if first != tool and first in free and first not in episode.required_position:
                return first
        return None

    @staticmethod
    def _harmless(episode: Episode, free: list[int]) -> int | None:
        """The most reliable never-called tool among ``free`` that is not required and has no dependencies."""
        registry = episode.registry
        spares = [t for t in free if t not in episode.required_position and not episode.calls[t]
                  and not registry.dependency_ids[t]]
        if not spares:
            return None
        bases = _bases(episode)
        return max(spares, key=lambda t: (bases[t], -t))


def _bases(episode: Episode) -> tuple[float, ...]:
    """The base success of each tool in ``episode``'s world, computed once per config."""
    config = episode.config
    cached = _BASES.get(id(config))
    if cached is None or cached[0] is not config:
        cached = _BASES[id(config)] = (config, tool_bases(config.processes, config.failure, episode.registry))
    return cached[1]


_BASES: dict[int, tuple[object, tuple[float, ...]]] = {}


def _last_calls(trace: list[CallRecord]) -> dict[str, CallRecord]:
    """The last call of each tool in ``trace`` (tool name -> record)."""
    return {record.tool: record for record in trace}


def _blocks(record: CallRecord, turn: int) -> bool:
    """Whether a tool whose last call is ``record`` is still rate-limited at ``turn`` (its Retry-After: the
    calls of the next ``retry_after`` turns are refused)."""
    return record.error_code == RATE_LIMIT_ERROR and turn <= record.turn + (record.retry_after or 0)


# Factories of the planners by name (``ppo.evaluation.registered_planner`` adds one while a block runs).
HEURISTICS: dict[str, Callable[[], Planner]] = {
    p.name: p for p in (RandomLegalPlanner, InOrderPlanner, DependencyAwarePlanner, ProcessAwarePlanner)}
