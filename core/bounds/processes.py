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
from .process_kernel import (
    MAX_BASES,
    MAX_BRANCHES,
    MAX_LOCAL,
    NEED_OUTCOMES,
    NEED_ROOM,
    NEED_SHAPES,
    NEED_VECTORS,
    OK,
    Frames,
    Lookups,
    Memo,
    Shapes,
    Tables,
    Vectors,
    call,
    expand,
    make_key,
    new_lookups,
    new_shape,
    outcome_code,
    put,
    shape_after,
    solve,
)

# A state as two int64 (``process_kernel``: shape, fresh spares and time ids; counters and the id of the call
# counts and process states of the local tools).
ProcessKey = tuple[int, int]
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
    ``all_actions`` adds the later required tools (whose success loses the episode).

    Shapes, keys, transitions and the DP are compiled (``process_kernel``); this class tabulates for them what
    the rules say (outcomes of a call, fresh spares, which failed spare is kept), filling an entry when a
    kernel asks for it. A key is canonical: counters that cannot reach a limit are forgotten (as
    ``PlainSubproblems.key``), only the fresh spares a remaining turn can use are kept, failed spares are
    listed in ``spare_rank`` order, and the time used only once it may matter."""

    def __init__(self, max_calls: int, rules: EpisodeRules, failure: FailureModel, processes: FailureProcesses,
                 all_actions: bool):
        super().__init__(max_calls, rules, failure, all_actions)
        self.processes = processes
        # The longest a call can take (its time counts against the budget).
        longest = max(o.duration for _, o in call_outcomes(processes, FRESH, 0.5, ("",)))
        # Every process state a tool can be in, by id (FRESH is 0).
        self.tool_states = tuple(ToolState(down, blocked) for down in (None, False, True)
                                 for blocked in range(processes.rate_limit_wait + 1))
        self._state_ids = {state: j for j, state in enumerate(self.tool_states)}
        n_states = len(self.tool_states)
        if (max_calls + 1) * n_states > 128:
            raise ValueError(f"bound (iii): a call cap of {max_calls} with rate_limit_wait="
                             f"{processes.rate_limit_wait} does not fit the DP's key (one byte per tool)")
        aged = [self._state_ids[ToolState(s.down, s.blocked - 1)] if s.blocked else j
                for j, s in enumerate(self.tool_states)]
        ranks = sorted(range(n_states), key=lambda j: self.spare_rank(0.0, 0, self.tool_states[j], False))
        budget = processes.time_budget_seconds
        self._constants: dict[str, Any] = dict(
            ints=np.array([rules.turn_limit, rules.max_consecutive_failures, rules.max_same_tool_failures,
                           max_calls, rules.strict_dependencies, n_states, budget is not None, all_actions],
                          dtype=np.int64),
            budget=float(budget or 0.0), longest=float(longest), ends=np.array(self._ends, dtype=np.int8),
            aged=np.array(aged, dtype=np.int64), state_rank=np.argsort(np.array(ranks)).astype(np.int64))
        self._bases: list[float] = []  # base id -> base
        self._base_ids: dict[float, int] = {}
        self._fresh: list[tuple[float, ...]] = []  # fresh id -> bases of the fresh spares left, best first
        self._fresh_ids: dict[tuple[float, ...], int] = {}
        self._grown: dict[str, np.ndarray] = {  # tables that grow: rows written so far in _rows
            "fresh": np.zeros((0, 4), np.int64), "fresh_cut": np.zeros((0, rules.turn_limit + 1), np.int64),
            "outcome_span": np.zeros((0, 2), np.int64), "outcome_q": np.zeros(0), "outcome_ok": np.zeros(0, bool),
            "outcome_duration": np.zeros(0), "outcome_state": np.zeros(0, np.int64)}
        self._rows = dict.fromkeys(self._grown, 0)
        self._keeps = np.zeros((0, n_states, 1), np.int8)
        self._lookups = Lookups(*new_lookups(), Vectors.empty(), Shapes.empty())
        self._memo = Memo.empty()  # the base class's ``memo`` stays empty: this DP's memo is compiled
        self._table: Tables | None = None
        self._frames = Frames.empty(rules.turn_limit + 2)
        self._req = np.zeros(5, np.int64)  # the arguments of NEED_OUTCOMES
        self._scratch = np.zeros((10, MAX_LOCAL + 1), np.int64)
        self._branches = (np.zeros(MAX_BRANCHES, np.int64), np.zeros(MAX_BRANCHES), np.zeros(MAX_BRANCHES, bool),
                          np.zeros((MAX_BRANCHES, 2), np.int64), np.zeros(MAX_BRANCHES, bool))

    # --- shapes ----------------------------------------------------------------------------------------

    def shape(self, n_required: int, deps: Sequence[tuple[int, ...]], bases: Sequence[float],
              n_spares: int) -> tuple[int, tuple[int, ...]]:
        """(shape id, local indices kept) of a tool list whose last ``n_spares`` tools are failed spares.
        Unlike ``PlainSubproblems.shape``, a helper that no required tool needs any more stays: a failed
        call may have left it better than a fresh spare as a filler (found up by an outage process)."""
        if len(deps) > MAX_LOCAL:
            raise ValueError(f"bound (iii): {len(deps)} local tools; the DP's key holds {MAX_LOCAL}")
        masks = np.array([sum(1 << d for d in ds) for ds in deps], np.int32)
        _, sid = self._call(new_shape, n_required, masks, np.array([self.base_id(b) for b in bases], np.int8),
                            n_spares)
        return sid, tuple(range(len(deps)))

    def after_success(self, sid: int, i: int) -> tuple[int, tuple[int, ...]]:
        _, new_sid = self._call(shape_after, sid, i)
        return new_sid, tuple(j for j in range(self._lookups.shapes.ints[sid, 1]) if j != i)

    def required_left(self, sid: int) -> int:
        return int(self._lookups.shapes.ints[sid, 0])

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

    @staticmethod
    def spare_rank(base: float, calls: int, state: ToolState, last: bool) -> tuple:
        """The order of failed spares in a key (interchangeable tools listed one way)."""
        return base, calls, state.down is None, bool(state.down), state.blocked, last

    # --- tables ----------------------------------------------------------------------------------------

    def _row(self, name: str, fill: int = -1) -> int:
        """A new row of grown table ``name`` (filled with ``fill``), its index."""
        row, table = self._rows[name], self._grown[name]
        if row == len(table):
            self._grown[name] = table = np.concatenate([table, np.full((max(64, row // 2),) + table.shape[1:], fill,
                                                                       table.dtype)])
            self._table = None  # the kernels read the new array from now on
        self._rows[name] = row + 1
        return row

    def base_id(self, base: float) -> int:
        """The id of a base (the table of kept spares grows with the bases)."""
        bid = self._base_ids.get(base)
        if bid is None:
            if len(self._bases) == MAX_BASES:
                raise ValueError(f"bound (iii): more than {MAX_BASES} distinct tool bases")
            bid = self._base_ids[base] = len(self._bases)
            self._bases.append(base)
            n = len(self._bases)
            self._keeps = np.array([[[self.keeps_spare(b, s, None if nb < 0 else self._bases[nb])
                                      for nb in range(-1, n)] for s in self.tool_states] for b in self._bases],
                                   dtype=np.int8)
            self._table = None
        return bid

    def fresh_id(self, fresh: tuple[float, ...]) -> int:
        """The id of a tuple of fresh spare bases (best first), with the ids of its cuts and rest."""
        fid = self._fresh_ids.get(fresh)
        if fid is None:
            fid = self._fresh_ids[fresh] = self._row("fresh")
            self._row("fresh_cut")
            self._fresh.append(fresh)
            ids = [self.base_id(b) for b in fresh[:2]] + [-1, -1]
            rest = self.fresh_id(fresh[1:]) if fresh else fid
            cuts = [fid if len(fresh) <= n else self.fresh_id(fresh[:n]) for n in range(self.rules.turn_limit + 1)]
            self._grown["fresh"][fid] = (len(fresh), ids[0], ids[1], rest)
            self._grown["fresh_cut"][fid] = cuts
        return fid

    def _tables(self) -> Tables:
        """The tables as the kernels read them: the grown arrays whole (the kernels read only the rows they
        were given ids of), made again only when an array was replaced or a base added."""
        if self._table is None:
            grown: dict[str, Any] = self._grown
            self._table = Tables(**self._constants, base_value=np.array(self._bases), keeps=self._keeps, **grown)
        return self._table

    def _fill(self, kind: int) -> None:
        """Tabulates what a kernel asked for, or gives it room (``process_kernel.NEED_*``)."""
        if kind == NEED_SHAPES:
            self._lookups = self._lookups._replace(shapes=self._lookups.shapes.grown())
        elif kind == NEED_VECTORS:
            self._lookups = self._lookups._replace(vectors=self._lookups.vectors.grown())
        elif kind == NEED_OUTCOMES:
            self._add_outcomes(*(int(x) for x in self._req[:5]))

    def _add_outcomes(self, state: int, bid: int, n_uncalled: int, n_failed: int, n_h: int) -> None:
        """Tabulates the outcomes of a call of a tool in state id ``state`` (failures of the success formula
        merged: the error code does not matter to the bound)."""
        p = success_probability(self._bases[bid], n_uncalled, n_failed, n_h, self.failure)
        merged: dict[tuple[bool, float, int], float] = {}
        for q, outcome in call_outcomes(self.processes, self.tool_states[state], p, ("",)):
            what = (outcome.success, outcome.duration, self._state_ids[outcome.state])
            merged[what] = merged.get(what, 0.0) + q
        index = self._row("outcome_span")
        self._grown["outcome_span"][index] = (self._rows["outcome_q"], len(merged))
        for (ok, duration, after), q in merged.items():
            row = self._row("outcome_q")
            for name in ("outcome_ok", "outcome_duration", "outcome_state"):
                self._row(name)
            self._grown["outcome_q"][row], self._grown["outcome_ok"][row] = q, ok
            self._grown["outcome_duration"][row], self._grown["outcome_state"][row] = duration, after
        put(self._lookups.outcome_index, outcome_code(state, bid, n_uncalled, n_failed, n_h), index)

    def _call(self, kernel: Any, *args: Any) -> Any:
        """A kernel's result, filling the tables it asks for until it has what it needs."""
        while True:
            result = call(kernel, self._tables(), self._lookups, *args)
            status = result if isinstance(result, int) else result[0]
            if status in (OK, -1, NEED_ROOM):
                return result  # done, lost, or the memo is full (``value`` grows it)
            self._fill(status)

    # --- keys, transitions and values ------------------------------------------------------------------

    def shape_of(self, key: Key) -> int:
        return key[0] & 0x7FFFFFFF

    def key(self, sid: int, codes: tuple[int, ...], states: tuple[ToolState, ...], n_h: int, consecutive: int,
            last: int, streak: int, turns: int, time: float, fresh: tuple[float, ...]) -> ProcessKey | None:
        """The canonical key of a state given with process states and fresh bases as they are (None: lost)."""
        n, fid = len(codes), self.fresh_id(fresh)
        status, key = self._call(make_key, sid, np.array(codes + (0,), np.int64),
                                 np.array([self._state_ids[s] for s in states] + [0], np.int64), n, n_h,
                                 consecutive, last, streak, turns, float(time), fid, self._req, self._scratch)
        return None if status < 0 else key

    def transitions(self, key: Key) -> list[tuple[int, Branches]]:
        """(action, its branches) of every action of a state in tie-break order: local tools under the call
        cap, then FILLER (the best fresh spare)."""
        acts, qs, oks, keys, lost = self._branches
        _, count = self._call(expand, key, self._req, self._scratch, *self._branches)
        moves: list[tuple[int, Branches]] = []
        for b in range(count):
            action = FILLER if acts[b] < 0 else int(acts[b])
            if not moves or moves[-1][0] != action:
                moves.append((action, []))
            moves[-1][1].append((float(qs[b]), bool(oks[b]), None if lost[b] else (int(keys[b, 0]), int(keys[b, 1]))))
        return moves

    def success_key(self, key: Key, action: int) -> Key | None:
        branches = dict(self.transitions(key))[action]
        return max((b for b in branches if b[1]), key=lambda b: b[0])[2]

    def value(self, key: Key | None) -> float:
        if key is None:
            return 0.0
        try:
            while True:
                status, value = self._call(solve, self._memo, self._frames, key, self._req, self._scratch)
                if status == OK:
                    return value
                self._memo = self._memo.grown()  # NEED_ROOM
        except BaseException:
            self._frames.depth[0] = -1  # the next key starts afresh
            raise

    def states(self) -> int:
        return int(self._memo.held[0])

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
