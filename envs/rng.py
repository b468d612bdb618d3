"""Bit-exact re-implementations of the numpy random calls the envs make, for speed.

The envs draw their randomness with numpy: ``np.random.default_rng(seed)`` (a ``SeedSequence`` feeding a
``PCG64``), ``Generator.integers`` and ``Generator.random``. Building a ``SeedSequence`` costs tens of
microseconds, which dominates a planner-env reset, and a batched env cannot call one Generator per
sub-env without a Python loop. This module computes exactly the same numbers:

* scalar (Python ints): ``seed_state`` (the PCG64 state of ``default_rng(seed)``) and
  ``scratch_default_rng`` (a Generator in that state, built without a SeedSequence; ``Episode.start``);
* batched (numpy ``uint64`` arrays, 128-bit values as (hi, lo) pairs): ``seed_states``, ``advance``,
  ``states_ahead``, ``output``, ``to_double``, ``bounded_uint32``, ``bounded_uint64`` over many
  generators at once (``ResiliBenchVectorEnv``).

numpy guarantees the bit streams of ``SeedSequence`` and ``PCG64``; the ``Generator`` methods used here
(Lemire's bounded integers, 53-bit doubles) have been stable for years but carry no formal guarantee, so
``self_check`` compares this module with numpy (once, on first use), and every user falls back to numpy
when it fails (``checked()``). The tests compare it with numpy over many seeds and generator states.
"""

from __future__ import annotations

import threading
from functools import cache

import numpy as np

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1
M128 = (1 << 128) - 1

# SeedSequence hashing (numpy/random/bit_generator.pyx), pool size 4.
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4

# PCG64 (XSL-RR 128/64) multiplier.
PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645

DOUBLE_SCALE = 1.0 / 9007199254740992.0  # 2**-53


def _hash_constants(init: int, mult: int, n: int) -> tuple[int, ...]:
    out, h = [], init
    for _ in range(n + 1):
        out.append(h)
        h = (h * mult) & M32
    return tuple(out)


# hashmix number k XORs with _HA[k] and multiplies by _HA[k + 1]; 4 (pool) + 12 (mixing) hashmixes.
_HA = _hash_constants(_INIT_A, _MULT_A, _POOL + _POOL * (_POOL - 1))
_HB = _hash_constants(_INIT_B, _MULT_B, 2 * _POOL)
_MIX_ORDER = tuple((s, d) for s in range(_POOL) for d in range(_POOL) if s != d)


def _hashmix(value: int, k: int) -> int:
    value = ((value ^ _HA[k]) * _HA[k + 1]) & M32
    return value ^ (value >> 16)


_ZERO_POOL = tuple(_hashmix(0, k) for k in range(_POOL))  # pool words of zero entropy words


def _pcg_init(words: list[int]) -> tuple[int, int]:
    """PCG64 (state, inc) from the eight 32-bit words of ``generate_state(4, uint64)``."""
    w = [words[2 * i] | (words[2 * i + 1] << 32) for i in range(4)]
    initstate = (w[0] << 64) | w[1]
    inc = ((((w[2] << 64) | w[3]) << 1) | 1) & M128
    return ((inc + initstate) * PCG_MULT + inc) & M128, inc


def seed_state(seed: int) -> tuple[int, int]:
    """(state, inc) of the PCG64 inside ``np.random.default_rng(seed)``, for ``0 <= seed < 2**128``:
    SeedSequence with pool size 4, then PCG64's seeding."""
    if not 0 <= seed <= M128:
        raise ValueError(f"seed must be in [0, 2**128), got {seed}")
    pool = [_hashmix((seed >> (32 * i)) & M32, i) for i in range(_POOL)]
    for k, (s, d) in enumerate(_MIX_ORDER, start=_POOL):
        mixed = (_MIX_L * pool[d] - _MIX_R * _hashmix(pool[s], k)) & M32
        pool[d] = mixed ^ (mixed >> 16)
    words = []
    for i in range(2 * _POOL):
        value = ((pool[i % _POOL] ^ _HB[i]) * _HB[i + 1]) & M32
        words.append(value ^ (value >> 16))
    return _pcg_init(words)




_local = threading.local()


