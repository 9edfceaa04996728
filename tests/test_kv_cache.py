"""``[engine] cache_type_k`` / ``cache_type_v``: parsed and refused as llama.cpp would refuse
them, naming the key; carried to the engine, which reports its KV memory per slot; and a
q8_0 cache serves greedy output close to f16's, compared as the conformance kit compares
backends (the kit's own bound, met or not, is printed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.client.reader import engine_command
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild
from strata_core.ops.config import ConfigError, check_cache_types, load_config
from strata_core.testing.harness import EngineProcess, llama_server_binary
from strata_core.testing.harness import llama_server as run_llama_server
from strata_core.testing.reference import N_TOKENS, Run, greedy_runs

#: The conformance kit's defaults (strata_core/testing/plugin.py): |Δ logprob| bound over
#: matching greedy tokens, and the top-2 margin under which a divergence is a near-tie.
MAX_DLOGPROB, TIE_MARGIN = 0.02, 0.05
#: What a q8_0 cache is held to here. It is lossy: on this 135M model it misses the kit's
#: bound, as llama-server's own q8_0 cache does (test_each_cache_type_equal_to_llama_servers);
#: a broken cache would miss these by far (every prompt diverging, logprobs off by nats).
#: How many of the 4 prompts part from f16 past a near-tie depends on the CPU's kernels
#: (1 on one 2-core machine, 2 on another: margins 0.25 and 0.13), so half of them may.
LOSSY_DLOGPROB, MOST_DIVERGING = 0.3, 2
#: Strata against llama-server with the same cache types: the same kernels, so only how each
#: turns logits into a logprob differs.
EQUAL_DLOGPROB = 1e-3


def test_cache_types_parse_and_default_to_f16() -> None:
    e = load_config(None, env={"STRATA_ENGINE_CACHE_TYPE_K": "q8_0", "STRATA_ENGINE_CACHE_TYPE_V": "q4_0"}).engine
    assert (e.cache_type_k, e.cache_type_v) == ("q8_0", "q4_0")
    e = load_config(None, env={}).engine
    assert (e.cache_type_k, e.cache_type_v) == ("f16", "f16")
    with pytest.raises(ConfigError, match="cache_type_k"):
        load_config(None, env={"STRATA_ENGINE_CACHE_TYPE_K": "q3_k"})


def test_what_llama_cpp_refuses_is_refused_naming_the_key() -> None:
    check_cache_types("q8_0", "f16", False, "layer")  # a quantised K needs nothing more
    check_cache_types("q4_0", "q4_0", True, "layer")
    check_cache_types("f16", "q8_0", None, "layer")  # flash attention "auto": llama.cpp decides
    with pytest.raises(ConfigError, match=r'cache_type_v = "q8_0" is quantised.*flash_attn is off'):
        check_cache_types("f16", "q8_0", False, "layer")
    with pytest.raises(ConfigError, match=r'cache_type_k = "q8_0": split_mode = "tensor" needs an f16 KV cache'):
        check_cache_types("q8_0", "f16", True, "tensor")
    with pytest.raises(ConfigError, match=r'cache_type_v = "bf16": split_mode = "tensor"'):
        check_cache_types("f16", "bf16", True, "tensor")


def test_serve_refuses_a_quantised_v_cache_without_flash_attention(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text('[engine]\nbackend = "cpu"\ncache_type_v = "q8_0"\n')  # the CPU backend's default: no flash attention
    done = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "serve", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert 'strata: error: [engine] cache_type_v = "q8_0" is quantised' in done.stderr
    assert "Traceback" not in done.stderr


def test_the_engine_command_carries_the_cache_types() -> None:
    argv = list(engine_command("m.gguf", site="", env={}, n_ctx=512, parallel=1, n_batch=64, threads=None,
                               n_gpu_layers=0, flash_attn=True, backend="cpu", cache_types=("q8_0", "q4_0")).argv)  # fmt: skip
    assert argv[argv.index("--cache-type-k") + 1] == "q8_0" and argv[argv.index("--cache-type-v") + 1] == "q4_0"


def start(cpu_engine: EngineBuild, model: Path, types: tuple[str, str], flash_attn: bool | None) -> tuple[int, list[proto.Event], str]:
    cmd = engine_command(str(model), site=str(cpu_engine.path), env={}, n_ctx=1024, parallel=1, n_batch=64,
                         threads=None, n_gpu_layers=0, flash_attn=flash_attn, backend="cpu", cache_types=types)  # fmt: skip
    done = subprocess.run(list(cmd.argv), input="QUIT\n", capture_output=True, text=True, timeout=300,
                          env={**os.environ, **cmd.env})  # fmt: skip
    return done.returncode, [proto.parse_event(line) for line in done.stdout.splitlines()], done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "iq4_nl"), ("bf16", "q5_1")])
def test_the_engine_reports_the_kv_memory_per_slot_llama_cpp_allocated(
    cpu_engine: EngineBuild, default_model: Path, types: tuple[str, str]
) -> None:
    rc, events, log = start(cpu_engine, default_model, types, True)
    assert rc == 0 and isinstance(events[0], proto.Ready), log[-2000:]
    kv = events[0].info["kv_cache"]
    assert (kv["type_k"], kv["type_v"]) == types
    # llama.cpp's own account: "llama_kv_cache: size = 22.50 MiB (1024 cells, ...), K (f16): ..."
    m = re.search(r"llama_kv_cache: size = +([0-9.]+) MiB.*K \((\w+)\).*V \((\w+)\)", log)
    assert m, log[-3000:]
    assert (m.group(2), m.group(3)) == types
    assert kv["bytes_per_slot"] / (1 << 20) == pytest.approx(float(m.group(1)), abs=0.006)


@pytest.mark.slow
def test_the_engine_refuses_a_quantised_v_cache_without_flash_attention(cpu_engine: EngineBuild, default_model: Path) -> None:
    rc, events, _ = start(cpu_engine, default_model, ("f16", "q8_0"), False)
    assert rc == 1 and isinstance(events[0], proto.Error)
    assert "engine failed to start" in events[0].message and "cache_type_v" in events[0].message


@pytest.fixture(scope="module")
def greedy(cpu_engine: EngineBuild, default_model: Path) -> dict[tuple[str, str], list[Run]]:
    """The reference prompts run greedy with an f16 and a q8_0 cache, both with flash
    attention (a quantised V needs it), so only the cache type differs."""
    runs = {}
    for types in (("f16", "f16"), ("q8_0", "q8_0")):
        e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1, flash_attn=True, cache_types=types)
        try:
            assert e.ready.info["kv_cache"]["type_v"] == types[1]
            runs[types] = greedy_runs(e)
        finally:
            e.close()
    return runs


@pytest.mark.slow
def test_q8_0_serves_greedy_output_close_to_f16_and_reports_the_kits_divergence(
    greedy: dict[tuple[str, str], list[Run]], capsys: pytest.CaptureFixture[str]
) -> None:
    worst, report, problems = 0.0, [], []
    for ref, got in zip(greedy[("f16", "f16")], greedy[("q8_0", "q8_0")], strict=True):
        n = min(len(ref.tokens), len(got.tokens))
        same = next((i for i in range(n) if ref.tokens[i] != got.tokens[i]), n)
        worst = max([worst] + [abs(ref.logprobs[i] - got.logprobs[i]) for i in range(same)])
        if same < n:
            line = f"{ref.prompt!r}: diverges at token {same} after a top-2 margin of {ref.margins[same]:.4f}"
            report.append(line)
            if ref.margins[same] >= TIE_MARGIN:
                problems.append(line)
    report.append(f"largest |Δ logprob| over the matching greedy tokens: {worst:.5f} (the kit's bound "
                  f"{MAX_DLOGPROB}: {'met' if worst <= MAX_DLOGPROB and not problems else 'not met'})")  # fmt: skip
    with capsys.disabled():
        print("\nq8_0 vs f16 KV cache:", *report, sep="\n  ")
    assert worst > 0.0, "the fixture: q8_0 must change the numbers at all"
    assert len(problems) <= MOST_DIVERGING, problems
    assert worst <= LOSSY_DLOGPROB


@pytest.mark.slow
@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0")])
def test_each_cache_type_equal_to_llama_servers(
    cpu_engine: EngineBuild, default_model: Path, greedy: dict[tuple[str, str], list[Run]],
    types: tuple[str, str], tmp_path: Path,
) -> None:
    """What q8_0 loses against f16 is llama.cpp's own: llama-server from the same tree with
    ``-ctk/-ctv`` writes the same greedy tokens with the same logprobs as Strata."""
    binary = llama_server_binary(cpu_engine)
    if binary is None:
        pytest.skip("no llama-server in the engine's build tree (python -m bench.peers builds it)")
    args = ["-m", str(default_model), "-c", "1024", "-np", "1", "-fa", "on", "-b", "256",
            "-ctk", types[0], "-ctv", types[1], "--no-warmup"]  # fmt: skip
    with run_llama_server(binary, args, tmp_path / "llama-server.log") as base:
        for run in greedy[types]:
            body = {"prompt": run.ids, "n_predict": N_TOKENS, "temperature": 0, "n_probs": 1, "cache_prompt": False}
            probs = httpx.post(f"{base}/completion", json=body, timeout=300).json()["completion_probabilities"]
            # llama-server's list also holds the end-of-generation token where the run stopped at one
            assert [p["id"] for p in probs][: len(run.tokens)] == run.tokens, run.prompt
            worst = max(abs(p["logprob"] - lp) for p, lp in zip(probs, run.logprobs, strict=False))
            assert worst <= EQUAL_DLOGPROB, (run.prompt, worst)
