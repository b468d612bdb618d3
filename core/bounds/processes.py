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
import struct
from collections.abc import Iterator, Sequence
from functools import cache, cached_property
from typing import Any, cast

import numpy as np

from resilibench.errors import ConfigError

from ..config import EpisodeRules, FailureModel, FailureProcesses, WorldConfig
from ..processes import FRESH, ToolState, call_outcomes, down_probability, tool_bases
from ..registry import ToolRegistry
from ..simulator import Episode, success_probability
from .base import FILLER, ExactBound, Key, Problem, State, Subproblems

# A state packed in bytes (``ProcessSubproblems.layout``: about 30 bytes, its hash kept by the object): shape
# id, id of the bases of the fresh spare tools left (best first), id of the time used, N_h, consecutive failures,
# local index of the tool of the current failure streak (-1: none), streak length, turns used, then the call
# count of each local tool, then the id of each local tool's process state (``ProcessSubproblems.tool_states``).
ProcessKey = bytes
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
        # Every process state a tool can be in, by id (FRESH is 0), and the id one turn later.
        self.tool_states = tuple(ToolState(down, blocked) for down in (None, False, True)
                                 for blocked in range(processes.rate_limit_wait + 1))
        self._state_ids = {state: j for j, state in enumerate(self.tool_states)}
        self._aged = tuple(self._state_ids[ToolState(s.down, s.blocked - 1)] if s.blocked else j
                           for j, s in enumerate(self.tool_states))
        # Bases of fresh spares left, by id: the tuple, the id without its first, the id cut to n (-1: not yet).
        self._fresh: list[tuple[float, ...]] = []
        self._fresh_ids: dict[tuple[float, ...], int] = {}
        self._fresh_rest: list[int] = []
        self._fresh_cut: list[list[int]] = []
        self._times: list[float] = [0.0]  # time used, by id, and its bytes in a key
        self._time_ids: dict[float, int] = {0.0: 0}
        self._time_tails: list[bytes] = [bytes(2)]
        self._layouts: list[struct.Struct] = []  # by number of local tools
        self._branches: dict[tuple, tuple[int, list[tuple[float, bool, float, int, int]]]] = {}
        self._orders: dict[tuple, tuple[int, ...] | None] = {}  # failed spares' (bases, calls, states, last) -> order
        self._reordered: dict[tuple[int, tuple[int, ...]], int] = {}  # (shape id, order) -> shape id

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

    def fresh_id(self, fresh: tuple[float, ...]) -> int:
        """The id of a tuple of fresh spare bases (best first)."""
        fid = self._fresh_ids.get(fresh)
        if fid is None:
            fid = self._fresh_ids[fresh] = len(self._fresh)
            self._fresh.append(fresh)
            self._fresh_rest.append(-1)
            self._fresh_cut.append([-1] * (self.rules.turn_limit + 1))
        return fid

    def _cut(self, fid: int, n: int) -> int:
        """The id of the first ``n`` bases of fresh tuple ``fid``."""
        cut = self._fresh_cut[fid][n]
        if cut < 0:
            fresh = self._fresh[fid]
            cut = self._fresh_cut[fid][n] = fid if len(fresh) <= n else self.fresh_id(fresh[:n])
        return cut

    def _rest(self, fid: int) -> int:
        """The id of fresh tuple ``fid`` without its first (best) base."""
        rest = self._fresh_rest[fid]
        if rest < 0:
            rest = self._fresh_rest[fid] = self.fresh_id(self._fresh[fid][1:])
        return rest

    def outcomes(self, state: int, base: float, n_uncalled: int, n_failed: int, n_h: int
                 ) -> tuple[int, list[tuple[float, bool, float, int, int]]]:
        """(number of groups, [(probability, success, duration, state id after, group)]) of the outcomes of a
        call of a tool in state id ``state`` (failures of the success formula merged: the error code does not
        matter to the bound). Outcomes of one group differ only in their duration."""
        memo_key = (state, base, n_uncalled, n_failed, n_h)
        entry = self._branches.get(memo_key)
        if entry is None:
            p = success_probability(base, n_uncalled, n_failed, n_h, self.failure)
            merged: dict[tuple[bool, float, int], float] = {}
            for q, outcome in call_outcomes(self.processes, self.tool_states[state], p, ("",)):
                what = (outcome.success, outcome.duration, self._state_ids[outcome.state])
                merged[what] = merged.get(what, 0.0) + q
            groups: dict[tuple[bool, int], int] = {}
            entry = self._branches[memo_key] = (len({(ok, after) for ok, _, after in merged}), [
                (q, ok, duration, after, groups.setdefault((ok, after), len(groups)))
                for (ok, duration, after), q in merged.items()])
        return entry

    def layout(self, n: int) -> struct.Struct:
        """The packing of a key with ``n`` local tools, all but the time id (``ProcessKey``)."""
        while len(self._layouts) <= n:
            self._layouts.append(struct.Struct(f"<IIBBbBB{2 * len(self._layouts)}B"))
        return self._layouts[n]

    def shape_of(self, key: Key) -> int:
        return int.from_bytes(key[:4], "little")

    def key(self, sid: int, codes: tuple[int, ...], states: tuple[ToolState, ...], n_h: int, consecutive: int,
            last: int, streak: int, turns: int, time: float, fresh: tuple[float, ...]) -> ProcessKey | None:
        """The canonical key of a state given with process states and fresh bases as they are."""
        body = self._body(sid, codes, tuple(self._state_ids[s] for s in states), n_h, consecutive, last, streak,
                          turns, self.fresh_id(fresh))
        return None if body is None else self._timed(body, self.shapes[sid][0], turns, time)

    def _body(self, sid: int, codes: tuple[int, ...], states: tuple[int, ...], n_h: int, consecutive: int,
              last: int, streak: int, turns: int, fid: int) -> bytes | None:
        """The canonical key of a state but its time (``_timed`` adds it), None when it is lost: as
        ``PlainSubproblems.key`` (counters that cannot reach a limit are forgotten); only the fresh spares a
        remaining turn can use are kept."""
        n_required, _, _, n_spares = self.shapes[sid]
        spare = self.rules.turn_limit - turns - n_required
        counters = self._canonical_counters(spare, codes, consecutive, last, streak)
        if counters is None:
            return None
        codes, consecutive, last, streak = counters
        if n_spares > 1:
            sid, order = self._spare_order(sid, codes, states, last)
            if order is not None:
                codes, states = tuple([codes[j] for j in order]), tuple([states[j] for j in order])
                last = order.index(last) if last >= 0 else last
        return self.layout(len(codes)).pack(sid, self._cut(fid, spare), n_h, consecutive, last, streak, turns,
                                            *codes, *states)

    def _timed(self, body: bytes, n_required: int, turns: int, time: float) -> ProcessKey | None:
        """The key of ``body`` (``_body``) at time used ``time``, None when it is lost: once the time budget is
        used up before the last required tool succeeded."""
        budget = self.budget
        if budget is None or time + self.longest * (self.rules.turn_limit - turns - 1) < budget:
            return body + self._time_tails[0]  # every call left fits in the budget, whatever the time used
        if n_required and time >= budget:
            return None
        tid = self._time_ids.get(time)
        if tid is None:
            tid = self._time_ids[time] = len(self._times)
            self._times.append(time)
            self._time_tails.append(tid.to_bytes(2, "little"))
        return body + self._time_tails[tid]

    @staticmethod
    def spare_rank(base: float, calls: int, state: ToolState, last: bool) -> tuple:
        """The order of failed spares in a key (interchangeable tools listed one way)."""
        return base, calls, state.down is None, bool(state.down), state.blocked, last

    def _spare_order(self, sid: int, codes: tuple[int, ...], states: tuple[int, ...], last: int
                     ) -> tuple[int, tuple[int, ...] | None]:
        """(shape id, order of the local tools; None: as they are) with the failed spares in ``spare_rank``
        order."""
        n_required, deps, bases, n_spares = self.shapes[sid]
        first = len(deps) - n_spares
        spares = (bases[first:], codes[first:], states[first:], last - first)
        if spares not in self._orders:
            order = sorted(range(n_spares), key=lambda j: self.spare_rank(
                bases[first + j], codes[first + j], self.tool_states[states[first + j]], j == last - first))
            self._orders[spares] = None if order == list(range(n_spares)) else tuple(order)
        order = self._orders[spares]
        if order is None:
            return sid, None
        new_sid = self._reordered.get((sid, order))
        if new_sid is None:
            new_sid = self._reordered[(sid, order)] = self.shape(
                n_required, deps, bases[:first] + tuple(bases[first + j] for j in order), n_spares)[0]
        return new_sid, tuple(range(first)) + tuple(first + j for j in order)

    def transitions(self, key: Key) -> list[tuple[int, Branches]]:
        """(action, its branches) of every action of a state in tie-break order: local tools under the call
        cap, then FILLER (the best fresh spare). The outcomes of a call that differ only in their duration
        share the rest of their key (``_body``)."""
        packed = cast(ProcessKey, key)
        n = (len(packed) - 2 - self.layout(0).size) // 2
        sid, fid, n_h, consecutive, last, streak, turns, *rest = self.layout(n).unpack(packed[:-2])
        codes, states = tuple(rest[:n]), tuple(rest[n:])
        time = self._times[int.from_bytes(packed[-2:], "little")]
        n_required, _, bases, _ = self.shapes[sid]
        strict, body_of, timed, outcomes = self.rules.strict_dependencies, self._body, self._timed, self.outcomes
        aged = self._aged
        later = tuple([aged[s] for s in states])  # every tool's state at the next turn, unless called now
        turns += 1
        moves = []
        for i, n_uncalled, n_failed in self._callable_tools(sid, codes):
            failed_codes = codes[:i] + (codes[i] + 1,) + codes[i + 1:]
            same = streak + 1 if last == i else 1
            if strict and (n_uncalled or n_failed):  # dependency error: no draw, no process stage
                body = body_of(sid, failed_codes, later, n_h + 1, consecutive + 1, i, same, turns, fid)
                moves.append((i, [(1.0, False, body and timed(body, n_required, turns, time))]))
                continue
            branches: Branches = []
            groups, found = outcomes(states[i], bases[i], n_uncalled, n_failed, n_h)
            bodies: list = [False] * groups
            for q, success, duration, state, group in found:
                if success and 0 < i < n_required:
                    branches.append((q, True, None))  # a later required tool succeeding first breaks the sequence
                    continue
                body = bodies[group]
                if body is False:
                    if not success:
                        body = body_of(sid, failed_codes, later[:i] + (state,) + later[i + 1:], n_h + 1,
                                       consecutive + 1, i, same, turns, fid)
                    else:
                        new_sid, keep = self.after_success(sid, i)
                        body = body_of(new_sid, tuple([codes[j] for j in keep]), tuple([later[j] for j in keep]),
                                       n_h, 0, -1, 0, turns, fid)
                    bodies[group] = body
                branches.append((q, success, body and timed(body, n_required - (success and i < n_required), turns,
                                                            time + duration)))
            moves.append((i, branches))
        fresh = self._fresh[fid]
        if fresh:
            base, rest_id = fresh[0], self._rest(fid)
            next_base = fresh[1] if len(fresh) > 1 else None
            branches = []
            groups, found = outcomes(0, base, 0, 0, n_h)
            bodies = [False] * groups
            for q, success, duration, state, group in found:
                body = bodies[group]
                if body is False:
                    if success:
                        body = body_of(sid, codes, later, n_h, 0, -1, 0, turns, rest_id)
                    elif self.keeps_spare(base, self.tool_states[state], next_base):
                        body = body_of(self.with_spare(sid, base), codes + (1,), later + (state,), n_h + 1,
                                       consecutive + 1, len(codes), 1, turns, rest_id)
                    else:
                        body = body_of(sid, codes, later, n_h + 1, consecutive + 1, -1, 1, turns, rest_id)
                    bodies[group] = body
                branches.append((q, success, body and timed(body, n_required, turns, time + duration)))
            moves.append((FILLER, branches))
        return moves

    def success_key(self, key: Key, action: int) -> Key | None:
        branches = dict(self.transitions(key))[action]
        return max((b for b in branches if b[1]), key=lambda b: b[0])[2]

    def action_values(self, key: Key) -> Iterator[tuple[int, float]]:
        value = self.value
        for action, branches in self.transitions(key):
            yield action, sum([q * value(after) for q, _, after in branches if after is not None])


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
