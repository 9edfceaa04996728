"""The vectorised sampler against the scalar reference, feature by feature.

Every fixture first shows that its feature changes the outcome under the reference
(so the comparison that follows can see the feature), then asserts the vectorised
sampler picks exactly the reference's token at every position.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_sampler import kept, reference_sample, reference_samples

from strata_core.contract.options import SamplingParams
from strata_core.engine import sampler
from strata_core.engine.sampler import sample, top_logprobs
from strata_core.engine.stages import SamplerState

N_VOCAB = 49_152
POSITIONS = range(6)


def _peaked(rng: np.random.Generator) -> np.ndarray:
    """LLM-like: a noisy tail with a head of 20 tokens that holds most of the mass."""
    x = rng.normal(0.0, 1.5, N_VOCAB).astype(np.float32)
    x[rng.choice(N_VOCAB, 20, replace=False)] = rng.uniform(6.0, 10.0, 20).astype(np.float32)
    return x


ROWS = {
    "peaked": _peaked(np.random.default_rng(1)),
    "flat": np.random.default_rng(2).normal(0.0, 1.0, N_VOCAB).astype(np.float32),
    # few distinct values: ties everywhere, including at every cut
    "dup": (np.round(np.random.default_rng(3).normal(0.0, 1.5, N_VOCAB) * 2) / 2).astype(
        np.float32
    ),
}
LISTS = {name: row.tolist() for name, row in ROWS.items()}
HEAD = {name: [int(i) for i in np.argsort(-row, kind="stable")[:8]] for name, row in ROWS.items()}
HISTORY = [int(i) for i in np.random.default_rng(4).integers(0, N_VOCAB, 200)]
T1 = SamplingParams(temperature=1.0, seed=7)


def draws(row: str, params: SamplingParams, history=HISTORY, mask=None) -> list[int]:
    return [sample(ROWS[row], params, history, p, mask=mask) for p in POSITIONS]


def check(row: str, base: SamplingParams, feature: SamplingParams, history=HISTORY, mask=None):
    """The feature is visible in the reference, and the sampler matches it exactly."""
    without = reference_samples(LISTS[row], base, history, POSITIONS)
    expected = reference_samples(LISTS[row], feature, history, POSITIONS, mask=mask)
    assert expected != without, "fixture cannot see its feature"
    assert draws(row, feature, history, mask) == expected


def test_greedy_ties_go_to_the_lower_id():
    x = ROWS["peaked"].copy()
    top = int(np.argmax(x))
    lower = top // 2
    assert sample(x, SamplingParams(), [], 0) == top
    x[lower] = x[top]
    assert sample(x, SamplingParams(), [], 0) == lower
    assert reference_sample(x.tolist(), SamplingParams(), [], 0) == lower
    # the same tie through the full greedy chain (bias forces the slow path)
    assert sample(x, SamplingParams(bias={0: 0.0}), [], 0) == lower


def test_logit_bias_greedy():
    check("peaked", SamplingParams(), SamplingParams(bias={HEAD["peaked"][5]: 5.0}))


def test_logit_bias_sampled():
    bias = {HEAD["peaked"][0]: -math.inf, HEAD["peaked"][3]: 2.5, 17: 12.0}
    check("peaked", T1, replace(T1, bias=bias))


def test_allowed_ids():
    allowed = tuple(int(i) for i in np.random.default_rng(5).choice(N_VOCAB, 50, replace=False))
    check("peaked", T1, replace(T1, allowed=allowed))
    assert set(draws("peaked", replace(T1, allowed=allowed))) <= set(allowed)


def test_grammar_mask():
    mask = np.random.default_rng(6).random(N_VOCAB) < 0.5
    check("peaked", T1, T1, mask=mask)
    assert all(mask[t] for t in draws("peaked", T1, mask=mask))


def test_allowed_and_mask_intersect():
    allowed = tuple(range(0, N_VOCAB, 97))
    mask = np.zeros(N_VOCAB, bool)
    mask[::2] = True
    check("flat", replace(T1, allowed=allowed), replace(T1, allowed=allowed), mask=mask)
    assert all(
        t % 2 == 0 and t % 97 == 0 for t in draws("flat", replace(T1, allowed=allowed), mask=mask)
    )


def test_nothing_permitted_is_an_error():
    params = SamplingParams(allowed=(3,))
    with pytest.raises(ValueError, match="no token is permitted"):
        sample(ROWS["flat"], params, [], 0, mask=np.zeros(N_VOCAB, bool))


def test_repeat_penalty_divides_positive_logits():
    head = HEAD["peaked"][0]
    check("peaked", SamplingParams(), SamplingParams(penalty_repeat=1.5, penalty_last_n=64), [head])


def test_repeat_penalty_multiplies_non_positive_logits():
    x = ROWS["peaked"] - np.float32(30.0)  # every logit negative
    top = int(np.argmax(x))
    params = SamplingParams(penalty_repeat=1.3, penalty_last_n=8)
    # dividing would raise a negative logit and keep it on top; llama.cpp's rule lowers it
    assert sample(x, params, [top], 0) != top
    assert sample(x, params, [top], 0) == reference_sample(x.tolist(), params, [top], 0)


def test_frequency_penalty_counts_occurrences():
    head = HEAD["peaked"][:3]
    history = [head[0]] * 5 + [head[1]] * 2 + [head[2]]
    base = replace(T1, penalty_last_n=64)
    check("peaked", base, replace(base, penalty_freq=0.8), history)


def test_presence_penalty_is_an_indicator():
    head = HEAD["peaked"][:3]
    base = replace(T1, penalty_last_n=64)
    check("peaked", base, replace(base, penalty_present=1.5), [head[0]] * 9 + head[1:])
    # presence ignores the count: 9 occurrences weigh the same as one
    once = replace(base, penalty_present=1.5)
    assert draws("peaked", once, head) == draws("peaked", once, [head[0]] * 9 + head[1:])


def test_penalty_window_is_the_last_n_of_history():
    head = HEAD["peaked"][0]
    history = [head] * 3 + HISTORY[:50]  # the head only appears before the last 50
    params = SamplingParams(penalty_repeat=2.0, penalty_last_n=64)
    check("peaked", replace(params, penalty_last_n=50), params, history)


def test_penalties_in_the_full_chain():
    history = HEAD["peaked"][:4] * 3 + HISTORY[:40]
    base = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, penalty_last_n=64, seed=11)
    full = replace(base, penalty_repeat=1.3, penalty_freq=0.3, penalty_present=0.4)
    check("peaked", base, full, history)


@pytest.mark.parametrize("k", [1, 5, 40, 1000])
def test_top_k(k):
    check("flat", replace(T1, temperature=1.5), replace(T1, temperature=1.5, top_k=k))


def test_top_k_ties_at_the_cut_keep_the_lower_ids():
    row = ROWS["dup"]
    x = row.tolist()
    params = replace(T1, top_k=7)
    order = kept(x, params)
    cut = x[order[-1]]
    tied = [i for i, v in enumerate(x) if v == cut]
    assert len(tied) > 1 and tied[-1] not in order  # the cut splits a run of equal logits
    check("dup", T1, params)


def test_top_k_equal_to_the_vocabulary_is_no_cut():
    for k in (N_VOCAB, N_VOCAB + 1):
        assert draws("flat", replace(T1, top_k=k)) == draws("flat", T1)
    assert draws("flat", replace(T1, top_k=N_VOCAB)) == reference_samples(
        LISTS["flat"], replace(T1, top_k=N_VOCAB), HISTORY, POSITIONS
    )


@pytest.mark.parametrize("min_p", [0.05, 0.5, 0.9])
def test_min_p(min_p):
    base = replace(T1, temperature=2.0)
    check("peaked", base, replace(base, min_p=min_p))


@pytest.mark.parametrize(
    ("row", "top_p", "top_k"),
    [("peaked", 0.5, 0), ("peaked", 0.9, 0), ("flat", 0.95, 0), ("flat", 0.3, 1000)],
)
def test_top_p(row, top_p, top_k):
    base = replace(T1, temperature=1.5, top_k=top_k)
    check(row, base, replace(base, top_p=top_p))


def test_temperature():
    check("peaked", replace(T1, temperature=0.3), replace(T1, temperature=1.5))


def test_duplicates_through_the_whole_chain():
    params = SamplingParams(temperature=0.9, top_k=500, min_p=0.01, top_p=0.8, seed=3)
    check("dup", replace(params, top_k=0, min_p=0.0, top_p=1.0), params)


def test_a_flat_draw_walks_past_the_first_block():
    params = replace(T1, temperature=2.0, seed=5)
    got = draws("flat", params)
    assert got == reference_samples(LISTS["flat"], params, HISTORY, POSITIONS)
    rank = {int(t): r for r, t in enumerate(np.argsort(-ROWS["flat"], kind="stable"))}
    assert max(rank[t] for t in got) > sampler._FIRST_BLOCK


def test_min_p_runs_before_top_p():
    x = np.log(np.array([4.0, 3.0, 2.0, 1.0], np.float32))
    c = sampler.candidates(x, 0)
    chained = sampler.apply_top_p(sampler.apply_min_p(c, 0.45), 0.75)
    reversed_ = sampler.apply_min_p(sampler.apply_top_p(c, 0.75), 0.45)
    assert chained.ids.tolist() == [0, 1]  # min_p keeps 3, renormalised: 4/9 + 3/9 >= 0.75
    assert reversed_.ids.tolist() == [0, 1, 2]
    params = SamplingParams(temperature=1.0, min_p=0.45, top_p=0.75)
    assert kept(x.tolist(), params) == [0, 1]
    assert {sample(x, replace(params, seed=s), [], 0) for s in range(64)} == {0, 1}


def test_seeded_replay_and_position_keyed_draws():
    params = replace(T1, temperature=1.5, top_k=100, seed=1234)
    first = [sample(ROWS["flat"], params, HISTORY, p) for p in range(16)]
    assert [sample(ROWS["flat"], params, HISTORY, p) for p in range(16)] == first
    assert len(set(first)) > 8  # positions draw independently
    # a draw depends on its own position only: asking out of order changes nothing
    assert [sample(ROWS["flat"], params, HISTORY, p) for p in reversed(range(16))] == first[::-1]
    other_seed = [sample(ROWS["flat"], replace(params, seed=1235), HISTORY, p) for p in range(16)]
    other_stream = [sample(ROWS["flat"], params, HISTORY, p, stream=1) for p in range(16)]
    assert other_seed != first and other_stream != first


def test_default_request_is_a_plain_argmax(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the default request must not run the chain")

    for name in ("apply_logit_bias", "apply_mask", "apply_penalties", "candidates", "draw"):
        monkeypatch.setattr(sampler, name, forbidden)
    monkeypatch.setattr(sampler.philox, "uniform", forbidden)
    params = SamplingParams()
    assert params.greedy and params.plain
    assert sample(ROWS["peaked"], params, HISTORY, 0) == int(np.argmax(ROWS["peaked"]))


def test_neutral_settings_add_nothing():
    x = ROWS["flat"]
    c = sampler.candidates(x, 0)
    assert sampler.apply_logit_bias(x, {}) is x
    assert sampler.apply_mask(x, None, None) is x
    assert sampler.apply_penalties(x, HISTORY, SamplingParams(penalty_last_n=64)) is x
    assert sampler.apply_min_p(c, 0.0) is c
    assert sampler.apply_top_p(c, 1.0) is c
    neutral = replace(T1, top_k=0, top_p=1.0, min_p=0.0, penalty_repeat=1.0, penalty_last_n=64)
    assert draws("flat", neutral) == draws("flat", T1)


# --- small vocabularies, random everything ---------------------------------------------

values = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, -math.inf]),
    st.floats(-30.0, 30.0, width=32),
)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 24))
    logits = draw(st.lists(values, min_size=n, max_size=n))
    if all(v == -math.inf for v in logits):
        logits[0] = 0.0  # a model's row always has a finite entry; masks may remove it
    ids = st.integers(0, n - 1)
    params = SamplingParams(
        temperature=draw(st.sampled_from([0.0, 0.7, 1.0]) | st.floats(0.05, 4.0)),
        top_k=draw(st.integers(0, n + 2)),
        top_p=draw(st.sampled_from([1.0, 0.5, 0.0]) | st.floats(0.0, 1.0)),
        min_p=draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0)),
        penalty_repeat=draw(st.sampled_from([1.0]) | st.floats(0.5, 2.0)),
        penalty_freq=draw(st.sampled_from([0.0]) | st.floats(-1.0, 1.0)),
        penalty_present=draw(st.sampled_from([0.0]) | st.floats(-1.0, 1.0)),
        penalty_last_n=draw(st.integers(0, 10)),
        seed=draw(st.integers(0, 2**64 - 1)),
        bias=draw(st.dictionaries(ids, st.floats(-5.0, 5.0) | st.just(-math.inf), max_size=3)),
        allowed=draw(st.none() | st.lists(ids, min_size=1, max_size=n).map(tuple)),
    )
    history = draw(st.lists(ids, max_size=16))
    mask = draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n))
    return logits, params, history, draw(st.integers(0, 2**40)), mask


@settings(max_examples=600, deadline=None)
@given(cases())
def test_matches_the_reference_on_small_vocabularies(case):
    logits, params, history, position, mask = case
    row = np.array(logits, np.float32)
    mask_row = None if mask is None else np.array(mask, bool)
    try:
        expected = reference_sample(logits, params, history, position, mask=mask)
    except ValueError:
        with pytest.raises(ValueError):
            sample(row, params, history, position, mask=mask_row)
        return
    assert sample(row, params, history, position, mask=mask_row) == expected


# --- logprobs ---------------------------------------------------------------------------


def test_top_logprobs_is_the_raw_log_softmax():
    x = ROWS["peaked"]
    lp, top = top_logprobs(x, 5)
    x64 = x.astype(np.float64)
    exact = x64 - (x64.max() + np.log(np.exp(x64 - x64.max()).sum()))
    np.testing.assert_allclose(lp, exact, atol=2e-5)
    assert [i for i, _ in top] == HEAD["peaked"][:5]
    assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def test_top_logprobs_ties_go_to_the_lower_id():
    x = ROWS["dup"]
    lp, top = top_logprobs(x, 20)
    assert [i for i, _ in top] == [int(i) for i in np.argsort(-x, kind="stable")[:20]]
    assert len({v for _, v in top}) < 20  # the fixture does tie


def test_top_logprobs_renormalise_over_allowed():
    allowed = [5, 17, 17, 400, 48_000]
    lp, top = top_logprobs(ROWS["flat"], 20, allowed)
    assert math.isclose(float(np.exp(lp.astype(np.float64)).sum()), 1.0, rel_tol=1e-5)
    assert np.isneginf(np.delete(lp, allowed)).all()
    assert sorted(i for i, _ in top) == [5, 17, 400, 48_000]
    assert top_logprobs(ROWS["flat"], 0)[1] == []


@pytest.mark.parametrize("further", [
    {"typical_p": 0.5}, {"top_n_sigma": 0.5}, {"xtc_probability": 1.0, "xtc_threshold": 0.01},
    {"dynatemp_range": 0.7}, {"mirostat": 1}, {"mirostat": 2, "mirostat_tau": 2.0},
    {"adaptive_target": 0.2, "samplers": "kmpta"}, {"min_keep": 20, "samplers": "tpm"},
])  # fmt: skip
def test_further_stages_pick_inside_the_processed_distribution(further: dict[str, Any]) -> None:
    """What ``probabilities`` / ``processed_logprobs`` report for a request with llama.cpp's
    further stages holds every token it picks (XTC's draw and Mirostat's and adaptive-p's
    own picks narrow it further, never beyond it), and an explicit default order picks
    what no order picks."""
    rng = np.random.default_rng(8)
    x = (rng.normal(0.0, 1.0, 3000) * 3).astype(np.float32)
    p = SamplingParams(temperature=0.9, top_k=200, top_p=0.95, min_p=0.01, seed=2, **further)
    q = sampler.probabilities(x, p, ())
    lp, _ = sampler.processed_logprobs(x, 5, p, ())
    state = SamplerState()
    for pos in range(40):
        tok = sampler.sample(x, p, (), pos, 0, None, state)
        assert q[tok] > 0 and np.isfinite(lp[tok]), (pos, tok)
    base = SamplingParams(temperature=0.9, top_k=200, top_p=0.95, min_p=0.01, seed=2)
    ordered = SamplingParams(temperature=0.9, top_k=200, top_p=0.95, min_p=0.01, seed=2, samplers="edskympxt")
    assert [sampler.sample(x, base, (), i) for i in range(20)] == [sampler.sample(x, ordered, (), i) for i in range(20)]
