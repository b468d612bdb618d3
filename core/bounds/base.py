"""What the two DPs of bound (iii) share (docs/core/bounds.md): the problem, the state, the tool helpers, the
DP over canonical subproblems (``Subproblems``) and the bound of one problem (``ExactBound``).

``plain.PlainBound`` solves worlds without failure processes, ``processes.ProcessBound`` worlds with
some; ``api.exact_bound`` chooses between them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from ..config import EpisodeRules, FailureModel
from ..registry import ToolRegistry, default_registry
from ..simulator import Episode, termination_reason
from ..tasks.library import Task

FILLER = -1  # action code of "call a fresh spare tool" inside the DP

# A subproblem key: the shape id and the counters the DP keeps (each DP has its own layout, ``shape_of`` reads
# the shape id).
Key = tuple | bytes


class State(NamedTuple):
    """A DP state of one problem: its subproblem key (None: lost) and the global id of each local tool."""

    key: Key | None
    tools: tuple[int, ...]


@dataclass(frozen=True)
class Problem:
    """What a bound depends on: the required tools in order, the call cap, the rules and the failure model,
    and the failure processes when some are on (``processes.frozen_processes``; empty: none)."""

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


def required_in_order(episode: Episode) -> bool:
    """Whether the required tools that succeeded are the first ones in order (else full success is no
    longer possible)."""
    return sum(episode.succeeded[t] for t in episode.required) == episode.next_required


class Subproblems(ABC):
    """A DP over canonical subproblems, shared by every problem with the same call cap, rules and failure
    model (a task library has thousands of problems but far fewer distinct remainders).

    A *shape* is what is left of a problem, with tool identities forgotten: the number of required tools
    left, then the local indices of each local tool's dependencies that have not succeeded (a DP may add
    more). Local tools are the required tools not yet succeeded, in the required order (index 0 is the next
    one), then the other tools the DP keeps. A tool that succeeded leaves the shape: it can no longer be
    called and, as a dependency, no longer lowers any probability. The tool actions of a shape are the next
    required tool and the tools after the required ones; ``all_actions`` makes every local tool an action
    (later required tools included: their success loses the episode).
    """

    def __init__(self, max_calls: int, rules: EpisodeRules, failure: FailureModel, all_actions: bool):
        self.max_calls, self.rules, self.failure, self.all_actions = max_calls, rules, failure, all_actions
        # _ends[consecutive][streak]: whether those counters end the episode (both stay below turn_limit + 2).
        self._ends = [[termination_reason(c, s, rules) is not None for s in range(rules.turn_limit + 2)]
                      for c in range(rules.turn_limit + 2)]
        # key -> optimal probability of full success; the optimal action is found again when asked (``solve``).
        self.memo: dict[Key, float] = {}
        # key -> (value, optimal action) of the states ``solve`` was asked about (a policy asks again and again).
        self.solved: dict[Key, tuple[float, int | None]] = {}

    # --- shapes ----------------------------------------------------------------------------------------

    @abstractmethod
    def after_success(self, sid: int, i: int) -> tuple[int, tuple[int, ...]]:
        """(shape id, local indices kept) once local tool i of shape ``sid`` has succeeded."""

    @abstractmethod
    def required_left(self, sid: int) -> int:
        """The number of required tools left in shape ``sid``."""

    # --- keys and transitions --------------------------------------------------------------------------

    def _canonical_counters(self, spare: int, codes: tuple[int, ...], consecutive: int, last: int, streak: int
                            ) -> tuple[tuple[int, ...], int, int, int] | None:
        """(call counts, consecutive failures, streak tool, streak length) of a state in canonical form, None
        when it is lost. With ``spare`` turns left beyond one per remaining required tool, more than
        ``spare`` further failures lose the episode anyway, so a consecutive-failure count or a streak that
        cannot reach its limit within ``spare`` failures is reset, and a call count that cannot reach the
        cap within ``spare + 1`` calls only says "called" (1). Equivalent states then share one key, and
        values stay bit-identical."""
        if spare < 0 or self._ends[consecutive][streak]:
            return None
        rules = self.rules
        if consecutive + spare < rules.max_consecutive_failures:
            consecutive = 0
        if last < 0 or streak + spare < rules.max_same_tool_failures:
            last, streak = -1, 0
        low = self.max_calls - spare - 1
        if low >= 2 and codes and max(codes) >= 2:
            codes = tuple(1 if 0 < c <= low else c for c in codes)
        return codes, consecutive, last, streak

    def shape_of(self, key: Key) -> int:
        """The shape id of a key."""
        return key[0]

    @abstractmethod
    def success_key(self, key: Key, action: int) -> Key | None:
        """The key once ``action`` (a local index or FILLER) has succeeded from ``key`` (of several
        successful outcomes, the likeliest); None when that loses the episode."""

    # --- dynamic programming ---------------------------------------------------------------------------

    @abstractmethod
    def action_values(self, key: Key) -> Iterator[tuple[int, float]]:
        """(action, optimal probability of full success after taking it) of every action of a state, in
        tie-break order: tool actions (local indices), then FILLER."""

    def value(self, key: Key | None) -> float:
        """Optimal probability of full success from ``key`` (None = lost), memoised."""
        if key is None:
            return 0.0
        value = self.memo.get(key)
        if value is None:
            value = self.memo[key] = self._best(key)[0]
        return value

    def _best(self, key: Key) -> tuple[float, int | None]:
        """(value, optimal action; None = FINISH) of ``key`` from its actions' values; ties go to the first
        action in tie-break order."""
        best, best_action = (1.0 if self.required_left(self.shape_of(key)) == 0 else 0.0), None
        if best == 0.0:
            for action, v in self.action_values(key):
                if v > best + 1e-12:
                    best, best_action = v, action
        return best, best_action

    def states(self) -> int:
        """The number of states solved so far."""
        return len(self.memo)

    def solve(self, key: Key | None) -> tuple[float, int | None]:
        """(optimal probability of full success, optimal action; None = FINISH) from ``key`` (None = lost).
        The memo keeps values only: the action is found again from the (memoised) values after it, once
        per state asked."""
        if key is None:
            return 0.0, None
        found = self.solved.get(key)
        if found is None:
            self.value(key)
            found = self.solved[key] = self._best(key)
        return found


DP = TypeVar("DP", bound=Subproblems)


class ExactBound(ABC, Generic[DP]):
    """Bound (iii) of one problem, with the optimal action of every state, on a shared ``Subproblems`` DP:
    the interface of ``plain.PlainBound`` and ``processes.ProcessBound``.

    ``all_actions=True`` makes every tool of the problem an action at every state (the reference the
    pruned action set is tested against)."""

    def __init__(self, problem: Problem, registry: ToolRegistry | None = None, all_actions: bool = False):
        if problem.rules.profile != "test":
            raise ValueError("bounds are defined for the 'test' failure profile only")
        self.registry = registry or default_registry()
        self.problem = problem
        self.rules, self.failure = problem.rules, problem.failure
        self.tools: tuple[int, ...] = problem_tools(problem.required, self.registry)
        self.m = len(problem.required)
        self.fillers = self._filler_order(spare_tools(problem.required, self.registry))
        check_fillers(self.fillers, self.rules)
        self.dp: DP = self._subproblems(all_actions)

    def _filler_order(self, spares: tuple[int, ...]) -> tuple[int, ...]:
        """The spare tools in the order filler calls take them (registry order)."""
        return spares

    @abstractmethod
    def _subproblems(self, all_actions: bool) -> DP:
        """The shared DP of this problem's call cap, rules and failure model."""

    # --- state -------------------------------------------------------------------------------------

    def _remaining(self, k: int, succeeded: Sequence[bool], spares: Sequence[int] = ()
                   ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """(local tools, local indices of each one's dependencies among them) after ``k`` required tools:
        the required tools left in order, the helpers not succeeded, then ``spares``."""
        local = self.problem.required[k:] + tuple(t for t in self.tools[self.m:] if not succeeded[t]) + tuple(spares)
        index = {t: j for j, t in enumerate(local)}
        return local, [tuple(index[d] for d in self.registry.dependency_ids[t] if d in index) for t in local]

    @abstractmethod
    def initial_state(self) -> State:
        """The DP state before any call."""

    @abstractmethod
    def _episode_state(self, episode: Episode) -> State:
        """The DP state of a running episode whose required tools succeeded in order."""

    def state_of(self, episode: Episode) -> State | None:
        """The DP state of a running episode, or None when full success is no longer possible."""
        return self._episode_state(episode) if required_in_order(episode) else None

    def after_success(self, state: State, action: int) -> State | None:
        """The state once local ``action`` (or FILLER) has succeeded (of several successful outcomes, the
        likeliest); None when that loses the episode."""
        if state.key is None:
            return None
        key = self.dp.success_key(state.key, action)
        if key is None:
            return None
        if action == FILLER:
            return State(key, state.tools)
        kept = self.dp.after_success(self.dp.shape_of(state.key), action)[1]
        return State(key, tuple(state.tools[j] for j in kept))

    # --- dynamic programming -------------------------------------------------------------------------

    def value(self, state: State | None) -> float:
        """Optimal probability of full success from ``state`` (None = lost)."""
        return 0.0 if state is None else self.dp.value(state.key)

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

    @property
    def optimal_success(self) -> float:
        return self.value(self.initial_state())

    @property
    def states_explored(self) -> int:
        """DP states solved so far, shared by every problem with this call cap, rules and failure model."""
        return self.dp.states()

    def happy_path(self) -> list[int]:
        """Tools the optimal policy calls when every call succeeds (global ids; of a call's successful
        outcomes, the likeliest)."""
        state, path, fillers_used = self.initial_state(), [], 0
        while state is not None:
            action = self.best_local_action(state)
            if action is None:
                break
            if action == FILLER:
                path.append(self.fillers[fillers_used])
                fillers_used += 1
            else:
                path.append(state.tools[action])
            state = self.after_success(state, action)
        return path

    # --- clairvoyant bound ---------------------------------------------------------------------------

    @abstractmethod
    def clairvoyant(self, stream: np.ndarray) -> bool:
        """Bound (ii) for one random stream: can any action sequence reach full success?"""
