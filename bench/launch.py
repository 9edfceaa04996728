"""One launcher for the servers a benchmark runs: ``strata serve``, llama.cpp's
llama-server (built by ``bench.peers`` from the engine's own sources) and
llama-cpp-python's server, each started from the same ``Flags`` on a free loopback port,
as a context manager that waits until the server answers and stops it on exit.

    with launch("llama-server", Flags(parallel=4), log) as srv:
        ...  # srv.base, srv.proc, srv.log
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from strata_core.ops.build import ensure_engine
from strata_core.ops.config import load_config
from strata_core.ops.models import resolve_model
from strata_core.ops.plugins import load_registry, select_backend
from strata_core.testing.harness import Server, loopback_process

KINDS = ("strata", "llama-server", "llama-cpp-python")


@dataclass(frozen=True)
class Flags:
    """What a server is started with, the same for every kind. ``None``: Strata's own
    choice (the configuration's, or the backend's default), which the peers are given."""

    backend: str | None = None  # None: the configuration's
    model: str = "default"  # a name Strata resolves, or a GGUF path
    parallel: int = 1  # slots (llama-server's -np)
    n_ctx: int = 2048  # context per slot
    threads: int | None = None
    ngl: int | None = None  # layers on the GPU
    flash_attn: bool | None = None

    def resolved(self) -> tuple[str, str, int, int, bool]:
        """(backend, model path, threads, ngl, flash_attn) as Strata's engine would take them."""
        cfg = load_config().engine
        backend = select_backend(load_registry(), self.backend or cfg.backend)
        d = backend.engine_defaults()
        threads = self.threads or cfg.threads or len(os.sched_getaffinity(0))
        ngl = d.n_gpu_layers if self.ngl is None else self.ngl
        fa = d.flash_attn if self.flash_attn is None else self.flash_attn
        return backend.name, str(resolve_model(self.model).path), threads, ngl, fa


class Running(Protocol):
    base: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Peer:
    """A server process of another project, started by ``process``."""

    base: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextmanager
def process(
    argv: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None,
    health: str = "/health", timeout: float = 300,
) -> Iterator[Peer]:  # fmt: skip
    """``argv`` on a free loopback port (``--host`` and ``--port`` added), its console in
    ``log``, once ``health`` answers 200; terminated on exit."""
    with loopback_process(list(argv), log, env, cwd, health, timeout) as (base, proc):
        yield Peer(base, proc, log)


def strata_args(flags: Flags) -> tuple[list[str], dict[str, str]]:
    """``strata serve``'s arguments and environment for ``flags``."""
    args = ["--model", flags.model, "--parallel", str(flags.parallel), "--n-ctx", str(flags.n_ctx)]
    args += ["--backend", flags.backend] if flags.backend else []
    env = {"STRATA_ENGINE_THREADS": str(flags.threads)} if flags.threads else {}
    if flags.ngl is not None:
        env["STRATA_ENGINE_N_GPU_LAYERS"] = str(flags.ngl)
    if flags.flash_attn is not None:
        env["STRATA_ENGINE_FLASH_ATTN"] = str(flags.flash_attn).lower()
    return args, env


def llama_server_argv(flags: Flags, binary: str | None = None) -> list[str]:
    """llama-server's command line for ``flags`` (the binary: ``bench.peers`` builds it)."""
    from bench.peers import llama_server

    backend, model, threads, ngl, fa = flags.resolved()
    return [binary or str(llama_server(backend)), "-m", model, "-np", str(flags.parallel),
            "-c", str(flags.n_ctx * flags.parallel), "-t", str(threads), "-tb", str(threads),
            "--no-webui", "-ngl", str(ngl), "-fa", "on" if fa else "off"]  # fmt: skip


def llama_cpp_python_argv(flags: Flags) -> tuple[list[str], dict[str, str]]:
    """llama-cpp-python's server (the engine's own llama_cpp package) for ``flags``."""
    backend, model, threads, ngl, _ = flags.resolved()
    site = str(ensure_engine(load_registry().get(backend)).path)
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_ctx", str(flags.n_ctx),
            "--n_threads", str(threads), "--n_gpu_layers", str(ngl)]  # fmt: skip
    return argv, {"PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}


@contextmanager
def launch(
    kind: str, flags: Flags, log: Path, extra: Sequence[str] = (), env: dict[str, str] | None = None,
    binary: str | None = None, timeout: float = 300,
) -> Iterator[Running]:  # fmt: skip
    """A server of ``kind`` (one of ``KINDS``) started with ``flags``, plus ``extra``
    arguments and ``env``; ``binary``: this llama-server instead of bench.peers'. A
    Strata server is the tests' ``Server`` (with ``dump_stacks`` and ``engine_log_tail``).
    SIGTERM (e.g. from ``timeout``) then stops the server as Ctrl-C does."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if kind == "strata":
        args, own = strata_args(flags)
        srv = Server([*args, *extra], log, env={**own, **(env or {})})
        try:
            srv.wait_ready(timeout)
            yield srv
        finally:
            srv.stop()
    elif kind == "llama-server":
        with process([*llama_server_argv(flags, binary), *extra], log, env, timeout=timeout) as peer:
            yield peer
    elif kind == "llama-cpp-python":  # it has no /health; /v1/models answers once it is up
        argv, own = llama_cpp_python_argv(flags)
        with process([*argv, *extra], log, {**own, **(env or {})}, health="/v1/models", timeout=timeout) as peer:
            yield peer
    else:
        raise ValueError(f"unknown server kind {kind!r}: one of {', '.join(KINDS)}")
