"""The batched sampler (one call over a step's rows) against sampler.sample, row by row.

Rows of a step carry every parameter combination at once, beside each other: a token must
be the one sampler.sample picks for that row alone, and a row that cannot be sampled
must fail alone, with sample's message.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_core.contract.options import SamplingParams
from strata_core.engine.batch_sampler import Row, _tops, sample_rows
from strata_core.engine.sampler import first, sample
from strata_core.engine.stages import InfillVocab, SamplerState

VOCAB = 1200  # above the lazy walk's first block (256), so top_p and draws widen it
#: the infill stage's vocabulary: hex pieces, many prefixes of others; two end tokens
INFILL = InfillVocab(tuple(b"" if t < 2 else f"{t:x}".encode() for t in range(VOCAB)), frozenset({0, 1}), 0)


def _params(draw: st.DrawFn, vocab: int) -> SamplingParams:
    ids = st.integers(0, vocab - 1)
    return SamplingParams(
        temperature=draw(st.sampled_from([0.0, 0.3, 1.0, 2.5])),
        top_k=draw(st.sampled_from([0, 1, 5, 40, 300])),
        top_p=draw(st.sampled_from([1.0, 0.9, 0.5, 0.05])),
        min_p=draw(st.sampled_from([0.0, 0.05, 0.3])),
        penalty_repeat=draw(st.sampled_from([1.0, 1.3, 0.8])),
        penalty_freq=draw(st.sampled_from([0.0, 0.5, -0.25])),
        penalty_present=draw(st.sampled_from([0.0, 0.75])),
        penalty_last_n=draw(st.sampled_from([0, 8, 64])),
        seed=draw(st.integers(0, 2**64 - 1)),
        bias=draw(st.dictionaries(ids, st.sampled_from([-np.inf, -3.0, 0.5, 9.0]), max_size=4)),
        allowed=draw(st.none() | st.lists(ids, min_size=1, max_size=30).map(tuple)),
        **(draw(_further()) if draw(st.booleans()) else {}),
    )


@st.composite
def _further(draw: st.DrawFn) -> dict[str, Any]:
    """llama.cpp's further stages (each off in some draws) and an order of its own."""
    return {
        "typical_p": draw(st.sampled_from([1.0, 0.9, 0.3])),
        "top_n_sigma": draw(st.sampled_from([-1.0, 0.5, 2.0])),
        "xtc_probability": draw(st.sampled_from([0.0, 0.5, 1.0])),
        "xtc_threshold": draw(st.sampled_from([0.1, 0.01, 0.6])),
        "dry_multiplier": draw(st.sampled_from([0.0, 0.8, 3.0])),
        "dry_base": draw(st.sampled_from([1.75, 1.0, 3.0])),
        "dry_allowed_length": draw(st.sampled_from([0, 1, 2])),
        "dry_penalty_last_n": draw(st.sampled_from([64, 8, -1, 0])),
        "dynatemp_range": draw(st.sampled_from([0.0, 0.5, 3.0])),
        "dynatemp_exponent": draw(st.sampled_from([1.0, 0.5, 2.0])),
        "mirostat": draw(st.sampled_from([0, 0, 1, 2])),
        "mirostat_tau": draw(st.sampled_from([5.0, 1.0])),
        "mirostat_eta": draw(st.sampled_from([0.1, 0.5])),
        "adaptive_target": draw(st.sampled_from([-1.0, 0.3, 0.9])),
        "adaptive_decay": draw(st.sampled_from([0.9, 0.0])),
        "min_keep": draw(st.sampled_from([0, 1, 3, 50])),
        "samplers": draw(st.none() | st.lists(st.sampled_from("edskympxtai"), min_size=1, max_size=10).map("".join)),
    }


@st.composite
def steps(draw: st.DrawFn) -> tuple[np.ndarray, list[Row]]:
    """A step's logits matrix and its rows: plain ones beside every combination."""
    n = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.5, 2.0]))
    x = rng.normal(0.0, scale, (n, VOCAB)).astype(np.float32)
    if draw(st.booleans()):  # ties at every cut
        x = (np.round(x * 2) / 2).astype(np.float32)
    rows = []
    for _ in range(n):
        params = SamplingParams() if draw(st.booleans()) else _params(draw, VOCAB)
        history = rng.integers(0, VOCAB, draw(st.integers(0, 80))).tolist()
        if draw(st.integers(0, 20)) == 0:
            history.append(VOCAB + 5)  # out of range: that row fails, when penalised
        mask = None
        if draw(st.booleans()):
            mask = rng.random(VOCAB) < draw(st.sampled_from([0.0, 0.002, 0.3, 1.0]))
        if draw(st.integers(0, 3)) == 0:  # repeats for DRY to find
            history += history[-draw(st.integers(1, 10)) :] * 3
        state = SamplerState(breakers={int(history[0]): ((),)} if history else {}, mu=draw(st.none() | st.just(3.0)),
                             infill=INFILL)  # fmt: skip
        rows.append(Row(params, history, draw(st.integers(0, 5000)), draw(st.integers(0, 3)), mask, state))
    return x, rows


