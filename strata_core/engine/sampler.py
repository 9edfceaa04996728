"""The sampling chain, on one float32 host logits row (numpy).

Order (docs/architecture.md, "Sampling"): logit bias -> allowed / grammar mask -> penalties -> top_k -> min_p ->
top_p -> temperature -> draw; temperature 0 is argmax (ties to the lower id) after the
first three, and a request with no keys is one argmax over the raw row.

Arithmetic contract, spelled out one token at a time by tests/reference_sampler.py:
bias, mask and penalties adjust the row in float32 (as llama.cpp does); thresholds and
weights are float64 (weight = exp((logit - head) / T)). Candidates are ordered by
descending logit, ties to the lower id. A normaliser is summed sequentially in ascending
id order, so the vocabulary never needs a full sort; running masses are summed
sequentially in candidate order. top_p keeps the shortest prefix whose running mass
reaches top_p * normaliser; the draw takes u = philox.uniform(seed, position, stream) and
returns the first candidate whose running mass exceeds u * normaliser (the last one if
rounding leaves none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from strata_core.contract.options import SamplingParams
from strata_core.engine import dry, philox, stages
from strata_core.engine.stages import SamplerState

F32 = np.float32
_FIRST_BLOCK = 256  # candidates sorted before a lazy walk widens its prefix


class Candidates(NamedTuple):
    ids: npt.NDArray[np.intp]
    logits: npt.NDArray[np.float32]  # the adjusted row's values; weights are float64
    ordered: bool  # True: in candidate order; False: ascending id


def apply_logit_bias(x: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    if not bias:
        return x
    ids = np.fromiter(bias.keys(), np.int64, len(bias))
    x = x.copy()
    x[ids] += np.fromiter(bias.values(), F32, len(bias))
    return x


def apply_mask(x: np.ndarray, allowed: Sequence[int] | None, mask: np.ndarray | None) -> np.ndarray:
    """-inf outside allowed and outside mask (True = permitted)."""
    if allowed is not None:
        y = np.full_like(x, -np.inf)
        ids = np.asarray(allowed, np.int64)
        y[ids] = x[ids]
        x = y
    return x if mask is None else np.where(mask, x, F32(-np.inf))


def apply_penalties(
    x: np.ndarray, history: Sequence[int] | np.ndarray, p: SamplingParams
) -> np.ndarray:
    """llama.cpp's rule over the last penalty_last_n ids of history (prompt tail + generated)."""
    window = np.asarray(history[-p.penalty_last_n :] if p.penalised else (), np.int64)
    if window.size == 0:
        return x
    if window.min() < 0 or window.max() >= x.size:
        raise ValueError(f"history holds a token id outside [0, {x.size})")
    ids, counts = np.unique(window, return_counts=True)
    rep, v = F32(p.penalty_repeat), x[ids]
    v = np.where(v <= 0, v * rep, v / rep)
    v -= counts.astype(F32) * F32(p.penalty_freq) + F32(p.penalty_present)
    x = x.copy()
    x[ids] = v
    return x


def first(v: np.ndarray, m: int) -> npt.NDArray[np.intp]:
    """Positions of the m best entries of v, in candidate order (lower position wins ties).

    A float partition finds the m-th value; everything at or above it (a few more than m
    when values tie) is ordered by one int64 key per entry -- the value's float32 bits
    made order-preserving, then the position -- so a plain np.sort (no argsort) resolves
    the ties, and the first m keys are the answer.
    """
    n = v.size
    if m < n:
        pos = np.flatnonzero(v >= np.partition(v, n - m)[n - m])
    else:
        pos = np.arange(n)
    return in_order(v, pos)[:m]


def in_order(v: np.ndarray, pos: np.ndarray) -> npt.NDArray[np.intp]:
    """The positions ``pos`` of v in candidate order (descending value, lower position first)."""
    bits = (v[pos].astype(F32) + F32(0.0)).view(np.int32)  # + 0.0: -0.0 ties with +0.0
    ascending = bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))  # signed order == float order
    keys = ((~ascending).astype(np.int64) << 32) | pos
    keys.sort()
    return (keys & 0xFFFFFFFF).astype(np.intp)


def _walk(
    c: Candidates, weights: np.ndarray, target: float, side: Literal["left", "right"]
) -> tuple[np.ndarray, int]:
    """Candidate-order positions and the index where the running mass first passes target."""
    n = c.ids.size
    if c.ordered:
        pos = np.arange(n)
        return pos, min(n - 1, int(np.searchsorted(np.cumsum(weights), target, side=side)))
    m = min(n, _FIRST_BLOCK)
    while True:  # most mass sits in the head: sort only as much as the walk needs
        pos = first(c.logits, m)
        i = int(np.searchsorted(np.cumsum(weights[pos]), target, side=side))
        if i < m or m == n:
            return pos, min(i, n - 1)
        m = min(n, m * 8)


