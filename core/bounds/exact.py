"""Exact upper bounds on full success (docs/core/bounds.md) and the optimal policy they imply.

* bound (iii) ``optimal_success``: the best full-success probability of any policy that knows the failure
  model, by dynamic programming over the episode state that matters: the required tools not yet
  succeeded, per relevant tool not yet succeeded its call count, N_h, consecutive failures, the
  failing-tool streak and turns used. Relevant tools are the required tools and their transitive
  dependencies; any other tool only matters as a "filler" call (it can reset the consecutive-failure
  count), and the fillers are interchangeable: every fresh dependency-free irrelevant tool has the same
  success probability. States are canonical (tool identities and what can no longer matter forgotten)
  and shared by every problem with the same call cap, rules and failure model (``Subproblems``).
* bound (ii) ``clairvoyant_success``: whether some action sequence reaches full success when every
  call's random draw is known in advance (search over the seeded stream of ``Episode``).
* bound (i) is 1.

Both bounds follow the episode rules of ``resilibench.core.simulator`` (turn limit, call cap, failure
terminations, strict dependencies) with a free completion signal, so they bound the planner env and the
text env alike. The training dynamics profile has no bound.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from resilibench.results import wilson_interval

from .. import simulator
from ..config import EpisodeRules, FailureModel, WorldConfig
from ..planner import Planner
from ..processes import CallOutcome, call_outcomes
from ..registry import OPERATION_PHRASES, ToolRegistry, default_registry
from ..simulator import (
    Episode,
    draw_stream,
    run_episode_seed,
    success_probability,
    termination_reason,
)
from ..tasks.library import Task, dependency_sort
from ..workflow import Node, Workflow

FILLER = -1  # action code of "call a fresh irrelevant tool" inside the DP

# A subproblem key: (shape id, call count per local tool, N_h, consecutive failures, local index of the tool
# of the current failure streak (-1: none), streak length, turns used). See ``Subproblems``.
Key = tuple[int, tuple[int, ...], int, int, int, int, int]


class State(NamedTuple):
    """A DP state of one problem: its subproblem key (None: lost) and the global id of each local tool."""

    key: Key | None
    tools: tuple[int, ...]


@dataclass(frozen=True)
class Problem:
    """What a bound depends on: the required tools in order, the call cap, the rules and the failure model,
    and the failure processes when some are on (``process_bounds.frozen_processes``; empty: none)."""

    required: tuple[int, ...]
    max_calls: int
    rules: EpisodeRules
    failure: FailureModel
    processes: tuple = ()


def relevant_tools(required: Sequence[int], registry: ToolRegistry) -> set[int]:
    """The required tools and their transitive dependencies."""
    relevant = set(required)
    for t in required:
        relevant |= registry.ancestors(t)
    return relevant


def spare_tools(required: Sequence[int], registry: ToolRegistry) -> tuple[int, ...]:
    """The dependency-free tools outside the required tools and their dependencies: bound (iii)'s filler
    calls. The DP needs one fresh filler per turn, so a task supports turn limits up to their number."""
    relevant = relevant_tools(required, registry)
    return tuple(t for t in range(len(registry)) if t not in relevant and not registry.dependency_ids[t])


def problem_tools(required: Sequence[int], registry: ToolRegistry) -> tuple[int, ...]:
    """The tools of a problem in search order, which is the tie-break order: the required tools, then the
    helpers (their non-required prerequisites, prerequisites first)."""
    helpers = sorted(relevant_tools(required, registry) - set(required),
                     key=lambda t: registry.tools[t].dependency_metadata["level"])
    return tuple(required) + tuple(helpers)


def check_fillers(fillers: Sequence[int], rules: EpisodeRules) -> None:
    """ValueError unless there is a spare tool for every turn (the DP's fresh filler of each turn)."""
    if len(fillers) < rules.turn_limit:
        raise ValueError(
            f"rules.turn_limit={rules.turn_limit}: bound (iii) needs {rules.turn_limit} spare tools "
            f"(dependency-free tools the task does not use), this task has {len(fillers)}"
        )


def largest_turn_limit(task: Task, registry: ToolRegistry | None = None) -> int:
    """The largest ``rules.turn_limit`` for which bound (iii) of ``task`` is defined."""
    registry = registry or default_registry()
    return len(spare_tools(task.required_ids(registry), registry))


class Subproblems:
    """The DP over canonical subproblems, shared by every problem with the same call cap, rules and failure
    model (a task library has thousands of problems but far fewer distinct remainders).

    A *shape* is what is left of a problem, with tool identities forgotten: the local tools that still
    matter, each with the local indices of its dependencies that have not succeeded. Local tools are the
    required tools not yet succeeded, in the required order (index 0 is the next one), then the helpers
    (non-required prerequisites) that have not succeeded, in tie-break order. A tool that succeeded leaves
    the shape: it can no longer be called and, as a dependency, no longer lowers any probability.

    ``all_actions=False`` (bound (iii)): the actions are the next required tool, the helpers and a filler;
    a helper that no required tool still needs, directly or through other helpers, leaves the shape.
    ``all_actions=True`` (bound (ii), and the reference the pruned set is tested against): every tool of
    the problem that has not succeeded stays an action, later required tools included (their success
    loses the episode), as in a DP over the full episode state.
    """

    def __init__(self, max_calls: int, rules: EpisodeRules, failure: FailureModel, all_actions: bool):
        self.max_calls, self.rules, self.failure, self.all_actions = max_calls, rules, failure, all_actions
        self._ids: dict[tuple, int] = {}
        self.shapes: list[tuple[int, tuple[tuple[int, ...], ...]]] = []  # id -> (n_required, deps)
        self._actions: list[tuple[int, ...]] = []  # id -> tool actions in tie-break order (FILLER comes last)
        self._after: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}  # (id, i) -> (id', kept indices)
        self._p: dict[tuple[int, int, int], float] = {}
        self._ends: dict[tuple[int, int], bool] = {}
        self.memo: dict[Key, tuple[float, int | None]] = {}  # key -> (value, optimal action; None = FINISH)

    # --- shapes ----------------------------------------------------------------------------------------

    def shape(self, n_required: int, deps: Sequence[tuple[int, ...]]) -> tuple[int, tuple[int, ...]]:
        """(shape id, local indices kept) of a tool list; drops helpers nothing needs unless all_actions."""
        keep = range(len(deps))
        if not self.all_actions:
            needed, stack = set(range(n_required)), list(range(n_required))
            while stack:
                for d in deps[stack.pop()]:
                    if d not in needed:
                        needed.add(d)
                        stack.append(d)
            keep = sorted(needed)
        position = {j: new for new, j in enumerate(keep)}
        canonical = (n_required, tuple(tuple(position[d] for d in deps[j]) for j in keep))
        sid = self._ids.get(canonical)
        if sid is None:
            sid = self._ids[canonical] = len(self.shapes)
            self.shapes.append(canonical)
            n = len(canonical[1])
            if self.all_actions:
                self._actions.append(tuple(range(n)))
            else:  # the next required tool, then the helpers
                self._actions.append(((0,) if n_required else ()) + tuple(range(n_required, n)))
        return sid, tuple(keep)

    def after_success(self, sid: int, i: int) -> tuple[int, tuple[int, ...]]:
        """(shape id, local indices kept) once local tool i of shape ``sid`` has succeeded."""
        entry = self._after.get((sid, i))
        if entry is None:
            n_required, deps = self.shapes[sid]
            rest = [j for j in range(len(deps)) if j != i]
            position = {j: new for new, j in enumerate(rest)}
            new_deps = [tuple(position[d] for d in deps[j] if d != i) for j in rest]
            new_sid, keep = self.shape(n_required - (i < n_required), new_deps)
            entry = self._after[(sid, i)] = (new_sid, tuple(rest[j] for j in keep))
        return entry

    # --- transitions -----------------------------------------------------------------------------------

    def probability(self, n_uncalled: int, n_failed: int, n_h: int) -> float:
        p = self._p.get((n_uncalled, n_failed, n_h))
        if p is None:
            fm = self.failure
            p = self._p[(n_uncalled, n_failed, n_h)] = success_probability(
                fm.base_success, n_uncalled, n_failed, n_h, fm)
        return p

    def key(self, sid: int, codes: tuple[int, ...], n_h: int, consecutive: int, last: int, streak: int,
            turns: int) -> Key | None:
        """The canonical key of a state, None when it is lost. With ``spare`` turns left beyond one per
        remaining required tool, more than ``spare`` further failures lose the episode anyway, so a
        consecutive-failure count or a streak that cannot reach its limit within ``spare`` failures is
        reset, and a call count that cannot reach the cap within ``spare + 1`` calls only says "called"
        (1). Equivalent states then share one key, and values stay bit-identical."""
        rules = self.rules
        spare = rules.turn_limit - turns - self.shapes[sid][0]
        end = self._ends.get((consecutive, streak))
        if end is None:
            end = self._ends[(consecutive, streak)] = termination_reason(consecutive, streak, rules) is not None
        if spare < 0 or end:
            return None
        if consecutive + spare < rules.max_consecutive_failures:
            consecutive = 0
        if last < 0 or streak + spare < rules.max_same_tool_failures:
            last, streak = -1, 0
        low = self.max_calls - spare - 1
        if low >= 2 and codes and max(codes) >= 2:
            codes = tuple(1 if 0 < c <= low else c for c in codes)
        return sid, codes, n_h, consecutive, last, streak, turns

    def transitions(self, key: Key) -> list[tuple[int, float, Key | None, Key | None]]:
        """(action, success probability, key after success, key after failure) of every action of a state
        in tie-break order: tools under the call cap (local indices), then FILLER."""
        sid, codes, n_h, consecutive, last, streak, turns = key
        n_required, deps = self.shapes[sid]
        cap, strict, make = self.max_calls, self.rules.strict_dependencies, self.key
        moves = []
        for i in self._actions[sid]:
            if codes[i] >= cap:
                continue
            n_uncalled = n_failed = 0
            for d in deps[i]:
                if codes[d]:
                    n_failed += 1
                else:
                    n_uncalled += 1
            p = 0.0 if strict and (n_uncalled or n_failed) else self.probability(n_uncalled, n_failed, n_h)
            if 0 < i < n_required:
                success = None  # a later required tool succeeding first breaks the sequence
            else:
                new_sid, keep = self.after_success(sid, i)
                success = make(new_sid, tuple([codes[j] for j in keep]), n_h, 0, -1, 0, turns + 1)
            failed = codes[:i] + (codes[i] + 1,) + codes[i + 1:]
            same = streak + 1 if last == i else 1
            moves.append((i, p, success, make(sid, failed, n_h + 1, consecutive + 1, i, same, turns + 1)))
        moves.append((FILLER, self.probability(0, 0, n_h), make(sid, codes, n_h, 0, -1, 0, turns + 1),
                      make(sid, codes, n_h + 1, consecutive + 1, -1, 1, turns + 1)))
        return moves

    # --- dynamic programming ---------------------------------------------------------------------------

    def solve(self, key: Key | None) -> tuple[float, int | None]:
        """(optimal probability of full success, optimal action) from ``key`` (None = lost)."""
        if key is None:
            return 0.0, None
        cached = self.memo.get(key)
        if cached is not None:
            return cached
        n_required = self.shapes[key[0]][0]
        best, best_action = 0.0, None  # None = FINISH
        if n_required == 0:
            best = 1.0
        else:
            for i, p, success, failure in self.transitions(key):
                v = (p * self.solve(success)[0] if p > 0.0 else 0.0) + (
                    (1.0 - p) * self.solve(failure)[0] if p < 1.0 else 0.0)
                if v > best + 1e-12:
                    best, best_action = v, i
        result = self.memo[key] = (best, best_action)
        return result


