"""Bound (iii) under the failure processes of ``WorldConfig.processes`` (docs/core/bounds.md, "Failure processes").

The DP of ``core.bounds.plain`` with the state each process adds, over canonical subproblems shared by every
problem with the same call cap, rules, failure model and processes (``ProcessSubproblems``):

* per-tool base: the base of each local tool (part of the shape), and the bases of the fresh spare tools
  left for filler calls, best first (fillers are taken best first);
* outages and rate limits: the process state (``core.processes.ToolState``) of each local tool;
* latency with a time budget: the time used (a finite set of sums of call durations).

A call's branches come from ``core.processes.call_outcomes``, the simulator's own list of the outcomes of
one call, so the process rules live once. A spare tool whose filler call failed becomes a local tool (it
may be called again) unless the best fresh spare is at least as good (``keeps_spare``). With every
process off this DP gives the values of ``core.bounds.plain.PlainSubproblems`` (tested); ``exact_bound``
uses that one then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from functools import cache, cached_property
from typing import Any

import numpy as np

from resilibench.errors import ConfigError

from ..config import EpisodeRules, FailureModel, FailureProcesses, WorldConfig
from ..processes import FRESH, ToolState, call_outcomes, down_probability, tool_bases
from ..registry import ToolRegistry
from ..simulator import Episode, success_probability
from .base import FILLER, ExactBound, Key, Problem, State, Subproblems

# (shape id, call count per local tool, process state per local tool, N_h, consecutive failures, local index
# of the tool of the current failure streak (-1: none), streak length, turns used, time used, bases of the
# fresh spare tools left, best first)
ProcessKey = tuple[int, tuple[int, ...], tuple[ToolState, ...], int, int, int, int, int, float, tuple[float, ...]]
# (probability, success, key after) of each outcome of an action
Branches = list[tuple[float, bool, "ProcessKey | None"]]


def frozen_processes(processes: FailureProcesses) -> tuple:
    """A hashable form of ``processes`` (its per-tool bases are a dict): what problems are keyed on."""
    return tuple((f.name, tuple(sorted(v.items())) if isinstance(v := getattr(processes, f.name), dict) else v)
                 for f in dataclasses.fields(processes))


def thawed_processes(frozen: tuple) -> FailureProcesses:
    """The ``FailureProcesses`` of ``frozen_processes``."""
    fields: dict[str, Any] = {name: dict(v) if name == "tool_base_success" else v for name, v in frozen}
    return FailureProcesses(**fields)


class ProcessSubproblems(Subproblems):
    """The DP of bound (iii) under failure processes (module docstring, ``base.Subproblems``).

    A shape is (number of required tools left, dependencies per local tool, base per local tool, number of
    failed spares): the local tools are the required tools not yet succeeded in order, the helpers not yet
    succeeded, then the spare tools whose filler call failed and that are kept (``keeps_spare``). The
    actions are the next required tool, the helpers, the kept spares and the best fresh spare;
    ``all_actions`` adds the later required tools (whose success loses the episode)."""

    def __init__(self, max_calls: int, rules: EpisodeRules, failure: FailureModel, processes: FailureProcesses,
                 all_actions: bool):
        super().__init__(max_calls, rules, failure, all_actions)
        self.processes = processes
        self.budget = processes.time_budget_seconds
        # The longest a call can take (its time counts against the budget).
        self.longest = max(o.duration for _, o in call_outcomes(processes, FRESH, 0.5, ("",)))
        self._branches: dict[tuple[ToolState, float], list[tuple[float, bool, float, ToolState]]] = {}

    # --- shapes ----------------------------------------------------------------------------------------

    def shape(self, n_required: int, deps: Sequence[tuple[int, ...]], bases: Sequence[float],
              n_spares: int) -> tuple[int, tuple[int, ...]]:
        """(shape id, local indices kept) of a tool list whose last ``n_spares`` tools are failed spares.
        Unlike ``PlainSubproblems.shape``, a helper that no required tool needs any more stays: a failed
        call may have left it better than a fresh spare as a filler (found up by an outage process)."""
        canonical = (n_required, tuple(deps), tuple(bases), n_spares)
        return self._register(canonical), tuple(range(len(deps)))

    def _shape_after(self, sid: int, i: int, rest: list[int], new_deps: list[tuple[int, ...]]
                     ) -> tuple[int, tuple[int, ...]]:
        n_required, deps, bases, n_spares = self.shapes[sid]
        spares_left = n_spares - (i >= len(deps) - n_spares)
        return self.shape(n_required - (i < n_required), new_deps, [bases[j] for j in rest], spares_left)

    def with_spare(self, sid: int, base: float) -> int:
        """The shape ``sid`` with one more failed spare (base ``base``) at the end."""
        n_required, deps, bases, n_spares = self.shapes[sid]
        return self.shape(n_required, deps + ((),), bases + (base,), n_spares + 1)[0]

    def keeps_spare(self, base: float, state: ToolState, fresh_base: float | None) -> bool:
        """Whether a spare tool of base ``base`` whose filler call failed (leaving it in ``state``) stays an
        action: unless the best fresh spare (base ``fresh_base``; None: none left) is at least as good, with
        a base as high and a fresh process state no worse (an outage chain whose down state persists,
        start + end <= 1, makes a tool found down worse than a fresh one and a tool found up better)."""
        if fresh_base is None or base > fresh_base:
            return True
        processes = self.processes
        return processes.outage_start > 0.0 and (
            down_probability(processes, state.down) < down_probability(processes, FRESH.down))

    # --- transitions -----------------------------------------------------------------------------------

    def outcomes(self, state: ToolState, p: float) -> list[tuple[float, bool, float, ToolState]]:
        """(probability, success, duration, state after) of each outcome of a call (failures of the success
        formula merged: the error code does not matter to the bound)."""
        entry = self._branches.get((state, p))
        if entry is None:
            merged: dict[tuple[bool, float, ToolState], float] = {}
            for q, outcome in call_outcomes(self.processes, state, p, ("",)):
                what = (outcome.success, outcome.duration, outcome.state)
                merged[what] = merged.get(what, 0.0) + q
            entry = self._branches[(state, p)] = [(q, *what) for what, q in merged.items()]
        return entry

    def key(self, sid: int, codes: tuple[int, ...], states: tuple[ToolState, ...], n_h: int, consecutive: int,
            last: int, streak: int, turns: int, time: float, fresh: tuple[float, ...]) -> ProcessKey | None:
        """The canonical key of a state, None when it is lost: as ``PlainSubproblems.key`` (counters that
        cannot reach a limit are forgotten), lost also once the time budget is used up before the last
        required tool succeeded; only the fresh spares a remaining turn can use are kept."""
        rules, budget = self.rules, self.budget
        n_required, _, _, n_spares = self.shapes[sid]
        spare = rules.turn_limit - turns - n_required
        counters = self._canonical_counters(spare, codes, consecutive, last, streak)
        if counters is None:
            return None
        if budget is None or time + self.longest * (rules.turn_limit - turns - 1) < budget:
            time = 0.0  # every call left fits in the budget, whatever the time used: it no longer matters
        elif n_required and time >= budget:
            return None
        codes, consecutive, last, streak = counters
        if n_spares > 1:
            sid, codes, states, last = self.sorted_spares(sid, codes, states, last)
        return sid, codes, states, n_h, consecutive, last, streak, turns, time, fresh[:spare]

    @staticmethod
    def spare_rank(base: float, calls: int, state: ToolState, last: bool) -> tuple:
        """The order of failed spares in a key (interchangeable tools listed one way)."""
        return base, calls, state.down is None, bool(state.down), state.blocked, last

    def sorted_spares(self, sid: int, codes: tuple[int, ...], states: tuple[ToolState, ...], last: int
                      ) -> tuple[int, tuple[int, ...], tuple[ToolState, ...], int]:
        """(shape id, call counts, process states, streak tool) with the failed spares in ``spare_rank``
        order."""
        n_required, deps, bases, n_spares = self.shapes[sid]
        first = len(deps) - n_spares
        order = sorted(range(first, len(deps)), key=lambda j: self.spare_rank(bases[j], codes[j], states[j],
                                                                               j == last))
        if order == list(range(first, len(deps))):
            return sid, codes, states, last
        order = list(range(first)) + order
        sid = self.shape(n_required, deps, [bases[j] for j in order], n_spares)[0]
        return sid, tuple([codes[j] for j in order]), tuple([states[j] for j in order]), (
            order.index(last) if last >= 0 else last)

    @staticmethod
    def aged(states: tuple[ToolState, ...]) -> tuple[ToolState, ...]:
        """The process states one turn later: a rate-limit block counts turns, called or not."""
        if not any(s.blocked for s in states):
            return states
        return tuple(ToolState(s.down, s.blocked - 1) if s.blocked else s for s in states)

    def probability(self, base: float, n_uncalled: int, n_failed: int, n_h: int) -> float:
        return success_probability(base, n_uncalled, n_failed, n_h, self.failure)

    def transitions(self, key: Key) -> list[tuple[int, Branches]]:
        """(action, its branches) of every action of a state in tie-break order: local tools under the call
        cap, then FILLER (the best fresh spare)."""
        sid, codes, states, n_h, consecutive, last, streak, turns, time, fresh = key
        n_required, deps, bases, n_spares = self.shapes[sid]
        strict, make = self.rules.strict_dependencies, self.key
        later = self.aged(states)  # every tool's state at the next turn, unless called now
        moves = []
        for i, n_uncalled, n_failed in self._callable_tools(sid, codes):
            failed_codes = codes[:i] + (codes[i] + 1,) + codes[i + 1:]
            same = streak + 1 if last == i else 1
            if strict and (n_uncalled or n_failed):  # dependency error: no draw, no process stage
                moves.append((i, [(1.0, False, make(sid, failed_codes, later, n_h + 1, consecutive + 1, i, same,
                                             turns + 1, time, fresh))]))
                continue
            branches: Branches = []
            for q, success, duration, state in self.outcomes(states[i], self.probability(
                    bases[i], n_uncalled, n_failed, n_h)):
                if not success:
                    after = later[:i] + (state,) + later[i + 1:]
                    branches.append((q, False, make(sid, failed_codes, after, n_h + 1, consecutive + 1, i, same,
                                             turns + 1, time + duration, fresh)))
                elif 0 < i < n_required:
                    branches.append((q, True, None))  # a later required tool succeeding first breaks the sequence
                else:
                    new_sid, keep = self.after_success(sid, i)
                    branches.append((q, True, make(new_sid, tuple([codes[j] for j in keep]),
                                             tuple([later[j] for j in keep]), n_h, 0, -1, 0, turns + 1,
                                             time + duration, fresh)))
            moves.append((i, branches))
        if fresh:
            base, rest = fresh[0], fresh[1:]
            branches = []
            for q, success, duration, state in self.outcomes(FRESH, self.probability(base, 0, 0, n_h)):
                if success:
                    branches.append((q, True, make(sid, codes, later, n_h, 0, -1, 0, turns + 1, time + duration,
                                             rest)))
                elif self.keeps_spare(base, state, rest[0] if rest else None):
                    branches.append((q, False, make(self.with_spare(sid, base), codes + (1,), later + (state,),
                                             n_h + 1, consecutive + 1, len(codes), 1, turns + 1,
                                             time + duration, rest)))
                else:
                    branches.append((q, False, make(sid, codes, later, n_h + 1, consecutive + 1, -1, 1, turns + 1,
                                             time + duration, rest)))
            moves.append((FILLER, branches))
        return moves

    def success_key(self, key: Key, action: int) -> Key | None:
        branches = dict(self.transitions(key))[action]
        return max((b for b in branches if b[1]), key=lambda b: b[0])[2]

    def action_values(self, key: Key) -> Iterator[tuple[int, float]]:
        solve = self.solve
        for action, branches in self.transitions(key):
            yield action, sum(q * solve(after)[0] for q, _, after in branches if after is not None)


@cache
def process_subproblems(max_calls: int, rules: EpisodeRules, failure: FailureModel, processes: tuple,
                        all_actions: bool = False) -> ProcessSubproblems:
    """The shared ``ProcessSubproblems`` of a call cap, rules, failure model and (frozen) processes."""
    return ProcessSubproblems(max_calls, rules, failure, thawed_processes(processes), all_actions)


class ProcessBound(ExactBound[ProcessSubproblems]):
    """Bound (iii) of one problem under failure processes (``base.ExactBound``) over ``ProcessSubproblems``.
    The filler of a state is the best fresh spare tool; a kept failed spare is a local tool."""

    def __init__(self, problem: Problem, registry: ToolRegistry | None = None, all_actions: bool = False):
        super().__init__(problem, registry, all_actions)
        self._check_other_tools()

    @cached_property
    def bases(self) -> tuple[float, ...]:
        """The base success probability of every tool (global ids)."""
        return tool_bases(thawed_processes(self.problem.processes), self.failure, self.registry)

    def _filler_order(self, spares: tuple[int, ...]) -> tuple[int, ...]:
        """The spare tools best first (highest base, then registry order)."""
        return tuple(sorted(spares, key=lambda t: (-self.bases[t], t)))

    def _subproblems(self, all_actions: bool) -> ProcessSubproblems:
        return process_subproblems(self.problem.max_calls, self.rules, self.failure, self.problem.processes,
                                   all_actions)

    def _check_other_tools(self) -> None:
        """ConfigError unless every other tool outside the problem (one with dependencies) has a base no
        higher than the worst spare a filler call may take (the ``turn_limit``-th best): such a tool is
        then never a better filler than a fresh spare, the argument the filler action rests on."""
        outside = set(range(len(self.registry))) - set(self.tools) - set(self.fillers)
        worst = self.bases[self.fillers[self.rules.turn_limit - 1]]
        better = sorted(self.registry.names[t] for t in outside if self.bases[t] > worst)
        if better:
            raise ConfigError("processes.tool_base_success", (
                f"processes.tool_base_success: bound (iii) takes filler calls from the spare tools (base >= "
                f"{worst} here); tool(s) {better[:3]} outside the task have a higher base and dependencies, "
                "which the bound does not model; give tools with dependencies bases no higher than those "
                "of dependency-free tools, or estimate with monte_carlo_success"))

    def _state(self, k: int, calls: Sequence[int], succeeded: Sequence[bool], states: Sequence[ToolState],
               n_h: int, consecutive: int, last: int, streak: int, turns: int, time: float) -> State:
        """The state after ``k`` required tools, from per-tool (global ids) calls, successes and process
        states. The failed spares kept are those ``keeps_spare`` keeps against the best fresh spare."""
        dp, fillers, bases = self.dp, self.fillers, self.bases
        fresh = tuple(bases[t] for t in fillers if not calls[t])
        spares = sorted((t for t in fillers if calls[t] and not succeeded[t] and dp.keeps_spare(
            bases[t], states[t], fresh[0] if fresh else None)),
            key=lambda t: dp.spare_rank(bases[t], calls[t], states[t], t == last and streak > 0))
        tools, deps = self._remaining(k, succeeded, spares)
        sid = dp.shape(self.m - k, deps, [bases[t] for t in tools], len(spares))[0]
        last = tools.index(last) if streak > 0 and last in tools else -1
        key = dp.key(sid, tuple(calls[t] for t in tools), tuple(states[t] for t in tools), n_h, consecutive,
                     last, streak, turns, time, fresh)
        return State(key, tools)

    def initial_state(self) -> State:
        n = len(self.registry)
        return self._state(0, [0] * n, [False] * n, [FRESH] * n, 0, 0, -1, 0, 0, 0.0)

    def _episode_state(self, episode: Episode) -> State:
        states = [episode.tool_state(t) for t in range(len(self.registry))]
        return self._state(episode.next_required, episode.calls, episode.succeeded, states, episode.n_failures,
                           episode.consecutive_failures, episode.last_tool, episode.same_tool_streak,
                           episode.turns_used, episode.time_used)

    def clairvoyant(self, stream: np.ndarray) -> bool:
        raise ConfigError("processes", "processes: bound (ii) is not defined under failure processes (their "
                          "draws come from streams of their own); bound (iii) is")


def process_problem(required: tuple[int, ...], max_calls: int, config: WorldConfig) -> Problem:
    """The ``Problem`` of a task's required tools and call cap in a world with failure processes."""
    return Problem(required, max_calls, config.rules, config.failure, frozen_processes(config.processes))
