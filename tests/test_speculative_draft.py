"""Draft-model speculation: the real engine with the default model and a truncated copy of
it as the draft (sharing the vocabulary), and the verifier path the scheduler runs.

The engines here run with flash attention on and contexts under 256 tokens: there the CPU
build computes a window's rows bitwise as it computes them one token at a time
(python -m bench.speculation tvd), so greedy output must match speculation off token for token.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_speculative import chi2_critical_999, chi2_statistic

from strata_core.backends.cpu import CpuBackend
from strata_core.contract import protocol as proto
from strata_core.contract.options import SamplingParams
from strata_core.engine.sampler import probabilities, sample
from strata_core.engine.speculation.verify import NULL, Proposal, sampled_proposal, verify_proposal
from strata_core.ops.build import EngineBuild
from strata_core.ops.config import ConfigError, load_config
from strata_core.testing.harness import EngineProcess, Server

COPY = "Please repeat this sentence exactly: the quick brown fox jumps over the lazy dog near the river bank. "
STORY = "<|im_start|>user\nWrite a short story about a dragon who learns to bake.<|im_end|>\n<|im_start|>assistant\n"
SEEDED = {"temperature": 0.8, "seed": 99}


# ---------------------------------------------------------------- the verifier path (fast)

MC_PARAMS = SamplingParams(temperature=0.9, top_k=4, top_p=0.97, seed=0)
MC_P_LOGITS = np.array(
    [[1.0, 0.2, -0.5, 0.8, -1.0], [0.1, 1.3, 0.0, -0.4, 0.6], [0.9, -2.0, 0.7, 0.3, 0.0]], np.float32
)
MC_Q_LOGITS = np.array(
    [[1.6, -0.5, -0.2, 0.3, -1.0], [-0.2, 1.9, -0.6, 0.1, 0.4], [1.2, -3.0, 0.2, 0.5, -0.4]], np.float32
)
MC_CONTEXT = [1, 2, 3]  # the tokens before the window; row j samples position 3 + j
MC_TAU = 0.15


def mc_counts(trials: int, verify_tau: float) -> np.ndarray:
    """Three emitted tokens per trial: a draft window through the drafter's and scheduler's
    own functions, continued by the target's ordinary sampler."""
    k, n = MC_P_LOGITS.shape
    counts = np.zeros((n,) * k, np.int64)
    for seed in range(trials):
        params = SamplingParams(**{**vars(MC_PARAMS), "seed": seed})
        prop = Proposal(q_rows=[])
        assert prop.q_rows is not None
        while len(prop.tokens) < k - 1 and NULL not in prop.tokens:
            tok, q = sampled_proposal(MC_Q_LOGITS[len(prop.tokens)], params, MC_CONTEXT + prop.tokens, MC_TAU)
            prop.tokens.append(tok)
            prop.q_rows.append(q)
        result = verify_proposal(
            lambda j, params=params: probabilities(MC_P_LOGITS[j], params, ()), prop, verify_tau, seed, len(MC_CONTEXT)
        )
        seq = [*prop.offered[: result.accepted], result.token]
        while len(seq) < k:
            seq.append(sample(MC_P_LOGITS[len(seq)], params, (), len(MC_CONTEXT) + len(seq)))
        counts[tuple(seq)] += 1
    return counts


def mc_target() -> np.ndarray:
    rows = [probabilities(row, MC_PARAMS, ()) for row in MC_P_LOGITS]
    assert all((r == 0).sum() >= 1 for r in rows)  # the fixture exercises the top_k cut
    return np.einsum("a,b,c->abc", *rows)


def test_draft_path_emits_the_target_law() -> None:
    counts = mc_counts(6_000, MC_TAU)
    stat, dof = chi2_statistic(counts, mc_target())
    assert stat < chi2_critical_999(dof), (stat, dof)


def test_draft_path_harness_sees_a_verifier_that_ignores_the_gate() -> None:
    """Negative control: verifying as if nothing were gated (the unfiltered q) is biased,
    and the same harness detects it."""
    stat, dof = chi2_statistic(mc_counts(6_000, 0.0), mc_target())
    assert stat > chi2_critical_999(dof), (stat, dof)


def test_probabilities_is_what_sample_draws_from() -> None:
    row = MC_P_LOGITS[0]
    p = probabilities(row, MC_PARAMS, ())
    draws = [sample(row, SamplingParams(**{**vars(MC_PARAMS), "seed": s}), (), 0) for s in range(4000)]
    freq = np.bincount(draws, minlength=p.size) / len(draws)
    assert freq[p == 0].sum() == 0
    assert np.abs(freq - p).max() < 0.03, (freq, p)
    greedy = probabilities(row, SamplingParams(), ())
    assert greedy[int(np.argmax(row))] == 1.0 and greedy.sum() == 1.0


