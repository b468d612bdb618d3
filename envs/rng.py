"""Bit-exact re-implementations of the numpy random calls the envs make, for speed.

The envs draw their randomness with numpy: ``np.random.default_rng(seed)`` (a ``SeedSequence`` feeding a
``PCG64``), ``Generator.integers`` and ``Generator.random``. Building a ``SeedSequence`` costs tens of
microseconds, which dominates a planner-env reset, and a batched env cannot call one Generator per
sub-env without a Python loop. This module computes exactly the same numbers:

* scalar (Python ints): ``seed_state`` (the PCG64 state of ``default_rng(seed)``) and
  ``draw_stream_from_seed`` (``draw_stream(default_rng(seed), n)`` without a SeedSequence);
* batched (numpy ``uint64`` arrays, 128-bit values as (hi, lo) pairs): ``seed_states``, ``advance``,
  ``output``, ``bounded_uint32``, ``bounded_uint64`` over many generators at once.

numpy guarantees the bit streams of ``SeedSequence`` and ``PCG64``; the ``Generator`` methods used here
(Lemire's bounded integers, 53-bit doubles) have been stable for years but carry no formal guarantee, so
``self_check`` compares this module with numpy, and every user falls back to numpy when it fails.
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


def seed_state_reference(seed: int) -> tuple[int, int]:
    """(state, inc) of the PCG64 inside ``np.random.default_rng(seed)``, for ``0 <= seed < 2**128``: the
    readable definition (SeedSequence with pool size 4, then PCG64's seeding). ``seed_state`` is the same
    computation unrolled."""
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


def _unrolled_seed_state():
    """Generate ``seed_state``: ``seed_state_reference`` as straight-line code with the hash constants
    inlined (about twice as fast: no loops, no tuple lookups). Checked against numpy by ``self_check``."""
    lines = ["def seed_state(seed):",
             '    """(state, inc) of the PCG64 inside ``np.random.default_rng(seed)``, 0 <= seed < 2**128."""',
             "    if not 0 <= seed <= M128:",
             "        raise ValueError(f'seed must be in [0, 2**128), got {seed}')"]
    for i in range(_POOL):
        lines += [f"    v = (((seed >> {32 * i}) & M32 ^ {_HA[i]}) * {_HA[i + 1]}) & M32", f"    p{i} = v ^ (v >> 16)"]
    for k, (s, d) in enumerate(_MIX_ORDER, start=_POOL):
        lines += [f"    v = ((p{s} ^ {_HA[k]}) * {_HA[k + 1]}) & M32", "    v ^= v >> 16",
                  f"    v = ({_MIX_L} * p{d} - {_MIX_R} * v) & M32", f"    p{d} = v ^ (v >> 16)"]
    for i in range(2 * _POOL):
        lines += [f"    v = ((p{i % _POOL} ^ {_HB[i]}) * {_HB[i + 1]}) & M32", f"    o{i} = v ^ (v >> 16)"]
    lines += ["    inc = ((((o4 | o5 << 32) << 64 | o6 | o7 << 32) << 1) | 1) & M128",
              "    return (((inc + ((o0 | o1 << 32) << 64 | o2 | o3 << 32)) * PCG_MULT) + inc) & M128, inc"]
    namespace = {"M32": M32, "M128": M128, "PCG_MULT": PCG_MULT}
    exec("\n".join(lines), namespace)  # noqa: S102  (our own constants only)
    return namespace["seed_state"]


seed_state = _unrolled_seed_state()


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
    if _CHECKED and isinstance(seed, int) and 0 <= seed <= M128:
        state, inc = seed_state(seed)
        return generator_from_state(state, inc, generator=_scratch_generator())
    return np.random.default_rng(seed)


# --- batched: many PCG64 generators as numpy uint64 arrays ---------------------------------------------


def _u64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64)


def seed_states(seeds) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``seed_state`` for an array of seeds in [0, 2**64): (state_hi, state_lo, inc_hi, inc_lo)."""
    seeds = _u64(seeds)
    words = [(seeds & M32).astype(np.uint32), (seeds >> 32).astype(np.uint32)]
    n = seeds.shape
    pool = []
    for i in range(_POOL):
        if i < len(words):
            value = (words[i] ^ np.uint32(_HA[i])) * np.uint32(_HA[i + 1])
            pool.append(value ^ (value >> np.uint32(16)))
        else:
            pool.append(np.full(n, _ZERO_POOL[i], dtype=np.uint32))
    for k, (s, d) in enumerate(_MIX_ORDER, start=_POOL):
        value = (pool[s] ^ np.uint32(_HA[k])) * np.uint32(_HA[k + 1])
        value ^= value >> np.uint32(16)
        mixed = np.uint32(_MIX_L) * pool[d] - np.uint32(_MIX_R) * value
        pool[d] = mixed ^ (mixed >> np.uint32(16))
    out = []
    for i in range(2 * _POOL):
        value = (pool[i % _POOL] ^ np.uint32(_HB[i])) * np.uint32(_HB[i + 1])
        out.append((value ^ (value >> np.uint32(16))).astype(np.uint64))
    w = [out[2 * i] | (out[2 * i + 1] << np.uint64(32)) for i in range(4)]
    inc_hi = (w[2] << np.uint64(1)) | (w[3] >> np.uint64(63))
    inc_lo = (w[3] << np.uint64(1)) | np.uint64(1)
    s_hi, s_lo = add128(inc_hi, inc_lo, w[0], w[1])
    s_hi, s_lo = mul128(s_hi, s_lo, PCG_MULT)
    s_hi, s_lo = add128(s_hi, s_lo, inc_hi, inc_lo)
    return s_hi, s_lo, inc_hi, inc_lo


def add128(a_hi, a_lo, b_hi, b_lo) -> tuple[np.ndarray, np.ndarray]:
    """(a + b) mod 2**128 on (hi, lo) uint64 arrays."""
    lo = a_lo + b_lo
    return a_hi + b_hi + (lo < a_lo).astype(np.uint64), lo


def mul64(a, b_lo: int) -> tuple[np.ndarray, np.ndarray]:
    """Full 128-bit product of uint64 array ``a`` and a 64-bit constant, as (hi, lo)."""
    a0, a1 = a & np.uint64(M32), a >> np.uint64(32)
    b0, b1 = np.uint64(b_lo & M32), np.uint64(b_lo >> 32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> np.uint64(32)) + (p01 & np.uint64(M32)) + (p10 & np.uint64(M32))
    lo = (p00 & np.uint64(M32)) | (mid << np.uint64(32))
    hi = p11 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) + (mid >> np.uint64(32))
    return hi, lo


