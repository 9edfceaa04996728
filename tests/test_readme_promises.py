"""What the README promises and no other test checked, through real servers and the CLI."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

ARGS = ["--backend", "cpu", "--parallel", "1", "--n-ctx", "512"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "strata_core.ops.cli", *args], capture_output=True, text=True,
                          timeout=600, env=os.environ.copy())  # fmt: skip


def test_health_is_503_until_the_engine_is_ready(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    """The server only listens once its first engine is up, so the window shows while a
    killed engine is restarted: /health answers 503 until the new one is ready."""
    with Server(ARGS, tmp_path / "server.log") as srv:
        assert httpx.get(f"{srv.base}/health").status_code == 200
        pid = httpx.get(f"{srv.base}/v1/strata/backend").json()["engine"]["pid"]
        os.kill(pid, signal.SIGKILL)
        seen: list[int] = []
        deadline = time.monotonic() + 300
        while not seen or seen[-1] != 200 or 503 not in seen:
            assert time.monotonic() < deadline, seen[-20:]
            seen.append(httpx.get(f"{srv.base}/health").status_code)
            time.sleep(0.01)
        assert httpx.get(f"{srv.base}/health").json() == {"status": "ok"}
        assert httpx.get(f"{srv.base}/v1/strata/backend").json()["engine"]["pid"] != pid


def test_backend_route_reports_the_running_build(server: Server, cpu_engine: EngineBuild) -> None:
    info = httpx.get(f"{server.base}/v1/strata/backend").json()
    assert info["backend"] == "cpu"
    assert info["build"]["cmake_args"] == cpu_engine.meta["cmake_args"]
    assert info["build"]["site"] == str(cpu_engine.path)
    assert info["devices"] and info["devices"][0]["index"] == 0
    engine = info["engine"]
    assert engine["backend"] == "cpu" and engine["slots"] == 4 and engine["n_vocab"] > 1000
    assert "chat_template" not in engine and "eog" not in engine  # too long to list here


def test_doctor_and_engine_list_show_the_build(cpu_engine: EngineBuild) -> None:
    doctor = cli("doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert "backend cpu: ok" in doctor.stdout
    assert f"engine build: {cpu_engine.path.parent}" in doctor.stdout
    listed = cli("engine", "list")
    assert listed.returncode == 0, listed.stderr
    assert str(cpu_engine.path.parent) in listed.stdout
    assert " ".join(cpu_engine.meta["cmake_args"]) in listed.stdout


def test_api_key_from_the_config_file(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text('[server]\napi_key = "from-the-file"\n')
    with Server(["--config", str(cfg), *ARGS], tmp_path / "server.log") as srv:
        r = httpx.post(f"{srv.base}/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="from-the-file", max_retries=0, timeout=120)
        assert client.completions.create(model="default", prompt="Hi", max_tokens=1).usage is not None
        # Ollama's routes too, answered in Ollama's shape; its client sends the key as a header
        r = httpx.post(f"{srv.base}/api/chat", json={"model": "default", "messages": []})
        assert r.status_code == 401 and "API key" in r.json()["error"]
        import ollama

        keyed = ollama.Client(host=srv.base, headers={"Authorization": "Bearer from-the-file"}, timeout=120)
        assert [m.model for m in keyed.list().models] == ["smollm2-135m-instruct"]


def test_frequency_penalty_over_http(client: openai.OpenAI) -> None:
    """Greedy, the model repeats itself on this prompt; a frequency penalty makes a
    repeated token cost more each time, so the most repeated one comes back less often."""
    messages = [{"role": "user", "content": "Count from 1 to 30, one number per line."}]

    def most_repeated(**extra: float) -> int:
        r = client.chat.completions.create(model="default", messages=messages, max_tokens=48, temperature=0,
                                           logprobs=True, **extra)  # type: ignore[arg-type]
        tokens = [e.token for e in (r.choices[0].logprobs.content or [])]  # type: ignore[union-attr]
        return collections.Counter(tokens).most_common(1)[0][1]

    plain = most_repeated()
    assert plain >= 8  # the fixture: without the penalty one token comes back again and again
    assert most_repeated(frequency_penalty=1.5) < plain


def test_auto_takes_the_first_backend_that_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` means the first of cuda, hip, sycl, metal, cpu whose probe succeeds."""
    from strata_core.ops.backend_spec import Probe, ProbeStatus
    from strata_core.ops.plugins import AUTO_ORDER, load_registry, select_backend

    assert AUTO_ORDER == ("cuda", "hip", "sycl", "metal", "cpu")
    reg = load_registry()
    ok = Probe(ProbeStatus.OK, "stubbed ok", ())
    refused = Probe(ProbeStatus.NO_DEVICE, "stubbed: no device", ())
    for name in ("cuda", "hip", "sycl", "metal"):
        monkeypatch.setattr(reg.backends[name].backend, "probe", lambda: refused)
    assert select_backend(reg, "auto").name == "cpu"
    for name in ("metal", "sycl", "hip", "cuda"):  # each one that can run beats those after it
        monkeypatch.setattr(reg.backends[name].backend, "probe", lambda: ok)
        assert select_backend(reg, "auto").name == name


def test_sigusr1_prints_stacks_and_serving_goes_on(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    """`kill -USR1` on the server prints its threads' stacks to the console (its event
    loop), on the engine to the engine's log (its main loop), and changes nothing else."""
    log = tmp_path / "server.log"
    with Server(ARGS, log) as srv:
        srv.dump_stacks()
        text = log.read_text()
        assert srv.engine_log is not None
        assert "strata_core/engine/__main__.py" in srv.engine_log.read_text()  # the engine's stack
        assert "strata_core/engine/__main__.py" not in text
        assert "uvicorn" in text  # the server's
        client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="x", max_retries=0, timeout=120)
        assert client.completions.create(model="default", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