# ---------------------------------------------------------------- configuration (fast)


def test_draft_mode_without_a_draft_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="draft_model"):
        load_config(None, env={"STRATA_SPECULATIVE_MODE": "draft"})
    cfg = load_config(None, env={"STRATA_SPECULATIVE_MODE": "draft", "STRATA_SPECULATIVE_DRAFT_MODEL": "d.gguf"})
    assert cfg.speculative.draft_model == "d.gguf" and cfg.speculative.threshold == 0.1
    with pytest.raises(ConfigError, match="threshold"):
        load_config(None, env={"STRATA_SPECULATIVE_THRESHOLD": "1.5"})


def test_draft_model_option_selects_draft_mode_and_reaches_the_engine() -> None:
    from strata_core.client.reader import engine_command
    from strata_core.ops.cli import _config, build_parser

    cfg = _config(build_parser().parse_args(["serve", "--draft-model", "small.gguf"]))
    assert (cfg.speculative.mode, cfg.speculative.draft_model) == ("draft", "small.gguf")
    common = dict(site="", env={}, n_ctx=64, parallel=1, n_batch=16, threads=None, n_gpu_layers=0, flash_attn=None, backend="cpu")
    argv = engine_command("m.gguf", draft_model="small.gguf", spec_threshold=0.25, **common).argv  # type: ignore[arg-type]
    assert argv[argv.index("--draft-model") + 1] == "small.gguf" and argv[argv.index("--spec-threshold") + 1] == "0.25"
    assert "--draft-model" not in engine_command("m.gguf", **common).argv  # type: ignore[arg-type]


def test_draft_mode_without_a_draft_model_refuses_to_serve(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "s.toml"
    cfg.write_text('[speculative]\nmode = "draft"\n')
    done = subprocess.run(
        [sys.executable, "-m", "strata_core.ops.cli", "serve", "--config", str(cfg)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "draft_model" in done.stderr, done.stderr


# ---------------------------------------------------------------- the real engine (slow)


@pytest.fixture(scope="module")
def engine(cpu_engine: EngineBuild, default_model: Path, draft_model: Path):  # type: ignore[no-untyped-def]
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=2, draft_model=draft_model, flash_attn=True, spec_threshold=0.02)
    yield e
    e.close()


def tokens(engine: EngineProcess, text: str) -> list[int]:
    engine.send(proto.Tokenize("tk", text, True))
    return list(engine.expect(proto.Tokens).ids)


def collect(
    engine: EngineProcess, gens: dict[str, tuple[list[int], dict[str, object]]], lps: dict[str, list[proto.Logprob]] | None = None
) -> dict[str, tuple[list[int], proto.Done]]:
    """Send several GENs at once and collect each one's tokens (and LP lines) and DONE."""
    for rid, (prompt, keys) in gens.items():
        engine.send(proto.Gen(rid, {k: str(v) for k, v in keys.items()}, tuple(prompt)))
    toks: dict[str, list[int]] = {rid: [] for rid in gens}
    done: dict[str, proto.Done] = {}
    while len(done) < len(gens):
        ev = engine.next_event()
        assert not isinstance(ev, proto.Error), ev
        if isinstance(ev, proto.Token) and ev.rid in toks:
            toks[ev.rid].append(ev.id)
        elif isinstance(ev, proto.Logprob) and lps is not None and ev.rid in toks:
            lps.setdefault(ev.rid, []).append(ev)
        elif isinstance(ev, proto.Done) and ev.rid in toks:
            done[ev.rid] = ev
    return {rid: (toks[rid], done[rid]) for rid in gens}


PENALISED = {"penalty_repeat": 1.3, "penalty_last_n": 64}  # history must roll back on rejection


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "keys"),
    [(COPY * 3, {}), (STORY, {}), (STORY, {**PENALISED, "logprobs": 2, "logprobs_mode": "processed"})],
    ids=["copy", "story", "story-penalised-logprobs"],
)
def test_greedy_draft_output_equals_speculation_off(engine: EngineProcess, text: str, keys: dict) -> None:  # type: ignore[type-arg]
    prompt = tokens(engine, text)
    lps: dict[str, list[proto.Logprob]] = {}
    r = collect(engine, {"off": (prompt, {"max_tokens": 40, **keys}), "on": (prompt, {"max_tokens": 40, "spec": "draft", **keys})}, lps)
    (off, off_done), (on, on_done) = r["off"], r["on"]
    assert "drafted" not in off_done.stats
    # windows ran, and some drafts were rejected: the cache and penalty history rolled back
    drafted, accepted = int(on_done.stats["drafted"]), int(on_done.stats["accepted"])
    assert accepted < drafted, on_done.stats
    if not keys:  # the penalties can make the draft miss every time (and back off)
        assert accepted > 0, on_done.stats
    assert on == off
    on_lp, off_lp = ([(e.logprob, e.top) for e in lps.get(rid, [])] for rid in ("on", "off"))
    assert on_lp == off_lp and len(on_lp) == (len(on) if "logprobs" in keys else 0)