def mul128(a_hi, a_lo, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(a * b) mod 2**128 for (hi, lo) uint64 arrays ``a`` and a 128-bit constant ``b``."""
    b_hi, b_lo = b >> 64, b & M64
    hi, lo = mul64(a_lo, b_lo)
    return hi + a_lo * np.uint64(b_hi) + a_hi * np.uint64(b_lo), lo


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


def output(s_hi, s_lo) -> np.ndarray:
    """PCG64's XSL-RR output (uint64) of the given (already stepped) states."""
    x = s_hi ^ s_lo
    rot = s_hi >> np.uint64(58)
    return (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))


def to_double(out) -> np.ndarray:
    """``Generator.random``'s double from a 64-bit output."""
    return (out >> np.uint64(11)).astype(np.float64) * DOUBLE_SCALE


def bounded_uint32(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Lemire's bounded draw in [0, n) from 32-bit values (``Generator.integers(n)`` for 2 <= n < 2**32):
    (result, rejected). Where ``rejected`` is True numpy would draw again; callers redo those with numpy."""
    m = _u64(values) * np.uint64(n)
    leftover = m & np.uint64(M32)
    threshold = ((1 << 32) - n) % n
    return m >> np.uint64(32), leftover < np.uint64(threshold)


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
        if not seed_state(seed) == seed_state_reference(seed) == (st["state"], st["inc"]):
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
    return True


_CHECKED = False
_CHECKED = self_check()


def checked() -> bool:
    """Whether the self-check passed at import (otherwise every user takes numpy's own path)."""
    return _CHECKED
