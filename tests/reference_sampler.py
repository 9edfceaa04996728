"""A scalar, pure-Python reference of the sampling chain: lists and math, no numpy.

It spells out the arithmetic contract that strata_core.engine.sampler implements with
vectorised numpy, one token at a time:
- bias, mask and penalties adjust the row in float32 (each result rounded to float32,
  which is exactly what a float32 operation gives); every later stage works in float64;
- candidates are ordered by descending logit, ties to the lower id;
- a normaliser is a sequential sum in ascending id order; a running mass is a sequential
  sum in candidate order (explicit loops: Python 3.12's sum() compensates);
- the draw returns the first candidate whose running mass exceeds u * normaliser, or the
  last candidate if rounding leaves none.
Weights use math.exp. Where numpy's float64 exp is glibc's (x86-64 without AVX-512) the
two agree bit for bit; numpy's AVX-512 exp may differ by one ulp, which can only matter
for a draw or cut that lands within ~1e-16 of a boundary.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Sequence

from strata_core.contract.options import SamplingParams
from strata_core.engine import philox


def f32(v: float) -> float:
    """v rounded to the nearest float32, as a Python float."""
    try:
        return float(struct.unpack("f", struct.pack("f", v))[0])
    except OverflowError:
        return math.copysign(math.inf, v)


def adjusted(
    logits: Sequence[float],
    params: SamplingParams,
    history: Sequence[int],
    mask: Sequence[bool] | None = None,
) -> list[float]:
    """The row after logit bias, allowed / grammar mask and penalties."""
    x = [f32(float(v)) for v in logits]
    for tok, b in params.bias.items():
        x[tok] = f32(x[tok] + f32(b))
    if params.allowed is not None:
        allowed = set(params.allowed)
        x = [v if i in allowed else -math.inf for i, v in enumerate(x)]
    if mask is not None:
        x = [v if bool(m) else -math.inf for v, m in zip(x, mask, strict=True)]
    if params.penalty_last_n > 0 and (
        params.penalty_repeat != 1.0 or params.penalty_freq != 0.0 or params.penalty_present != 0.0
    ):
        rep, freq, present = (
            f32(params.penalty_repeat),
            f32(params.penalty_freq),
            f32(params.penalty_present),
        )
        window = [int(t) for t in history][-params.penalty_last_n :]
        for tok, count in Counter(window).items():
            v = x[tok]
            v = f32(v * rep) if v <= 0 else f32(v / rep)
            x[tok] = f32(v - f32(f32(count * freq) + present))
    return x


def _mass(order: list[int], weight: dict[int, float]) -> float:
    total = 0.0
    for i in sorted(order):
        total += weight[i]
    return total


def kept(x: list[float], params: SamplingParams) -> list[int]:
    """Candidate ids, in candidate order, after top_k, min_p and top_p."""
    order = sorted((i for i, v in enumerate(x) if v > -math.inf), key=lambda i: (-x[i], i))
    if params.top_k > 0:
        order = order[: params.top_k]
    if params.min_p > 0.0:
        threshold = x[order[0]] + math.log(params.min_p)
        order = [i for i in order if x[i] >= threshold]
    if params.top_p < 1.0:
        head = x[order[0]]
        weight = {i: math.exp(x[i] - head) for i in order}
        target = params.top_p * _mass(order, weight)
        running, keep = 0.0, len(order)
        for n, i in enumerate(order, 1):
            running += weight[i]
            if running >= target:
                keep = n
                break
        order = order[:keep]
    return order


def reference_samples(
    logits: Sequence[float],
    params: SamplingParams,
    history: Sequence[int],
    positions: Sequence[int],
    stream: int = 0,
    mask: Sequence[bool] | None = None,
) -> list[int]:
    """One token per position; the chain up to the draw is shared, only u differs."""
    x = adjusted(logits, params, history, mask)
    best = 0
    for i in range(1, len(x)):
        if x[i] > x[best]:
            best = i
    if not x[best] > -math.inf:
        raise ValueError("no token is permitted")
    if params.temperature == 0.0:
        return [best for _ in positions]
    order = kept(x, params)
    head = x[order[0]]
    weight = {i: math.exp((x[i] - head) / params.temperature) for i in order}
    total = _mass(order, weight)
    return [_draw(order, weight, philox.uniform(params.seed, p, stream) * total) for p in positions]


def _draw(order: list[int], weight: dict[int, float], target: float) -> int:
    running = 0.0
    for i in order:
        running += weight[i]
        if running > target:
            return i
    return order[-1]


def reference_sample(
    logits: Sequence[float],
    params: SamplingParams,
    history: Sequence[int],
    position: int,
    stream: int = 0,
    mask: Sequence[bool] | None = None,
) -> int:
    return reference_samples(logits, params, history, [position], stream, mask)[0]
