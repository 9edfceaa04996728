"""llama.cpp's samplers beyond top_k / min_p / top_p / temperature, on candidate arrays
(src/llama-sampler.cpp's definitions; sampler.py runs them in the request's order).

Each works on the candidates' float32 logits in candidate order (descending logit, ties
to the lower id) with the temperature applied so far (``t``), and returns how many of the
head (or which) survive. Probabilities are float64 softmaxes at ``t``. Mirostat and
adaptive-p pick the token themselves and keep state per request (``SamplerState``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from strata_core.contract.options import SamplingParams
from strata_core.engine.dry import Breakers

F64 = npt.NDArray[np.float64]
MIROSTAT_M = 100  # Mirostat v1 estimates the Zipf exponent from this many head tokens
# adaptive-p's transform (llama.cpp's constants): a peak at the target, linear tails
_WIDTH, _PEAK, _SHARPNESS = 0.3, 5.0, 10.0
INFILL_KEEP = 0.2  # the infill stage keeps text tokens of at least this probability (llama.cpp's)


@dataclass(frozen=True)
class InfillVocab:
    """What the infill stage reads of the vocabulary."""

    pieces: Sequence[bytes]  # by token id, special tokens' as empty (llama.cpp's special=false)
    eog: frozenset[int]
    end: int  # the token it falls back on when no text token is likely: EOT, else EOS


@dataclass
class SamplerState:
    """What a request's picks carry from one token to the next."""

    breakers: Breakers = field(default_factory=dict)  # DRY's, on the engine's vocabulary
    mu: float | None = None  # Mirostat's running surprise bound (None: 2 * tau)
    ema_sum: float | None = None  # adaptive-p: sum of picked tokens' probabilities * decay^age
    ema_weight: float | None = None  # and sum of decay^age
    infill: InfillVocab | None = None  # the infill stage's, when the request's order has it


def softmax(logits: np.ndarray, t: float) -> F64:
    z = np.exp((logits.astype(np.float64) - float(logits.max())) / t)
    return z / z.sum()


def top_n_sigma(logits: np.ndarray, t: float, n: float) -> npt.NDArray[np.bool_]:
    """Keep the logits within n standard deviations of the best (scale-free: t cancels)."""
    z = logits.astype(np.float64) / t
    return z >= z.max() - n * float(z.std())


def typical(logits: np.ndarray, t: float, p: float, min_keep: int) -> npt.NDArray[np.intp]:
    """Positions kept by locally typical sampling: the candidates whose surprise is closest
    to the entropy, until their mass exceeds p (at least min_keep)."""
    q = softmax(logits, t)
    with np.errstate(divide="ignore"):
        surprise = -np.log(q)
    entropy = float(np.sum(np.where(q > 0, q * surprise, 0.0)))
    order = np.argsort(np.abs(surprise - entropy), kind="stable")
    mass = np.cumsum(q[order])
    over = np.flatnonzero((mass > p) & (np.arange(q.size) >= max(min_keep, 1) - 1))
    return order[: int(over[0]) + 1 if over.size else q.size]


def xtc(logits: np.ndarray, t: float, threshold: float, min_keep: int) -> int:
    """How many head candidates XTC drops (the draw already fell under its probability):
    all those at or above the threshold but the last of them."""
    q = softmax(logits, t)
    above = int(np.argmin(q >= threshold)) if not (q >= threshold).all() else q.size
    drop = above - 1
    return drop if drop > 0 and q.size - drop >= min_keep else 0


def dynatemp(logits: np.ndarray, t: float, p: SamplingParams) -> float:
    """The temperature dynamic temperature maps the candidates' normalised entropy to."""
    q = softmax(logits, t)
    entropy = -float(np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0)))
    low, high = max(0.0, p.temperature - p.dynatemp_range), p.temperature + p.dynatemp_range
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # 0 ** -e: inf, as powf
        return float(low + (high - low) * np.float64(entropy / math.log(q.size)) ** p.dynatemp_exponent)


def choose(q: np.ndarray, u: float) -> int:
    """The first position whose running mass exceeds u (the last if rounding leaves none)."""
    return min(q.size - 1, int(np.searchsorted(np.cumsum(q), u * float(q.sum()), side="right")))


