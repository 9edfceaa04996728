"""One sampler call per step: every logits row of the step at once (sampler.py's chain).

The rows of a step are a matrix; each row brings its request's parameters, its history,
the position keying its Philox draw and, under a grammar, its mask. What is the same
arithmetic for every row runs once over the matrix: the raw argmax of every plain row,
then for the others logit bias, ``allowed``, penalties (one scatter each over all rows),
the grammar masks (a row each), the "nothing permitted" check and the greedy picks (one
argmax). DRY's sequence matching runs per row, over the row's own history. The top_k cut
of every sampled row whose chain starts with it (the costly step: the best k of the whole
row) is found for all rows of the same top_k together, reading only the blocks of each
row that can hold them (``_tops``); the rows of the old chain (top_k -> min_p -> top_p ->
temperature) then make their cuts and draws as one padded matrix (``_draw_heads``). The
further stages' cuts and draws run per row (sampler.pick: the cuts in the row's order,
each with its own Philox uniforms and its request's state). Every value is computed by
the same float32 / float64 operations as sampler.sample on that row alone, so a token
never depends on the rows beside it (tests/test_batch_sampler.py checks this row by row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from strata_core.contract.options import SamplingParams
from strata_core.engine import dry, philox
from strata_core.engine.sampler import F32, Candidates, best, first, in_order, pick, top_k_leads
from strata_core.engine.stages import SamplerState

_BLOCK = 64  # columns per block when bounding each row's top_k (``_tops``)


class Row(NamedTuple):
    """What one logits row is sampled with."""

    params: SamplingParams
    history: Sequence[int] | np.ndarray  # the tokens before it (penalties read their tail)
    position: int  # keys the Philox draw
    stream: int = 0
    mask: npt.NDArray[np.bool_] | None = None  # True = permitted (a grammar's)
    state: SamplerState | None = None  # the request's (DRY's breakers, Mirostat's mu, ...)


#: Any plain row (greedy over the raw logits, no mask): its token needs nothing else.
PLAIN = Row(SamplingParams(), (), 0)


class Sampled(NamedTuple):
    tokens: npt.NDArray[np.int64]  # -1 where the row failed
    errors: dict[int, str]  # row -> why no token could be sampled (the request's error)


def sample_rows(logits: np.ndarray, rows: Sequence[Row | None]) -> Sampled:
    """A token for each row of ``logits`` (n x n_vocab float32), as sampler.sample picks it;
    a row given as None is not sampled (its token is -1)."""
    n = len(rows)
    tokens = np.full(n, -1, np.int64)
    errors: dict[int, str] = {}
    plain = np.array([r is PLAIN or (r is not None and r.mask is None and r.params.plain) for r in rows], bool)
    biased = np.array([r is not None and not plain[i] and r.mask is None and r.params.biased_argmax
                       for i, r in enumerate(rows)], bool)  # fmt: skip
    raw = plain | biased  # rows that start from the raw argmax
    count = int(raw.sum())
    if 2 * count >= n and count:  # the default request: one argmax over the raw rows
        tokens[raw] = np.argmax(logits, axis=1)[raw]
    elif count:  # few: a copy of their rows costs less than an argmax over all
        tokens[raw] = np.argmax(logits[raw], axis=1)
    for i in np.flatnonzero(biased).tolist():
        r = rows[i]
        assert r is not None
        tokens[i] = _biased_argmax(logits[i], int(tokens[i]), r.params.bias)
    rest = np.fromiter((i for i, r in enumerate(rows) if r is not None and not plain[i] and tokens[i] < 0), np.intp)
    if rest.size:
        _adjusted_rows(logits, [r for i in rest if (r := rows[i]) is not None], rest, tokens, errors)
    return Sampled(tokens, errors)


def _biased_argmax(x: np.ndarray, m: int, bias: Mapping[int, float]) -> int:
    """argmax(x + bias) from the raw argmax ``m`` of ``x`` without touching the row: only
    the biased ids can overtake ``m`` (ties to the lower id, as np.argmax); -1 where the
    bias moves ``m`` itself or the row has no finite logit (the whole chain decides)."""
    best = x[m]
    if m in bias or best == -np.inf:
        return -1
    pick = m
    for t, b in bias.items():
        y = x[t] + F32(b)
        if y > best or (y == best and t < pick):
            best, pick = y, t
    return pick


def _adjusted_rows(
    logits: np.ndarray, rows: list[Row], index: npt.NDArray[np.intp], tokens: np.ndarray, errors: dict[int, str]
) -> None:
    """Bias, masks and penalties over the rows together, then each row's pick."""
    x = np.array(logits[index], F32)  # a copy: the stages write to it
    vocab = x.shape[1]
    _add_bias(x, rows)
    _keep_allowed(x, rows)
    for i, r in enumerate(rows):
        if r.mask is not None:
            x[i] = np.where(r.mask, x[i], F32(-np.inf))
    bad = _penalise(x, rows)
    for i, r in enumerate(rows):  # DRY's matching is the row's own history's
        if r.params.dry and i not in bad:
            x[i] = dry.apply(x[i], r.history, r.params, r.state.breakers if r.state is not None else {})
    alive = x.max(axis=1) > -np.inf
    greedy = np.fromiter((r.params.greedy for r in rows), bool, len(rows))
    picks = np.argmax(x, axis=1) if greedy.any() else None
    heads = _heads(x, rows, [i for i, r in enumerate(rows) if alive[i] and i not in bad])
    drawn = _draw_heads(rows, {i: c for i, c in heads.items() if not rows[i].params.extended})
    for i, r in enumerate(rows):
        at = int(index[i])
        if i in bad:
            errors[at] = f"history holds a token id outside [0, {vocab})"
        elif not alive[i]:
            errors[at] = "no token is permitted: allowed / grammar mask / bias excluded all"
        elif picks is not None and greedy[i]:
            tokens[at] = picks[i]
        elif i in drawn:
            tokens[at] = drawn[i]
        else:
            tokens[at] = pick(x[i], r.params, r.position, r.stream, r.state, heads.get(i))


