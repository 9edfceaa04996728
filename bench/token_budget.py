"""Where one generated token's milliseconds go, layer by layer, at concurrency 1.

    python -m bench.token_budget [--backend cpu] [--model default] [--tokens 128] [--rounds 3]
        [--llama-server PATH]

Streams the same greedy chat through each layer in turn and reports the median time
between tokens (ITL) and the CPU each process spent per token:

1. ``scheduler``: the engine's scheduler in a process of its own, no I/O; per step its
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
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.launch import Flags, launch, process
from bench.load import chat, one
from strata_core.client.reader import engine_command
from strata_core.contract import protocol as proto
from strata_core.ops.build import ensure_engine
from strata_core.ops.config import EngineConfig
from strata_core.ops.plugins import load_registry
from strata_core.testing.harness import run_engine_script

PROMPT = "Write a story about a lighthouse keeper who finds a message in a bottle."


_floor_child: list = []  # floor_app's line writer, started by its first request


async def floor_app(scope: dict, receive: object, send: object) -> None:
    """Layer 5: one SSE chat chunk for each line a child process writes every FLOOR_ITL
    seconds (the child is started once, as an engine is, and writes n lines when asked)."""
    import asyncio

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
    """One streamed greedy chat; the gaps between content chunks, the chunks, and each
    process's CPU seconds over the request."""
    before = [cpu_secs(p) for p in pids]
    reply = one(base, chat(PROMPT, tokens))
    if reply.error is not None:
        raise RuntimeError(reply.error)
    return reply.itl, len(reply.times), [cpu_secs(p) - b for p, b in zip(pids, before, strict=True)]


SCHEDULER = """
import json
from strata_core.engine.llama import Llama, ModelOptions
from strata_core.contract.options import SamplingParams
from strata_core.engine.loop import Engine
from strata_core.engine.request import Request
m = Llama(ModelOptions(path=MODEL, n_ctx=2048, n_seq=1, n_batch=512, threads={threads},
                       n_gpu_layers={ngl}, flash_attn={fa!r}))
m.warm_up()
prompt = m.tokenize({text!r}.encode(), True, True)
steps = []
for r in range({rounds}):
    s = Engine(m, lambda e: None, trace=steps.append)
    s.submit(Request("r", list(prompt), SamplingParams(), {tokens}, frozenset(), None))
    first = len(steps)
    while s.busy:
        s.step()
    steps[first:] = [x for x in steps[first:] if x.get("n") == 1 and "rows" in x][2:]
print(json.dumps(steps))
"""
TEXT = "<|im_start|>user\n" + PROMPT + "<|im_end|>\n<|im_start|>assistant\n"


def scheduler_layer(a: argparse.Namespace, flags: Flags, rows: dict[str, float]) -> None:
    """1. the scheduler in a process of its own (libllama loads before numpy there)."""
    backend, model, threads, ngl, fa = flags.resolved()
    script = SCHEDULER.format(threads=threads, ngl=ngl, fa=fa, text=TEXT, rounds=a.rounds, tokens=a.tokens)
    steps = run_engine_script(script, ensure_engine(load_registry().get(backend)), Path(model))
    for key, label in (("step_ms", "step"), ("decode_ms", "llama_decode"), ("verify_ms", "sampling")):
        rows[f"scheduler: {label}"] = statistics.median(s[key] for s in steps)


def engine_layer(a: argparse.Namespace, flags: Flags, rows: dict[str, float]) -> None:
    """2. the engine process over its protocol, this process reading its stdout."""
    name, model, threads, ngl, fa = flags.resolved()
    backend = load_registry().get(name)
    cmd = engine_command(model, site=str(ensure_engine(backend).path), env=backend.engine_env(EngineConfig()),
                         n_ctx=2048, parallel=1, n_batch=512, threads=threads, n_gpu_layers=ngl, flash_attn=fa,
                         backend=name)  # fmt: skip
    eng = subprocess.Popen(list(cmd.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env={**os.environ, **cmd.env}, bufsize=1)  # fmt: skip
    assert eng.stdin is not None and eng.stdout is not None
    eng.stdout.readline()  # READY
    eng.stdin.write(proto.encode_command(proto.Tokenize("t", TEXT, True)) + "\n")
    eng.stdin.flush()
    tokens = proto.parse_event(eng.stdout.readline())
    assert isinstance(tokens, proto.Tokens), tokens
    ids = tokens.ids
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


def http_layer(a: argparse.Namespace, name: str, base: str, pids: list[int], rows: dict[str, float]) -> None:
    """3 to 5: streamed chats against a server; ITL and each of ``pids``' CPU per token."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-server", help="this llama-server binary instead of the one bench.peers builds")
    a = ap.parse_args()
    flags = Flags(backend=a.backend, model=a.model, parallel=1, n_ctx=2048)
    flags = replace(flags, threads=flags.resolved()[2])  # every layer the same, Strata's own choice
    rows: dict[str, float] = {}  # milliseconds
    scheduler_layer(a, flags, rows)
    engine_layer(a, flags, rows)
    with tempfile.TemporaryDirectory() as tmp:
        with launch("strata", flags, Path(tmp) / "strata.log") as srv:
            children = subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True).stdout.split()
            http_layer(a, "strata", srv.base, [srv.proc.pid, int(children[0])], rows)
        with launch("llama-server", flags, Path(tmp) / "llama-server.log", binary=a.llama_server) as peer:
            http_layer(a, "llama-server", peer.base, [peer.proc.pid], rows)
        fenv = {"FLOOR_TOKENS": str(a.tokens), "FLOOR_ITL": str(rows["engine: ITL"] / 1e3)}
        argv = [sys.executable, "-m", "uvicorn", "bench.token_budget:floor_app", "--log-level", "warning"]
        with process(argv, Path(tmp) / "floor.log", fenv, cwd=Path(__file__).resolve().parents[1]) as floor:
            http_layer(a, "floor", floor.base, [floor.proc.pid], rows)
    print(f"median over {a.rounds} rounds of {a.tokens} tokens, {flags.threads} threads, backend {flags.resolved()[0]}")
    for name, ms in rows.items():
        print(f"{name:<38} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
