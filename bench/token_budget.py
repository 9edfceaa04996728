"""Where one generated token's milliseconds go, layer by layer, at concurrency 1.

    python bench/token_budget.py [--backend cpu] [--model default] [--tokens 128] [--rounds 3]
        [--llama-server PATH]

Streams the same greedy chat through each layer in turn and reports the median time
between tokens (ITL) and the CPU each process spent per token:

1. ``scheduler``: the engine's scheduler in this process, no I/O; per step its
   ``llama_decode`` call, its sampling, and the rest of the step (``STRATA_STEP_TRACE``).
2. ``engine``: the engine process over its protocol, this process reading its stdout.
3. ``strata``: ``strata serve`` over HTTP (SSE), this process the client.
4. ``llama-server`` beside it, same model, slots, threads and flash attention.
5. ``floor``: the least a Python server does for a streamed token, for scale beside 3's
   server CPU: a bare ASGI app (``floor_app``) under uvicorn that reads one line a token
   from a child process's pipe, at the engine's pace, and sends one chat chunk for it.

The differences between the layers are what each adds: 2 - 1 the protocol and pipes, 3 - 2
the server (reader, SSE, HTTP) and its contention with the engine's threads for cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a story about a lighthouse keeper who finds a message in a bottle."


_floor_child: list = []  # floor_app's line writer, started by its first request


async def floor_app(scope: dict, receive: object, send: object) -> None:
    """Layer 5: one SSE chat chunk for each line a child process writes every FLOOR_ITL
    seconds (the child is started once, as an engine is, and writes n lines when asked)."""
    import asyncio
    import json

    assert callable(send)
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    if scope["path"] == "/health":
        await send({"type": "http.response.body", "body": b"ok"})
        return
    if not _floor_child:
        child = (f"import sys, time\nfor n in sys.stdin:\n    for i in range(int(n)):\n"
                 f"        time.sleep({float(os.environ['FLOOR_ITL'])}); print('T r', i, flush=True)\n")  # fmt: skip
        _floor_child.append(await asyncio.create_subprocess_exec(
            sys.executable, "-c", child, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE))  # fmt: skip
    proc = _floor_child[0]
    assert proc.stdin is not None and proc.stdout is not None
    n = int(os.environ["FLOOR_TOKENS"])
    proc.stdin.write(f"{n}\n".encode())
    for _ in range(n):
        line = await proc.stdout.readline()
        delta = {"content": f" w{line.split()[-1].decode()}"}
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "system_fingerprint": None,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}  # fmt: skip
        await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def cpu_secs(pid: int) -> float:
    """User and system CPU seconds of a process and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def med_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3 if xs else float("nan")


