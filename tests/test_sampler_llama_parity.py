"""Our chain against llama.cpp's own samplers, on the same logits.

llama.cpp's penalties, top_k, min_p, top_p and temp samplers are applied in our order
(penalties -> top_k -> min_p -> top_p -> temperature) with llama_sampler_apply on a
llama_token_data_array; the kept candidates must be the same ids, and their probabilities
after temperature must agree to 1e-6. The rules coincide in this order: llama.cpp's min_p
keeps logit >= max + logf(p) and its top_p keeps the smallest prefix whose softmax mass
(over the candidates that reach it) is >= p, both with the head always kept (min_keep=1).
Where they differ we stay off the difference: llama.cpp breaks ties at a cut in an
unspecified order, so the rows here hold no duplicate logits; it computes in float32,
we in float64 after the float32 penalties, hence the tolerance.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from strata_core.contract.options import SamplingParams
from strata_core.engine import sampler

pytestmark = pytest.mark.slow

N_VOCAB = 49_152
TOKEN = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


@pytest.fixture(scope="module")
def ll(llama_cpp_site: Path) -> ModuleType:
    if str(llama_cpp_site) not in sys.path:
        sys.path.insert(0, str(llama_cpp_site))
    return importlib.import_module("llama_cpp.llama_cpp")


def _row(seed: int, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    spread = np.sort(rng.normal(0.0, 1.5, N_VOCAB)) + np.arange(N_VOCAB) * 1e-5  # distinct
    x = rng.permutation(spread).astype(np.float32)
    x[rng.choice(N_VOCAB, 20, replace=False)] = rng.uniform(5.0, 9.0, 20).astype(np.float32)
    x += np.float32(shift)
    assert np.unique(x).size == N_VOCAB  # no ties: llama.cpp orders them arbitrarily
    return x


def llama_chain(ll: ModuleType, x: np.ndarray, p: SamplingParams, history: list[int]):
    """Kept ids (ascending) and their logits after llama.cpp's samplers, in our order."""
    buf = (ll.llama_token_data * x.size)()
    view = np.frombuffer(buf, TOKEN)
    view["id"], view["logit"], view["p"] = np.arange(x.size), x, 0.0
    cur = ll.llama_token_data_array(buf, x.size, -1, False)
    stages = [
        ll.llama_sampler_init_penalties(
            x.size, p.penalty_last_n, p.penalty_repeat, p.penalty_freq, p.penalty_present
        )
    ]
    for tok in history:
        ll.llama_sampler_accept(stages[0], tok)
    stages += [
        ll.llama_sampler_init_top_k(p.top_k),
        ll.llama_sampler_init_min_p(p.min_p, 1),
        ll.llama_sampler_init_top_p(p.top_p, 1),
        ll.llama_sampler_init_temp(p.temperature),
    ]
    try:
        for stage in stages:
            ll.llama_sampler_apply(stage, ctypes.byref(cur))
    finally:
        for stage in stages:
            ll.llama_sampler_free(stage)
    # the samplers may repoint data (top_p copies out of a sort buffer): read through cur
    kept = np.frombuffer(
        ctypes.cast(cur.data, ctypes.POINTER(ll.llama_token_data * cur.size)).contents, TOKEN
    ).copy()
    kept.sort(order="id")
    return kept["id"].astype(np.int64), kept["logit"].astype(np.float64)


def our_chain(x: np.ndarray, p: SamplingParams, history: list[int]):
    """Kept ids (ascending) and their logits after temperature, from sampler's stages."""
    y = sampler.apply_penalties(x, history, p)
    c = sampler.apply_top_p(sampler.apply_min_p(sampler.candidates(y, p.top_k), p.min_p), p.top_p)
    order = np.argsort(c.ids)
    return c.ids[order].astype(np.int64), c.logits.astype(np.float64)[order] / p.temperature


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


HISTORY = [int(t) for t in np.random.default_rng(9).integers(0, N_VOCAB, 100)]
BASE = SamplingParams(temperature=1.0)
PENALISED = replace(
    BASE, penalty_repeat=1.3, penalty_freq=0.3, penalty_present=0.4, penalty_last_n=64
)
CASES = {
    "temperature": replace(BASE, temperature=0.7),
    "penalties": replace(PENALISED, temperature=0.8),
    "top_k": replace(BASE, top_k=40),
    "top_k_large": replace(BASE, top_k=1000, temperature=1.4),
    "min_p": replace(BASE, min_p=0.05, temperature=1.3),
    "top_p": replace(BASE, top_p=0.9),
    "top_p_tight": replace(BASE, top_p=0.3, temperature=0.5),
    "min_p_then_top_p": replace(BASE, min_p=0.02, top_p=0.8, temperature=1.2),
    "full": replace(PENALISED, temperature=0.8, top_k=40, min_p=0.05, top_p=0.95),
    "full_wide": replace(PENALISED, temperature=1.1, top_k=5000, min_p=0.001, top_p=0.99),
}


def mass_before(x: np.ndarray, p: SamplingParams, history: list[int]) -> dict[int, float]:
    """For each candidate entering top_p: the float64 softmax mass of those ahead of it."""
    y = sampler.apply_penalties(x, history, p)
    c = sampler.apply_min_p(sampler.candidates(y, p.top_k), p.min_p)
    logits = c.logits.astype(np.float64)
    order = np.argsort(-logits, kind="stable")
    w = np.exp(logits[order] - logits.max())
    ahead = (np.cumsum(w) - w) / w.sum()
    return dict(zip(c.ids[order].tolist(), ahead.tolist(), strict=True))


@pytest.mark.parametrize("shift", [0.0, -12.0], ids=["mixed_sign", "all_negative"])
@pytest.mark.parametrize("name", list(CASES))
def test_kept_candidates_and_probabilities_match_llama_cpp(ll, name, shift):
    x, p = _row(11, shift), CASES[name]
    history = HISTORY + [int(t) for t in np.argsort(-x)[:6]] * 2  # penalise the head too
    ids, logits = our_chain(x, p, history)
    ref_ids, ref_logits = llama_chain(ll, x, p, history)
    if name not in ("temperature", "penalties"):
        assert ids.size < N_VOCAB  # the case does cut
    if ids.tolist() != ref_ids.tolist():
        # llama.cpp sums top_p's running mass in float32: after n terms it can be off by
        # about n * 2**-24, so a cut that deep may land one token apart -- and only there.
        ahead = mass_before(x, p, history)
        tolerance = len(ahead) * 2.0**-24
        for tok in set(ids.tolist()) ^ set(ref_ids.tolist()):
            assert abs(ahead[tok] - p.top_p) <= tolerance, f"token {tok} is not at the cut"
        common = np.intersect1d(ids, ref_ids)
        logits, ref_logits = logits[np.isin(ids, common)], ref_logits[np.isin(ref_ids, common)]
        ids = ref_ids = common
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(softmax(logits), softmax(ref_logits), rtol=0, atol=1e-6)


def test_penalised_logits_match_llama_cpp(ll):
    x = _row(12)
    p = PENALISED
    history = HISTORY + [int(t) for t in np.argsort(-x)[:6]] * 3
    ours = sampler.apply_penalties(x, history, p)
    ids, theirs = llama_chain(ll, x, p, history)
    assert ids.tolist() == list(range(N_VOCAB))
    changed = np.flatnonzero(ours != x)
    assert changed.size > 50  # the window does penalise
    np.testing.assert_allclose(ours.astype(np.float64), theirs, rtol=2e-7, atol=1e-6)