@cache
def subproblems(max_calls: int, rules: EpisodeRules, failure: FailureModel, all_actions: bool = False) -> Subproblems:
    """The shared ``Subproblems`` of a call cap, rules and failure model."""
    return Subproblems(max_calls, rules, failure, all_actions)


class ExactBound:
    """Bound (iii) for one problem, with the optimal action of every state, on the shared subproblem DP."""

    def __init__(self, problem: Problem, registry: ToolRegistry | None = None, all_actions: bool = False):
        self.registry = registry or default_registry()
        self.problem = problem
        if problem.rules.profile != "test":
            raise ValueError("bounds are defined for the 'test' failure profile only")
        self.rules, self.failure = problem.rules, problem.failure
        required = problem.required
        self.tools: tuple[int, ...] = problem_tools(required, self.registry)
        self.m = len(required)
        self.fillers = spare_tools(required, self.registry)
        check_fillers(self.fillers, self.rules)
        self.dp = subproblems(problem.max_calls, self.rules, self.failure, all_actions)

    # --- state -------------------------------------------------------------------------------------

    def _state(self, dp: Subproblems, k: int, calls, succeeded, n_h: int, consecutive: int, last: int,
               streak: int, turns: int) -> State:
        """The state after ``k`` required tools, with per-tool ``calls`` and ``succeeded`` (global ids)."""
        local = self.problem.required[k:] + tuple(t for t in self.tools[self.m:] if not succeeded[t])
        index = {t: j for j, t in enumerate(local)}
        deps = [tuple(index[d] for d in self.registry.dependency_ids[t] if d in index) for t in local]
        sid, keep = dp.shape(self.m - k, deps)
        tools = tuple(local[j] for j in keep)
        last = tools.index(last) if streak > 0 and last in tools else -1
        return State(dp.key(sid, tuple(calls[t] for t in tools), n_h, consecutive, last, streak, turns), tools)

    def initial_state(self, dp: Subproblems | None = None) -> State:
        zeros = [0] * len(self.registry)
        return self._state(dp or self.dp, 0, zeros, zeros, 0, 0, -1, 0, 0)

    def state_of(self, episode: Episode) -> State | None:
        """The DP state of a running episode, or None when full success is no longer possible."""
        k = episode.next_required
        if sum(episode.succeeded[t] for t in episode.required) != k:  # a required tool succeeded out of order
            return None
        return self._state(self.dp, k, episode.calls, episode.succeeded, episode.n_failures,
                           episode.consecutive_failures, episode.last_tool, episode.same_tool_streak,
                           episode.turns_used)

    def after_success(self, state: State, action: int) -> State | None:
        """The state once local ``action`` (or FILLER) has succeeded; None when that loses the episode."""
        success = next(move[2] for move in self.dp.transitions(state.key) if move[0] == action)
        if success is None or action == FILLER:
            return success and State(success, state.tools)
        return State(success, tuple(state.tools[j] for j in self.dp.after_success(state.key[0], action)[1]))

    # --- dynamic programming -------------------------------------------------------------------------

    def value(self, state: State | None) -> float:
        """Optimal probability of full success from ``state`` (None = lost)."""
        return 0.0 if state is None else self.dp.solve(state.key)[0]

    def best_local_action(self, state: State) -> int | None:
        """The optimal local action (index into ``state.tools``, FILLER) or None for FINISH."""
        return self.dp.solve(state.key)[1]

    def next_tool(self, episode: Episode) -> int | None:
        """The tool the optimal policy calls now (the first fresh filler for FILLER), None to finish."""
        state = self.state_of(episode)
        if state is None:
            return None
        action = self.best_local_action(state)
        if action is None or action != FILLER:
            return None if action is None else state.tools[action]
        return next(t for t in self.fillers if episode.calls[t] == 0)  # there is one: see check_fillers

    def best_tool(self, state: State) -> int | None:
        """The optimal action as a global tool id (the first fresh filler for FILLER), or None for FINISH."""
        action = self.best_local_action(state)
        if action is None:
            return None
        return self.fillers[0] if action == FILLER else state.tools[action]

    @property
    def optimal_success(self) -> float:
        return self.value(self.initial_state())

    @property
    def states_explored(self) -> int:
        """DP states solved so far, shared by every problem with this call cap, rules and failure model."""
        return len(self.dp.memo)

    def happy_path(self) -> list[int]:
        """Tools the optimal policy calls when every call succeeds (global ids)."""
        state, path = self.initial_state(), []
        while state is not None:
            action = self.best_local_action(state)
            if action is None:
                break
            path.append(self.best_tool(state))
            state = self.after_success(state, action)
        return path

    # --- clairvoyant bound ---------------------------------------------------------------------------

    def clairvoyant(self, stream: np.ndarray) -> bool:
        """Bound (ii) for one random stream: can any action sequence (every tool of the problem, later
        required ones included, and fillers) reach full success?"""
        dp = subproblems(self.problem.max_calls, self.rules, self.failure, all_actions=True)
        seen: set[tuple[Key, int]] = set()
        success_draws = stream[:, 0]
        strict = self.rules.strict_dependencies

        def search(key: Key | None, draws: int) -> bool:
            if key is None:
                return False
            n_required = dp.shapes[key[0]][0]
            if n_required == 0:
                return True
            if (key, draws) in seen:
                return False
            # Every remaining required success needs a future draw below the best possible probability,
            # which N_h only lowers: too few such draws left means no way through.
            best_p = dp.probability(0, 0, key[2])
            if int(np.count_nonzero(success_draws[draws:] < best_p)) < n_required:
                return False
            seen.add((key, draws))
            for i, p, success, failure in dp.transitions(key):
                if i != FILLER and p == 0.0 and strict:
                    if search(failure, draws):  # dependency error: no draw
                        return True
                    continue
                if search(success if stream[draws, 0] < p else failure, draws + 1):
                    return True
            return False

        return search(self.initial_state(dp).key, 0)