def _mass(c: Candidates, weights: np.ndarray) -> float:
    w = weights[np.argsort(c.ids)] if c.ordered else weights
    return float(np.cumsum(w)[-1])


def _weights(c: Candidates, temperature: float) -> npt.NDArray[np.float64]:
    return np.exp((c.logits.astype(np.float64) - float(c.logits.max())) / temperature)


def candidates(x: np.ndarray, top_k: int) -> Candidates:
    """The permitted entries of x, cut to the top_k best when top_k is set."""
    if 0 < top_k < x.size:
        return best(x, first(x, top_k))
    permitted = x > -np.inf
    if permitted.all():
        return Candidates(np.arange(x.size), x, False)
    ids = np.flatnonzero(permitted)
    return Candidates(ids, x[ids], False)


def best(x: np.ndarray, ids: np.ndarray) -> Candidates:
    """top_k's candidates from the positions of x's top_k best (``first``): the permitted ones."""
    ids = ids[x[ids] > -np.inf]
    return Candidates(ids, x[ids], True)


def top_k_leads(p: SamplingParams) -> bool:
    """A sampled pick's first cut is top_k over the whole adjusted row (as far as the row
    decides: an extended chain cuts only when more than top_k tokens are permitted), so a
    caller may find that head itself and pass it to ``pick``."""
    if p.greedy or p.top_k <= 0 or p.mirostat or "k" not in p.order:
        return False
    lead = p.order.partition("k")[0] if p.extended else ""
    return all(s in "eda" or (s == "s" and p.top_n_sigma <= 0.0) for s in lead)


def apply_min_p(c: Candidates, min_p: float, t: float = 1.0, min_keep: int = 0) -> Candidates:
    """Keep p >= min_p * p_max at temperature t (at least min_keep of the head)."""
    if min_p <= 0.0:
        return c
    keep = c.logits >= np.float64(float(c.logits.max()) + t * math.log(min_p))  # compared in f64
    if int(keep.sum()) < min_keep:
        return _head(c, min_keep)
    return Candidates(c.ids[keep], c.logits[keep], c.ordered)


def apply_top_p(c: Candidates, top_p: float, t: float = 1.0, min_keep: int = 0) -> Candidates:
    """The shortest head whose mass at temperature t reaches top_p (at least min_keep)."""
    if top_p >= 1.0:
        return c
    w = _weights(c, t)
    pos, i = _walk(c, w, top_p * _mass(c, w), "left")
    if i + 1 < min_keep:
        return _head(c, min_keep)
    return Candidates(c.ids[pos[: i + 1]], c.logits[pos[: i + 1]], True)


def _head(c: Candidates, k: int) -> Candidates:
    """The k best candidates, in candidate order."""
    pos = np.arange(min(k, c.ids.size)) if c.ordered else first(c.logits, min(k, c.ids.size))
    return Candidates(c.ids[pos], c.logits[pos], True)


def _by_id(c: Candidates, keep: np.ndarray) -> Candidates:
    """The candidates at positions ``keep``, in ascending id order."""
    keep = keep[np.argsort(c.ids[keep], kind="stable")]
    return Candidates(c.ids[keep], c.logits[keep], False)


def draw(c: Candidates, temperature: float, u: float) -> int:
    w = _weights(c, temperature)
    pos, i = _walk(c, w, u * _mass(c, w), "right")
    return int(c.ids[pos[i]])


def sample(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] | np.ndarray,
    position: int,
    stream: int = 0,
    mask: np.ndarray | None = None,
    state: SamplerState | None = None,
) -> int:
    """One token id from a float32 logits row; position keys the Philox draw; ``state``:
    the request's (DRY's breakers, Mirostat's and adaptive-p's running values)."""
    if params.plain and mask is None:
        return int(np.argmax(logits))
    x = permitted(logits, params, history, mask, state)
    if params.greedy:
        return int(np.argmax(x))
    return pick(x, params, position, stream, state)


def pick(
    x: np.ndarray,
    params: SamplingParams,
    position: int,
    stream: int,
    state: SamplerState | None,
    head: Candidates | None = None,
) -> int:
    """A sampled pick from an adjusted row: the cuts, the temperature and the draw; ``head``:
    the row's top_k cut found already (only where ``top_k_leads`` and that cut applies)."""
    if not params.extended:
        return draw(truncate(x, params, head), params.temperature, philox.uniform(params.seed, position, stream))
    u, u_xtc = philox.uniforms(params.seed, position, stream)
    state = state if state is not None else SamplerState()
    if params.mirostat:
        return _mirostat(x, params, u, state)
    c, t = chain(x, params, u_xtc, head, state.infill)
    if params.adaptive_target >= 0.0 and "a" in params.order:
        return _adaptive(c, t, params, u, state)
    return draw(c, t, u)


