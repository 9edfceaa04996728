"""Scale-out benchmark (docs/scale-out.md): ``strata serve --replicas N`` on a local Ray
cluster.

- ``routing``: a multi-turn workload (conversations with their own long system prompts,
  each turn resending the whole history) on 2 replicas, routed by prefix and at random:
  the share of prompt tokens served from an engine's cache, and TTFT.
- ``throughput``: the same independent chats on 1 replica with every core and on 2
  replicas with half each (and plain ``strata serve`` without Ray): output tokens/s.

    python -m bench.scale_out routing --conversations 8 --turns 4
    python -m bench.scale_out throughput --requests 32 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.launch import Flags, Running, launch
from bench.load import chat, run_load, stream

WORDS = ("river stone lantern orbit meadow copper signal harbor velvet thunder quiet ember "
         "falcon prism canyon willow").split()  # fmt: skip


def system_prompt(conv: int, words: int) -> str:
    """A system prompt of its own for each conversation (no two share a prefix beyond the
    chat template's preamble)."""
    body = " ".join(WORDS[(conv * 7 + i * i) % len(WORDS)] for i in range(words))
    return f"Conversation {conv}. You are a terse assistant. Background notes: {body}"


@dataclass
class Turns:
    prompt: int = 0
    cached: int = 0
    later_prompt: int = 0  # turns after the first: what a replica holding the prefix can reuse
    later_cached: int = 0
    ttft: list[float] = field(default_factory=list)
    later_ttft: list[float] = field(default_factory=list)
    moved: int = 0  # turns served by another replica than the turn before


async def turn(client: httpx.AsyncClient, base: str, messages: list[dict[str, str]], max_tokens: int,
               out: Turns, later: bool) -> tuple[str, str]:  # fmt: skip
    reply = await stream(client, base, chat(messages, max_tokens))
    if reply.error is not None or reply.usage is None or reply.ttft is None:
        raise RuntimeError(f"a turn failed: {reply.error or 'no usage or no content'}")
    usage = reply.usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    out.prompt += usage["prompt_tokens"]
    out.cached += cached
    out.ttft.append(reply.ttft)
    if later:
        out.later_prompt += usage["prompt_tokens"]
        out.later_cached += cached
        out.later_ttft.append(reply.ttft)
    return reply.text, reply.headers.get("x-strata-replica", "")


async def conversations(base: str, n: int, turns: int, words: int, max_tokens: int) -> Turns:
    out = Turns()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, read=120)) as client:

        async def one(conv: int) -> None:
            messages = [{"role": "system", "content": system_prompt(conv, words)}]
            last = None
            for t in range(turns):
                messages.append({"role": "user", "content": f"Question {t}: what is {conv} times {t + 2}?"})
                text, replica = await turn(client, base, messages, max_tokens, out, later=t > 0)
                out.moved += last is not None and replica != last
                last = replica
                messages.append({"role": "assistant", "content": text})

        await asyncio.gather(*(one(c) for c in range(n)))
    return out


def server(tmp: Path, name: str, parallel: int, n_ctx: int, threads: int, cluster: str | None,
           replicas: int | None) -> AbstractContextManager[Running]:  # fmt: skip
    """``strata serve`` on the CPU, with ``threads`` each engine (in the configuration file,
    which every replica reads) and a ``[cluster]`` section for ``--replicas``."""
    (tmp / f"{name}.toml").write_text(f"[engine]\nthreads = {threads}\n{cluster or ''}")
    extra = ["--config", str(tmp / f"{name}.toml")] + (["--replicas", str(replicas)] if replicas else [])
    return launch("strata", Flags(backend="cpu", parallel=parallel, n_ctx=n_ctx), tmp / f"{name}.log", extra)


CLUSTER = """
[cluster]
routing = "{routing}"
cpus_per_replica = {cpus}
"""


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def routing(args: argparse.Namespace, tmp: Path) -> None:
    print(f"{args.conversations} conversations x {args.turns} turns, system prompt {args.words} words, "
          f"{args.max_tokens} tokens a reply, 2 replicas x {args.parallel} slots, 1 thread each")  # fmt: skip
    print("| routing | round | cached share, all turns | cached share, turns 2+ | TTFT p50 (s) | "
          "TTFT p50 turns 2+ (s) | turns moved | wall (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for rnd in range(args.rounds):
        for policy in ("prefix", "random"):
            cluster = CLUSTER.format(routing=policy, cpus=1)
            with server(tmp, f"{policy}-{rnd}", args.parallel, 2048, 1, cluster, 2) as srv:
                t0 = time.perf_counter()
                r = asyncio.run(conversations(srv.base, args.conversations, args.turns, args.words, args.max_tokens))
                wall = time.perf_counter() - t0
            print(f"| {policy} | {rnd + 1} | {r.cached / r.prompt:.1%} | {r.later_cached / r.later_prompt:.1%} | "
                  f"{p50(r.ttft):.3f} | {p50(r.later_ttft):.3f} | {r.moved}/{args.conversations * (args.turns - 1)} "
                  f"| {wall:.1f} |", flush=True)  # fmt: skip


def throughput(args: argparse.Namespace, tmp: Path) -> None:
    cores = os.cpu_count() or 1
    half = max(1, cores // 2)
    setups = [  # (name, threads per engine, cluster, replicas)
        ("strata serve (no Ray)", cores, None, None),
        (f"1 replica x {cores} threads", cores, CLUSTER.format(routing="least_loaded", cpus=cores), 1),
        (f"2 replicas x {half} threads", half, CLUSTER.format(routing="least_loaded", cpus=half), 2),
    ]
    print(f"{args.requests} chats, {args.concurrency} at a time, {args.max_tokens} tokens each, "
          f"{args.parallel} slots per engine, {cores} cores")
    print("| setup | round | output tokens/s | TTFT p50 (s) | ITL p50 (ms) | errors |")
    print("|---|---|---|---|---|---|")
    for rnd in range(args.rounds):
        for i, (name, threads, cluster, replicas) in enumerate(setups):
            with server(tmp, f"tp{i}-{rnd}", args.parallel, 1024, threads, cluster, replicas) as srv:
                r = run_load(srv.base, args.concurrency, args.requests, args.max_tokens, tag=f"{rnd}")
            print(f"| {name} | {rnd + 1} | {r.tok_s:.1f} | {r.pct('ttft', 0.5) / 1e3:.3f} | {r.pct('itl', 0.5):.1f} "
                  f"| {len(r.errors)} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["routing", "throughput"])
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--words", type=int, default=250, help="words in each conversation's system prompt")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=4, help="slots per engine")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (routing if args.what == "routing" else throughput)(args, Path(tmp))


if __name__ == "__main__":
    main()
