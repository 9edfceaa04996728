"""Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).

Counter-based: a draw is a pure function of (key, counter), so a request's randomness
depends only on its seed and the position being sampled -- never on what ran before it or
beside it, and a speculative window that is partly rejected does not shift later draws.
Bit-exact with Random123's ``philox4x32_R(10, ctr, key)``.
"""

from __future__ import annotations

_MASK32 = 0xFFFFFFFF
_M0 = 0xD2511F53  # round multipliers
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9  # Weyl key increments (golden ratio, sqrt(3) - 1)
_W1 = 0xBB67AE85

Counter = tuple[int, int, int, int]
Key = tuple[int, int]


def philox4x32(counter: Counter, key: Key, rounds: int = 10) -> Counter:
    """Return the four 32-bit output words for ``counter`` under ``key``."""
    c0, c1, c2, c3 = (int(w) & _MASK32 for w in counter)
    k0, k1 = (int(w) & _MASK32 for w in key)
    for r in range(rounds):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> 32) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> 32) ^ c3 ^ k1,
            p0 & _MASK32,
        )
    return c0, c1, c2, c3


def uniform(seed: int, position: int, stream: int = 0) -> float:
    """A uniform double in [0, 1) for (seed, position, stream).

    key = (seed low 32 bits, seed high 32 bits); counter = (position low 32, position high
    32, stream, 0). The top 53 bits of ``word0 << 32 | word1`` scaled by 2**-53, so every
    value is exactly representable and 1.0 is never returned.
    """
    w0, w1, _, _ = _block(seed, position, stream)
    return _unit(w0, w1)


def uniforms(seed: int, position: int, stream: int = 0) -> tuple[float, float]:
    """``uniform``'s draw and a second, independent one from the same block's other two
    words (XTC's chance)."""
    w0, w1, w2, w3 = _block(seed, position, stream)
    return _unit(w0, w1), _unit(w2, w3)


def _unit(hi: int, lo: int) -> float:
    return ((hi << 32 | lo) >> 11) * 2.0**-53


def _block(seed: int, position: int, stream: int) -> Counter:
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed={seed} is out of range: expected 0 <= seed < 2**64")
    if not 0 <= position < 1 << 64:
        raise ValueError(f"position={position} is out of range: expected 0 <= position < 2**64")
    if not 0 <= stream < 1 << 32:
        raise ValueError(f"stream={stream} is out of range: expected 0 <= stream < 2**32")
    return philox4x32((position & _MASK32, position >> 32, stream, 0), (seed & _MASK32, seed >> 32))
