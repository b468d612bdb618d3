"""Bound (iii) of a world without failure processes, by DP, and bound (ii) on the same states
(docs/core/bounds.md).

* bound (iii): the best full-success probability of any policy that knows the failure model, by dynamic
  programming over the episode state that matters: the required tools not yet succeeded, per relevant
  tool not yet succeeded its call count, N_h, consecutive failures, the failing-tool streak and turns
  used. Relevant tools are the required tools and their transitive dependencies; any other tool only
  matters as a "filler" call (it can reset the consecutive-failure count), and the fillers are
  interchangeable: every fresh dependency-free irrelevant tool has the same success probability.
* bound (ii): whether some action sequence reaches full success when every call's random draw is known
  in advance (search over the seeded stream of ``Episode``).

Both follow the episode rules of ``resilibench.core.simulator`` (turn limit, call cap, failure
terminations, strict dependencies) with a free completion signal, so they bound the planner env and the
text env alike. The training dynamics profile has no bound.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache
from typing import cast

import numpy as np

from ..config import EpisodeRules, FailureModel
from ..simulator import Episode, success_probability
from .base import FILLER, ExactBound, Key, State, Subproblems

# (shape id, call count per local tool, N_h, consecutive failures, local index of the tool of the current
# failure streak (-1: none), streak length, turns used)
PlainKey = tuple[int, tuple[int, ...], int, int, int, int, int]


class PlainSubproblems(Subproblems):
    """The DP of bound (iii) without failure processes (``base.Subproblems``). A shape is (number of required
    tools left, dependencies per local tool); after the required tools come the helpers (non-required
    prerequisites) that have not succeeded, in tie-break order.

    ``all_actions=False`` (bound (iii)): the actions are the next required tool, the helpers and a filler;
    a helper that no required tool still needs, directly or through other helpers, leaves the shape.
    ``all_actions=True`` (bound (ii), and the reference the pruned set is tested against): every tool of
    the problem that has not succeeded stays an action, as in a DP over the full episode state.
    """

    def __init__(self, max_calls: int, rules: EpisodeRules, failure: FailureModel, all_actions: bool):
        super().__init__(max_calls, rules, failure, all_actions)
        self._p: dict[tuple[int, int, int], float] = {}
        self._ids: dict[tuple, int] = {}
        self.shapes: list[tuple] = []  # id -> (n_required, deps)
        self._actions: list[tuple[int, ...]] = []  # id -> tool actions in tie-break order (FILLER comes last)
        self._after: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}  # (id, i) -> (id', kept indices)
        self._callable: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, int, int], ...]] = {}

    def _register(self, canonical: tuple) -> int:
        """The id of a canonical shape (n_required, deps), registered with its tool actions if new."""
        sid = self._ids.get(canonical)
        if sid is None:
            sid = self._ids[canonical] = len(self.shapes)
            self.shapes.append(canonical)
            n_required, n = canonical[0], len(canonical[1])
            if self.all_actions:
                self._actions.append(tuple(range(n)))
            else:  # the next required tool, then the tools after the required ones
                self._actions.append(((0,) if n_required else ()) + tuple(range(n_required, n)))
        return sid

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
        return self._register(canonical), tuple(keep)

    def after_success(self, sid: int, i: int) -> tuple[int, tuple[int, ...]]:
        entry = self._after.get((sid, i))
        if entry is None:
            n_required, deps = self.shapes[sid]
            rest = [j for j in range(len(deps)) if j != i]
            position = {j: new for new, j in enumerate(rest)}
            new_sid, keep = self.shape(n_required - (i < n_required),
                                       [tuple(position[d] for d in deps[j] if d != i) for j in rest])
            entry = self._after[(sid, i)] = (new_sid, tuple(rest[j] for j in keep))
        return entry

    def required_left(self, sid: int) -> int:
        return self.shapes[sid][0]

    def _callable_tools(self, sid: int, codes: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
        """(local index, uncalled dependencies, failed dependencies) of each tool action of shape ``sid``
        under the call cap, in tie-break order; kept per (shape, call counts), which bound (ii)'s search
        meets again on every stream."""
        tools = self._callable.get((sid, codes))
        if tools is None:
            deps, cap, found = self.shapes[sid][1], self.max_calls, []
            for i in self._actions[sid]:
                if codes[i] < cap:
                    failed = sum(1 for d in deps[i] if codes[d])
                    found.append((i, len(deps[i]) - failed, failed))
            tools = self._callable[(sid, codes)] = tuple(found)
        return tools

    def probability(self, n_uncalled: int, n_failed: int, n_h: int) -> float:
        p = self._p.get((n_uncalled, n_failed, n_h))
        if p is None:
            fm = self.failure
            p = self._p[(n_uncalled, n_failed, n_h)] = success_probability(
                fm.base_success, n_uncalled, n_failed, n_h, fm)
        return p

    def key(self, sid: int, codes: tuple[int, ...], n_h: int, consecutive: int, last: int, streak: int,
            turns: int) -> PlainKey | None:
        """The canonical key of a state, None when it is lost (``Subproblems._canonical_counters``)."""
        spare = self.rules.turn_limit - turns - self.shapes[sid][0]
        counters = self._canonical_counters(spare, codes, consecutive, last, streak)
        if counters is None:
            return None
        codes, consecutive, last, streak = counters
        return sid, codes, n_h, consecutive, last, streak, turns

    def transitions(self, key: Key) -> list[tuple[int, float, PlainKey | None, PlainKey | None]]:
        """(action, success probability, key after success, key after failure) of every action of a state
        in tie-break order: tools under the call cap (local indices), then FILLER."""
        sid, codes, n_h, consecutive, last, streak, turns = cast(PlainKey, key)
        n_required = self.shapes[sid][0]
        strict, make = self.rules.strict_dependencies, self.key
        moves = []
        for i, n_uncalled, n_failed in self._callable_tools(sid, codes):
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

    def success_key(self, key: Key, action: int) -> Key | None:
        return next(move[2] for move in self.transitions(key) if move[0] == action)

    def action_values(self, key: Key) -> Iterator[tuple[int, float]]:
        value = self.value
        for i, p, success, failure in self.transitions(key):
            yield i, (p * value(success) if p > 0.0 else 0.0) + ((1.0 - p) * value(failure) if p < 1.0 else 0.0)


@cache
def plain_subproblems(max_calls: int, rules: EpisodeRules, failure: FailureModel, all_actions: bool = False
                      ) -> PlainSubproblems:
    """The shared ``PlainSubproblems`` of a call cap, rules and failure model."""
    return PlainSubproblems(max_calls, rules, failure, all_actions)


class PlainBound(ExactBound[PlainSubproblems]):
    """Bound (iii) of one problem without failure processes (``base.ExactBound``), and its bound (ii)."""

    def _subproblems(self, all_actions: bool) -> PlainSubproblems:
        return plain_subproblems(self.problem.max_calls, self.rules, self.failure, all_actions)

    def _state(self, dp: PlainSubproblems, k: int, calls: Sequence[int], succeeded: Sequence[bool], n_h: int,
               consecutive: int, last: int, streak: int, turns: int) -> State:
        """The state on ``dp`` after ``k`` required tools, with per-tool ``calls`` and ``succeeded`` (global
        ids)."""
        local, deps = self._remaining(k, succeeded)
        sid, keep = dp.shape(self.m - k, deps)
        tools = tuple(local[j] for j in keep)
        last = tools.index(last) if streak > 0 and last in tools else -1
        return State(dp.key(sid, tuple(calls[t] for t in tools), n_h, consecutive, last, streak, turns), tools)

    def _start(self, dp: PlainSubproblems) -> State:
        """The state on ``dp`` before any call."""
        zeros = [0] * len(self.registry)
        return self._state(dp, 0, zeros, [False] * len(zeros), 0, 0, -1, 0, 0)

    def initial_state(self) -> State:
        return self._start(self.dp)

    def _episode_state(self, episode: Episode) -> State:
        return self._state(self.dp, episode.next_required, episode.calls, episode.succeeded, episode.n_failures,
                           episode.consecutive_failures, episode.last_tool, episode.same_tool_streak,
                           episode.turns_used)

    def clairvoyant(self, stream: np.ndarray) -> bool:
        """Bound (ii) for one random stream: can any action sequence (every tool of the problem, later
        required ones included, and fillers) reach full success?"""
        dp = plain_subproblems(self.problem.max_calls, self.rules, self.failure, all_actions=True)
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

        return search(self._start(dp).key, 0)
