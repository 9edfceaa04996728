"""The engine's log (llama.cpp's 2,000 lines at start, its Python warnings and stack dumps)
goes to a file of its own, not the server's console, unless --log-level debug; an
unexpected exit puts the file's name and last lines on the console."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

ARGS = ["--backend", "cpu", "--parallel", "1", "--n-ctx", "512"]
LLAMA_LINES = ("llama_model_loader", "load_tensors")


def home_env(cpu_engine: EngineBuild, home: Path) -> dict[str, str]:
    """A fresh $STRATA_HOME that reuses the tests' engine build."""
    return {"STRATA_HOME": str(home), "STRATA_ENGINE_LLAMA_CPP": str(cpu_engine.path)}


def wait_for(what: str, check, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_the_engine_logs_to_its_file_not_the_console(server: Server) -> None:
    assert server.engine_log is not None
    console, engine = server.log.read_text(), server.engine_log.read_text()
    for line in LLAMA_LINES:
        assert line in engine  # the fixture: llama.cpp does write these
        assert line not in console
    assert f"the engine logs to {server.engine_log}" in console
    assert "Strata serving smollm2-135m-instruct on http://" in console
    # the session server: 4 slots of 1024 tokens, 30 layers x 2 x 192 f16 values a token
    assert "KV cache f16/f16: 22.5 MiB per slot (4 slots of 1024 tokens)" in console
    info = httpx.get(f"{server.base}/v1/strata/backend").json()
    assert info["engine_log"] == str(server.engine_log)


def test_default_log_under_strata_home_and_a_crash_shows_its_end(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Server(ARGS, tmp_path / "server.log", env=home_env(cpu_engine, home), engine_log=False) as srv:
        path = home / "logs" / f"engine-{srv.port}.log"
        console = srv.log.read_text()
        assert f"the engine logs to {path}" in console
        assert all(line in path.read_text() for line in LLAMA_LINES)
        assert not any(line in console for line in LLAMA_LINES)
        assert len(console.splitlines()) <= 3, console  # loading, serving: what a user needs

        pid = httpx.get(f"{srv.base}/v1/strata/backend").json()["engine"]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for("a warning about the exit", lambda: "exited unexpectedly" in srv.log.read_text())
        wait_for("the restarted engine", lambda: httpx.get(f"{srv.base}/health").status_code == 200)
        console = srv.log.read_text()
        assert "the engine exited unexpectedly (killed by SIGKILL)" in console
        assert f"The last 20 lines of its log, {path}:" in console
        # the lines shown are the log's own, and the restarted engine appends to it
        shown = console.split(f"{path}:\n", 1)[1].splitlines()[:20]
        logged = path.read_text().splitlines()
        assert all(line.startswith("    ") and line[4:] in logged for line in shown), shown
        assert sum(line.startswith("==== ") for line in logged) == 2


def test_log_level_debug_puts_the_engine_log_on_the_console(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Server([*ARGS, "--log-level", "debug"], tmp_path / "server.log", env=home_env(cpu_engine, home),
                engine_log=False) as srv:  # fmt: skip
        console = srv.log.read_text()
        assert all(line in console for line in LLAMA_LINES)
        assert not (home / "logs").exists()
        assert httpx.get(f"{srv.base}/v1/strata/backend").json()["engine_log"] is None
