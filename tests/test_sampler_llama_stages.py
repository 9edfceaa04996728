"""llama.cpp's further samplers against libllama's own (llama_sampler_init_typical,
_top_n_sigma, _xtc, _temp_ext, _dry, _mirostat, _mirostat_v2, _adaptive_p, and min_keep on
_min_p / _top_p), each applied alone to the same logits row through llama_sampler_apply:
the candidates each leaves must be the same ids, with the same probabilities to float
tolerance. Rows are random (no tied logits: llama.cpp orders ties arbitrarily) and the
default model's own. For the stages that draw (XTC, Mirostat, adaptive-p) the
deterministic part is compared: what XTC cuts when it fires, the head Mirostat keeps for
a mu, the logits adaptive-p's transform gives.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from test_sampler_llama_parity import TOKEN, _row, ll  # noqa: F401  (ll: the fixture)

from strata_core.contract.options import SamplingParams
from strata_core.engine import dry, sampler, stages
from strata_core.engine.stages import SamplerState

pytestmark = pytest.mark.slow


def apply(lib: ModuleType, stage: Any, x: np.ndarray, accept: list[int] = ()) -> np.ndarray:  # type: ignore[assignment]
    """The token data llama.cpp's ``stage`` leaves of row ``x`` (its candidates, in its order)."""
    buf = (lib.llama_token_data * x.size)()
    view = np.frombuffer(buf, TOKEN)
    view["id"], view["logit"], view["p"] = np.arange(x.size), x, 0.0
    cur = lib.llama_token_data_array(buf, x.size, -1, False)
    try:
        for tok in accept:
            lib.llama_sampler_accept(stage, tok)
        lib.llama_sampler_apply(stage, ctypes.byref(cur))
    finally:
        lib.llama_sampler_free(stage)
    return np.frombuffer(ctypes.cast(cur.data, ctypes.POINTER(lib.llama_token_data * cur.size)).contents, TOKEN).copy()


def ours(x: np.ndarray, p: SamplingParams, u_xtc: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Kept ids (ascending) and their probabilities after the stages ``p.samplers`` names."""
    c, t = sampler.chain(x, p, u_xtc)
    order = np.argsort(c.ids)
    return c.ids[order], stages.softmax(c.logits[order], t)


def theirs(kept: np.ndarray, t: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    kept = kept[np.isfinite(kept["logit"])]
    kept.sort(order="id")
    return kept["id"].astype(np.intp), stages.softmax(kept["logit"], t)


@pytest.fixture(scope="module")
def model_rows(ll: ModuleType, default_model: Path) -> Any:  # noqa: F811
    """The default model's vocabulary (pieces, tokenizer) and two of its logits rows."""
    mp = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(str(default_model).encode(), mp)
    vocab = ll.llama_model_get_vocab(model)
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch = 256, 256
    ctx = ll.llama_init_from_model(model, cp)
    prompt = b"The cat sat on the mat. The cat sat on the mat. The"
    ids = (ll.llama_token * 64)()
    n = ll.llama_tokenize(vocab, prompt, len(prompt), ids, 64, True, False)
    ll.llama_decode(ctx, ll.llama_batch_get_one(ids, n))
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    rows = [np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), (n_vocab,)).astype(np.float32).copy()]
    yield model, vocab, rows, list(ids[:n])
    ll.llama_free(ctx)
    ll.llama_model_free(model)


ROWS = {"random": lambda: _row(21), "shifted": lambda: _row(22, -8.0)}
BASE = SamplingParams(temperature=1.0)


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize(("p", "min_keep"), [(0.8, 0), (0.5, 0), (0.2, 30)])
def test_typical(ll, row, p, min_keep):  # noqa: F811
    x = ROWS[row]()
    ids, q = ours(x, replace(BASE, typical_p=p, min_keep=min_keep, samplers="y"))
    ref_ids, ref_q = theirs(apply(ll, ll.llama_sampler_init_typical(p, min_keep), x))
    assert 1 < ids.size < x.size and (min_keep == 0 or ids.size >= min_keep)
    if ids.tolist() != ref_ids.tolist():
        # llama.cpp sums the running mass in float32 (n terms: off by about n * 2**-24) over
        # float32 surprises: a cut that deep may land a few tokens apart, and only there
        ahead = _typical_mass_before(x)
        for tok in set(ids.tolist()) ^ set(ref_ids.tolist()):
            assert abs(ahead[tok] - p) <= ids.size * 2.0**-24 * 4, f"token {tok} is not at the cut"
        common = np.intersect1d(ids, ref_ids)
        q, ref_q = q[np.isin(ids, common)], ref_q[np.isin(ref_ids, common)]
        q, ref_q = q / q.sum(), ref_q / ref_q.sum()
    np.testing.assert_allclose(q, ref_q, atol=1e-6)