@cache
def _bound_for(problem: Problem) -> ExactBound:
    if not problem.processes:
        return ExactBound(problem)
    from .processes import ProcessBound

    return ProcessBound(problem)


def exact_bound(task: Task, config: WorldConfig | None = None, registry: ToolRegistry | None = None) -> ExactBound:
    """The (cached) bound (iii) of a task, an ExactBound, or under failure processes a
    ``process_bounds.ProcessBound`` (same interface); tasks with the same required tools share one."""
    config = config or WorldConfig()
    required, max_calls = task.required_ids(registry), 1 + task.max_retries
    if config.processes.active:
        from .processes import ProcessBound, process_problem

        problem = process_problem(required, max_calls, config)
        return _bound_for(problem) if registry is None else ProcessBound(problem, registry)
    problem = Problem(required, max_calls, config.rules, config.failure)
    return _bound_for(problem) if registry is None else ExactBound(problem, registry)


def optimal_success(task: Task, config: WorldConfig | None = None) -> float:
    """Bound (iii): the exact optimal full-success probability of ``task``."""
    return exact_bound(task, config).optimal_success


def clairvoyant_success(task: Task, seeds: Sequence[int], config: WorldConfig | None = None) -> float:
    """Bound (ii) averaged over the streams that a run's episodes of ``task`` meet for run seeds ``seeds``
    (``simulator.run_episode_seed``, as ``policies.runner`` plays them)."""
    config = config or WorldConfig()
    bound = exact_bound(task, config)
    turn_limit = config.rules.turn_limit
    hits = [bound.clairvoyant(draw_stream(run_episode_seed(task.instance_id, seed), turn_limit)) for seed in seeds]
    return float(np.mean(hits)) if hits else float("nan")