def chain(
    x: np.ndarray,
    p: SamplingParams,
    u_xtc: float | None,
    head: Candidates | None = None,
    vocab: stages.InfillVocab | None = None,
) -> tuple[Candidates, float]:
    """The candidates an extended pick draws from and the temperature it draws at: the cut
    stages in the request's order (penalties and DRY ran on the row already); XTC
    applies when its draw ``u_xtc`` falls at or under its probability (None: never);
    ``head``: the top_k cut found already, so the stages after it run on it; the infill
    stage reads ``vocab``."""
    c, t, order = candidates(x, 0), 1.0, p.order
    if head is not None:
        c, order = head, order.partition("k")[2]
    for stage in order:
        if stage == "k" and 0 < p.top_k < c.ids.size:
            c = _head(c, p.top_k)
        elif stage == "m":
            c = apply_min_p(c, p.min_p, t, p.min_keep)
        elif stage == "p":
            c = apply_top_p(c, p.top_p, t, p.min_keep)
        elif stage == "s" and p.top_n_sigma > 0.0 and c.ids.size > 1:
            c = _by_id(c, np.flatnonzero(stages.top_n_sigma(c.logits, t, p.top_n_sigma)))
        elif stage == "y" and p.typical_p < 1.0:
            c = _head(c, c.ids.size)
            c = _by_id(c, stages.typical(c.logits, t, p.typical_p, p.min_keep))
        elif stage == "x" and u_xtc is not None and _xtc_fires(p, u_xtc) and c.ids.size > 1:
            c = _head(c, c.ids.size)
            drop = stages.xtc(c.logits, t, p.xtc_threshold, p.min_keep)
            c = Candidates(c.ids[drop:], c.logits[drop:], True)
        elif stage == "t":
            c, t = _temperature(c, t, p)
        elif stage == "i":
            c = _infill(c, t, vocab)
    return c, t


def _infill(c: Candidates, t: float, vocab: stages.InfillVocab | None) -> Candidates:
    """The infill stage's survivors, with their logits (the draw weighs them afresh, as
    llama.cpp's does); the end token alone when no text token is likely."""
    if vocab is None:
        raise ValueError("the infill sampler needs the vocabulary (SamplerState.infill)")
    c = _head(c, c.ids.size)
    kept = stages.infill(c.ids, c.logits, t, vocab)
    if kept is None:
        return Candidates(np.array([vocab.end], np.intp), np.ones(1, F32), True)
    return Candidates(c.ids[kept[0]], c.logits[kept[0]], True)


def _xtc_fires(p: SamplingParams, u: float) -> bool:
    return p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5 and u <= p.xtc_probability


def _temperature(c: Candidates, t: float, p: SamplingParams) -> tuple[Candidates, float]:
    """Temperature, or the dynamic one; a temperature of 0 leaves the best candidate alone."""
    if p.dynatemp_range <= 0.0:
        return c, t * p.temperature
    if c.ids.size <= 1:
        return c, t
    dyn = stages.dynatemp(c.logits, t, p)
    return (_head(c, 1), t) if dyn <= 0.0 else (c, t * dyn)


def _mirostat(x: np.ndarray, p: SamplingParams, u: float, state: SamplerState) -> int:
    """Mirostat v1 / v2 over the whole adjusted row at the temperature (llama.cpp's chain
    in Mirostat mode has no other cut); mu moves toward the target surprise."""
    c = candidates(x, 0)
    mu = state.mu if state.mu is not None else 2.0 * p.mirostat_tau
    q = stages.softmax(c.logits, p.temperature)  # ascending id: only the head is sorted
    if p.mirostat == 1:
        q = q[first(c.logits, min(stages.MIROSTAT_M, q.size))]
    head = _head(c, stages.mirostat_cut(q, p, mu, x.size))
    q = stages.softmax(head.logits, p.temperature)
    i = stages.choose(q, u)
    state.mu = stages.mirostat_update(mu, p, float(q[i]))
    return int(head.ids[i])


def _adaptive(c: Candidates, t: float, p: SamplingParams, u: float, state: SamplerState) -> int:
    """adaptive-p's pick from the chain's survivors; the picked token's probability before
    the transform moves the running average."""
    c = _head(c, c.ids.size)
    q = stages.softmax(c.logits, t)
    i = stages.choose(stages.softmax(stages.adaptive_logits(q, p, state), 1.0), u)
    stages.adaptive_update(state, p, float(q[i]))
    return int(c.ids[i])


