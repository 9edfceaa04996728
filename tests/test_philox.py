"""Philox4x32-10 against Random123's known answers, and the uniform draw built on it."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from strata_core.engine.philox import philox4x32, uniform

# Random123 tests/kat_vectors (DEShawResearch/random123 @ 9545ff6), the philox4x32 lines:
# "philox4x32 <rounds> ctr[4] key[2] -> result[4]".
KAT = [
    (10, (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        10,
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        10,
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
    (
        7,
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A),
    ),
]


@pytest.mark.parametrize(("rounds", "ctr", "key", "expected"), KAT)
def test_known_answers(rounds, ctr, key, expected):
    assert philox4x32(ctr, key, rounds) == expected


def test_uniform_uses_seed_position_and_stream_words():
    w0, w1, _, _ = philox4x32((5, 1, 3, 0), (0x89ABCDEF, 0x01234567))
    expected = ((w0 << 32 | w1) >> 11) / 2**53
    assert uniform(0x0123456789ABCDEF, (1 << 32) | 5, 3) == expected


def test_uniform_is_a_pure_function_of_its_arguments():
    assert uniform(42, 7) == uniform(42, 7)
    draws = {uniform(42, 7), uniform(43, 7), uniform(42, 8), uniform(42, 7, 1)}
    assert len(draws) == 4


def test_uniform_range_and_bounds():
    for seed in (0, 1, 2**32, 2**64 - 1):
        for pos in (0, 1, 2**32 - 1, 2**32, 2**64 - 1):
            assert 0.0 <= uniform(seed, pos) < 1.0
    with pytest.raises(ValueError, match="seed"):
        uniform(2**64, 0)
    with pytest.raises(ValueError, match="seed"):
        uniform(-1, 0)
    with pytest.raises(ValueError, match="position"):
        uniform(0, -1)
    with pytest.raises(ValueError, match="stream"):
        uniform(0, 0, 2**32)


def test_uniform_is_uniform_over_positions():
    n, bins = 40_000, 20
    draws = [uniform(1234, p) for p in range(n)]
    mean = sum(draws) / n
    assert abs(mean - 0.5) < 4 * math.sqrt(1 / 12 / n)
    counts = [0] * bins
    for u in draws:
        counts[int(u * bins)] += 1
    expected = n / bins
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 43.8  # chi-square, 19 degrees of freedom, p = 0.001
    # consecutive positions are not correlated (the draw for p+1 is no function of p's)
    pairs = sum((a - 0.5) * (b - 0.5) for a, b in pairwise(draws)) / (n - 1)
    assert abs(pairs) < 4 * (1 / 12) / math.sqrt(n)


def test_streams_are_independent():
    n = 10_000
    a = [uniform(7, p, 0) for p in range(n)]
    b = [uniform(7, p, 1) for p in range(n)]
    cov = sum((x - 0.5) * (y - 0.5) for x, y in zip(a, b, strict=True)) / n
    assert abs(cov) < 4 * (1 / 12) / math.sqrt(n)
