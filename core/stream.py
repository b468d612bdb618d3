"""The counter-based random source of every episode: draw ``i`` of a seed is a pure function of (seed, i).

Definition (docs/core/stream.md, has it with test vectors)::

    GAMMA = 0x9E3779B97F4A7C15
    mix(z)  = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
    key(seed)     = mix(seed + GAMMA)                 (all arithmetic modulo 2**64)
    bits(seed, i) = mix(key(seed) + (i + 1) * GAMMA)  (output i of SplitMix64 started at key(seed))
    uniform(seed, i) = (bits(seed, i) >> 11) * 2**-53, a double in [0, 1)
    subkey(k, tag)   = mix(k ^ (tag * 0xD1B54A32D192ED03))  (the key of an independent stream, tag = 1, 2, ...)

The same function is computed two ways, with bit-identical results: scalar on Python ints (``key``,
``bits``, ``uniform``; the single env, the text env, the MCP server) and on numpy ``uint64`` arrays
(``key_array``, ``bits_array``; the vector env). The uses of the stream (which index feeds which draw)
are defined in ``resilibench.core.simulator``.
"""

from __future__ import annotations

__all__ = [
    "M64", "GAMMA", "UNIT", "mix", "key", "bits", "uniform", "SUBKEY_MUL", "subkey", "below", "mix_array",
    "key_array", "offsets", "bits_array", "to_uniform", "below_array",
]

import numpy as np

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
UNIT = 2.0**-53  # (bits >> 11) * UNIT is a double in [0, 1) with 53 random bits


def mix(z: int) -> int:
    """SplitMix64's output function of a 64-bit value (a bijection of [0, 2**64))."""
    z = ((z ^ (z >> 30)) * _MUL1) & M64
    z = ((z ^ (z >> 27)) * _MUL2) & M64
    return z ^ (z >> 31)


def key(seed: int) -> int:
    """The key of a seed (any int; taken modulo 2**64): ``mix(seed + GAMMA)``."""
    return mix((seed + GAMMA) & M64)


def bits(k: int, i: int) -> int:
    """Draw ``i`` (64 bits) of the seed whose key is ``k``."""
    z = ((k + (i + 1) * GAMMA) & M64)  # mix, inlined: this is the hot path of an env step
    z = ((z ^ (z >> 30)) * _MUL1) & M64
    z = ((z ^ (z >> 27)) * _MUL2) & M64
    return z ^ (z >> 31)


def uniform(k: int, i: int) -> float:
    """Draw ``i`` of the seed whose key is ``k`` as a double in [0, 1): ``(bits(k, i) >> 11) * UNIT``."""
    z = ((k + (i + 1) * GAMMA) & M64)  # bits, inlined: every drawing call of an episode reads one or two
    z = ((z ^ (z >> 30)) * _MUL1) & M64
    z = ((z ^ (z >> 27)) * _MUL2) & M64
    return ((z ^ (z >> 31)) >> 11) * UNIT


SUBKEY_MUL = 0xD1B54A32D192ED03


def subkey(k: int, tag: int) -> int:
    """The key of stream number ``tag`` (1, 2, ...) derived from key ``k``: ``mix(k ^ (tag * SUBKEY_MUL))``.
    Its draws (``uniform(subkey(k, tag), i)``) are independent of the draws of ``k`` itself, so a new use of
    randomness (the failure processes) leaves the draws of the existing uses unchanged."""
    return mix(k ^ ((tag * SUBKEY_MUL) & M64))


def below(x: int, n: int) -> int:
    """An index in [0, n) from 64 random bits, for 1 <= n < 2**32: ``((x >> 32) * n) >> 32``."""
    return ((x >> 32) * n) >> 32


# --- the same on numpy uint64 arrays -------------------------------------------------------------------

_S11, _S27, _S30, _S31, _S32 = (np.uint64(s) for s in (11, 27, 30, 31, 32))
_U_MUL1, _U_MUL2, _U_GAMMA = np.uint64(_MUL1), np.uint64(_MUL2), np.uint64(GAMMA)


def mix_array(z: np.ndarray) -> np.ndarray:
    """``mix`` of each value of a uint64 array, in place (and returned)."""
    z ^= z >> _S30
    z *= _U_MUL1
    z ^= z >> _S27
    z *= _U_MUL2
    z ^= z >> _S31
    return z


def key_array(seeds: np.ndarray) -> np.ndarray:
    """``key`` of each seed of a uint64 array (a new array)."""
    return mix_array(np.asarray(seeds, dtype=np.uint64) + _U_GAMMA)


def offsets(indices) -> np.ndarray:
    """``(i + 1) * GAMMA mod 2**64`` for each draw index ``i`` (uint64): add a key to get the input of
    ``mix`` for those draws."""
    return (np.asarray(indices, dtype=np.uint64) + np.uint64(1)) * _U_GAMMA


def bits_array(keys: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """``bits(key, i)`` elementwise, where ``offset`` holds ``offsets(i)``; shapes broadcast."""
    return mix_array(keys + offset)


def to_uniform(x: np.ndarray) -> np.ndarray:
    """Doubles in [0, 1) from 64-bit draws: ``(x >> 11) * 2**-53``."""
    u = (x >> _S11).astype(np.float64)
    u *= UNIT
    return u


def below_array(x: np.ndarray, n: int) -> np.ndarray:
    """``below`` elementwise (int64)."""
    return (((x >> _S32) * np.uint64(n)) >> _S32).astype(np.int64)