def _heads(x: np.ndarray, rows: list[Row], live: list[int]) -> dict[int, Candidates]:
    """The top_k cut of every live row whose pick starts with it (sampler.top_k_leads),
    found for all rows of the same top_k at once (``_tops``)."""
    vocab = x.shape[1]
    by_k: dict[int, list[int]] = {}
    for i in live:
        p = rows[i].params
        if top_k_leads(p) and p.top_k < vocab and (not p.extended or np.count_nonzero(x[i] > -np.inf) > p.top_k):
            by_k.setdefault(p.top_k, []).append(i)
    heads: dict[int, Candidates] = {}
    for k, which in by_k.items():
        for i, ids in zip(which, _tops(x, np.array(which, np.intp), k), strict=True):
            heads[i] = best(x[i], ids)
    return heads


def _draw_heads(rows: list[Row], heads: dict[int, Candidates]) -> dict[int, int]:
    """min_p -> top_p -> temperature -> draw (sampler.truncate and sampler.draw) for every
    row of the old chain from its top_k head, as one matrix padded with -inf: each cut
    keeps a prefix of the head; weights are the same elementwise float64 exps, and the
    masses the same sequential sums (cumsum, in the same order; the padding adds 0.0)."""
    if len(heads) < 2:
        return {}
    at = list(heads)
    params = [rows[i].params for i in at]
    width = max(c.ids.size for c in heads.values())
    ids = np.full((len(at), width), np.iinfo(np.intp).max, np.intp)  # padding sorts last by id
    logits = np.full((len(at), width), -np.inf, np.float64)
    for j, i in enumerate(at):
        ids[j, : heads[i].ids.size], logits[j, : heads[i].ids.size] = heads[i].ids, heads[i].logits
    size = np.fromiter((heads[i].ids.size for i in at), np.intp, len(at))
    top = logits[:, :1]  # candidate order: the head's first is its max
    log_min_p = np.array([math.log(p.min_p) if p.min_p > 0.0 else -np.inf for p in params])
    size = np.minimum(size, (logits >= top + log_min_p[:, None]).sum(axis=1))
    by_id = np.argsort(ids, axis=1, kind="stable")
    top_p = np.array([p.top_p for p in params])
    cut = _walk_prefix(np.exp(logits - top), size, by_id, top_p, "left")
    size = np.where(top_p < 1.0, cut + 1, size)
    u = np.array([philox.uniform(p.seed, rows[i].position, rows[i].stream) for i, p in zip(at, params, strict=True)])
    t = np.array([p.temperature for p in params])
    chosen = _walk_prefix(np.exp((logits - top) / t[:, None]), size, by_id, u, "right")
    return {i: int(ids[j, chosen[j]]) for j, i in enumerate(at)}