def mirostat_cut(q: np.ndarray, p: SamplingParams, mu: float, n_vocab: int) -> int:
    """How many head candidates Mirostat keeps: v2 those whose surprise is at most mu (q:
    every candidate's probability, in any order); v1 the k its Zipf estimate gives (q: at
    least the first ``MIROSTAT_M`` probabilities, descending)."""
    if p.mirostat == 2:
        with np.errstate(divide="ignore"):
            return max(1, int(np.count_nonzero(-np.log2(q) <= mu)))
    m = min(MIROSTAT_M - 1, q.size - 1)
    if m < 1:
        return 1
    i = np.arange(m, dtype=np.float64)
    ti = np.log((i + 2) / (i + 1))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # overflow: no cut, as in float
        s_hat = np.sum(ti * np.log(q[:m] / q[1 : m + 1])) / np.sum(ti * ti)
        eps = s_hat - 1
        k = float(((eps * np.float64(2.0) ** mu) / (1 - np.float64(n_vocab) ** -eps)) ** (1 / s_hat))
    return q.size if not math.isfinite(k) else max(1, min(q.size, int(k)))


def mirostat_update(mu: float, p: SamplingParams, q_picked: float) -> float:
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return float(mu - p.mirostat_eta * (-np.log2(np.float64(q_picked)) - p.mirostat_tau))


def adaptive_logits(q: np.ndarray, p: SamplingParams, state: SamplerState) -> F64:
    """adaptive-p's transform of the candidates' probabilities: logits peaking where the
    probability is the target, corrected by how far the picks so far fell from it."""
    target = min(max(p.adaptive_target, 0.0), 1.0)
    _, summed, total = _ema(state, p)
    adapted = target if total == 0.0 else min(max(2.0 * target - summed / total, 0.0), 1.0)
    d = np.abs(q - adapted) / _WIDTH
    return _PEAK - _SHARPNESS * d * d / (1.0 + d)


def _ema(state: SamplerState, p: SamplingParams) -> tuple[float, float, float]:
    """adaptive-p's decay and running sums (llama.cpp starts them as if every past pick
    had hit the target)."""
    decay = min(max(p.adaptive_decay, 0.0), 0.99)
    summed = state.ema_sum if state.ema_sum is not None else p.adaptive_target / (1.0 - decay)
    total = state.ema_weight if state.ema_weight is not None else 1.0 / (1.0 - decay)
    return decay, summed, total


def adaptive_update(state: SamplerState, p: SamplingParams, q_picked: float) -> None:
    decay, summed, total = _ema(state, p)
    state.ema_sum, state.ema_weight = q_picked + decay * summed, 1.0 + decay * total


def infill(ids: np.ndarray, logits: np.ndarray, t: float, vocab: InfillVocab) -> tuple[npt.NDArray[np.intp], F64] | None:
    """Positions the infill stage keeps of candidates in candidate order, and the
    probabilities it gives them; None: only ``vocab.end`` is left.

    End-of-generation tokens alone when they are likely enough against the text; else
    each token whose piece starts another's takes the less likely one's probability (in
    candidate order, as llama.cpp walks them), then the text tokens under ``INFILL_KEEP``
    are dropped."""
    q = softmax(logits, t)
    is_eog = np.fromiter((int(i) in vocab.eog for i in ids), bool, ids.size)
    if 3.0 * float(q[is_eog].sum()) * ids.size > float(q[~is_eog].sum()):
        keep = np.flatnonzero(is_eog)
        return keep, q[keep] / q[keep].sum()
    q, dead = q.copy(), np.zeros(ids.size, bool)
    for i0, longer in enumerate(_extensions([vocab.pieces[int(i)] for i in ids])):
        for i1 in longer:
            if dead[i0]:
                break
            if not dead[i1]:
                dst, src = (i1, i0) if q[i1] > q[i0] else (i0, i1)
                q[dst], q[src], dead[src] = q[dst] + q[src], 0.0, True
    keep = np.flatnonzero(~dead & ((q >= INFILL_KEEP) | is_eog))
    if not (~is_eog[keep]).any():
        return None
    return keep, q[keep] / q[keep].sum()


def _extensions(pieces: Sequence[bytes]) -> list[list[int]]:
    """For each piece, the positions of the others it is a non-empty prefix of, ascending."""
    by_text = sorted(range(len(pieces)), key=pieces.__getitem__)
    texts = [pieces[i] for i in by_text]
    out: list[list[int]] = []
    for i, piece in enumerate(pieces):
        longer: list[int] = []
        if piece:
            j = bisect.bisect_left(texts, piece)
            while j < len(texts) and texts[j].startswith(piece):
                longer.append(by_text[j])
                j += 1
        out.append(sorted(k for k in longer if k != i))
    return out