def _typical_mass_before(x: np.ndarray) -> dict[int, float]:
    q = stages.softmax(x, 1.0)
    surprise = -np.log(q)
    order = np.argsort(np.abs(surprise - float(np.sum(q * surprise))), kind="stable")
    mass = np.cumsum(q[order]) - q[order]
    return dict(zip(order.tolist(), mass.tolist(), strict=True))


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("n", [0.5, 1.0, 3.0])
def test_top_n_sigma(ll, row, n):  # noqa: F811
    x = ROWS[row]()
    ids, q = ours(x, replace(BASE, top_n_sigma=n, samplers="s"))
    ref_ids, ref_q = theirs(apply(ll, ll.llama_sampler_init_top_n_sigma(n), x))
    assert 1 <= ids.size < x.size
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(q, ref_q, atol=1e-6)


@pytest.mark.parametrize(("threshold", "min_keep"), [(0.01, 0), (0.001, 0), (0.001, 49_150)])
def test_xtc_cut_when_it_fires(ll, threshold, min_keep):  # noqa: F811
    x = _row(23)
    # probability 1: llama.cpp's draw always fires; ours is given a draw that does
    p = replace(BASE, xtc_probability=1.0, xtc_threshold=threshold, min_keep=min_keep, samplers="x")
    ids, q = ours(x, p, 0.0)
    ref_ids, ref_q = theirs(apply(ll, ll.llama_sampler_init_xtc(1.0, threshold, min_keep, 7), x))
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(q, ref_q, atol=1e-6)
    assert (ids.size < x.size) == (min_keep == 0)  # the cut happens unless min_keep forbids it
    half = replace(p, xtc_probability=0.5)  # a draw above the probability: no cut
    assert ours(x, half, 0.7)[0].size == x.size and ours(x, half, 0.3)[0].tolist() == ids.tolist()


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize(("t", "delta", "exponent"), [(1.0, 0.5, 1.0), (0.7, 0.6, 2.0), (1.2, 1.5, 0.5)])
def test_dynatemp(ll, row, t, delta, exponent):  # noqa: F811
    x = ROWS[row]()
    p = replace(BASE, temperature=t, dynatemp_range=delta, dynatemp_exponent=exponent, samplers="t")
    ids, q = ours(x, p)
    kept = apply(ll, ll.llama_sampler_init_temp_ext(t, delta, exponent), x)
    ref_ids, ref_q = theirs(kept)  # its logits are scaled already
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(q, ref_q, rtol=5e-4, atol=1e-7)  # its entropy is float32
    plain = theirs(apply(ll, ll.llama_sampler_init_temp(t), x))[1]
    assert np.abs(q - plain).max() > 1e-6  # the temperature did move


@pytest.mark.parametrize(("min_p", "top_p", "min_keep"), [(0.9, 1.0, 25), (0.0, 0.05, 40)])
def test_min_keep_on_min_p_and_top_p(ll, min_p, top_p, min_keep):  # noqa: F811
    x = _row(24)
    p = replace(BASE, min_p=min_p, top_p=top_p, min_keep=min_keep, samplers="m" if min_p else "p")
    ids, q = ours(x, p)
    stage = ll.llama_sampler_init_min_p(min_p, min_keep) if min_p else ll.llama_sampler_init_top_p(top_p, min_keep)
    ref_ids, ref_q = theirs(apply(ll, stage, x))
    assert ids.size == min_keep  # min_keep is what holds the cut open
    assert ids.tolist() == ref_ids.tolist()
    np.testing.assert_allclose(q, ref_q, atol=1e-6)


