"""Fixtures that start the real engine and a real server on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.build import EngineBuild, ensure_engine
from strata_core.config import load_config
from strata_core.models import default_model_path


@pytest.fixture(scope="session")
def cpu_engine() -> EngineBuild:
    """The CPU engine, built once and cached under $STRATA_HOME (or the operator's
    ``engine.llama_cpp``, e.g. STRATA_ENGINE_LLAMA_CPP, when set)."""
    llama_cpp = load_config().engine.llama_cpp
    return ensure_engine(CpuBackend(), llama_cpp, log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def llama_cpp_site(cpu_engine: EngineBuild) -> Path:
    return cpu_engine.path


@pytest.fixture(scope="session")
def default_model() -> Path:
    return default_model_path()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "strata_core.cli", "serve", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def server(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = Server(["--backend", "cpu", "--parallel", "4", "--n-ctx", "1024"], log)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture()
def client(server: Server):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)