def varied_tasks(count: int, seed: int = 0, max_tools: int = 6, registry: ToolRegistry | None = None
                 ) -> list[Task]:
    """``count`` tasks with distinct random required-tool lists (1 to ``max_tools`` of any tools, sorted by
    their dependencies, max_retries 3): a varied workload for checking and timing the bounds."""
    registry = registry or default_registry()
    rng = np.random.default_rng(seed)
    seen: set[tuple[str, ...]] = set()
    tasks = []
    while len(tasks) < count:
        picked = rng.choice(len(registry), size=int(rng.integers(1, max_tools + 1)), replace=False)
        tools = tuple(dependency_sort([registry.names[t] for t in picked], registry))
        if tools not in seen:
            seen.add(tools)
            tasks.append(Task(instance_id=f"varied_{len(tasks):05d}", task_type="basic_file_processing",
                              description="random required tools", inputs={}, expected_outputs={},
                              required_tools=tools, constraints={"max_retries": 3}, complexity="medium"))
    return tasks


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
    return (tuple(episode.calls), tuple(episode.succeeded), tuple(map(episode.tool_state, range(len(episode.calls)))),
            episode.n_failures, episode.consecutive_failures, episode.last_tool, episode.same_tool_streak,
            episode.turns_used, episode.time_used, episode.turns_left)