def _scratch_generator() -> np.random.Generator:
    """A per-thread Generator whose state is overwritten before every use."""
    gen = getattr(_local, "generator", None)
    if gen is None:
        gen = _local.generator = np.random.Generator(np.random.PCG64(0))
    return gen


def generator_from_state(state: int, inc: int, has_uint32: int = 0, uinteger: int = 0,
                         generator: np.random.Generator | None = None) -> np.random.Generator:
    """A numpy Generator (new, or ``generator`` overwritten) in the given PCG64 state."""
    gen = generator if generator is not None else np.random.Generator(np.random.PCG64(0))
    gen.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int(state), "inc": int(inc)},
        "has_uint32": int(has_uint32),
        "uinteger": int(uinteger),
    }
    return gen


def generator_state(gen: np.random.Generator) -> tuple[int, int, int, int]:
    """(state, inc, has_uint32, uinteger) of a PCG64-backed Generator."""
    st = gen.bit_generator.state
    if st["bit_generator"] != "PCG64":
        raise ValueError(f"expected a PCG64 generator, got {st['bit_generator']}")
    return st["state"]["state"], st["state"]["inc"], st["has_uint32"], st["uinteger"]


def scratch_default_rng(seed) -> np.random.Generator:
    """A Generator in exactly the state of ``np.random.default_rng(seed)``, built without a SeedSequence for
    int seeds in [0, 2**128). It is a per-thread scratch object, valid until the next call in the same
    thread: use it at once (``Episode.start`` draws the whole stream from it immediately)."""
    if isinstance(seed, int) and 0 <= seed <= M128 and checked():
        state, inc = seed_state(seed)
        return generator_from_state(state, inc, generator=_scratch_generator())
    return np.random.default_rng(seed)


# --- batched: many PCG64 generators as numpy uint64 arrays ---------------------------------------------


def _u64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64)


_U32_16 = np.uint32(16)
_S11, _S32, _S58, _S63, _M32_64 = (np.uint64(k) for k in (11, 32, 58, 63, M32))
_ONE64, _SIXTY_FOUR = np.uint64(1), np.uint64(64)


def _mix32(value: np.ndarray, xor: int, mult: int, tmp: np.ndarray) -> np.ndarray:
    """In place: value = hash((value ^ xor) * mult), the SeedSequence hashmix step on uint32 arrays."""
    value ^= np.uint32(xor)
    value *= np.uint32(mult)
    np.right_shift(value, _U32_16, out=tmp)
    value ^= tmp
    return value


def seed_states(seeds) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``seed_state`` for an array of seeds in [0, 2**64): (state_hi, state_lo, inc_hi, inc_lo)."""
    seeds = _u64(seeds)
    shape = seeds.shape
    tmp = np.empty(shape, dtype=np.uint32)
    pool = [_mix32((seeds & _M32_64).astype(np.uint32), _HA[0], _HA[1], tmp),
            _mix32((seeds >> _S32).astype(np.uint32), _HA[1], _HA[2], tmp)]
    pool += [np.full(shape, _ZERO_POOL[i], dtype=np.uint32) for i in range(2, _POOL)]
    value = np.empty(shape, dtype=np.uint32)
    for k, (s, d) in enumerate(_MIX_ORDER, start=_POOL):
        np.copyto(value, pool[s])
        _mix32(value, _HA[k], _HA[k + 1], tmp)
        target = pool[d]  # target = mix(target, value) = hash(MIX_L * target - MIX_R * value)
        target *= np.uint32(_MIX_L)
        value *= np.uint32(_MIX_R)
        target -= value
        np.right_shift(target, _U32_16, out=tmp)
        target ^= tmp
    words = [_mix32(pool[i % _POOL].copy(), _HB[i], _HB[i + 1], tmp).astype(np.uint64) for i in range(2 * _POOL)]
    w = []
    for i in range(4):
        words[2 * i + 1] <<= _S32
        words[2 * i + 1] |= words[2 * i]
        w.append(words[2 * i + 1])
    inc_hi = w[2] << _ONE64
    inc_hi |= w[3] >> _S63
    inc_lo = w[3] << _ONE64
    inc_lo |= _ONE64
    s_hi, s_lo = add128(inc_hi, inc_lo, w[0], w[1])
    s_hi, s_lo = mul128(s_hi, s_lo, PCG_MULT)
    s_hi, s_lo = add128(s_hi, s_lo, inc_hi, inc_lo)
    return s_hi, s_lo, inc_hi, inc_lo


def add128(a_hi, a_lo, b_hi, b_lo) -> tuple[np.ndarray, np.ndarray]:
    """(a + b) mod 2**128 on (hi, lo) uint64 arrays."""
    lo = a_lo + b_lo
    hi = a_hi + b_hi
    hi += lo < a_lo  # carry
    return hi, lo


def mul64(a, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Full 128-bit product of uint64 array ``a`` and a 64-bit constant ``b``, as (hi, lo)."""
    b0, b1 = np.uint64(b & M32), np.uint64(b >> 32)
    a0 = a & _M32_64
    a1 = a >> _S32
    lo = a0 * b0  # p00
    a0 *= b1  # p01
    hi = a1 * b1  # p11
    a1 *= b0  # p10
    mid = lo >> _S32
    lo &= _M32_64
    hi += a0 >> _S32
    hi += a1 >> _S32
    a0 &= _M32_64
    a1 &= _M32_64
    mid += a0
    mid += a1
    hi += mid >> _S32
    mid <<= _S32
    lo |= mid
    return hi, lo