def stream_http(base: str, tokens: int, pids: list[int]) -> tuple[list[float], int, list[float]]:
    """One streamed greedy chat; the gaps between content chunks, the tokens, and each
    process's CPU seconds over the request."""
    body = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    before = [cpu_secs(p) for p in pids]
    gaps, last, n = [], None, 0
    with httpx.Client(timeout=600) as c, c.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
                n += 1
    return gaps, n, [cpu_secs(p) - b for p, b in zip(pids, before, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-server", help="this llama-server binary instead of one built by bench/peers.py")
    a = ap.parse_args()

    from strata_core.client.reader import engine_command
    from strata_core.ops.build import ensure_engine
    from strata_core.ops.config import EngineConfig, load_config
    from strata_core.ops.models import resolve_model
    from strata_core.ops.plugins import load_registry
    from strata_core.testing.harness import Server, free_port

    backend = load_registry().get(a.backend)
    site = str(ensure_engine(backend).path)
    model = str(resolve_model(a.model).path)
    d = backend.engine_defaults()
    threads = load_config().engine.threads or len(os.sched_getaffinity(0))
    rows: dict[str, float] = {}  # milliseconds

    # 1. the scheduler in a subprocess of its own (libllama loads before numpy there)
    script = f"""
import json, sys, time
from strata_core.engine.llama import Llama, ModelOptions
from strata_core.contract.options import SamplingParams
from strata_core.engine.loop import Engine
from strata_core.engine.request import Request
m = Llama(ModelOptions(path={model!r}, n_ctx=2048, n_seq=1, n_batch=512, threads={threads},
                       n_gpu_layers={d.n_gpu_layers}, flash_attn={d.flash_attn!r}))
m.warm_up()
text = "<|im_start|>user\\n" + {PROMPT!r} + "<|im_end|>\\n<|im_start|>assistant\\n"
prompt = m.tokenize(text.encode(), True, True)
for r in range({a.rounds}):
    steps = []
    s = Engine(m, lambda e: None, trace=steps.append)
    s.submit(Request("r", list(prompt), SamplingParams(), {a.tokens}, frozenset(), None))
    while s.busy:
        s.step()
    print(json.dumps([x for x in steps if x.get("n") == 1 and "rows" in x][2:]), flush=True)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, str(Path(__file__).resolve().parents[1])])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    import json

    steps = [s for line in out.stdout.splitlines() for s in json.loads(line)]
    for key, label in (("step_ms", "step"), ("decode_ms", "llama_decode"), ("verify_ms", "sampling")):
        rows[f"scheduler: {label}"] = statistics.median(s[key] for s in steps)

    # 2. the engine process over the protocol
    from strata_core.contract import protocol as proto

    cmd = engine_command(model, site=site, env=backend.engine_env(EngineConfig()), n_ctx=2048, parallel=1,
                         n_batch=512, threads=threads, n_gpu_layers=d.n_gpu_layers, flash_attn=d.flash_attn,
                         backend=backend.name)  # fmt: skip
    eng = subprocess.Popen(list(cmd.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env={**os.environ, **cmd.env}, bufsize=1)  # fmt: skip
    assert eng.stdin is not None and eng.stdout is not None
    eng.stdout.readline()  # READY
    eng.stdin.write(proto.encode_command(proto.Tokenize("t", "<|im_start|>user\n" + PROMPT + "<|im_end|>\n<|im_start|>assistant\n", True)) + "\n")
    eng.stdin.flush()
    ids = proto.parse_event(eng.stdout.readline()).ids  # type: ignore[attr-defined]
    gaps: list[float] = []
    cpu: list[float] = []
    for r in range(a.rounds):
        before = cpu_secs(eng.pid)
        eng.stdin.write(proto.encode_command(proto.Gen(f"g{r}", {"max_tokens": str(a.tokens)}, tuple(ids))) + "\n")
        eng.stdin.flush()
        last = None
        while True:
            line = eng.stdout.readline()
            if line.startswith("T "):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
            elif line.startswith("DONE"):
                break
        cpu.append((cpu_secs(eng.pid) - before) / a.tokens)
    eng.stdin.write("QUIT\n")
    eng.stdin.close()
    eng.wait(30)
    rows["engine: ITL"] = med_ms(gaps)
    rows["engine: CPU per token"] = statistics.median(cpu) * 1e3

    # 3. strata serve; 4. llama-server; 5. the floor
    from bench.serving import wait_health

    def http(name: str, base: str, pids: list[int]) -> None:
        stream_http(base, 8, pids)  # warm-up
        itl: list[float] = []
        per: list[list[float]] = []
        for _ in range(a.rounds):
            g, n, secs = stream_http(base, a.tokens, pids)
            itl += g
            per.append([s / max(n, 1) for s in secs])
        rows[f"{name}: ITL"] = med_ms(itl)
        for i, label in enumerate(["server", "engine"][: len(pids)]):
            rows[f"{name}: CPU per token ({label})"] = statistics.median(p[i] for p in per) * 1e3

    def measure(name: str, port: int, proc: subprocess.Popen[bytes]) -> None:
        """``http`` on a server process started on ``port``, stopped afterwards."""
        try:
            base = f"http://127.0.0.1:{port}"
            wait_health(base, proc)
            http(name, base, [proc.pid])
        finally:
            proc.terminate()
            proc.wait(30)

    with tempfile.TemporaryDirectory() as tmp:
        args = ["--backend", backend.name, "--model", model, "--parallel", "1", "--n-ctx", "2048"]
        with Server(args, Path(tmp) / "strata.log", {"STRATA_ENGINE_THREADS": str(threads)}) as srv:
            children = subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True).stdout.split()
            http("strata", srv.base, [srv.proc.pid, int(children[0])])
        from bench.peers import llama_server

        port = free_port()
        binary = a.llama_server or str(llama_server(backend.name))
        peer = subprocess.Popen([binary, "-m", model, "-np", "1", "-c", "2048", "-t", str(threads), "-tb", str(threads),
                                 "--port", str(port), "--no-webui", "-ngl", "99" if d.n_gpu_layers else "0",
                                 "-fa", "on" if d.flash_attn else "off"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        measure("llama-server", port, peer)

        port = free_port()
        fenv = {**os.environ, "FLOOR_TOKENS": str(a.tokens), "FLOOR_ITL": str(rows["engine: ITL"] / 1e3)}
        floor = subprocess.Popen([sys.executable, "-m", "uvicorn", "bench.token_budget:floor_app", "--port", str(port),
                                  "--log-level", "warning"], cwd=Path(__file__).resolve().parents[1], env=fenv)  # fmt: skip
        measure("floor", port, floor)

    print(f"median over {a.rounds} rounds of {a.tokens} tokens, {threads} threads, backend {backend.name}")
    for name, ms in rows.items():
        print(f"{name:<38} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
