"""One model on several GPUs: ``[engine] split_mode``, ``tensor_split`` and ``main_gpu``
reach the engine exactly as configured, what llama.cpp would refuse is refused at start
naming the key, and the machine's NCCL_* / CUDA_* environment reaches the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from strata_core.client.reader import engine_command
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild
from strata_core.ops.config import ConfigError, check_split, load_config
from strata_core.testing.harness import Server


def engine_of(**env: str):  # type: ignore[no-untyped-def]
    return load_config(None, env={f"STRATA_ENGINE_{k.upper()}": v for k, v in env.items()}).engine


def test_split_keys_parse_from_the_environment() -> None:
    e = engine_of(split_mode="tensor", tensor_split="3,1", devices="0,1")
    assert (e.split_mode, e.tensor_split, e.main_gpu) == ("tensor", [3.0, 1.0], 0)
    assert engine_of().split_mode == "layer"  # llama.cpp's default, and llama-server's
    assert engine_of(split_mode="none", main_gpu="1").main_gpu == 1


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"split_mode": "row"}, 'split_mode = \'row\': "row" is superseded by "tensor"'),
        ({"split_mode": "rows"}, "engine.split_mode = 'rows'"),
        ({"tensor_split": "3,1", "devices": "0,1,2"}, "[engine] tensor_split = [3.0, 1.0] has 2 proportions for devices"),
        ({"tensor_split": "0,0"}, "[engine] tensor_split = [0.0, 0.0]: expected proportions >= 0, at least one"),
        ({"tensor_split": "1,-1"}, "[engine] tensor_split = [1.0, -1.0]"),
        ({"tensor_split": ",".join(["1"] * 17)}, "expected 1 to 16 proportions"),
        ({"split_mode": "none", "tensor_split": "3,1"}, '[engine] tensor_split = [3.0, 1.0] has no effect with split_mode = "none"'),
        ({"main_gpu": "1"}, '[engine] main_gpu = 1 acts only with split_mode = "none"'),
        ({"split_mode": "none", "main_gpu": "2", "devices": "0,1"}, "[engine] main_gpu = 2 is not among devices = '0,1'"),
    ],
)  # fmt: skip
def test_split_settings_llama_cpp_would_refuse_or_ignore_are_refused(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        engine_of(**env)
    assert says in str(err.value)


def test_tensor_mode_needs_flash_attention_and_offload() -> None:
    check_split("tensor", True, -1)  # the CUDA backend's defaults pass
    check_split("layer", False, 0)  # only tensor mode has these needs
    with pytest.raises(ConfigError, match=r'split_mode = "tensor" needs flash attention'):
        check_split("tensor", False, -1)
    with pytest.raises(ConfigError, match=r'split_mode = "tensor" splits the layers on the GPUs, and n_gpu_layers = 0'):
        check_split("tensor", True, 0)


def test_engine_command_carries_exactly_the_split_keys() -> None:
    def argv(**split: object) -> list[str]:
        cmd = engine_command("m.gguf", site="", env={}, n_ctx=512, parallel=1, n_batch=64, threads=None,
                             n_gpu_layers=-1, flash_attn=True, backend="cuda", **split)  # type: ignore[arg-type]  # fmt: skip
        return list(cmd.argv)

    def flag(args: list[str], name: str) -> str | None:
        return args[args.index(name) + 1] if name in args else None

    plain = argv()
    assert (flag(plain, "--split-mode"), flag(plain, "--main-gpu"), flag(plain, "--tensor-split")) == ("layer", "0", None)
    split = argv(split_mode="tensor", tensor_split=[3, 1.5])
    assert (flag(split, "--split-mode"), flag(split, "--tensor-split")) == ("tensor", "3.0,1.5")
    assert flag(argv(split_mode="none", main_gpu=1), "--main-gpu") == "1"


def test_serve_refuses_tensor_mode_on_the_cpu_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text('[engine]\nbackend = "cpu"\nsplit_mode = "tensor"\n')
    done = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "serve", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2
    assert 'strata: error: [engine] split_mode = "tensor" needs flash attention' in done.stderr
    assert "Traceback" not in done.stderr
    cfg.write_text('[engine]\nbackend = "cpu"\nsplit_mode = "tensor"\nflash_attn = true\n')
    done = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "serve", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2
    assert "n_gpu_layers = 0" in done.stderr and "Traceback" not in done.stderr


def start_engine(
    cpu_engine: EngineBuild, model: Path, n_gpu_layers: int = 0, flash_attn: bool | None = None, **split: object
) -> tuple[int, list[proto.Event]]:
    cmd = engine_command(str(model), site=str(cpu_engine.path), env={}, n_ctx=256, parallel=1, n_batch=64,
                         threads=None, n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, backend="cpu",
                         **split)  # type: ignore[arg-type]  # fmt: skip
    done = subprocess.run(list(cmd.argv), input="QUIT\n", capture_output=True, text=True, timeout=300,
                          env={**os.environ, **cmd.env})  # fmt: skip
    return done.returncode, [proto.parse_event(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_the_engine_refuses_tensor_mode_it_cannot_run(cpu_engine: EngineBuild, default_model: Path) -> None:
    """The engine applies the server's rules to whatever client starts it, and its own:
    tensor mode on a build that cannot offload."""
    for settings, says in [
        ({"flash_attn": False, "n_gpu_layers": -1}, 'split_mode = "tensor" needs flash attention'),
        ({"n_gpu_layers": 0}, "n_gpu_layers = 0"),
        ({"flash_attn": True, "n_gpu_layers": -1}, "split_mode tensor needs a GPU build of llama.cpp"),
        ({"split_mode": "layer", "tensor_split": [0.0]}, "engine options: [engine] tensor_split = [0.0]: expected"),
    ]:
        rc, events = start_engine(cpu_engine, default_model, **{"split_mode": "tensor", **settings})  # type: ignore[arg-type]
        assert rc == 1 and isinstance(events[0], proto.Error), settings
        assert events[0].message.startswith("engine failed to start: ") and says in events[0].message, settings


@pytest.mark.slow
def test_the_engine_reports_the_split_it_set(cpu_engine: EngineBuild, default_model: Path) -> None:
    rc, events = start_engine(cpu_engine, default_model, split_mode="none", main_gpu=0)
    assert rc == 0 and isinstance(events[0], proto.Ready)
    assert events[0].info["split"] == {"mode": "none", "main_gpu": 0, "tensor_split": []}


#: What a machine sets for NCCL and CUDA; the engine must run with it unchanged.
MACHINE_ENV = {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "NVL", "CUDA_MODULE_LOADING": "LAZY"}


@pytest.mark.slow
def test_server_hands_the_split_and_the_machine_env_to_the_engine(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text('[engine]\nsplit_mode = "layer"\ntensor_split = [1]\ndevices = "0"\n')
    env = {"STRATA_ENGINE_LLAMA_CPP": str(cpu_engine.path), **MACHINE_ENV}
    args = ["--backend", "cpu", "--parallel", "1", "--n-ctx", "512", "--config", str(cfg)]
    with Server(args, tmp_path / "server.log", env=env) as srv:
        engine = httpx.get(f"{srv.base}/v1/strata/backend", timeout=10).json()["engine"]
        assert engine["split"] == {"mode": "layer", "main_gpu": 0, "tensor_split": [1.0]}
        argv = Path(f"/proc/{engine['pid']}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"--split-mode") + 1] == b"layer"
        assert argv[argv.index(b"--tensor-split") + 1] == b"1.0"
        environ = dict(
            item.decode().split("=", 1) for item in Path(f"/proc/{engine['pid']}/environ").read_bytes().split(b"\0") if item
        )
        assert {k: environ.get(k) for k in MACHINE_ENV} == MACHINE_ENV
