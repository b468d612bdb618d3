"""The full-success probability of a planner on a task: exact, by enumerating every branch of every call
(``exact_policy_success``, how bound (iii) is checked), or estimated by Monte Carlo (``monte_carlo_success``,
where an exact value costs too much).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from resilibench.results import wilson_interval

from .. import simulator
from ..config import WorldConfig
from ..planner import Planner
from ..processes import CallOutcome, call_outcomes
from ..simulator import Episode, run_episode_seed
from ..tasks.library import Task
from .base import required_in_order


def branch_episode(episode: Episode) -> Episode:
    """A copy of an episode whose mutable state (lists, arrays) is independent of the original."""
    clone = copy.copy(episode)
    for name, value in vars(episode).items():
        if isinstance(value, list | np.ndarray):
            setattr(clone, name, value.copy())
    return clone


@contextmanager
def _taking(outcome: CallOutcome) -> Iterator[list[bool]]:
    """Inside, an Episode call that reaches the processes' draw point takes ``outcome`` as the branch its
    draws select (``simulator.sample_outcome``); the yielded flag says whether one did. Not thread-safe:
    branch enumeration only."""
    reached = [False]

    def take(*_: object) -> CallOutcome:
        reached[0] = True
        return outcome

    original, simulator.sample_outcome = simulator.sample_outcome, take
    try:
        yield reached
    finally:
        simulator.sample_outcome = original


def call_branches(episode: Episode, tool: int) -> list[tuple[float, Episode]]:
    """Every branch (probability, episode after) of calling ``tool`` in ``episode`` (left as it is): one
    branch when the call is answered without a draw; else, in a v1 world, success and failure (by writing
    the success draw of the episode's stream), and under failure processes each outcome of
    ``processes.call_outcomes`` for the tool's state now (outcomes that differ only in the error code of a
    failed success draw merged, as they lead to the same state)."""
    if not episode.processes_on:
        success_branch = branch_episode(episode)
        record = success_branch.call(tool)
        if success_branch.draws_used == episode.draws_used:  # answered without a draw
            return [(1.0, success_branch)]
        p = record.probability
        assert p is not None  # a call that drew carries its success probability
        failure_branch = branch_episode(episode)
        failure_branch.stream[episode.draws_used, 0] = 1.0
        failure_branch.call(tool)
        return [(p, success_branch), (1.0 - p, failure_branch)]
    merged: dict[tuple, tuple[float, CallOutcome]] = {}
    for q, outcome in call_outcomes(episode.config.processes, episode.tool_state(tool), episode.probability(tool),
                                    episode.registry.tools[tool].error_codes):
        what = (outcome.success, outcome.drew or outcome.error_code, outcome.duration, outcome.state)
        merged[what] = (merged[what][0] + q, merged[what][1]) if what in merged else (q, outcome)
    branches = []
    for q, outcome in merged.values():
        branch = branch_episode(episode)
        with _taking(outcome) as reached:
            branch.call(tool)
        if not reached[0]:  # answered without a draw
            return [(1.0, branch)]
        branches.append((q, branch))
    return branches


def episode_state(episode: Episode) -> tuple:
    """What the future of a running episode depends on (tool states, counters, time): a memo key."""
    return (tuple(episode.calls), tuple(episode.succeeded), episode.process_state(),
            episode.n_failures, episode.consecutive_failures, episode.last_tool, episode.same_tool_streak,
            episode.turns_used, episode.time_used, episode.turns_left)


def exact_policy_success(planner: Planner, task: Task, config: WorldConfig | None = None) -> float:
    """The exact full-success probability of a deterministic planner on ``task``, by enumerating every
    branch of every call (``call_branches``; at most 2**turn_limit leaves in a v1 world). Under failure
    processes the states met are memoised, so the planner must act on the episode's state alone (the
    optimal and heuristic planners do), and they are met a level (calls made) at a time: a planner with an
    ``act_batch(episodes)`` method (a learned policy: one batched network call) decides a level at once.
    Used to check bound (iii)."""
    config = config or WorldConfig()
    planner.reset(task, np.random.default_rng(0))
    root = Episode.start(task, 0, config)
    root.stream = np.zeros_like(root.stream)
    if root.processes_on:
        return _state_graph_success(planner, root)
    finish = len(root.registry)

    def expand(episode: Episode) -> float:
        if episode.done:
            return _graded_full(episode)
        action = planner.act(episode, None)
        if action == finish:
            episode.finish()
            return expand(episode)
        if episode.turns_left == 0:
            episode.end_out_of_turns()
            return expand(episode)
        return sum(q * expand(branch) for q, branch in call_branches(episode, action) if q > 0.0)

    return expand(root)


def _graded_full(episode: Episode) -> float:
    """1.0 when an ended (so graded) episode reached full success, else 0.0."""
    assert episode.evaluation is not None  # an ended episode is graded
    return float(episode.evaluation.level == "full_success")


Node = tuple | float  # a running episode's memo key (``episode_state``), or the value of a decided one


def _node(episode: Episode) -> Node:
    """An ended episode's value, 0.0 once a required tool succeeded out of order (full success is no
    longer possible), else its state key."""
    if episode.done:
        return _graded_full(episode)
    return episode_state(episode) if required_in_order(episode) else 0.0


def _state_graph_success(planner: Planner, root: Episode) -> float:
    """``exact_policy_success`` under failure processes: the distinct states reachable under the planner,
    a frontier at a time (the planner's ``act_batch`` decides a frontier at once when it has one), then the
    value of each state, the probability-weighted sum over its branches in call order (the same sums, in
    the same order, as a depth-first enumeration with a memo)."""
    finish = len(root.registry)
    act_batch = getattr(planner, "act_batch", None)
    children: dict[tuple, list[tuple[float, Node]]] = {}
    start = _node(root)
    frontier = {start: root} if isinstance(start, tuple) else {}
    while frontier:
        episodes = list(frontier.values())
        actions = act_batch(episodes) if act_batch else [planner.act(e, None) for e in episodes]
        following: dict[tuple, Episode] = {}
        for (key, episode), action in zip(frontier.items(), actions, strict=True):
            if action == finish:
                episode.finish()
            elif episode.turns_left == 0:
                episode.end_out_of_turns()
            if episode.done:
                children[key] = [(1.0, _node(episode))]
                continue
            children[key] = out = []
            for q, branch in call_branches(episode, action):
                if q > 0.0:
                    node = _node(branch)
                    out.append((q, node))
                    if isinstance(node, tuple) and node not in children and node not in frontier:
                        following.setdefault(node, branch)
        frontier = following
    values: dict[tuple, float] = {}

    def value(node: Node) -> float:
        if not isinstance(node, tuple):
            return node
        if node not in values:
            values[node] = sum(q * value(child) for q, child in children[node])
        return values[node]

    return value(start)


def play_episode(planner: Planner, task: Task, seed: int, config: WorldConfig | None = None) -> Episode:
    """The episode ``planner`` plays to its end on ``task`` for run seed ``seed``: the stream of
    ``simulator.run_episode_seed``, the one ``resilibench run`` meets."""
    episode = Episode.start(task, run_episode_seed(task.instance_id, seed), config or WorldConfig())
    planner.reset(task, np.random.default_rng(seed))
    finish = len(episode.registry)
    while not episode.done:
        action = planner.act(episode, None)
        if action == finish:
            episode.finish()
        elif episode.turns_left == 0:
            episode.end_out_of_turns()
        else:
            episode.call(action)
    return episode


def monte_carlo_success(planner: Planner, tasks: Sequence[Task], config: WorldConfig | None = None,
                        episodes: int = 1000) -> tuple[float, tuple[float, float]]:
    """(full-success rate, its 95% Wilson interval) of ``planner`` over ``episodes`` episodes of each task,
    on the streams of run seeds 0..episodes-1 (``play_episode``): the estimate to report where an exact
    value is too costly to compute."""
    wins = int(sum(_graded_full(play_episode(planner, task, seed, config)) for task in tasks for seed in range(episodes)))
    n = episodes * len(tasks)
    return (wins / n if n else float("nan")), wilson_interval(wins, n)