@pytest.mark.parametrize(("version", "tau"), [(1, 5.0), (1, 2.0), (2, 5.0), (2, 3.0)])
def test_mirostat_head_for_its_mu(ll, model_rows, version, tau):  # noqa: F811
    """The head Mirostat keeps at its first pick (mu = 2 tau), on random and model rows."""
    _, _, rows, _ = model_rows
    for x in [_row(25), rows[0]]:
        p = replace(BASE, mirostat=version, mirostat_tau=tau)
        c = sampler._head(sampler.candidates(x, 0), x.size)
        k = stages.mirostat_cut(stages.softmax(c.logits, 1.0), p, 2.0 * tau, x.size)
        stage = (ll.llama_sampler_init_mirostat(x.size, 3, tau, 0.1, 100) if version == 1
                 else ll.llama_sampler_init_mirostat_v2(3, tau, 0.1))  # fmt: skip
        kept = apply(ll, stage, x)
        assert k == kept.size
        assert sorted(c.ids[:k].tolist()) == sorted(kept["id"].tolist())
        np.testing.assert_allclose(np.sort(stages.softmax(c.logits[:k], 1.0)), np.sort(kept["p"]), atol=1e-6)


@pytest.mark.parametrize("target", [0.1, 0.5, 0.9])
def test_adaptive_p_transform(ll, target):  # noqa: F811
    x = _row(26)
    c = sampler._head(sampler.candidates(x, 0), x.size)
    q = stages.softmax(c.logits, 1.0)
    p = replace(BASE, adaptive_target=target, adaptive_decay=0.9)
    logits = stages.adaptive_logits(q, p, SamplerState())
    kept = apply(ll, ll.llama_sampler_init_adaptive_p(target, 0.9, 3), x)
    by_id = dict(zip(kept["id"].tolist(), kept["logit"].tolist(), strict=True))
    np.testing.assert_allclose(logits, [by_id[i] for i in c.ids.tolist()], atol=1e-4)


@pytest.mark.parametrize("breakers", [("\n", ":", '"', "*"), (" mat", ".")])
@pytest.mark.parametrize(("mult", "base", "allowed", "last_n"), [(0.8, 1.75, 2, 64), (2.0, 3.0, 1, 16), (1.0, 1.75, 0, -1)])
def test_dry_on_the_model(ll, model_rows, breakers, mult, base, allowed, last_n):  # noqa: F811
    """DRY's penalties on the model's row after its looping prompt, the breakers on its vocabulary."""
    _, vocab, rows, prompt = model_rows
    x = rows[0]
    n_vocab = x.size
    buf = ctypes.create_string_buffer(256)

    def piece(t: int) -> bytes:
        n = ll.llama_token_to_piece(vocab, t, buf, 256, 0, True)
        return buf.raw[:n]

    pieces = [piece(t) for t in range(n_vocab)]

    def tokenize(text: bytes) -> list[int]:
        out = (ll.llama_token * 64)()
        return list(out[: ll.llama_tokenize(vocab, text, len(text), out, 64, False, False)])

    heads = dry.breakers(breakers, pieces, tokenize)
    p = replace(BASE, dry_multiplier=mult, dry_base=base, dry_allowed_length=allowed, dry_penalty_last_n=last_n)
    mine = dry.apply(x, prompt, p, heads)
    texts = (ctypes.c_char_p * len(breakers))(*[b.encode() for b in breakers])
    window = len(prompt) if last_n < 0 else last_n
    stage = ll.llama_sampler_init_dry(vocab, mult, base, allowed, window, texts, len(breakers))
    kept = apply(ll, stage, x, prompt)
    kept.sort(order="id")
    # the loop is penalised, unless "." (the prompt's last sentence end) limits it below allowed
    assert ((mine != x).sum() >= 1) == ("." not in breakers or allowed < 2)
    np.testing.assert_allclose(mine, kept["logit"], rtol=1e-6, atol=1e-5)


