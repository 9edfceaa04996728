"""Speculation on the real engine emits exactly what it emits with speculation off."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import EngineProcess

pytestmark = pytest.mark.slow

COPY = "Please repeat this sentence exactly: the quick brown fox jumps over the lazy dog near the river bank. "


@pytest.fixture(scope="module")
def engine(cpu_engine: EngineBuild, default_model: Path):  # type: ignore[no-untyped-def]
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=2, spec_adaptive=False)
    yield e
    e.close()


def run(engine: EngineProcess, rid: str, prompt: list[int], **keys: object) -> tuple[list[int], dict[str, str]]:
    events = engine.run(rid, prompt, **keys)
    done = events[-1]
    assert isinstance(done, proto.Done)
    return [e.id for e in events if isinstance(e, proto.Token)], dict(done.stats)


@pytest.fixture(scope="module")
def copy_prompt(engine: EngineProcess) -> list[int]:
    engine.send(proto.Tokenize("tk", COPY * 3, True))
    ev = engine.expect(proto.Tokens)
    return list(ev.ids)


SEEDED_GAP = (
    "llama.cpp's CPU build computes a multi-token window's logits differently from one token "
    "at a time (python -m bench.speculation tvd: TVD up to 0.05 per row), so a seeded draw can land on "
    "the other side of a boundary; greedy picks are unaffected here"
)


@pytest.mark.parametrize(
    "keys",
    [{}, pytest.param({"temperature": 0.8, "seed": 99}, marks=pytest.mark.xfail(strict=True, reason=SEEDED_GAP))],
    ids=["greedy", "seeded"],
)
def test_speculation_preserves_the_output(engine: EngineProcess, copy_prompt: list[int], keys: dict) -> None:  # type: ignore[type-arg]
    off, off_stats = run(engine, "off", copy_prompt, max_tokens=48, **keys)
    on, on_stats = run(engine, "on", copy_prompt, max_tokens=48, spec="ngram", **keys)
    assert "drafted" not in off_stats
    assert int(on_stats["drafted"]) > 0, on_stats  # the fixture must exercise windows
    assert on == off


def test_seeded_speculation_preserves_the_output_where_windows_are_exact(
    cpu_engine: EngineBuild, default_model: Path, copy_prompt: list[int]
) -> None:
    """With flash attention on and a context under 256 tokens the CPU build computes a
    window's rows bitwise as one token at a time (python -m bench.speculation tvd), and there a seeded
    n-gram run replays speculation off exactly."""
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1, flash_attn=True, spec_adaptive=False)
    try:
        for seed in (2, 3):  # cool enough that drafts are kept, and rejected
            keys = {"temperature": 0.4, "seed": seed}
            off, _ = run(e, "off", copy_prompt, max_tokens=48, **keys)
            on, on_stats = run(e, "on", copy_prompt, max_tokens=48, spec="ngram", **keys)
            assert 0 < int(on_stats["accepted"]) < int(on_stats["drafted"]), on_stats
            assert on == off
    finally:
        e.close()


@pytest.mark.parametrize("keys", [
    {"temperature": 0.8, "seed": 5, "mirostat": 2}, {"dry_multiplier": 0.8},
    {"temperature": 0.8, "seed": 5, "typical_p": 0.9, "xtc_probability": 0.5},
], ids=["mirostat", "dry-greedy", "typical-xtc"])  # fmt: skip
def test_further_samplers_decode_without_windows(engine: EngineProcess, copy_prompt: list[int], keys: dict) -> None:  # type: ignore[type-arg]
    """Mirostat's state, DRY's history and XTC's draw are not what speculation's verifier
    knows: such a request asking for n-gram windows gets none, and emits what it emits
    with speculation off."""
    off, _ = run(engine, "off", copy_prompt, max_tokens=24, **keys)
    on, on_stats = run(engine, "on", copy_prompt, max_tokens=24, spec="ngram", **keys)
    assert "drafted" not in on_stats or int(on_stats["drafted"]) == 0, on_stats
    assert on == off


PASSAGE = (
    "<|im_start|>user\nRepeat the following passage exactly, word for word:\n\nThe keeper "
    "climbed the ninety steps every night, trimmed the wick, and wrote the name of every ship "
    "in the logbook by the stairs. In winter the storms came from the north, and the spray "
    "reached the windows of the lamp room.<|im_end|>\n<|im_start|>assistant\n"
)


def test_copy_heavy_text_is_accepted(engine: EngineProcess) -> None:
    engine.send(proto.Tokenize("tk", PASSAGE, True))
    out, stats = run(engine, "acc", list(engine.expect(proto.Tokens).ids), max_tokens=64, spec="ngram")
    assert len(out) > 40 and int(stats["accepted"]) >= int(stats["drafted"]) // 2, stats


def test_adaptive_windows_open_only_where_they_pay(
    cpu_engine: EngineBuild, default_model: Path, copy_prompt: list[int]
) -> None:
    """The default policy measures what a window's rows cost and what its drafts keep: on
    two CPU cores, where a row costs nearly a step, it opens far fewer windows on free text
    than one at every match does, and the output is the same (flash attention on and a
    short context: windows compute bitwise as single steps there)."""
    got = {}
    for policy, adaptive in (("every", False), ("paid", True)):
        e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1, flash_attn=True, spec_adaptive=adaptive)
        try:
            e.send(proto.Tokenize("tk", "Once upon a time, in a village by the sea, there lived", True))
            story = list(e.expect(proto.Tokens).ids)
            run(e, "measure", copy_prompt, max_tokens=48, spec="ngram")  # rows get timed
            got[policy] = run(e, policy, story, max_tokens=96, spec="ngram")
        finally:
            e.close()
    (every, every_stats), (paid, paid_stats) = got["every"], got["paid"]
    assert paid == every
    assert int(every_stats["drafted"]) >= 8, every_stats  # the text offers n-gram matches
    assert int(paid_stats["drafted"]) <= int(every_stats["drafted"]) // 2, (paid_stats, every_stats)


def test_unknown_spec_mode_is_refused(engine: EngineProcess, copy_prompt: list[int]) -> None:
    events = engine.run("bad", copy_prompt, max_tokens=4, spec="lookahead")
    assert isinstance(events[0], proto.Error) and "spec='lookahead' is not supported" in events[0].message
    assert isinstance(events[-1], proto.Done) and events[-1].reason == "error"


def test_draft_mode_without_a_draft_model_is_refused(engine: EngineProcess, copy_prompt: list[int]) -> None:
    events = engine.run("nodraft", copy_prompt, max_tokens=4, spec="draft")
    assert isinstance(events[0], proto.Error) and "needs a draft model" in events[0].message
    assert isinstance(events[-1], proto.Done) and events[-1].reason == "error"


def test_server_reports_speculation_and_honours_the_switch(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    import httpx

    from strata_core.testing.harness import Server

    cfg = tmp_path / "spec.toml"
    cfg.write_text('[speculative]\nmode = "ngram"\nk = 4\n')
    srv = Server(["--config", str(cfg), "--parallel", "1", "--n-ctx", "1024"], tmp_path / "server.log")
    try:
        srv.wait_ready()
        body = {"messages": [{"role": "user", "content": COPY * 2}], "max_tokens": 40}
        on = httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=300).json()
        off = httpx.post(f"{srv.base}/v1/chat/completions", json={**body, "speculative": False}, timeout=300).json()
        assert on["usage"]["speculative"]["drafted_tokens"] > 0
        assert "speculative" not in off["usage"]
        assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
        metrics = httpx.get(f"{srv.base}/metrics").text
        drafted = on["usage"]["speculative"]["drafted_tokens"]
        assert f"strata_spec_drafted_tokens_total {drafted}\n" in metrics, metrics
        # A request naming a seed decodes alone and without windows ([sampling]
        # exact_seed_replay), so it replays exactly whatever runs beside it.
        seeded = {**body, "seed": 5, "temperature": 0.7}
        first = httpx.post(f"{srv.base}/v1/chat/completions", json=seeded, timeout=300).json()
        again = httpx.post(f"{srv.base}/v1/chat/completions", json=seeded, timeout=300).json()
        assert "speculative" not in first["usage"]
        assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    finally:
        srv.stop()
