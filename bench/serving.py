"""Serving benchmark: Strata beside llama.cpp's llama-server (same pinned sources and
flags) and llama-cpp-python's server, in one run, same model, same slots, same prompts.
The servers take turns for ``--rounds`` rounds so that drift in the machine's load falls on
all of them; the figures pool every round and the per-round rates show the spread. With
``--waves`` every server runs throughout and they take turns every wave of c requests
(ABBA), so drift slower than a wave falls on all alike; each wave starts and ends with its
own ramp, and --requests counts the requests of each concurrency (--requests / c waves).
--control runs a second Strata server, strata-b, as a peer: its ratio shows what two
identical servers differ by in the run.

    python bench/serving.py --concurrency 1 4 --requests 8 --max-tokens 128

Reports per server and concurrency: aggregate output tokens/s, TTFT p50 and ITL p50
(streamed chunks), and the ratio of Strata to each peer. Requests send ``ignore_eos`` (as
vLLM's benchmark does), so every reply runs to --max-tokens on every server: two servers'
greedy texts part where their numerics differ, and one that ends a reply early would
otherwise hold fewer tokens in the same wave's time (--stop-at-eos lets replies end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import llama_server  # noqa: E402
from strata_core.ops.build import ensure_engine  # noqa: E402
from strata_core.ops.models import resolve_model  # noqa: E402
from strata_core.ops.plugins import load_registry  # noqa: E402

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten year old.",
    "List ten facts about the planet Mars, one per line.",
    "Describe the water cycle in detail.",
    "Write a letter to a friend describing your last holiday.",
    "What are the main causes of the French Revolution? Answer at length.",
    "Give step by step instructions for baking bread.",
    "Summarise the plot of a detective novel you invent.",
]


@dataclass
class Result:
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    wall: float = 0.0
    drafted: int = 0  # speculative drafts, from usage.speculative where a server reports it
    accepted: int = 0

    def add(self, other: Result) -> None:
        """Pool another run into this one."""
        self.tokens, self.wall = self.tokens + other.tokens, self.wall + other.wall
        self.drafted, self.accepted = self.drafted + other.drafted, self.accepted + other.accepted
        self.ttft += other.ttft
        self.itl += other.itl


async def one(
    client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, res: Result, extra: dict[str, Any] | None = None
) -> None:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    t0 = time.perf_counter()
    last = None
    usage, chunks = None, 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]["completion_tokens"]
                spec = ev["usage"].get("speculative") or {}
                res.drafted += spec.get("drafted_tokens", 0)
                res.accepted += spec.get("accepted_tokens", 0)
            if ev.get("choices") and ev["choices"][0].get("delta", {}).get("content"):
                chunks += 1
                now = time.perf_counter()
                if last is None:
                    res.ttft.append(now - t0)
                else:
                    res.itl.append(now - last)
                last = now
    # llama-cpp-python's server sends no usage chunk: count its content chunks instead.
    res.tokens += usage if usage is not None else chunks


async def run_load(
    base: str, concurrency: int, n_requests: int, max_tokens: int, tag: str | None = None,
    prompts: list[str] = PROMPTS, extra: dict[str, Any] | None = None, first: int = 0,
) -> Result:  # fmt: skip
    """``n_requests`` streamed chats from ``prompts`` (cycling, from the ``first``-th),
    ``concurrency`` at a time. With a ``tag``, each prompt starts with it and its index, so
    no server answers from a cache of an earlier run's prompts (llama-server keeps whole
    prompts in host memory); only the chat template's own preamble is shared, as between
    real users."""
    res = Result()
    sem = asyncio.Semaphore(concurrency)
    # No keep-alive: llama-server closes streamed connections that a pool would reuse.
    limits = httpx.Limits(max_keepalive_connections=0)
    # A stream that stalls for a minute fails the run rather than hanging it.
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, read=60), limits=limits) as client:
        await one(client, f"{base}/v1/chat/completions", PROMPTS[0], 8, Result())  # warm-up

        async def guarded(i: int) -> None:
            prompt = prompts[(first + i) % len(prompts)]
            if tag is not None:
                prompt = f"[{tag}-{i}] {prompt}"
            async with sem:
                await one(client, f"{base}/v1/chat/completions", prompt, max_tokens, res, extra)

        t0 = time.perf_counter()
        await asyncio.gather(*(guarded(i) for i in range(n_requests)))
        res.wall = time.perf_counter() - t0
    return res


def wait_health(base: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:  # llama-cpp-python's server has no /health; /v1/models answers once it is up
            if any(httpx.get(f"{base}{p}", timeout=2).status_code == 200 for p in ("/health", "/v1/models")):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(base)


def abba(names: list[str], turn: int) -> list[str]:
    """The order in which ``names`` take ``turn``: as given on even turns, reversed on odd
    ones (A B, B A, A B, ...), so drift slower than a turn falls on all of them alike."""
    return names if turn % 2 == 0 else names[::-1]


def start(name: str, cmd: list[str], port: int, env: dict[str, str], show: bool) -> subprocess.Popen[bytes]:
    """Start one server on ``port``, its output in /tmp/bench-<name>.log."""
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    log = Path(f"/tmp/bench-{name}.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if show:
        print(f"{name}: {' '.join(cmd)} (log: {log})", flush=True)
    return proc


def servers(args: argparse.Namespace, model: str, slots: int, flash_attn: bool) -> dict[str, list[str]]:
    threads = str(args.threads)
    fa = "on" if flash_attn else "off"
    out = {
        "strata": [sys.executable, "-m", "strata_core.ops.cli", "serve", "--backend", args.backend,
                   "--model", model, "--parallel", str(slots), "--n-ctx", str(args.n_ctx),
                   "--port", "{port}"],
        "llama-server": [args.llama_server or str(llama_server(args.backend)), "-m", model, "-np", str(slots),
                         "-c", str(args.n_ctx * slots), "-t", threads, "-tb", threads,
                         "--port", "{port}", "--no-webui", "-ngl", str(args.ngl), "-fa", fa],
    }  # fmt: skip
    if args.control:  # started after llama-server: what two identical servers differ by in this run
        out["strata-b"] = list(out["strata"])
    if args.llama_cpp_python:
        out["llama-cpp-python"] = [sys.executable, "-m", "llama_cpp.server", "--model", model,
                                   "--n_ctx", str(args.n_ctx), "--n_threads", threads,
                                   "--n_gpu_layers", str(args.ngl), "--port", "{port}"]  # fmt: skip
    return out


def p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3 if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU for the peers (Strata uses the backend's default)")
    ap.add_argument("--llama-server", help="this llama-server binary instead of one built by bench/peers.py")
    ap.add_argument("--llama-cpp-python", action="store_true", help="also run llama-cpp-python's server")
    ap.add_argument("--repeat-prompts", action="store_true",
                    help="reuse the same prompts at every concurrency (measures the peers' prompt caches)")
    ap.add_argument("--rounds", type=int, default=3, help="servers alternate this many times; figures pool all rounds")
    ap.add_argument("--waves", action="store_true",
                    help="run every server throughout and take turns every wave of c requests (ABBA), not every round")
    ap.add_argument("--control", action="store_true",
                    help="a second Strata server, strata-b, whose ratio to strata is the bench's own noise")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="let replies end at the model's end-of-generation token; by default requests send "
                         "ignore_eos, so every server generates --max-tokens for each and a reply that two "
                         "servers' numerics end at different lengths does not count as speed")
    ap.add_argument("--port", type=int, default=8931)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    extra = None if args.stop_at_eos else {"ignore_eos": True}
    model = str(resolve_model(args.model).path)
    backend = load_registry().get(args.backend)
    site = ensure_engine(backend).path
    slots = max(args.concurrency)
    env = {**os.environ, "STRATA_ENGINE_THREADS": str(args.threads)}
    if args.llama_cpp_python:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    pooled: dict[str, dict[int, Result]] = {}
    rates: dict[str, dict[int, list[float]]] = {}

    def record(rnd: int, name: str, c: int, r: Result) -> None:
        pooled.setdefault(name, {}).setdefault(c, Result()).add(r)
        rates.setdefault(name, {}).setdefault(c, []).append(r.tokens / r.wall)
        print(f"round {rnd} {name:<17} c={c:<3} {r.tokens / r.wall:8.1f} tok/s  TTFT p50 {p50(r.ttft):7.1f} ms"
              f"  ITL p50 {p50(r.itl):6.2f} ms  ({r.tokens} tokens)", flush=True)  # fmt: skip

    cmds = servers(args, model, slots, backend.engine_defaults().flash_attn)
    if args.waves:  # every server runs throughout; they take turns every wave of c requests
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for i, (name, cmd) in enumerate(cmds.items()):
                procs[name] = start(name, cmd, args.port + i, env, True)
            bases = {name: f"http://127.0.0.1:{args.port + i}" for i, name in enumerate(procs)}
            for name, proc in procs.items():
                wait_health(bases[name], proc)
            for rnd in range(args.rounds):
                for c in args.concurrency:
                    got = {name: Result() for name in procs}
                    for wave in range(max(1, args.requests // c)):
                        for name in abba(list(procs), rnd + wave):
                            tag = None if args.repeat_prompts else f"round {rnd} c{c} w{wave}"
                            got[name].add(asyncio.run(run_load(bases[name], c, c, args.max_tokens, tag, extra=extra, first=wave * c)))
                    for name, r in got.items():
                        record(rnd, name, c, r)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)
    else:  # one server at a time, each started afresh for every round
        for rnd in range(args.rounds):
            for name, cmd in cmds.items():
                proc = start(name, cmd, args.port, env, rnd == 0)
                try:
                    wait_health(f"http://127.0.0.1:{args.port}", proc)
                    for c in args.concurrency:
                        tag = None if args.repeat_prompts else f"round {rnd} c{c}"
                        record(rnd, name, c, asyncio.run(run_load(f"http://127.0.0.1:{args.port}", c, args.requests, args.max_tokens, tag, extra=extra)))
                finally:
                    proc.terminate()
                    proc.wait(30)
    table: dict[str, dict[int, dict[str, float]]] = {}
    print(f"pooled over {args.rounds} rounds:")
    for name, by_c in pooled.items():
        for c, r in by_c.items():
            row = {"tok_s": r.tokens / r.wall, "ttft_p50_ms": p50(r.ttft), "itl_p50_ms": p50(r.itl),
                   "tokens": r.tokens, "round_tok_s": rates[name][c]}  # fmt: skip
            table.setdefault(name, {})[c] = row
            spread = ", ".join(f"{x:.1f}" for x in rates[name][c])
            print(f"{name:<17} c={c:<3} {row['tok_s']:8.1f} tok/s  TTFT p50 {row['ttft_p50_ms']:7.1f} ms"
                  f"  ITL p50 {row['itl_p50_ms']:6.2f} ms  (rounds: {spread})", flush=True)
    for peer in [n for n in table if n != "strata"]:
        for c in args.concurrency:
            s, p = table["strata"][c], table[peer][c]
            print(f"strata / {peer} c={c}: tokens/s x{s['tok_s'] / p['tok_s']:.3f}, "
                  f"TTFT x{s['ttft_p50_ms'] / p['ttft_p50_ms']:.3f}, ITL x{s['itl_p50_ms'] / p['itl_p50_ms']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
