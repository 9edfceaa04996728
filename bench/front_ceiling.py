"""The HTTP tier's ceiling: ``strata serve`` streaming at concurrency c from an engine whose
decode costs nothing, so what limits tokens/s is the host's work per token (the engine's
Python, the pipe, the server's reader, detokenizer, SSE and HTTP) and the load generator.

    python -m bench.front_ceiling [--concurrency 1 16 64] [--requests 128] [--max-tokens 128]

The engine is the real one on the default model (its vocabulary, template, scheduler,
emission), with ``llama_decode`` replaced by nothing and its logits by a fixed random matrix
(``device_sampling`` on, as on a GPU: greedy picks read as ids). Prints, per concurrency,
tokens/s and the CPU milliseconds per streamed token of the server process and of the
engine process (from /proc), which say what a GPU step would have to hide.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.load import run_load
from strata_core.testing.harness import free_port, wait_healthy


def stand_in_engine() -> None:
    """The engine's main() with a Llama whose decode does nothing (run in the engine process)."""
    import numpy as np

    from strata_core.engine import llama as engine_llama  # isort: skip
    from strata_core.engine.__main__ import main

    made: dict[str, Any] = {}

    def matrix(self: Any) -> Any:
        """The fixed logits rows (made on first use: the vocabulary is the model's) and
        their argmax, what a pick in the decode gives (the stand-in ignores a bias)."""
        if not made:
            made["rows"] = np.random.default_rng(0).normal(0.0, 2.0, (512, self.n_vocab)).astype(np.float32)
            made["argmax"] = [int(t) for t in np.argmax(made["rows"], axis=1)]
        return made

    cls = engine_llama.Llama
    cls.decode = lambda self, batch: None  # type: ignore[method-assign]
    cls.synchronize = lambda self: None  # type: ignore[method-assign]
    cls.outputs = lambda self, n: matrix(self)["rows"][:n]  # type: ignore[method-assign]
    cls.logits = lambda self, i: matrix(self)["rows"][i]  # type: ignore[method-assign]
    cls.sampled = lambda self, r, n: [matrix(self)["argmax"][i] for i in r]  # type: ignore[method-assign]
    if os.environ.get("FRONT_CEILING_PROFILE"):  # where the engine's CPU goes
        import cProfile

        cProfile.runctx("main(sys.argv[1:])", globals(), locals(), os.environ["FRONT_CEILING_PROFILE"])
        return
    sys.exit(main(sys.argv[1:]))


def serve_with_stand_in(argv: list[str]) -> None:
    """``strata serve`` whose engines are ``stand_in_engine`` (run in the server process)."""
    from strata_core.api import launch
    from strata_core.client.reader import EngineCommand
    from strata_core.ops.cli import main

    real = launch.engine_command

    def command(*args: Any, **kw: Any) -> EngineCommand:
        cmd = real(*args, **kw)
        i = cmd.argv.index("strata_core.engine")
        return EngineCommand([*cmd.argv[: i - 1], "-m", "bench.front_ceiling", "--engine", *cmd.argv[i + 1 :]], cmd.env)

    launch.engine_command = command  # type: ignore[assignment]
    sys.exit(main(["serve", *argv]))


def cpu_ms(pid: int) -> float:
    """A process's user + system CPU time so far, in milliseconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def engine_pid(server: int) -> int:
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    return int(children[0])


def main() -> None:
    if sys.argv[1:2] == ["--engine"]:
        del sys.argv[1]
        return stand_in_engine()
    if sys.argv[1:2] == ["--serve"]:
        return serve_with_stand_in(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    slots = max(a.concurrency)
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        config = Path(d) / "strata.toml"
        config.write_text(f'[engine]\nbackend = "cpu"\nparallel = {slots}\nn_ctx = 512\ndevice_sampling = true\n')
        log = Path(d) / "server.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
        argv = [sys.executable, "-m", "bench.front_ceiling", "--serve", "--config", str(config), "--port", str(port)]
        proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(proc, base, log)
            run_load(base, 1, 1, 8)  # the engine starts on the first request
            engine = engine_pid(proc.pid)
            print(f"stand-in engine, {slots} slots, {a.requests} requests x {a.max_tokens} tokens each, ignore_eos")
            for c in a.concurrency:
                s0, e0 = cpu_ms(proc.pid), cpu_ms(engine)
                load = run_load(base, c, a.requests, a.max_tokens, extra={"ignore_eos": True})
                s1, e1 = cpu_ms(proc.pid), cpu_ms(engine)
                tokens = sum(r.tokens for r in load.replies)
                print(f"c={c:<3d} {load.tok_s:8.1f} tok/s  ITL p50 {load.pct('itl', 0.5):6.2f} ms  "
                      f"server CPU {(s1 - s0) / tokens:.3f} ms/token  engine CPU {(e1 - e0) / tokens:.3f} ms/token  "
                      f"errors {len(load.errors)}")  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