def survivors(
    x: np.ndarray, params: SamplingParams, state: SamplerState | None = None
) -> tuple[Candidates, float]:
    """The candidates a sampled pick draws from and its temperature, as far as they follow
    from the row alone (XTC's draw, Mirostat's and adaptive-p's state left out)."""
    if not params.extended:
        return truncate(x, params), params.temperature
    if params.mirostat:
        return candidates(x, 0), params.temperature
    return chain(x, params, None, vocab=state.infill if state is not None else None)


def adjust(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] | np.ndarray,
    mask: np.ndarray | None = None,
    state: SamplerState | None = None,
) -> np.ndarray:
    """The chain's first stages, which greedy picks run too: bias -> mask -> penalties -> DRY."""
    x = apply_logit_bias(np.asarray(logits, F32), params.bias)
    x = apply_penalties(apply_mask(x, params.allowed, mask), history, params)
    return dry.apply(x, history, params, state.breakers if state is not None else {}) if params.dry else x


def permitted(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] | np.ndarray,
    mask: np.ndarray | None = None,
    state: SamplerState | None = None,
) -> np.ndarray:
    """``adjust``, refusing a row in which no token survives (ValueError)."""
    x = adjust(logits, params, history, mask, state)
    if not x.max() > -np.inf:
        raise ValueError("no token is permitted: allowed / grammar mask / bias excluded all")
    return x


def truncate(x: np.ndarray, params: SamplingParams, head: Candidates | None = None) -> Candidates:
    """The cuts a sampled pick makes on an adjusted row: top_k (or ``head``, its cut found
    already) -> min_p -> top_p."""
    c = candidates(x, params.top_k) if head is None else head
    return apply_top_p(apply_min_p(c, params.min_p), params.top_p)


def probabilities(
    logits: np.ndarray,
    params: SamplingParams,
    history: Sequence[int] | np.ndarray,
    mask: np.ndarray | None = None,
    state: SamplerState | None = None,
) -> npt.NDArray[np.float64]:
    """The distribution ``sample`` draws from, over the whole vocabulary (float64): the
    survivors of the chain weighted at the temperature; a point mass when greedy."""
    x = permitted(logits, params, history, mask, state)
    p = np.zeros(x.size, np.float64)
    if params.greedy:
        p[int(np.argmax(x))] = 1.0
        return p
    c, t = survivors(x, params, state)
    w = _weights(c, t)
    p[c.ids] = w / _mass(c, w)
    return p


def top_logprobs(
    logits: np.ndarray, k: int, allowed: Sequence[int] | np.ndarray | None = None
) -> tuple[np.ndarray, list[tuple[int, float]]]:
    """Log-softmax of the raw row (renormalised over allowed) and its k best (id, logprob)."""
    x = np.asarray(logits, F32)
    if allowed is not None:
        x = apply_mask(x, np.unique(np.asarray(allowed, np.int64)).tolist(), None)
    return _log_softmax_top(x, k)


def processed_logprobs(
    logits: np.ndarray,
    k: int,
    params: SamplingParams,
    history: Sequence[int] | np.ndarray,
    mask: np.ndarray | None = None,
    state: SamplerState | None = None,
) -> tuple[np.ndarray, list[tuple[int, float]]]:
    """The distribution ``sample`` draws from, as log-probabilities, and its k best.

    The row runs through the same stages: bias, mask, penalties, then (when sampling)
    top_k, min_p, top_p and temperature; a token a stage cuts is -inf, so it never
    appears among the k best. A greedy pick has no temperature to apply, so its
    distribution is the log-softmax of the adjusted row (vLLM's processed_logprobs does
    the same).
    """
    x = permitted(logits, params, history, mask, state)
    if params.greedy:
        return _log_softmax_top(x, k)
    c, t = survivors(x, params, state)
    # over the survivors only: a row that is mostly -inf is slow to partition
    z = (c.logits.astype(np.float64) - float(c.logits.max())) / t
    lz = (z - math.log(np.exp(z).sum())).astype(F32)
    lp = np.full(x.size, -np.inf, F32)
    lp[c.ids] = lz
    n = min(k, lz.size)
    pos = first(lz, n) if n > 0 else np.empty(0, np.intp)  # candidate order: ties to lower id
    return lp, [(int(c.ids[i]), float(lz[i])) for i in pos]


def _log_softmax_top(x: np.ndarray, k: int) -> tuple[np.ndarray, list[tuple[int, float]]]:
    d = x - x.max()
    lp = d - F32(math.log(np.exp(d).sum(dtype=np.float64)))
    n = min(k, int(np.count_nonzero(lp > -np.inf)))
    top = first(lp, n) if n > 0 else np.empty(0, np.intp)
    return lp, [(int(i), float(lp[i])) for i in top]