def _walk_prefix(
    weights: np.ndarray, size: np.ndarray, by_id: np.ndarray, share: np.ndarray, side: Literal["left", "right"]
) -> npt.NDArray[np.intp]:
    """sampler._walk on each row's first ``size`` candidates: the position where the running
    mass first passes ``share`` of the prefix's mass (summed in ascending id order)."""
    inside = np.arange(weights.shape[1]) < size[:, None]
    w = np.where(inside, weights, 0.0)
    target = share * np.cumsum(np.take_along_axis(w, by_id, axis=1), axis=1)[:, -1]
    running = np.cumsum(w, axis=1)
    passed = running < target[:, None] if side == "left" else running <= target[:, None]
    return np.minimum(size - 1, (passed & inside).sum(axis=1))


def _tops(x: np.ndarray, which: npt.NDArray[np.intp], m: int) -> list[npt.NDArray[np.intp]]:
    """sampler.first(x[i], m) for each row i in ``which`` (0 < m < vocab), without a
    partition of each whole row: the m-th largest of a row's block maxima is at or under
    its m-th best value (m blocks reach it), so only the blocks reaching it are read.
    A row whose bound reaches many blocks (ties, -inf, NaN) takes first() itself."""
    n = x.shape[1]
    b = min(_BLOCK, max(1, n // (8 * m)))  # at least 8m blocks
    sub = x if which.size == x.shape[0] else x[which]
    peaks = np.maximum.reduceat(sub, np.arange(0, n, b), axis=1)
    bound = np.partition(peaks, peaks.shape[1] - m, axis=1)[:, peaks.shape[1] - m]
    reached = peaks >= bound[:, None]
    few = (reached.sum(axis=1) <= 4 * m) & ~np.isnan(peaks).any(axis=1)
    rb, cb = np.nonzero(reached & few[:, None])
    cols = cb[:, None] * b + np.arange(b)
    inside = cols < n  # the last block may be short
    cols = np.where(inside, cols, n - 1)
    keep = (sub[rb[:, None], cols] >= bound[rb][:, None]) & inside
    counts = np.bincount(rb, keep.sum(axis=1), len(which)).astype(np.intp)
    found = np.split(cols[keep], np.cumsum(counts)[:-1])
    return [in_order(sub[j], found[j])[:m] if few[j] else first(sub[j], m) for j in range(len(which))]


def _scatter(rows: list[Row], ids_of: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(row, id) pairs flattened over the rows."""
    counts = [len(ids) for ids in ids_of]
    which = np.repeat(np.arange(len(rows)), counts)
    ids = np.fromiter((i for ids in ids_of for i in ids), np.int64, sum(counts))
    return which, ids


def _add_bias(x: np.ndarray, rows: list[Row]) -> None:
    biased = [r.params.bias for r in rows]
    if not any(biased):
        return
    which, ids = _scatter(rows, [list(b.keys()) for b in biased])
    x[which, ids] += np.fromiter((v for b in biased for v in b.values()), F32, ids.size)


def _keep_allowed(x: np.ndarray, rows: list[Row]) -> None:
    lists = [r.params.allowed for r in rows]
    limited = [i for i, a in enumerate(lists) if a is not None]
    if not limited:
        return
    keep = np.zeros((len(limited), x.shape[1]), bool)
    which, ids = _scatter([rows[i] for i in limited], [lists[i] or () for i in limited])
    keep[which, ids] = True
    x[limited] = np.where(keep, x[limited], F32(-np.inf))


def _penalise(x: np.ndarray, rows: list[Row]) -> set[int]:
    """llama.cpp's repetition rule over each penalised row's window (sampler.apply_penalties);
    the rows whose history holds an id outside the vocabulary, left as they were."""
    vocab = x.shape[1]
    windows: dict[int, np.ndarray] = {}
    bad: set[int] = set()
    for i, r in enumerate(rows):
        p = r.params
        if not p.penalised:
            continue
        w = np.asarray(r.history[-p.penalty_last_n :], np.int64)
        if w.size and (w.min() < 0 or w.max() >= vocab):
            bad.add(i)
        elif w.size:
            windows[i] = w
    if not windows:
        return bad
    which = np.repeat(np.fromiter(windows, np.int64, len(windows)), [w.size for w in windows.values()])
    keys, counts = np.unique(which * vocab + np.concatenate(list(windows.values())), return_counts=True)
    r, ids = keys // vocab, keys % vocab
    params = [rows[i].params for i in range(len(rows))]
    rep = np.array([p.penalty_repeat for p in params], F32)[r]
    freq = np.array([p.penalty_freq for p in params], F32)[r]
    present = np.array([p.penalty_present for p in params], F32)[r]
    v = x[r, ids]
    v = np.where(v <= 0, v * rep, v / rep)
    v -= counts.astype(F32) * freq + present
    x[r, ids] = v
    return bad
