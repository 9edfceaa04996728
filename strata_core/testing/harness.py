"""Start real engines and servers for tests: an engine process spoken to line by line,
``strata serve`` on a free loopback port, and scripts that drive the engine's classes
in a process of their own."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from strata_core.client.reader import engine_command
from strata_core.contract import protocol as proto
from strata_core.ops.backend_spec import Backend
from strata_core.ops.build import EngineBuild, list_engines
from strata_core.ops.config import EngineConfig, SpeculativeConfig, load_config

E = TypeVar("E", bound=proto.Event)


def run_engine_script(script: str, engine: EngineBuild, model: Path) -> Any:
    """Run ``script`` (with MODEL set) where the engine's libllama is importable (it must
    load before numpy, so in a process of its own); the JSON its last line prints."""
    env = {**os.environ, "PYTHONPATH": f"{engine.path}{os.pathsep}{Path(__file__).parents[2]}"}
    code = f"MODEL = {str(model)!r}\n{script}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineProcess:
    """An engine process driven directly over the protocol, for protocol-level checks."""

    def __init__(
        self, backend: Backend, build: EngineBuild, model: Path, parallel: int = 2,
        draft_model: Path | None = None, spec_threshold: float = SpeculativeConfig().threshold,
        flash_attn: bool | None = None, spec_adaptive: bool = SpeculativeConfig().adaptive,
        prompt_cache_mib: int = EngineConfig().prompt_cache_mib,
        cache_types: tuple[str, str] = ("f16", "f16"), mmproj: Path | None = None,
        device_sampling: bool | None = None, spec_k: int = SpeculativeConfig().k,
    ) -> None:  # fmt: skip
        d = backend.engine_defaults()
        flash_attn = d.flash_attn if flash_attn is None else flash_attn
        cmd = engine_command(
            str(model), site=str(build.path), env=backend.engine_env(EngineConfig()), n_ctx=1024,
            parallel=parallel, n_batch=256, threads=load_config().engine.threads, n_gpu_layers=d.n_gpu_layers,
            flash_attn=flash_attn, backend=backend.name,
            draft_model=str(draft_model) if draft_model else None, spec_threshold=spec_threshold,
            spec_adaptive=spec_adaptive, prompt_cache_mib=prompt_cache_mib, cache_types=cache_types,
            mmproj=str(mmproj) if mmproj else None, spec_k=spec_k,
            device_sampling=load_config().engine.device_sampling if device_sampling is None else device_sampling,
        )  # fmt: skip
        self.proc = subprocess.Popen(
            list(cmd.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, **cmd.env}, text=True, bufsize=1,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.ready = self.expect(proto.Ready, timeout=300)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, cmd: proto.Command) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(proto.encode_command(cmd) + "\n")
        self.proc.stdin.flush()

    def next_event(self, timeout: float = 120) -> proto.Event:
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise EOFError("the engine exited")
        return proto.parse_event(line)

    def expect(self, kind: type[E], timeout: float = 120) -> E:
        ev = self.next_event(timeout)
        if not isinstance(ev, kind):
            raise AssertionError(f"expected {kind.__name__}, got {ev!r}")
        return ev

    def run(self, rid: str, prompt: list[int], **keys: object) -> list[proto.Event]:
        """Send one GEN and collect its events up to and including DONE."""
        self.send(proto.Gen(rid, {k: str(v) for k, v in keys.items()}, tuple(prompt)))
        events: list[proto.Event] = []
        while True:
            ev = self.next_event()
            if getattr(ev, "rid", None) == rid:
                events.append(ev)
                if isinstance(ev, proto.Done):
                    return events

    def close(self) -> None:
        try:
            self.send(proto.Quit())
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def wait_healthy(
    proc: subprocess.Popen[Any], base: str, log: Path, timeout: float = 300, path: str = "/health"
) -> None:
    """Until ``base`` + ``path`` answers 200 (a Strata server or llama-server: /health);
    fails with the end of ``log`` if ``proc`` exits or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server not ready: {log.read_text()[-3000:]}")


def llama_server_binary(engine: EngineBuild) -> Path | None:
    """llama-server built in the engine's own CMake tree (``python -m bench.peers`` builds it there),
    else in the tree of another build of the same sources whose flags differ only in
    LLAVA_BUILD (whether the engine carries mtmd: llama-server builds its own)."""

    def flags(b: EngineBuild) -> tuple[str, ...]:
        return tuple(a for a in b.meta.get("cmake_args", []) if not a.startswith("-DLLAVA_BUILD="))

    same = [b for b in list_engines() if b.backend == engine.backend and flags(b) == flags(engine)
            and b.meta.get("llama_cpp_python") == engine.meta.get("llama_cpp_python")]  # fmt: skip
    for tree in [engine.meta.get("build_dir"), *(b.meta.get("build_dir") for b in same)]:
        found = sorted(Path(tree).rglob("llama-server")) if tree and Path(tree).is_dir() else []
        binary = next((p for p in found if p.is_file() and os.access(p, os.X_OK)), None)
        if binary is not None:
            return binary
    return None


@contextmanager
def loopback_process(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None,
    health: str = "/health", timeout: float = 300,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:  # fmt: skip
    """``argv`` and ``--host 127.0.0.1 --port N`` (a free port), its console in ``log_path``,
    with ``env`` over this environment; its base URL and process once ``health`` answers."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(proc, base, log_path, timeout, health)
            yield base, proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def llama_server(binary: Path, args: list[str], log_path: Path) -> Iterator[str]:
    """llama-server with ``args`` on a free loopback port, its console in ``log_path``; its
    base URL once healthy."""
    with loopback_process([str(binary), *args], log_path) as (base, _):
        yield base


class Server:
    """``strata serve`` in a subprocess on a free loopback port; its console goes to ``log``
    and its engine's log to ``engine_log`` beside it (``engine_log=False``: where the
    server puts it by default, $STRATA_HOME/logs)."""

    def __init__(
        self, args: list[str], log: Path, env: dict[str, str] | None = None, engine_log: bool = True
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.engine_log = log.with_name(f"{log.stem}.engine.log") if engine_log else None
        cmd = [sys.executable, "-m", "strata_core.ops.cli", "serve", "--port", str(self.port), *args]
        if self.engine_log is not None:
            cmd += ["--engine-log", str(self.engine_log)]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    def wait_ready(self, timeout: float = 300) -> None:
        wait_healthy(self.proc, self.base, self.log, timeout)

    def dump_stacks(self) -> None:
        """Have the server and its engine print every thread's stack (SIGUSR1): the server's
        to ``log``, the engine's to its own log."""
        pids = [self.proc.pid]
        try:
            pids.append(int(httpx.get(f"{self.base}/v1/strata/backend", timeout=5).json()["engine"]["pid"]))
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(1.0)

    def engine_log_tail(self, chars: int = 12000) -> str:
        """The end of the engine's log, when it has a file of its own here."""
        if self.engine_log is None or not self.engine_log.exists():
            return ""
        return self.engine_log.read_text(errors="replace")[-chars:]

    def __enter__(self) -> Server:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
