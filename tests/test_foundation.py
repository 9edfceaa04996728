"""Issue 2: registry, config, the engine build and a first decode on the real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.ops.backend_spec import ProbeStatus
from strata_core.ops.build import EngineBuild, build_key, engine_dir, find_engine
from strata_core.ops.config import ConfigError, load_config
from strata_core.ops.plugins import load_registry

STRATA = [sys.executable, "-m", "strata_core.ops.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STRATA, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600
    )


# ---- registry ------------------------------------------------------------------------


def write_plugin(root: Path, name: str, body: str) -> None:
    """An installed distribution (dist-info on sys.path) with one strata.backends entry point."""
    (root / f"{name}.py").write_text(textwrap.dedent(body))
    info = root / f"strata_{name}_test-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: strata-{name}-test\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[strata.backends]\n{name} = {name}\n")


def test_backends_json_lists_all_five() -> None:
    done = run_cli("backends", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert {"cpu", "cuda", "hip", "sycl", "metal"} <= set(rows)
    assert rows["cpu"]["status"] == "ok"
    registry = load_registry()
    for name in ("cuda", "hip", "sycl", "metal"):
        probe = registry.get(name).probe()  # what this machine has, asked here too
        assert rows[name]["status"] == probe.status.value, rows[name]
        assert rows[name]["reason"] == probe.reason
        assert rows[name]["verified_on_hardware"] is (name == "cuda")  # docs/backends/cuda.md
        # a build against the real toolchain is recorded in docs/backends/<name>.md
        assert rows[name]["build_verified"] is (name in {"cuda", "hip"}), rows[name]
    assert rows["cpu"]["build_verified"] is True


def test_backends_text_marks_what_is_verified() -> None:
    done = run_cli("backends")
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if not line[:1].isspace()}
    assert "unverified" not in lines["cpu"] and "unverified" not in lines["cuda"]
    assert lines["hip"].endswith("[build verified, unverified on hardware]")
    assert lines["sycl"].endswith("  [unverified on hardware]") and "build" not in lines["sycl"]


def test_broken_plugin_is_reported_and_others_work(tmp_path: Path) -> None:
    write_plugin(tmp_path, "exploding", "raise RuntimeError('boom at import')\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = run_cli("backends", "--json", env=env)
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["exploding"]["status"] == "broken"
    assert "boom at import" in rows["exploding"]["reason"]
    assert rows["exploding"]["distribution"] == "strata-exploding-test"
    assert rows["cpu"]["status"] == "ok"

    strict = run_cli("backends", env={**env, "STRATA_STRICT_PLUGINS": "1"})
    assert strict.returncode != 0
    assert "boom at import" in strict.stderr


def test_plugin_with_wrong_interface_version_is_broken(tmp_path: Path) -> None:
    write_plugin(
        tmp_path,
        "oldapi",
        """
        from strata_core.backends.cpu import CpuBackend
        from strata_core.ops.hookspecs import hookimpl

        class Old(CpuBackend):
            name = "oldapi"
            api_version = 0

        @hookimpl
        def strata_backends():
            return [Old()]
        """,
    )
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    rows = {r["name"]: r for r in json.loads(run_cli("backends", "--json", env=env).stdout)}
    assert rows["oldapi"]["status"] == "broken"
    assert "interface version 0" in rows["oldapi"]["reason"]


def test_explicit_backend_that_cannot_run_fails_with_the_probe_reason() -> None:
    registry = load_registry()
    probes = {n: registry.get(n).probe() for n in ("metal", "hip", "sycl", "cuda")}
    # no_device still builds (a build machine without the GPU): pick one that cannot
    name = next(
        (n for n, p in probes.items() if p.status not in {ProbeStatus.OK, ProbeStatus.NO_DEVICE}),
        None,
    )
    if name is None:
        pytest.skip("every accelerator backend's toolchain is on this machine")
    done = run_cli("engine", "build", "--backend", name)
    assert done.returncode == 2
    assert f"backend '{name}' is not available" in done.stderr
    assert probes[name].reason in done.stderr


# ---- config --------------------------------------------------------------------------


def test_misspelled_key_refuses_to_start(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text("[engine]\nparalel = 4\n")
    with pytest.raises(ConfigError, match="unknown key 'paralel'"):
        load_config(cfg, env={})
    done = run_cli("serve", "--config", str(cfg))
    assert done.returncode == 2
    assert "unknown key 'paralel'" in done.stderr


def test_out_of_range_value_refuses_to_start(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text("[sampling]\ntemperature = 7.5\n")
    with pytest.raises(ConfigError, match=r"sampling\.temperature = 7\.5"):
        load_config(cfg, env={})
    done = run_cli("serve", "--config", str(cfg))
    assert done.returncode == 2
    assert "sampling.temperature" in done.stderr


def test_unknown_section_and_env_key_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text("[speculativ]\nmode = 'off'\n")
    with pytest.raises(ConfigError, match="unknown key 'speculativ'"):
        load_config(cfg, env={})
    with pytest.raises(ConfigError, match="unknown key 'modle'"):
        load_config(None, env={"STRATA_ENGINE_MODLE": "x"})


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text("[engine]\nparallel = 2\nn_ctx = 512\nbackend = 'cpu'\n")
    env = {"STRATA_ENGINE_PARALLEL": "3", "STRATA_BACKEND": "cuda"}
    c = load_config(cfg, env=env, overrides={"engine": {"parallel": 5, "backend": None}})
    assert (c.engine.parallel, c.engine.n_ctx, c.engine.backend) == (5, 512, "cuda")
    assert load_config(None, env={}).engine.parallel == "auto"  # a CPU engine is asked for CPU_PARALLEL


# ---- the native engine ---------------------------------------------------------------


def test_engine_build_is_cached_and_keyed(cpu_engine: EngineBuild) -> None:
    spec = CpuBackend().build_spec()
    assert cpu_engine.path.parent == engine_dir("cpu", spec)
    assert (cpu_engine.path / "llama_cpp").is_dir()
    meta = json.loads((cpu_engine.path.parent / "build.json").read_text())
    assert meta["cmake_args"] == list(spec.cmake_args)
    assert "-DGGML_NATIVE=OFF" in meta["cmake_args"]
    # A second build call reuses the finished build instead of compiling again.
    done = run_cli("engine", "build", "--backend", "cpu")
    assert done.returncode == 0, done.stderr
    assert str(cpu_engine.path.parent) in done.stdout
    assert "building" not in done.stderr
    assert json.loads((cpu_engine.path.parent / "build.json").read_text())["built_at"] == meta["built_at"]
    # Other flags make another key: a CPU build is never taken for a CUDA one.
    from strata_core.ops.backend_spec import BuildSpec

    other = BuildSpec(cmake_args=(*spec.cmake_args, "-DGGML_CUDA=ON"))
    assert build_key(other) != build_key(spec)
    assert find_engine("cuda", other) is None


def test_cuda_source_edit_applies_to_the_pinned_release_once(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    """The CUDA backend's edit finds its text in the pinned release (a new pin whose text
    moved fails here, not in a GPU build), is applied from the released text every time,
    and is part of the build key."""
    import shutil

    from strata_cuda import GRAPH_KEY_BY_SHAPE

    from strata_core.ops.backend_spec import BuildSpec, SourceEdit
    from strata_core.ops.build import ORIGINAL, BuildError, apply_source_edits, source_dir

    edit = GRAPH_KEY_BY_SHAPE
    released = source_dir(print) / edit.path
    kept = released.with_name(released.name + ORIGINAL)
    tree = tmp_path / "src"
    target = tree / edit.path
    target.parent.mkdir(parents=True)
    shutil.copy2(kept if kept.is_file() else released, target)
    release_text = target.read_text()
    assert release_text.count(edit.old) == 1 and edit.new not in release_text

    said: list[str] = []
    apply_source_edits(tree, (edit,), said.append)
    edited = target.read_text()
    assert edited == release_text.replace(edit.old, edit.new) and said == [f"edited {edit.path}: {edit.why}"]
    assert target.with_name(target.name + ORIGINAL).read_text() == release_text
    stamp = target.stat().st_mtime_ns
    apply_source_edits(tree, (edit,), said.append)  # unchanged: no rewrite, no rebuild
    assert target.stat().st_mtime_ns == stamp and len(said) == 1

    # A changed edit is applied to the released text, not stacked on the older one.
    other = SourceEdit(edit.path, edit.old, edit.new.replace("different keys", "their own keys"), "v2")
    apply_source_edits(tree, (other,), said.append)
    assert target.read_text() == release_text.replace(edit.old, other.new)
    with pytest.raises(BuildError, match="occurs 0 times"):
        apply_source_edits(tree, (SourceEdit(edit.path, "no such text", "", "stale"),), said.append)

    spec = BuildSpec(cmake_args=("-DGGML_CUDA=ON",))
    assert build_key(BuildSpec(spec.cmake_args, source_edits=(edit,))) != build_key(spec)
    assert build_key(BuildSpec(spec.cmake_args, source_edits=(other,))) != build_key(
        BuildSpec(spec.cmake_args, source_edits=(edit,))
    )


def test_engine_gives_logits_of_one_token(cpu_engine: EngineBuild, default_model: Path) -> None:
    code = textwrap.dedent(
        f"""
        import numpy as np
        from strata_core.engine.llama import Batch, Llama, ModelOptions
        m = Llama(ModelOptions(path={str(default_model)!r}, n_ctx=64, n_seq=1, n_batch=16))
        b = Batch(16)
        b.add([1], 0, 0, "all")
        m.decode(b)
        row = m.logits(0).copy()
        print(m.n_vocab, row.shape[0], bool(np.isfinite(row).all()), float(row.std()) > 0.1)
        """
    )
    env = {**os.environ, "PYTHONPATH": f"{cpu_engine.path}{os.pathsep}{Path(__file__).parents[1]}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["49152", "49152", "True", "True"]
