"""``parallel = "auto"``: the slot arithmetic (engine/fit.py), the configuration, and the
CPU's fixed default."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_core.engine.fit import AUTO_MOST, MARGIN, MIB, auto_slots, fit_slots, kv_bytes_per_token
from strata_core.ops.config import CPU_PARALLEL, ConfigError, EngineConfig, load_config, slots_for
from strata_core.ops.models import default_model_path

GIB = 1 << 30


def test_slots_are_what_is_left_over_one_slots_kv() -> None:
    # an H100 after an 8B F16 (16 GiB), 128 KiB of KV a token, 4096 tokens a slot: 512 MiB a slot
    fit = fit_slots(free=78 * GIB, weights=16 * GIB, compute=GIB, kv_per_token=128 << 10, n_ctx=4096)
    assert fit.slots == 120  # 60 GiB left after compute and margin, over 512 MiB a slot
    # a 1B F16 (2.4 GiB), 32 KiB of KV a token, 2048 tokens a slot: 64 MiB a slot, 1,160 would fit
    fit = fit_slots(free=78 * GIB, weights=2400 << 20, compute=GIB, kv_per_token=32 << 10, n_ctx=2048)
    assert fit.slots == AUTO_MOST == 256  # capped
    fit = fit_slots(free=24 * GIB, weights=16 * GIB, compute=GIB, kv_per_token=128 << 10, n_ctx=4096)
    assert fit.slots == 12  # 6 GiB left after compute and the 1 GiB margin
    assert fit.n_ctx == 4096 and fit.need == 16 * GIB + GIB + MARGIN
    assert "12 slots x 4096 tokens" in fit.describe()


def test_when_no_slot_fits_the_context_shrinks_to_a_floor() -> None:
    kv = 128 << 10
    fit = fit_slots(free=18 * GIB + 700 * MIB, weights=16 * GIB, compute=GIB, kv_per_token=kv, n_ctx=8192)
    assert fit.slots == 1 and fit.n_ctx == 5376  # 700 MiB: 5600 tokens, in steps of 256
    with pytest.raises(ValueError, match="one slot of 4096 tokens"):  # 2400 tokens: below the floor
        fit_slots(free=18 * GIB + 300 * MIB, weights=16 * GIB, compute=GIB, kv_per_token=kv, n_ctx=8192)
    with pytest.raises(ValueError, match="does not fit the device: 8192 MiB free"):
        fit_slots(free=8 * GIB, weights=16 * GIB, compute=GIB, kv_per_token=kv, n_ctx=4096)


def test_kv_bytes_per_token_from_metadata() -> None:
    meta = {"general.architecture": "llama", "llama.block_count": 32, "llama.embedding_length": 4096,
            "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8}  # fmt: skip
    assert kv_bytes_per_token(meta.get) == 32 * 8 * (128 + 128) * 2  # Llama 3 8B: 128 KiB
    meta["llama.attention.key_length"] = 192  # an explicit head size wins
    assert kv_bytes_per_token(meta.get) == 32 * 8 * (192 + 128) * 2
    with pytest.raises(ValueError, match="no llama.block_count"):
        kv_bytes_per_token({k: v for k, v in meta.items() if k != "llama.block_count"}.get)


def test_the_default_models_kv_size_and_no_gpu() -> None:
    path = str(default_model_path())
    from strata_core.engine.fit import gguf_meta

    # SmolLM2-135M: 30 layers, 3 KV heads of 64
    assert kv_bytes_per_token(gguf_meta(path)) == 30 * 3 * (64 + 64) * 2
    assert auto_slots(path, 4096, 512, free=None) is None  # no GPU: the caller keeps CPU_PARALLEL
    fit = auto_slots(path, 4096, 512, free=4 * GIB)
    assert fit is not None and fit.need > MARGIN + Path(path).stat().st_size  # weights, compute, margin
    assert fit.slots == (4 * GIB - fit.need) // (23040 * 4096) == 31


def test_auto_is_the_default_and_a_cpu_keeps_a_fixed_number(tmp_path: Path) -> None:
    assert EngineConfig().parallel == "auto"
    assert slots_for("auto", on_gpu=False) == CPU_PARALLEL
    assert slots_for("auto", on_gpu=True) == "auto"
    assert slots_for(8, on_gpu=True) == 8 and slots_for(8, on_gpu=False) == 8
    cfg = tmp_path / "strata.toml"
    cfg.write_text('[engine]\nparallel = 16\n[models.a]\npath = "a.gguf"\nparallel = "auto"\n')
    loaded = load_config(cfg)
    assert loaded.engine.parallel == 16 and loaded.models["a"].parallel == "auto"
    assert EngineConfig(parallel="12").parallel == 12  # as an environment variable gives it


@pytest.mark.parametrize("value", ['"many"', "0", "300", "2.5", "true"])
def test_a_bad_parallel_names_the_key(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text(f"[engine]\nparallel = {value}\n")
    with pytest.raises(ConfigError, match="parallel"):
        load_config(cfg)


def test_the_engine_takes_auto_on_its_command_line() -> None:
    from strata_core.engine.__main__ import parse_args

    assert parse_args(["--model", "m.gguf"]).parallel == "auto"
    assert parse_args(["--model", "m.gguf", "--parallel", "6"]).parallel == 6
    with pytest.raises(SystemExit):
        parse_args(["--model", "m.gguf", "--parallel", "lots"])