def _one(logits: np.ndarray, r: Row) -> int | str:
    try:
        return sample(logits, r.params, r.history, r.position, r.stream, r.mask, copy.deepcopy(r.state))
    except ValueError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(steps())
def test_batched_rows_are_the_per_row_tokens(step: tuple[np.ndarray, list[Row]]) -> None:
    _per_row(*step)


def _per_row(x: np.ndarray, rows: list[Row]) -> None:
    """The batch's token (or error) for each row is sample's for that row alone."""
    out = sample_rows(x, [r._replace(state=copy.deepcopy(r.state)) for r in rows])
    got = [out.errors[i] if i in out.errors else int(out.tokens[i]) for i in range(len(rows))]
    assert got == [_one(x[i], r) for i, r in enumerate(rows)]


def test_the_fixture_sees_each_stage() -> None:
    """Each stage the batch applies changes a token somewhere (a test that can fail)."""
    rng = np.random.default_rng(5)
    x = rng.normal(0.0, 1.0, (1, VOCAB)).astype(np.float32)
    top = int(np.argmax(x[0]))
    history = [top] * 4
    variants = {
        "bias": SamplingParams(bias={top: -np.inf}),
        "allowed": SamplingParams(allowed=(3, 4)),
        "penalty": SamplingParams(penalty_repeat=50.0, penalty_last_n=8),
        "sampled": SamplingParams(temperature=5.0, seed=3),
    }
    for name, params in variants.items():
        got = int(sample_rows(x, [Row(params, history, 11)]).tokens[0])
        assert got != top, name
        assert got == sample(x[0], params, history, 11), name
    mask = np.zeros(VOCAB, bool)
    mask[7] = True
    assert sample_rows(x, [Row(SamplingParams(), (), 0, 0, mask)]).tokens[0] == 7


FURTHER: dict[str, dict[str, Any]] = {
    "typical_p": {"typical_p": 0.3}, "top_n_sigma": {"top_n_sigma": 0.3},
    "xtc": {"xtc_probability": 1.0, "xtc_threshold": 0.01}, "dynatemp": {"dynatemp_range": 1.5},
    "mirostat1": {"mirostat": 1, "mirostat_tau": 1.0}, "mirostat2": {"mirostat": 2, "mirostat_tau": 1.0},
    "adaptive_p": {"adaptive_target": 0.05, "samplers": "kta"}, "min_keep": {"min_keep": 30},
    "samplers": {"samplers": "tkp"}, "dry": {"dry_multiplier": 5.0, "dry_allowed_length": 1},
}  # fmt: skip


@pytest.mark.parametrize("name", list(FURTHER))
def test_the_fixture_sees_each_further_stage(name: str) -> None:
    """Each of llama.cpp's further stages moves some of 64 seeded picks off the plain
    chain's (a test that can fail), and the batch's picks are the per-row ones, state and all."""
    rng = np.random.default_rng(6)
    x = (rng.normal(0.0, 1.0, (64, VOCAB)) * 3).astype(np.float32)
    base = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, min_p=0.01, seed=4)
    params = SamplingParams(**{**{f: getattr(base, f) for f in ("temperature", "top_k", "top_p", "min_p", "seed")},
                               **FURTHER[name]})  # fmt: skip
    history = [int(t) for t in np.argsort(-x[0])[:3]] * 4  # DRY: the row's best tokens repeat
    plain = sample_rows(x, [Row(base, history, i) for i in range(64)]).tokens
    batch_state, row_state = SamplerState(), SamplerState()
    got = sample_rows(x, [Row(params, history, i, 0, None, batch_state) for i in range(64)]).tokens
    assert (got != plain).any(), name
    assert got.tolist() == [sample(x[i], params, history, i, 0, None, row_state) for i in range(64)]
    assert batch_state == row_state


@pytest.mark.parametrize("plain_rows", [64, 48])
def test_a_large_step_matches(plain_rows: int) -> None:
    """A 64-row step on the default model's vocabulary: plain rows with sampled ones among them."""
    rng = np.random.default_rng(plain_rows)
    x = rng.normal(0.0, 2.0, (64, 49_152)).astype(np.float32)
    sampled = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=9)
    rows = [Row(SamplingParams() if i < plain_rows else sampled, (), 100 + i) for i in range(64)]
    out = sample_rows(x, rows)
    assert not out.errors
    assert out.tokens.tolist() == [sample(x[i], r.params, r.history, r.position) for i, r in enumerate(rows)]


