"""Exact upper bounds on full success (SPEC 5) and the optimal policy they imply.

* bound (iii) ``optimal_success``: the best full-success probability of any policy that knows the failure
  model, by dynamic programming over the episode state that matters: the in-order prefix of required
  tools, per relevant tool its call count or success, N_h, consecutive failures, the failing-tool streak
  and turns used. Relevant tools are the required tools and their transitive dependencies; any other tool
  only matters as a "filler" call (it can reset the consecutive-failure count), and the fillers are
  interchangeable: every fresh dependency-free irrelevant tool has the same success probability.
* bound (ii) ``clairvoyant_success``: whether some action sequence reaches full success when every
  call's random draw is known in advance (search over the seeded stream of ``Episode``).
* bound (i) is 1.

Both bounds follow the episode rules of ``resilibench.envs.simulator`` (turn limit, call cap, failure
terminations, strict dependencies) with a free completion signal, so they bound the planner env and the
text env alike. The training dynamics profile has no bound.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

import numpy as np

from resilibench.envs.config import EpisodeRules, FailureModel, WorldConfig
from resilibench.envs.planner_env import ResiliBenchEnv
from resilibench.envs.registry import OPERATION_PHRASES, ToolRegistry, default_registry
from resilibench.envs.simulator import Episode, success_probability, task_seed, termination_reason
from resilibench.envs.tasks import Task
from resilibench.metrics.workflow import Node, Workflow
from resilibench.policies.base import Planner

FILLER = -1  # action code of "call a fresh irrelevant tool" inside the DP
SUCCEEDED = -1  # per-tool code of a tool that has succeeded

# A DP state: (prefix k, per-relevant-tool codes, N_h, consecutive failures, last failing tool, streak, turns)
State = tuple[int, tuple[int, ...], int, int, int, int, int]


@dataclass(frozen=True)
class Problem:
    """What a bound depends on: the required tools in order, the call cap, the rules and failure model."""

    required: tuple[int, ...]
    max_calls: int
    rules: EpisodeRules
    failure: FailureModel


def _relevant(required: Sequence[int], registry: ToolRegistry) -> set[int]:
    """The required tools and their transitive dependencies."""
    relevant = set(required)
    for t in required:
        relevant |= registry.ancestors(t)
    return relevant


def spare_tools(required: Sequence[int], registry: ToolRegistry) -> tuple[int, ...]:
    """The dependency-free tools outside the required tools and their dependencies: bound (iii)'s filler
    calls. The DP needs one fresh filler per turn, so a task supports turn limits up to their number."""
    relevant = _relevant(required, registry)
    return tuple(t for t in range(len(registry)) if t not in relevant and not registry.dependency_ids[t])


def largest_turn_limit(task: Task, registry: ToolRegistry | None = None) -> int:
    """The largest ``rules.turn_limit`` for which bound (iii) of ``task`` is defined."""
    registry = registry or default_registry()
    return len(spare_tools(task.required_ids(registry), registry))


class ExactBound:
    """Bound (iii) for one problem, with the optimal action of every reachable state."""

    def __init__(self, problem: Problem, registry: ToolRegistry | None = None):
        self.registry = registry or default_registry()
        self.problem = problem
        if problem.rules.profile != "test":
            raise ValueError("bounds are defined for the 'test' failure profile only")
        self.rules, self.failure = problem.rules, problem.failure
        required = problem.required
        relevant = _relevant(required, self.registry)
        ancestors = sorted(relevant - set(required), key=lambda t: self.registry.tools[t].dependency_metadata["level"])
        # Search order = tie-break order: required tools, then helpers (prerequisites first).
        self.tools: tuple[int, ...] = tuple(required) + tuple(ancestors)
        self.local = {t: i for i, t in enumerate(self.tools)}
        self.m = len(required)
        self.deps = tuple(tuple(self.local[d] for d in self.registry.dependency_ids[t]) for t in self.tools)
        self.fillers = spare_tools(required, self.registry)
        if len(self.fillers) < self.rules.turn_limit:
            raise ValueError(
                f"rules.turn_limit={self.rules.turn_limit}: bound (iii) needs {self.rules.turn_limit} spare tools "
                f"(dependency-free tools the task does not use), this task has {len(self.fillers)}"
            )
        self._values: dict[State, float] = {}
        self._actions: dict[State, int | None] = {}

    # --- state -------------------------------------------------------------------------------------

    def initial_state(self) -> State:
        return (0, (0,) * len(self.tools), 0, 0, -1, 0, 0)

    def state_of(self, episode: Episode) -> State | None:
        """The DP state of a running episode, or None when full success is no longer possible."""
        k = episode.next_required
        required_done = sum(episode.succeeded[t] for t in episode.required)
        if required_done != k:  # a required tool succeeded out of order
            return None
        codes = tuple(SUCCEEDED if episode.succeeded[t] else episode.calls[t] for t in self.tools)
        streak = episode.same_tool_streak
        last = self.local.get(episode.last_tool, -1) if streak > 0 else -1
        if last == -1:
            streak = 0
        return (k, codes, episode.n_failures, episode.consecutive_failures, last, streak, episode.turns_used)

    # --- dynamic programming -------------------------------------------------------------------------

    def _probability(self, i: int, codes: tuple[int, ...], n_h: int) -> float:
        n_uncalled = n_failed = 0
        for d in self.deps[i]:
            c = codes[d]
            if c == 0:
                n_uncalled += 1
            elif c > 0:
                n_failed += 1
        if self.rules.strict_dependencies and (n_uncalled or n_failed):
            return 0.0
        return success_probability(self.failure.base_success, n_uncalled, n_failed, n_h, self.failure)

    def _after_failure(self, state: State, i: int) -> State | None:
        k, codes, n_h, consec, last, streak, turns = state
        streak = streak + 1 if (i >= 0 and last == i) else 1
        if termination_reason(consec + 1, streak, self.rules) is not None:
            return None
        if i >= 0:
            codes = codes[:i] + (codes[i] + 1,) + codes[i + 1 :]
            return (k, codes, n_h + 1, consec + 1, i, streak, turns + 1)
        return (k, codes, n_h + 1, consec + 1, -1, 0, turns + 1)

    def _after_success(self, state: State, i: int) -> State | None:
        k, codes, n_h, consec, last, streak, turns = state
        if i < 0:
            return (k, codes, n_h, 0, -1, 0, turns + 1)
        if i < self.m:
            if i != k:
                return None  # a later required tool succeeding first breaks the sequence
            k += 1
        codes = codes[:i] + (SUCCEEDED,) + codes[i + 1 :]
        return (k, codes, n_h, 0, -1, 0, turns + 1)

    def _outcomes(self, state: State, i: int) -> tuple[float, State | None, State | None]:
        """(success probability, state after success, state after failure) of calling local tool i."""
        n_h = state[2]
        if i == FILLER:
            p = success_probability(self.failure.base_success, 0, 0, n_h, self.failure)
        else:
            p = self._probability(i, state[1], n_h)
        return p, self._after_success(state, i), self._after_failure(state, i)

    def _candidates(self, state: State) -> Iterable[int]:
        codes = state[1]
        cap = self.problem.max_calls
        for i in range(len(self.tools)):
            if codes[i] != SUCCEEDED and codes[i] < cap:
                yield i
        yield FILLER

    def value(self, state: State | None) -> float:
        """Optimal probability of full success from ``state`` (None = lost)."""
        if state is None:
            return 0.0
        cached = self._values.get(state)
        if cached is not None:
            return cached
        k, turns = state[0], state[6]
        best, best_action = 0.0, None  # None = FINISH
        if k == self.m:
            best = 1.0
        elif self.rules.turn_limit - turns >= self.m - k:
            for i in self._candidates(state):
                p, success, failure = self._outcomes(state, i)
                v = (p * self.value(success) if p > 0.0 else 0.0) + (
                    (1.0 - p) * self.value(failure) if p < 1.0 else 0.0
                )
                if v > best + 1e-12:
                    best, best_action = v, i
        self._values[state] = best
        self._actions[state] = best_action
        return best

    def best_local_action(self, state: State) -> int | None:
        """The optimal local action (index into ``tools``, FILLER) or None for FINISH."""
        self.value(state)
        return self._actions[state]

    @property
    def optimal_success(self) -> float:
        return self.value(self.initial_state())

    @property
    def states_explored(self) -> int:
        return len(self._values)

    def happy_path(self) -> list[int]:
        """Tools the optimal policy calls when every call succeeds (global ids)."""
        state, path = self.initial_state(), []
        while state is not None:
            action = self.best_local_action(state)
            if action is None:
                break
            path.append(self.tools[action] if action != FILLER else self.fillers[0])
            state = self._after_success(state, action)
        return path

    # --- clairvoyant bound ---------------------------------------------------------------------------

    def clairvoyant(self, stream: np.ndarray) -> bool:
        """Bound (ii) for one random stream: can any action sequence reach full success?"""
        seen: set[tuple[State, int]] = set()
        success_draws = stream[:, 0]
        fm = self.failure

        def search(state: State | None, draws: int) -> bool:
            if state is None:
                return False
            k, turns = state[0], state[6]
            if k == self.m:
                return True
            if self.rules.turn_limit - turns < self.m - k or (state, draws) in seen:
                return False
            # Every remaining required success needs a future draw below the best possible probability,
            # which N_h only lowers: too few such draws left means no way through.
            best_p = success_probability(fm.base_success, 0, 0, state[2], fm)
            if int(np.count_nonzero(success_draws[draws:] < best_p)) < self.m - k:
                return False
            seen.add((state, draws))
            for i in self._candidates(state):
                p, success, failure = self._outcomes(state, i)
                if i != FILLER and p == 0.0 and self.rules.strict_dependencies:
                    if search(failure, draws):  # dependency error: no draw
                        return True
                    continue
                nxt = success if stream[draws, 0] < p else failure
                if search(nxt, draws + 1):
                    return True
            return False

        return search(self.initial_state(), 0)


@cache
def _bound_for(problem: Problem) -> ExactBound:
    return ExactBound(problem)


def exact_bound(task: Task, config: WorldConfig | None = None, registry: ToolRegistry | None = None) -> ExactBound:
    """The (cached) ExactBound of a task; tasks with the same required tools share one."""
    config = config or WorldConfig()
    problem = Problem(task.required_ids(registry), 1 + task.max_retries, config.rules, config.failure)
    return _bound_for(problem) if registry is None else ExactBound(problem, registry)


def optimal_success(task: Task, config: WorldConfig | None = None) -> float:
    """Bound (iii): the exact optimal full-success probability of ``task``."""
    return exact_bound(task, config).optimal_success


def clairvoyant_success(task: Task, seeds: Sequence[int], config: WorldConfig | None = None) -> float:
    """Bound (ii) averaged over the streams that a run's episodes of ``task`` meet for run seeds ``seeds``
    (``ResiliBench-v0`` reset with ``task_seed(task_id, seed)``, as ``policies.runner`` does)."""
    config = config or WorldConfig()
    bound = exact_bound(task, config)
    env = ResiliBenchEnv(tasks=[task], split=None, config=config)
    hits = []
    for seed in seeds:
        env.reset(seed=task_seed(task.instance_id, seed), options={"task_id": task.instance_id})
        hits.append(bound.clairvoyant(env.episode.stream))
    return float(np.mean(hits)) if hits else float("nan")


def reference_workflow(task: Task, config: WorldConfig | None = None) -> Workflow:
    """The optimal policy's workflow: its happy-path tool sequence with dependency edges (a tool after
    each tool it depends on) and the required order (each required tool after the previous one)."""
    bound = exact_bound(task, config)
    return path_workflow(task, bound.happy_path(), bound.registry)


def path_workflow(task: Task, tools: Sequence[int], registry: ToolRegistry) -> Workflow:
    """The workflow of a tool sequence: each tool after the tools it depends on, each required tool after
    the previous required one (how the optimal and the learned policies' workflows are built)."""
    nodes = tuple(Node(registry.names[t], OPERATION_PHRASES[registry.tools[t].operation]) for t in tools)
    position = {t: i for i, t in enumerate(tools)}
    edges = {(position[d], position[t]) for t in tools for d in registry.dependency_ids[t] if d in position}
    required = [t for t in task.required_ids(registry) if t in position]
    edges |= {(position[a], position[b]) for a, b in pairwise(required)}
    return Workflow(nodes, tuple(sorted(edges)))


class OptimalPlanner:
    """Follows the bound-(iii) policy; FINISHes once full success is reached or no longer possible."""

    name = "optimal"

    def __init__(self, config: WorldConfig | None = None):
        self.config = config or WorldConfig()

    def reset(self, task: Task, rng: np.random.Generator) -> None:
        self.bound = exact_bound(task, self.config)
        self.rng = rng

    def act(self, episode: Episode, observation: np.ndarray) -> int:
        finish = len(episode.registry)
        state = self.bound.state_of(episode)
        if state is None:
            return finish
        action = self.bound.best_local_action(state)
        if action is None:
            return finish
        if action != FILLER:
            return self.bound.tools[action]
        for t in self.bound.fillers:
            if episode.calls[t] == 0:
                return t
        raise RuntimeError("no fresh filler tool left")  # excluded by the constructor's check


def branch_episode(episode: Episode) -> Episode:
    """A copy of an episode whose mutable state (lists, arrays) is independent of the original."""
    clone = copy.copy(episode)
    for name, value in vars(episode).items():
        if isinstance(value, list | np.ndarray):
            setattr(clone, name, value.copy())
    return clone


def exact_policy_success(planner: Planner, task: Task, config: WorldConfig | None = None) -> float:
    """The exact full-success probability of a deterministic planner on ``task``, by enumerating every
    success/failure branch of the episode (at most 2**turn_limit leaves). Used to check bound (iii)."""
    config = config or WorldConfig()
    planner.reset(task, np.random.default_rng(0))
    root = Episode.start(task, 0, config)
    root.stream = np.zeros_like(root.stream)
    finish = len(root.registry)

    def expand(episode: Episode) -> float:
        if episode.done:
            return float(episode.evaluation.level == "full_success")
        action = planner.act(episode, None)
        if action == finish:
            episode.finish()
            return expand(episode)
        if episode.turns_left == 0:
            episode.end_out_of_turns()
            return expand(episode)
        success_branch = branch_episode(episode)
        record = success_branch.call(action)
        if success_branch.draws_used == episode.draws_used:  # answered without a draw
            return expand(success_branch)
        p = record.probability
        failure_branch = branch_episode(episode)
        failure_branch.stream[episode.draws_used, 0] = 1.0
        failure_branch.call(action)
        return p * expand(success_branch) + (1.0 - p) * expand(failure_branch)

    return expand(root)