def exact_policy_success(planner: Planner, task: Task, config: WorldConfig | None = None) -> float:
    """The exact full-success probability of a deterministic planner on ``task``, by enumerating every
    branch of every call (``call_branches``; at most 2**turn_limit leaves in a v1 world). Under failure
    processes the states met are memoised, so the planner must act on the episode's state alone (the
    optimal and heuristic planners do). Used to check bound (iii)."""
    config = config or WorldConfig()
    planner.reset(task, np.random.default_rng(0))
    root = Episode.start(task, 0, config)
    root.stream = np.zeros_like(root.stream)
    finish = len(root.registry)
    memo: dict[tuple, float] | None = {} if root.processes_on else None

    def expand(episode: Episode) -> float:
        if episode.done:
            return float(episode.evaluation.level == "full_success")
        if memo is None:
            return step(episode)
        if sum(episode.succeeded[t] for t in episode.required) != episode.next_required:
            return 0.0  # a required tool succeeded out of order: full success is no longer possible
        key = episode_state(episode)
        if key not in memo:
            memo[key] = step(episode)
        return memo[key]

    def step(episode: Episode) -> float:
        action = planner.act(episode, None)
        if action == finish:
            episode.finish()
            return expand(episode)
        if episode.turns_left == 0:
            episode.end_out_of_turns()
            return expand(episode)
        return sum(q * expand(branch) for q, branch in call_branches(episode, action) if q > 0.0)

    return expand(root)


def monte_carlo_success(planner: Planner, tasks: Sequence[Task], config: WorldConfig | None = None,
                        episodes: int = 1000) -> tuple[float, tuple[float, float]]:
    """(full-success rate, its 95% Wilson interval) of ``planner`` over ``episodes`` episodes of each task,
    on the streams of run seeds 0..episodes-1 (``simulator.run_episode_seed``, as ``resilibench run``
    plays them): the estimate to report where an exact value is too costly to compute."""
    config = config or WorldConfig()
    wins = 0
    for task in tasks:
        for seed in range(episodes):
            episode = Episode.start(task, run_episode_seed(task.instance_id, seed), config)
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
            wins += episode.evaluation.level == "full_success"
    n = episodes * len(tasks)
    return (wins / n if n else float("nan")), wilson_interval(wins, n)