@st.composite
def biased_steps(draw: st.DrawFn) -> tuple[np.ndarray, list[Row]]:
    """Greedy rows under a logit bias only (their token is read off the raw argmax), with
    ties, biases on and around the argmax, and rows with no finite logit."""
    n = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (np.round(rng.normal(0.0, 1.0, (n, VOCAB)) * 2) / 2).astype(np.float32)
    if draw(st.integers(0, 9)) == 0:
        x[0] = -np.inf
    rows = []
    for i in range(n):
        top = int(np.argmax(x[i]))
        near = st.sampled_from([top, max(top - 1, 0), min(top + 1, VOCAB - 1), 0, VOCAB - 1]) | st.integers(0, VOCAB - 1)
        bias = draw(st.dictionaries(near, st.sampled_from([-np.inf, -0.5, 0.0, 0.5, 1.0, 9.0]), min_size=1, max_size=5))
        rows.append(Row(SamplingParams(bias=bias), (), i))
    return x, rows


@settings(max_examples=300, deadline=None)
@given(biased_steps())
def test_biased_greedy_rows_are_the_per_row_tokens(step: tuple[np.ndarray, list[Row]]) -> None:
    _per_row(*step)


@st.composite
def head_steps(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """Rows for the batched top_k head: odd widths (a short last block), ties, -inf runs and NaN."""
    n, vocab = draw(st.integers(1, 5)), draw(st.sampled_from([2, 7, 1200, 3001]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(0.0, 1.0, (n, vocab)).astype(np.float32)
    if draw(st.booleans()):
        x = (np.round(x * draw(st.sampled_from([1, 4]))) / 4).astype(np.float32)
    for i in range(n):
        kind = draw(st.sampled_from(["plain", "masked", "flat", "nan", "negzero"]))
        if kind == "masked":
            x[i, rng.random(vocab) < draw(st.sampled_from([0.5, 0.99, 1.0]))] = -np.inf
        elif kind == "flat":
            x[i] = 1.0
        elif kind == "nan":
            x[i, rng.integers(0, vocab)] = np.nan
        elif kind == "negzero":
            x[i, rng.integers(0, vocab, 3)] = draw(st.sampled_from([0.0, -0.0]))
    return x, draw(st.integers(1, vocab - 1))


@settings(max_examples=300, deadline=None)
@given(head_steps())
def test_the_batched_top_k_head_is_each_rows_own(step: tuple[np.ndarray, int]) -> None:
    """_tops finds what sampler.first finds on each row alone, whatever the row holds."""
    x, m = step
    got = _tops(x, np.arange(x.shape[0]), m)
    for i in range(x.shape[0]):
        assert got[i].tolist() == first(x[i], m).tolist()


def test_rows_of_several_top_k_in_one_step() -> None:
    """Rows with different top_k (and orders that do or do not start with it) beside each other."""
    rng = np.random.default_rng(8)
    x = rng.normal(0.0, 2.0, (8, 5000)).astype(np.float32)
    orders = [None, "kpt", "skt", "tk", "pk"]
    rows = [Row(SamplingParams(temperature=1.0, top_k=k, top_p=0.9, seed=2, samplers=orders[i % 5]), (), i)
            for i, k in enumerate([1, 40, 40, 300, 4999, 40, 2, 1000])]  # fmt: skip
    assert sample_rows(x, rows).tokens.tolist() == [sample(x[i], r.params, r.history, r.position) for i, r in enumerate(rows)]


@st.composite
def chain_steps(draw: st.DrawFn) -> tuple[np.ndarray, list[Row]]:
    """Rows of the old chain only (top_k -> min_p -> top_p -> temperature), which the batch
    cuts and draws as one matrix: heads of different sizes (-inf cut some), ties, extremes."""
    n = draw(st.integers(2, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.normal(0.0, 1.0, (n, VOCAB)) * draw(st.sampled_from([0.1, 3.0]))).astype(np.float32)
    if draw(st.booleans()):
        x = np.round(x).astype(np.float32)
    rows = []
    for i in range(n):
        if draw(st.integers(0, 4)) == 0:
            x[i, rng.random(VOCAB) < 0.995] = -np.inf  # fewer permitted than top_k
        params = SamplingParams(
            temperature=draw(st.sampled_from([0.01, 0.7, 1.0, 4.0])),
            top_k=draw(st.sampled_from([1, 2, 40, 300, VOCAB - 1])),
            top_p=draw(st.sampled_from([1.0, 0.95, 0.5, 0.01])),
            min_p=draw(st.sampled_from([0.0, 0.05, 0.9])),
            seed=draw(st.integers(0, 2**64 - 1)),
        )
        rows.append(Row(params, (), draw(st.integers(0, 5000)), draw(st.integers(0, 3))))
    return x, rows


@settings(max_examples=300, deadline=None)
@given(chain_steps())
def test_old_chain_rows_drawn_together_are_the_per_row_tokens(step: tuple[np.ndarray, list[Row]]) -> None:
    _per_row(*step)
