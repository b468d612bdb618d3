"""The compiled part of ``processes.ProcessSubproblems``: its keys, transitions and DP (docs/core/bounds.md,
"How the process DP stores its states").

A key is a tuple of two int64: shape id, id of the fresh spare bases left and id of the time used; N_h,
consecutive failures, streak tool + 1, streak length, turns used, number of local tools and the id of the
*vector* of the local tools, one byte per tool (``calls * n_states + process state id``) eight to a word in
three words, interned (``Vectors``): far fewer vectors than states. The kernels register the shapes
themselves (``Shapes``: a shape after a success, with a kept spare or with its failed spares reordered is
found from the shape's rows) and otherwise only combine what ``ProcessSubproblems`` tabulates from the
rules written once in Python (``Tables``): the outcomes of a call (``core.processes.call_outcomes`` and
``success_probability``), the termination rule, which failed spare is kept, the fresh spare lists. A kernel
that needs an entry not tabulated yet, or room in a table, stops with a request (``NEED_*``, with the
arguments of NEED_OUTCOMES in the ``req`` array); ``ProcessSubproblems`` fills it and calls again, and the
DP resumes from its explicit stack.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numba
import numpy as np
from numba import types
from numba.typed import Dict, List

MAX_LOCAL = 24  # local tools a key holds (a vector of three words of eight bytes)
MAX_BRANCHES = 1024  # branches of one state
MAX_BASES = 32  # distinct tool bases (a registry of 30 tools and the default base)
OK, NEED_SHAPES, NEED_OUTCOMES, NEED_VECTORS, NEED_ROOM = 0, 1, 2, 3, 4
# ints of Tables: turn limit, max consecutive failures, max same-tool failures, call cap, strict dependencies,
# number of process states, whether there is a time budget, whether every local tool is an action
TURN_LIMIT, MAX_CONSECUTIVE, MAX_SAME, CAP, STRICT, N_STATES, HAS_BUDGET, ALL_ACTIONS = range(8)


class Tables(NamedTuple):
    """What the kernels read (``ProcessSubproblems`` fills it; arrays grow by replacement)."""

    ints: np.ndarray  # the constants above
    budget: float  # time budget (when HAS_BUDGET)
    longest: float  # the longest a call can take
    ends: np.ndarray  # [consecutive, streak] -> 1 when those counters end the episode
    aged: np.ndarray  # process state id -> its id one turn later
    state_rank: np.ndarray  # process state id -> its rank in ``spare_rank``
    base_value: np.ndarray  # base id -> base
    fresh: np.ndarray  # [fresh id, 0..3] -> length, first base id, second base id (-1), id without the first
    fresh_cut: np.ndarray  # [fresh id, n] -> id of its first n bases
    keeps: np.ndarray  # [base id, state after, next fresh base id + 1] -> 1 when a failed spare is kept
    outcome_span: np.ndarray  # [list id, 0..1] -> first row, number of rows
    outcome_q: np.ndarray  # row -> probability
    outcome_ok: np.ndarray  # row -> success
    outcome_duration: np.ndarray  # row -> duration
    outcome_state: np.ndarray  # row -> process state id after


class Lookups(NamedTuple):
    """The typed containers the kernels read (apart from ``Tables``: numba types a tuple of arrays alone
    quickly when called from Python)."""

    outcome_index: Any  # typed dict packed (state, base id, uncalled, failed, N_h) -> outcome list id
    times: Any  # typed list: time id -> time used (the kernels add to it)
    time_ids: Any  # typed dict: time used -> id
    vectors: Vectors
    shapes: Shapes


class Frames(NamedTuple):
    """The explicit stack of ``solve``: one frame per turn, each a key and its branches (``expand``)."""

    depth: np.ndarray  # [0]: index of the top frame (-1: empty)
    key: np.ndarray  # [frame, 2]
    expanded: np.ndarray  # [frame]: whether its branches are listed
    cursor: np.ndarray  # [frame]: first branch whose value is not known yet
    size: np.ndarray  # [frame]: number of branches
    action: np.ndarray  # [frame, branch]
    q: np.ndarray  # [frame, branch] probability
    ok: np.ndarray  # [frame, branch] success
    after: np.ndarray  # [frame, branch, 2] key after
    lost: np.ndarray  # [frame, branch]
    value: np.ndarray  # [frame, branch] value of the key after

    @classmethod
    def empty(cls, n: int) -> Frames:
        """Frames for keys of up to ``n`` turns."""
        b = MAX_BRANCHES
        return cls(np.full(1, -1, np.int64), np.zeros((n, 2), np.int64), np.zeros(n, bool), np.zeros(n, np.int64),
                   np.zeros(n, np.int64), np.zeros((n, b), np.int64), np.zeros((n, b)), np.zeros((n, b), bool),
                   np.zeros((n, b, 2), np.int64), np.zeros((n, b), bool), np.zeros((n, b)))


_ENTRY: dict[Any, Any] = {}


def call(kernel: Any, *args: Any) -> Any:
    """``kernel(*args)``; after its first call, through the compiled entry point of its one signature, which
    skips the dispatcher's typing of every argument (about 1 ms for typed containers and tuples of arrays,
    against some 15 us for the call itself): a DP asking for thousands of table entries makes as many calls.
    The arguments must have the types of the first call (``ProcessSubproblems`` always passes the same)."""
    entry = _ENTRY.get(kernel)
    if entry is not None:
        return entry(*args)
    result = kernel(*args)
    if len(kernel.signatures) == 1:
        _ENTRY[kernel] = kernel.overloads[kernel.signatures[0]].entry_point
    return result


class Memo(NamedTuple):
    """The DP's memo, key -> optimal probability of full success: an open-addressing hash table over arrays
    (24 bytes a slot; a typed dict takes several times that), grown by ``grown`` when ``solve`` asks for room
    (NEED_ROOM: three quarters full). An empty slot has key word 0 = -1 (a key's words are >= 0)."""

    keys: np.ndarray  # [slot, 2]
    values: np.ndarray  # [slot]
    held: np.ndarray  # [0]: keys held

    @classmethod
    def empty(cls, slots: int = 1 << 16) -> Memo:
        """An empty memo of ``slots`` slots."""
        return cls(np.full((slots, 2), -1, np.int64), np.zeros(slots), np.zeros(1, np.int64))

    def grown(self) -> Memo:
        """The same keys and values in half as many slots again (a smaller step than doubling: less memory
        held at the end and while both tables are)."""
        memo = Memo.empty(len(self.values) * 3 // 2)
        _rehash(self.keys, self.values, memo.keys, memo.values)
        memo.held[0] = self.held[0]
        return memo


@numba.njit(cache=True, inline='always')
def _mix(h, word):
    """``h`` with one more word >= 0 hashed in (splitmix64's finaliser)."""
    h = (h ^ np.uint64(word)) * np.uint64(0x9E3779B97F4A7C15)
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@numba.njit(cache=True, inline='always')
def _slot(keys, key):
    """The slot of ``key`` (a tuple of words >= 0) in an open-addressing table's keys (linear probing, any
    number of slots under 2**32): where it is, or the empty slot (word 0 = -1) where it goes."""
    h = np.uint64(0)
    for w in range(len(key)):
        h = _mix(h, key[w])
    n = keys.shape[0]
    i = np.int64(((h >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))  # the high bits scaled to [0, n)
    while keys[i, 0] != -1:
        same = True
        for w in range(len(key)):
            same &= keys[i, w] == key[w]
        if same:
            break
        i += 1
        if i == n:
            i = 0
    return i


@numba.njit(cache=True)
def _rehash(keys, values, new_keys, new_values) -> None:
    """Copies a table into a larger one."""
    for i in range(keys.shape[0]):
        if keys[i, 0] != -1:
            j = _slot(new_keys, (keys[i, 0], keys[i, 1]))
            new_keys[j], new_values[j] = keys[i], values[i]


class Vectors(NamedTuple):
    """The interned vectors of local tools (module docstring): their words by id, and an open-addressing table from
    the words to the id, grown (``grown``) when a kernel asks for room (NEED_VECTORS: three quarters full)."""

    words: np.ndarray  # [id, 3]
    keys: np.ndarray  # [slot, 3]
    ids: np.ndarray  # [slot]
    held: np.ndarray  # [0]: vectors held

    @classmethod
    def empty(cls, slots: int = 1 << 12) -> Vectors:
        return cls(np.zeros((slots, 3), np.int64), np.full((slots, 3), -1, np.int64), np.zeros(slots, np.int64),
                   np.zeros(1, np.int64))

    def grown(self) -> Vectors:
        """The same vectors in twice the slots."""
        vectors = Vectors.empty(2 * len(self.ids))
        n = vectors.held[0] = self.held[0]
        vectors.words[:n] = self.words[:n]
        _reindex(vectors.words, n, vectors.keys, vectors.ids)
        return vectors


@numba.njit(cache=True)
def _reindex(words, n, keys, ids) -> None:
    """Enters vectors 0..n-1 into an empty table."""
    for v in range(n):
        j = _slot(keys, (words[v, 0], words[v, 1], words[v, 2]))
        keys[j], ids[j] = words[v], v


class Shapes(NamedTuple):
    """The shapes (``processes.ProcessSubproblems`` docstring), registered by the kernels: their rows by id, the
    shapes found after each success, and an open-addressing table from a shape to its id. The row after the
    last shape stages the shape being looked up (``_register``). Rows are as wide as the most local tools a
    shape has had so far; ``grown`` doubles the rows, or widens them, when a kernel asks (NEED_SHAPES)."""

    ints: np.ndarray  # [shape, 0..2] -> n required, n local tools, n failed spares
    deps: np.ndarray  # [shape, j] -> bit mask of local tool j's dependencies
    base: np.ndarray  # [shape, j] -> base id of local tool j
    after: np.ndarray  # [shape, i] -> shape once local tool i succeeded (-1: not found yet)
    slots: np.ndarray  # [slot] -> shape id (-1: empty), twice as many as rows
    held: np.ndarray  # [0]: shapes held; [1]: local tools a row must hold (a kernel asking for wider rows)

    @classmethod
    def empty(cls, rows: int = 1 << 10, width: int = 8) -> Shapes:
        return cls(np.zeros((rows, 3), np.int8), np.zeros((rows, width), np.int32), np.zeros((rows, width), np.int8),
                   np.full((rows, width), -1, np.int32), np.full(2 * rows, -1, np.int32), np.zeros(2, np.int64))

    def grown(self) -> Shapes:
        """The same shapes in wider rows when a kernel asked for them, else in twice the rows."""
        rows, width = len(self.ints), self.deps.shape[1]
        wider = self.held[1] > width
        shapes = Shapes.empty(rows if wider else 2 * rows, max(width, int(self.held[1])))
        n = shapes.held[0] = self.held[0]
        for new, old in zip(shapes[:4], self[:4], strict=True):
            new[:n, :old.shape[1]] = old[:n]
        _register_all(shapes)
        return shapes


@numba.njit(cache=True)
def _register(s, new) -> int:
    """The id of shape row ``new`` of ``s`` (``Shapes``): of the same shape registered before, else ``new``
    itself, entered into the table. Only the first n entries of a row's deps and bases count."""
    n = np.int64(s.ints[new, 1])
    h = np.uint64(0)
    for w in range(3):
        h = _mix(h, s.ints[new, w])
    for j in range(n):
        h = _mix(h, s.deps[new, j] + (np.int64(s.base[new, j]) << 32))
    mask = len(s.slots) - 1
    i = np.int64(h & np.uint64(mask))
    while s.slots[i] != -1:
        sid = s.slots[i]
        same = True
        for w in range(3):
            same &= s.ints[sid, w] == s.ints[new, w]
        for j in range(n):
            same &= s.deps[sid, j] == s.deps[new, j] and s.base[sid, j] == s.base[new, j]
        if same:
            return sid
        i = (i + 1) & mask
    s.slots[i] = new
    return new


@numba.njit(cache=True)
def _register_all(s) -> None:
    """Enters the shapes held into an empty table."""
    for sid in range(s.held[0]):
        _register(s, sid)


@numba.njit(cache=True, inline='always')
def _staged(s) -> int:
    """The id of the shape staged in row ``held`` of ``s``, registered if new; -1 when there is no row left
    to stage the next one (NEED_SHAPES: the staged shape is staged again once ``s`` has grown)."""
    new = s.held[0]
    if new + 1 >= len(s.ints):
        return -1
    sid = _register(s, new)
    if sid == new:
        s.held[0] = new + 1
    return sid


@numba.njit(cache=True, inline='always')
def _copy_shape(s, sid, n) -> int:
    """Stages a copy of shape ``sid`` with ``n`` local tools (its first ones); returns the staging row, -1
    when rows of ``n`` tools are wider than ``s`` holds (NEED_SHAPES: wider rows)."""
    if n > s.deps.shape[1]:
        if n > MAX_LOCAL:
            raise ValueError("bound (iii): more local tools than the DP's key holds")
        s.held[1] = n
        return -1
    new = s.held[0]
    s.ints[new, 0], s.ints[new, 1], s.ints[new, 2] = s.ints[sid, 0], n, s.ints[sid, 2]
    for j in range(min(n, s.ints[sid, 1])):
        s.deps[new, j], s.base[new, j] = s.deps[sid, j], s.base[sid, j]
    return new


@numba.njit(cache=True, inline='always')
def _shape_after(s, sid, i) -> int:
    """The shape once local tool i of ``sid`` has succeeded: the tool leaves, the later ones move down one
    index (-1: NEED_SHAPES)."""
    found = int(s.after[sid, i])
    if found < 0:
        n_required, n, n_spares = s.ints[sid, 0], s.ints[sid, 1], s.ints[sid, 2]
        new = _copy_shape(s, sid, n - 1)
        s.ints[new, 0] = n_required - (i < n_required)
        s.ints[new, 2] = n_spares - (i >= n - n_spares)
        low = (1 << i) - 1
        for j in range(i + 1, n):
            s.base[new, j - 1] = s.base[sid, j]
        for j in range(n):
            if j != i:
                deps = s.deps[sid, j]
                s.deps[new, j - (j > i)] = (deps & low) | ((deps >> (i + 1)) << i)
        found = s.after[sid, i] = _staged(s)
    return found


@numba.njit(cache=True, inline='always')
def _shape_with_spare(s, sid, bid) -> int:
    """The shape ``sid`` with one more failed spare of base id ``bid`` at the end (-1: NEED_SHAPES)."""
    n = np.int64(s.ints[sid, 1])
    new = _copy_shape(s, sid, n + 1)
    if new < 0:
        return -1
    s.ints[new, 2] += 1
    s.deps[new, n], s.base[new, n] = 0, bid
    return _staged(s)


@numba.njit(cache=True)
def new_shape(t, u, n_required, deps, bases, n_spares):
    """(status, id) of a shape given by its local tools' dependency masks and base ids."""
    s, n = u.shapes, len(deps)
    if n > s.deps.shape[1]:
        s.held[1] = n
        return NEED_SHAPES, 0
    new = s.held[0]
    s.ints[new, 0], s.ints[new, 1], s.ints[new, 2] = n_required, n, n_spares
    for j in range(n):
        s.deps[new, j], s.base[new, j] = deps[j], bases[j]
    sid = _staged(s)
    return (NEED_SHAPES, 0) if sid < 0 else (OK, sid)


@numba.njit(cache=True)
def shape_after(t, u, sid, i):
    """(status, id) of ``_shape_after``."""
    found = _shape_after(u.shapes, sid, i)
    return (NEED_SHAPES, 0) if found < 0 else (OK, found)


def outcome_code(state: Any, base: Any, uncalled: Any, failed: Any, n_h: Any) -> Any:
    """The key of an outcome list in ``Tables.outcome_index``."""
    return state + 64 * (base + 64 * (uncalled + 64 * (failed + 64 * n_h)))


_outcome_code = numba.njit(cache=True)(outcome_code)


@numba.njit(cache=True, inline='always')
def shape_of(key) -> int:
    """The shape id of a key."""
    return key[0] & 0x7FFFFFFF


@numba.njit(cache=True, inline='always')
def _unpack(t, u, key, codes, states):
    """(shape, fresh id, time id, N_h, consecutive, streak tool, streak, turns, n) of a key; fills the
    call counts and process state ids of its local tools."""
    w0, w1, ns = key[0], key[1], t.ints[N_STATES]
    n, vector = (w1 >> 30) & 63, u.vectors.words[w1 >> 36]
    for j in range(n):
        b = (vector[j // 8] >> (8 * (j % 8))) & 255
        codes[j] = b // ns
        states[j] = b % ns
    return (w0 & 0x7FFFFFFF, (w0 >> 31) & 0xFFFF, w0 >> 47, w1 & 63, (w1 >> 6) & 63, ((w1 >> 12) & 63) - 1,
            (w1 >> 18) & 63, (w1 >> 24) & 63, n)


@numba.njit(cache=True, inline='always')
def _ranks_before(t, bid_a, code_a, state_a, last_a, bid_b, code_b, state_b, last_b) -> bool:
    """Whether spare a comes strictly before spare b in ``spare_rank`` order (base, calls, state, last)."""
    base_a, base_b = t.base_value[bid_a], t.base_value[bid_b]
    if base_a != base_b:
        return base_a < base_b
    if code_a != code_b:
        return code_a < code_b
    rank_a, rank_b = t.state_rank[state_a], t.state_rank[state_b]
    if rank_a != rank_b:
        return rank_a < rank_b
    return last_a < last_b


@numba.njit(cache=True, inline='always')
def _body(t, u, sid, codes, states, n, n_h, consecutive, last, streak, turns, fid, req, scratch):
    """The canonical key of a state but its time id into ``scratch[5]`` (``ProcessSubproblems`` docstring);
    codes and states are changed in place. Returns OK, -1 when the state is lost, or a NEED_ request."""
    ints, out, shapes = t.ints, scratch[5], u.shapes
    n_required, n_spares = np.int64(shapes.ints[sid, 0]), np.int64(shapes.ints[sid, 2])
    spare = ints[TURN_LIMIT] - turns - n_required
    if spare < 0 or t.ends[consecutive, streak]:
        return -1
    if consecutive + spare < ints[MAX_CONSECUTIVE]:
        consecutive = 0
    if last < 0 or streak + spare < ints[MAX_SAME]:
        last, streak = -1, 0
    low = ints[CAP] - spare - 1
    if low >= 2:
        for j in range(n):
            if 0 < codes[j] <= low:
                codes[j] = 1
    if n_spares > 1:
        first = n - n_spares
        order = scratch[6]
        for a in range(n_spares):
            order[a] = a
        for a in range(1, n_spares):  # insertion sort: stable, as ``sorted``
            j, b = a, order[a]
            while j > 0:
                c = order[j - 1]
                if not _ranks_before(t, shapes.base[sid, first + b], codes[first + b], states[first + b],
                                     b == last - first, shapes.base[sid, first + c], codes[first + c],
                                     states[first + c], c == last - first):
                    break
                order[j] = c
                j -= 1
            order[j] = b
        moved = False
        for a in range(n_spares):
            moved |= order[a] != a
        if moved:
            new = _copy_shape(shapes, sid, n)
            for a in range(n_spares):
                shapes.base[new, first + a] = shapes.base[sid, first + order[a]]
            sid = _staged(shapes)
            if sid < 0:
                return NEED_SHAPES
            spare_codes, spare_states = scratch[7], scratch[8]
            _copy_tools(codes[first:], states[first:], -1, n_spares, spare_codes, spare_states)
            new_last = last
            for a in range(n_spares):
                codes[first + a], states[first + a] = spare_codes[order[a]], spare_states[order[a]]
                if last == first + order[a]:
                    new_last = first + a
            last = new_last
    ns = ints[N_STATES]
    words = scratch[9]
    words[0], words[1], words[2] = 0, 0, 0
    for j in range(n):
        words[j // 8] += (codes[j] * ns + states[j]) << (8 * (j % 8))
    vectors = u.vectors
    slot = _slot(vectors.keys, (words[0], words[1], words[2]))
    if vectors.keys[slot, 0] != -1:
        vid = vectors.ids[slot]
    else:
        vid = vectors.held[0]
        if 4 * vid >= 3 * len(vectors.ids):
            return NEED_VECTORS
        vectors.keys[slot], vectors.words[vid], vectors.ids[slot] = words[:3], words[:3], vid
        vectors.held[0] = vid + 1
    out[0] = sid + (t.fresh_cut[fid, spare] << 31)
    out[1] = n_h + (consecutive << 6) + ((last + 1) << 12) + (streak << 18) + (turns << 24) + (n << 30) + (vid << 36)
    return OK


@numba.njit(cache=True, inline='always')
def _copy_tools(codes, states, skip, n, out_codes, out_states) -> None:
    """Copies the first ``n`` call counts and process states but index ``skip`` (-1: none), element by element
    (a slice counts references: an atomic operation each, the kernels' largest cost when they were made)."""
    k = 0
    for j in range(n):
        if j != skip:
            out_codes[k], out_states[k] = codes[j], states[j]
            k += 1


@numba.njit(cache=True, inline='always')
def _time_id(t, u, n_required, turns, time) -> int:
    """The time id of a key at time used ``time``, -1 when it is lost: 0 while every call left fits in the
    budget (the time used no longer matters); lost once the budget is used up before the last required tool
    succeeded."""
    if not t.ints[HAS_BUDGET] or time + t.longest * (t.ints[TURN_LIMIT] - turns - 1) < t.budget:
        return 0
    if n_required and time >= t.budget:
        return -1
    if time in u.time_ids:
        return u.time_ids[time]
    tid = len(u.times)
    u.time_ids[time] = tid
    u.times.append(time)
    return tid


@numba.njit(cache=True, inline='always')
def _emit(t, status, out, tid, action, q, ok, acts, qs, oks, keys, lost, count):
    """Writes one branch (its key from ``out`` and ``tid``, lost unless both are found)."""
    acts[count], qs[count], oks[count] = action, q, ok
    lost[count] = status != OK or tid < 0
    if not lost[count]:
        keys[count, 0], keys[count, 1] = out[0] + (tid << 47), out[1]


@numba.njit(cache=True)
def expand(t, u, key, req, scratch, acts, qs, oks, keys, lost):
    """(status, number of branches) of a state: every action's branches (action, probability, success, key
    after, lost) in tie-break order, the actions as ``ProcessSubproblems.transitions`` lists them."""
    codes, states, later, work_codes, work_states = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4]
    out = scratch[5]
    sid, fid, tid, n_h, consecutive, last, streak, turns, n = _unpack(t, u, key, codes, states)
    time, shapes = u.times[tid], u.shapes
    n_required = np.int64(shapes.ints[sid, 0])
    for j in range(n):
        later[j] = t.aged[states[j]]
    turns += 1
    strict, cap, all_actions, count = t.ints[STRICT], t.ints[CAP], t.ints[ALL_ACTIONS], 0
    for i in range(n):  # the tool actions: the next required tool, then the tools after the required ones
        if codes[i] >= cap or not all_actions and 0 < i < n_required:
            continue
        deps, n_deps, n_failed = np.int64(shapes.deps[sid, i]), 0, 0
        for d in range(n):
            if (deps >> d) & 1:
                n_deps += 1
                n_failed += codes[d] != 0
        n_uncalled = n_deps - n_failed
        same = streak + 1 if last == i else 1
        if strict and (n_uncalled or n_failed):  # dependency error: no draw, no process stage
            _copy_tools(codes, later, -1, n, work_codes, work_states)
            work_codes[i] += 1
            status = _body(t, u, sid, work_codes, work_states, n, n_h + 1, consecutive + 1, i, same, turns, fid,
                           req, scratch)
            if status > 0:
                return status, 0
            _emit(t, status, out, _time_id(t, u, n_required, turns, time) if status == OK else -1, i, 1.0, False,
                  acts, qs, oks, keys, lost, count)
            count += 1
            continue
        bid = np.int64(shapes.base[sid, i])
        code = _outcome_code(states[i], bid, n_uncalled, n_failed, n_h)
        if code in u.outcome_index:
            index = u.outcome_index[code]
        else:
            req[0], req[1], req[2], req[3], req[4] = states[i], bid, n_uncalled, n_failed, n_h
            return NEED_OUTCOMES, 0
        start, rows = t.outcome_span[index, 0], t.outcome_span[index, 1]
        for r in range(start, start + rows):
            q, ok = t.outcome_q[r], t.outcome_ok[r]
            if count >= MAX_BRANCHES:
                raise ValueError("bound (iii): more branches in one state than the compiled DP holds")
            if ok and 0 < i < n_required:  # a later required tool succeeding first breaks the sequence
                _emit(t, -1, out, -1, i, q, True, acts, qs, oks, keys, lost, count)
                count += 1
                continue
            if not ok:
                _copy_tools(codes, later, -1, n, work_codes, work_states)
                work_codes[i] += 1
                work_states[i] = t.outcome_state[r]
                status = _body(t, u, sid, work_codes, work_states, n, n_h + 1, consecutive + 1, i, same, turns, fid,
                               req, scratch)
            else:
                new_sid = _shape_after(shapes, sid, i)
                if new_sid < 0:
                    return NEED_SHAPES, 0
                _copy_tools(codes, later, i, n, work_codes, work_states)
                status = _body(t, u, new_sid, work_codes, work_states, n - 1, n_h, 0, -1, 0, turns, fid, req, scratch)
            if status > 0:
                return status, 0
            tid_after = -1 if status != OK else _time_id(
                t, u, n_required - (ok and i < n_required), turns, time + t.outcome_duration[r])
            _emit(t, status, out, tid_after, i, q, ok, acts, qs, oks, keys, lost, count)
            count += 1
    if t.fresh[fid, 0] > 0:  # FILLER: the best fresh spare
        bid, second, rest = t.fresh[fid, 1], t.fresh[fid, 2], t.fresh[fid, 3]
        code = _outcome_code(0, bid, 0, 0, n_h)
        if code in u.outcome_index:
            index = u.outcome_index[code]
        else:
            req[0], req[1], req[2], req[3], req[4] = 0, bid, 0, 0, n_h
            return NEED_OUTCOMES, 0
        start, rows = t.outcome_span[index, 0], t.outcome_span[index, 1]
        for r in range(start, start + rows):
            q, ok, state = t.outcome_q[r], t.outcome_ok[r], t.outcome_state[r]
            if count >= MAX_BRANCHES:
                raise ValueError("bound (iii): more branches in one state than the compiled DP holds")
            _copy_tools(codes, later, -1, n, work_codes, work_states)
            if ok:
                status = _body(t, u, sid, work_codes, work_states, n, n_h, 0, -1, 0, turns, rest, req, scratch)
            elif t.keeps[bid, state, second + 1]:
                spare_sid = _shape_with_spare(shapes, sid, bid)
                if spare_sid < 0:
                    return NEED_SHAPES, 0
                work_codes[n], work_states[n] = 1, state
                status = _body(t, u, spare_sid, work_codes, work_states, n + 1, n_h + 1, consecutive + 1, n, 1, turns,
                               rest, req, scratch)
            else:
                status = _body(t, u, sid, work_codes, work_states, n, n_h + 1, consecutive + 1, -1, 1, turns, rest,
                               req, scratch)
            if status > 0:
                return status, 0
            tid_after = -1 if status != OK else _time_id(t, u, n_required, turns, time + t.outcome_duration[r])
            _emit(t, status, out, tid_after, -1, q, ok, acts, qs, oks, keys, lost, count)
            count += 1
    return OK, count


@numba.njit(cache=True)
def make_key(t, u, sid, codes, states, n, n_h, consecutive, last, streak, turns, time, fid, req, scratch):
    """(status, key) of a state given with its counters as they are (status -1: lost)."""
    status = _body(t, u, sid, codes, states, n, n_h, consecutive, last, streak, turns, fid, req, scratch)
    tid = -1
    if status == OK:
        tid = _time_id(t, u, np.int64(u.shapes.ints[sid, 0]), turns, time)
        if tid < 0:
            status = -1
    out = scratch[5]
    key = (out[0] + (max(tid, 0) << 47), out[1])
    return status, key


@numba.njit(cache=True)
def solve(t, u, memo, frames, key, req, scratch):
    """(status, optimal probability of full success) of ``key`` into ``memo``, depth first with an explicit
    stack of frames, one per turn (``Frames``): a key is solved once every key after it is; ties go to the
    first action, as ``Subproblems._best``; each action's branches are summed in order from 0.0, as ``sum``
    does. On a NEED_ request the frames are kept: call again, with the same key, once it is filled."""
    depth, memo_keys, memo_values = frames.depth, memo.keys, memo.values
    if depth[0] < 0:
        slot = _slot(memo_keys, key)
        if memo_keys[slot, 0] != -1:
            return OK, memo_values[slot]
        depth[0] = 0
        frames.key[0, :] = key
        frames.expanded[0] = False
    while depth[0] >= 0:
        if 4 * memo.held[0] >= 3 * len(memo_values):
            return NEED_ROOM, 0.0
        d = depth[0]
        row = frames.key[d]
        here = (row[0], row[1])
        if not frames.expanded[d]:
            if u.shapes.ints[shape_of(here), 0] == 0:
                best = 1.0
                count = 0
            else:
                status, count = expand(t, u, here, req, scratch, frames.action[d], frames.q[d], frames.ok[d],
                                       frames.after[d], frames.lost[d])
                if status != OK:
                    return status, 0.0
            frames.expanded[d], frames.cursor[d], frames.size[d] = True, 0, count
        b, count, values, lost, after = frames.cursor[d], frames.size[d], frames.value[d], frames.lost[d], frames.after[d]
        descend = False
        while b < count:
            if not lost[b]:
                slot = _slot(memo_keys, (after[b, 0], after[b, 1]))
                if memo_keys[slot, 0] == -1:
                    descend = True
                    break
                values[b] = memo_values[slot]
            b += 1
        frames.cursor[d] = b
        if descend:
            frames.key[d + 1, :] = after[b]
            frames.expanded[d + 1] = False
            depth[0] = d + 1
            continue
        best = 1.0 if u.shapes.ints[shape_of(here), 0] == 0 else 0.0
        b, actions, q = 0, frames.action[d], frames.q[d]
        while b < count:
            action, value = actions[b], 0.0
            while b < count and actions[b] == action:
                if not lost[b]:
                    value += q[b] * values[b]
                b += 1
            if value > best + 1e-12:
                best = value
        slot = _slot(memo_keys, here)
        memo_keys[slot, 0], memo_keys[slot, 1], memo_values[slot] = here[0], here[1], best
        memo.held[0] += 1
        depth[0] = d - 1
    return OK, memo_values[_slot(memo_keys, key)]


@numba.njit(cache=True)
def new_lookups():
    """Empty ``Lookups``, made compiled (cached) rather than
    from Python, whose typed containers compile their methods in every process."""
    outcome_index = Dict.empty(key_type=types.int64, value_type=types.int64)
    times = List.empty_list(types.float64)
    times.append(0.0)
    time_ids = Dict.empty(key_type=types.float64, value_type=types.int64)
    time_ids[0.0] = 0
    return outcome_index, times, time_ids


@numba.njit(cache=True)
def put(table, key, value) -> None:
    """table[key] = value, compiled (see ``new_lookups``)."""
    table[key] = value