@pytest.mark.slow
def test_greedy_draft_under_concurrency_equals_speculation_off(engine: EngineProcess) -> None:
    a, b = tokens(engine, COPY * 2), tokens(engine, STORY)
    off = collect(engine, {"a": (a, {"max_tokens": 32}), "b": (b, {"max_tokens": 32})})
    on = collect(engine, {"a": (a, {"max_tokens": 32, "spec": "draft"}), "b": (b, {"max_tokens": 32, "spec": "draft"})})
    assert sum(int(on[r][1].stats["drafted"]) for r in on) > 0
    for rid in ("a", "b"):
        assert on[rid][0] == off[rid][0], rid


@pytest.mark.slow
def test_seeded_draft_sampling_completes_and_reports_counts(engine: EngineProcess) -> None:
    prompt = tokens(engine, STORY)
    r = collect(engine, {"s": (prompt, {"max_tokens": 48, "spec": "draft", **SEEDED, "penalty_repeat": 1.1, "penalty_last_n": 64})})
    toks, done = r["s"]
    assert done.reason in ("stop", "length") and int(done.stats["gen"]) == len(toks) > 0
    drafted, accepted = int(done.stats["drafted"]), int(done.stats["accepted"])
    assert drafted > 0 and 0 <= accepted <= drafted, done.stats
    assert all(0 <= t < int(engine.ready.info["n_vocab"]) for t in toks)


@pytest.mark.slow
def test_spec_draft_without_a_draft_model_is_refused(cpu_engine: EngineBuild, default_model: Path) -> None:
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1)
    try:
        assert "spec_draft" not in e.ready.info["capabilities"]
        events = e.run("x", [1, 2, 3], max_tokens=2, spec="draft")
        assert isinstance(events[0], proto.Error) and "--draft-model" in events[0].message
    finally:
        e.close()


@pytest.mark.slow
def test_draft_model_with_another_vocabulary_is_refused(cpu_engine: EngineBuild, default_model: Path, tmp_path: Path) -> None:
    from strata_core.testing.models import SHAPES, write_random, write_tokenizer

    write_tokenizer(default_model, tmp_path / "tok.gguf", extra_tokens=8)
    write_random(tmp_path / "tok.gguf", tmp_path / "other.gguf", SHAPES["tiny"])
    with pytest.raises(AssertionError, match=r"n_vocab 49160, the model 49152"):
        EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1, draft_model=tmp_path / "other.gguf")


@pytest.mark.slow
def test_server_draft_mode_greedy_matches_and_honours_the_switch(cpu_engine: EngineBuild, draft_model: Path, tmp_path: Path) -> None:
    import httpx

    cfg = tmp_path / "draft.toml"
    cfg.write_text(
        f'[engine]\nflash_attn = true\n[speculative]\nmode = "draft"\ndraft_model = "{draft_model}"\nk = 4\n'
    )
    srv = Server(["--config", str(cfg), "--parallel", "2", "--n-ctx", "512"], tmp_path / "server.log")
    try:
        srv.wait_ready()

        def chat(content: str, **extra: object) -> dict:  # type: ignore[type-arg]
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 32, "temperature": 0, **extra}
            return httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=300).json()  # type: ignore[no-any-return]

        def complete(prompt: str, **extra: object) -> dict:  # type: ignore[type-arg]
            body = {"prompt": prompt, "max_tokens": 32, "temperature": 0, **extra}
            return httpx.post(f"{srv.base}/v1/completions", json=body, timeout=300).json()  # type: ignore[no-any-return]

        prompts = [COPY * 2, "Explain why the sky is blue."]
        off_chat = [chat(p, speculative=False) for p in prompts]
        off_text = [complete(p, speculative=False) for p in prompts]
        assert all("speculative" not in r["usage"] for r in off_chat + off_text)
        with ThreadPoolExecutor(2) as pool:  # concurrency 2: both slots draft in one batch
            on_chat = list(pool.map(chat, prompts))
            on_text = list(pool.map(complete, prompts))
        assert sum(r["usage"].get("speculative", {}).get("drafted_tokens", 0) for r in on_chat + on_text) > 0
        for on, off in zip(on_chat, off_chat, strict=True):
            assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
        for on, off in zip(on_text, off_text, strict=True):
            assert on["choices"][0]["text"] == off["choices"][0]["text"]
    finally:
        srv.stop()