def _infill_vocab(ll: ModuleType, vocab: Any, n_vocab: int) -> stages.InfillVocab:  # noqa: F811
    """The default model's vocabulary as the engine hands it to the infill stage."""
    buf = ctypes.create_string_buffer(256)

    def piece(t: int) -> bytes:
        n = ll.llama_token_to_piece(vocab, t, buf, 256, 0, False)  # special=false: control tokens empty
        return buf.raw[:n]

    pieces = [piece(t) for t in range(n_vocab)]
    eog = frozenset(t for t in range(n_vocab) if ll.llama_vocab_is_eog(vocab, t))
    end = ll.llama_vocab_eot(vocab)
    return stages.InfillVocab(pieces, eog, end if end >= 0 else ll.llama_vocab_eos(vocab))


def _llama_infill(ll: ModuleType, vocab: Any, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:  # noqa: F811
    """The token data libllama's infill stage leaves of the candidates ``ids`` (finite logits)."""
    buf = (ll.llama_token_data * ids.size)()
    view = np.frombuffer(buf, TOKEN)
    view["id"], view["logit"], view["p"] = ids, logits, 0.0
    cur = ll.llama_token_data_array(buf, ids.size, -1, False)
    stage = ll.llama_sampler_init_infill(vocab)
    try:
        ll.llama_sampler_apply(stage, ctypes.byref(cur))
    finally:
        ll.llama_sampler_free(stage)
    kept = np.frombuffer(ctypes.cast(cur.data, ctypes.POINTER(ll.llama_token_data * cur.size)).contents, TOKEN).copy()
    return kept[np.isfinite(kept["logit"])]


def _same_as_llama(ll, vocab, iv: stages.InfillVocab, ids: np.ndarray, logits: np.ndarray) -> Any:  # noqa: F811
    """Our stage equals libllama's on candidates in candidate order; what ours left."""
    kept = _llama_infill(ll, vocab, ids, logits)
    mine = stages.infill(ids, logits, 1.0, iv)
    if mine is None:
        assert kept["id"].tolist() == [iv.end] and kept["logit"].tolist() == [1.0]
        return mine
    pos, q = mine
    assert ids[pos].tolist() == kept["id"].tolist()
    np.testing.assert_allclose(q, kept["p"], rtol=1e-5, atol=1e-6)
    return mine


@pytest.mark.parametrize(("k", "t", "eog_boost"), [(40, 1.0, 0.0), (40, 0.5, 0.0), (200, 2.0, 0.0), (40, 1.0, 12.0), (3, 1.0, 0.0)])
def test_infill_on_the_model(ll, model_rows, k, t, eog_boost):  # noqa: F811
    """llama.cpp's infill stage after top_k and temperature on the model's row (its pieces
    and EOG tokens): the same survivors with the same probabilities; the chain keeps them."""
    _, vocab, rows, _ = model_rows
    iv = _infill_vocab(ll, vocab, rows[0].size)
    x0 = rows[0].copy()
    x0[sorted(iv.eog)] += np.float32(eog_boost)  # a row where an end is likely enough
    head = sampler.first(x0, k)
    mine = _same_as_llama(ll, vocab, iv, head, x0[head] / np.float32(t))
    assert not eog_boost or mine is None or set(head[mine[0]].tolist()) <= iv.eog  # the fixture: ends only
    c, _ = sampler.chain(x0, replace(BASE, temperature=t, top_k=k, samplers="kti"), None, vocab=iv)
    want = [iv.end] if mine is None else head[mine[0]].tolist()
    assert c.ids.tolist() == want


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_infill_merges_prefixes_as_llama_does(ll, model_rows, seed):  # noqa: F811
    """Candidates that are prefixes of one another (the vocabulary's pieces starting " c"),
    random logits: the merges leave llama.cpp's survivors and probabilities."""
    _, vocab, rows, _ = model_rows
    iv = _infill_vocab(ll, vocab, rows[0].size)
    ids = np.array([t for t, w in enumerate(iv.pieces) if w.startswith(b" c") and len(w) <= 4], np.intp)
    assert ids.size > 50 and any(stages._extensions([iv.pieces[int(i)] for i in ids]))  # the fixture merges
    rng = np.random.default_rng(seed)
    logits = np.sort(rng.normal(0.0, 2.0, ids.size)).astype(np.float32)[::-1].copy()
    ids = rng.permutation(ids)
    _same_as_llama(ll, vocab, iv, ids, logits)