def mul128(a_hi, a_lo, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(a * b) mod 2**128 for (hi, lo) uint64 arrays ``a`` and a 128-bit constant ``b``."""
    b_hi, b_lo = b >> 64, b & M64
    hi, lo = mul64(a_lo, b_lo)
    if b_hi:
        hi += a_lo * np.uint64(b_hi)
    hi += a_hi * np.uint64(b_lo)
    return hi, lo


@cache
def jump(k: int) -> tuple[int, int]:
    """(multiplier, increment factor) of k PCG64 steps: state_k = mult * state + factor * inc."""
    mult, factor = 1, 0
    for _ in range(k):
        mult, factor = (mult * PCG_MULT) & M128, (factor * PCG_MULT + 1) & M128
    return mult, factor


def advance(s_hi, s_lo, inc_hi, inc_lo, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The PCG64 states ``k`` steps after (s_hi, s_lo)."""
    mult, factor = jump(k)
    a_hi, a_lo = mul128(s_hi, s_lo, mult)
    if factor == 1:
        return add128(a_hi, a_lo, inc_hi, inc_lo)
    b_hi, b_lo = mul128(inc_hi, inc_lo, factor)
    return add128(a_hi, a_lo, b_hi, b_lo)


@cache
def _jump_table(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mult_hi, mult_lo, factor_hi, factor_lo) of 0 .. n steps, as uint64 arrays."""
    pairs = [jump(k) for k in range(n + 1)]
    split = [(np.array([x >> 64 for x in col], dtype=np.uint64), np.array([x & M64 for x in col], dtype=np.uint64))
             for col in zip(*pairs, strict=True)]
    return split[0][0], split[0][1], split[1][0], split[1][1]


def _mul128_columns(a_hi, a_lo, b_hi, b_lo):
    """(a * b) mod 2**128 with a of shape (n, 1) and per-column constants b of shape (k,): (n, k)."""
    a0, a1 = a_lo & _M32_64, a_lo >> _S32
    b0, b1 = b_lo & _M32_64, b_lo >> _S32
    p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
    mid = (p00 >> _S32) + (p01 & _M32_64) + (p10 & _M32_64)
    lo = (p00 & _M32_64) | (mid << _S32)
    hi = a1 * b1 + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32) + a_lo * b_hi + a_hi * b_lo
    return hi, lo


def states_ahead(s_hi, s_lo, inc_hi, inc_lo, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The states 0 .. n steps after (s_hi, s_lo) of each generator, by jump-ahead: (len, n + 1) arrays;
    output k of a generator is ``output`` of its state k + 1."""
    m_hi, m_lo, f_hi, f_lo = _jump_table(n)
    col = (slice(None), None)
    a_hi, a_lo = _mul128_columns(s_hi[col], s_lo[col], m_hi, m_lo)
    b_hi, b_lo = _mul128_columns(inc_hi[col], inc_lo[col], f_hi, f_lo)
    return add128(a_hi, a_lo, b_hi, b_lo)


def output(s_hi, s_lo) -> np.ndarray:
    """PCG64's XSL-RR output (uint64) of the given (already stepped) states: rotr(hi ^ lo, hi >> 58)."""
    x = s_hi ^ s_lo
    rot = s_hi >> _S58
    left = (_SIXTY_FOUR - rot) & _S63
    out = x >> rot
    x <<= left
    out |= x
    return out


def to_double(out) -> np.ndarray:
    """``Generator.random``'s double from a 64-bit output: (out >> 11) * 2**-53."""
    d = (out >> _S11).astype(np.float64)
    d *= DOUBLE_SCALE
    return d


def bounded_uint32(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Lemire's bounded draw in [0, n) from 32-bit values (``Generator.integers(n)`` for 2 <= n < 2**32):
    (result, rejected). Where ``rejected`` is True numpy would draw again; callers redo those with numpy."""
    m = _u64(values) * np.uint64(n)
    threshold = ((1 << 32) - n) % n
    return m >> _S32, (m & _M32_64) < np.uint64(threshold)


def bounded_uint64(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Lemire's bounded draw in [0, n) from 64-bit values (``Generator.integers(n)`` for 2**32 < n < 2**64):
    (result, rejected)."""
    hi, lo = mul64(_u64(values), n)
    threshold = ((1 << 64) - n) % n
    return hi, lo < np.uint64(threshold)


def self_check() -> bool:
    """Whether this module reproduces numpy's numbers on a few seeds (scalar and batched)."""
    seeds = [0, 1, 2**32 - 1, 2**32, 987654321987654321, 2**63 - 2, 2**64 - 1]
    for seed in [*seeds, 2**100 + 12345]:
        st = np.random.PCG64(seed).state["state"]
        if seed_state(seed) != (st["state"], st["inc"]):
            return False
        expected = np.random.default_rng(seed).random((3, 2))
        state, inc = seed_state(seed)
        if not np.array_equal(generator_from_state(state, inc).random((3, 2)), expected):
            return False
    s_hi, s_lo, i_hi, i_lo = seed_states(np.array(seeds, dtype=np.uint64))
    for j, seed in enumerate(seeds):
        state, inc = seed_state(seed)
        if (int(s_hi[j]) << 64 | int(s_lo[j]), int(i_hi[j]) << 64 | int(i_lo[j])) != (state, inc):
            return False
        gen = np.random.default_rng(seed)
        n1 = gen.integers(3528)  # 32-bit path: low half of one output, high half buffered
        n2 = gen.integers(3528)
        big = gen.integers(2**63 - 1)
        o_hi, o_lo = advance(s_hi[j : j + 1], s_lo[j : j + 1], i_hi[j : j + 1], i_lo[j : j + 1])
        out1 = output(o_hi, o_lo)
        o_hi, o_lo = advance(o_hi, o_lo, i_hi[j : j + 1], i_lo[j : j + 1])
        out2 = output(o_hi, o_lo)
        r1, _ = bounded_uint32(out1 & np.uint64(M32), 3528)
        r2, _ = bounded_uint32(out1 >> np.uint64(32), 3528)
        r3, _ = bounded_uint64(out2, 2**63 - 1)
        if (int(r1[0]), int(r2[0]), int(r3[0])) != (n1, n2, big):
            return False
        a_hi, a_lo = states_ahead(s_hi[j : j + 1], s_lo[j : j + 1], i_hi[j : j + 1], i_lo[j : j + 1], 2)
        if not np.array_equal(output(a_hi[0, 1:], a_lo[0, 1:]), np.concatenate([out1, out2])):
            return False
    gen = np.random.default_rng(5)
    before = gen.bit_generator.state
    gen.integers(1)  # a one-task pool: numpy draws nothing
    return gen.bit_generator.state == before


_CHECKED: bool | None = None


def checked() -> bool:
    """Whether ``self_check`` passed (run once, on first use); otherwise every user takes numpy's own path."""
    global _CHECKED
    if _CHECKED is None:
        try:
            _CHECKED = self_check()
        except Exception:  # any surprise from numpy: use numpy itself
            _CHECKED = False
    return _CHECKED
