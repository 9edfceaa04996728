"""Decode speed of sampled requests against greedy ones, through a real server.

    python bench/decode_speed.py [--requests 5] [--max-tokens 128] [--rounds 1]

Starts ``strata serve --parallel 1`` on the default model and streams the same chat
prompts greedy (temperature 0) and sampled (temperature 0.8, top_p 0.95, top_k 40 and
repetition / frequency / presence penalties), one request at a time, alternating the modes
so that a change in the machine's load hits all alike; ``--temperature-only`` adds a third
mode, temperature 0.8 alone (what most clients send: no cut, so the sampler sees the whole
vocabulary). A request's decode time runs from
its first streamed token to its last, so prompt processing is left out; tokens/s is
(tokens - 1) / decode time, summed over the requests of a mode. Prints each rate, its
ratio to greedy (target >= 0.95), and the median of the per-prompt ratios, which a burst
of load from other work on the machine disturbs less; the load averages before and
after are printed to judge how quiet the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.serving import PROMPTS  # noqa: E402
from strata_core.testing.harness import Server  # noqa: E402

MODES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0},
    "sampled": {
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": 40,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.2,
        "presence_penalty": 0.2,
    },
}
TEMPERATURE_ONLY = {"temperature": 0.8}


@dataclass
class Tally:
    tokens: int = 0  # tokens after the first, i.e. the ones the decode time covers
    seconds: float = 0.0
    rates: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def decode(
    client: httpx.Client, prompt: str, max_tokens: int, seed: int, mode: dict[str, Any]
) -> tuple[int, float]:
    """Stream one chat reply; return (tokens, seconds from the first token to the last)."""
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        **mode,
    }
    first = last = 0.0
    tokens = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    return tokens, last - first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=5, help="prompts per mode and round")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--backend", help="as for strata serve (default: auto)")
    ap.add_argument("--model", help="as for strata serve (default: the default model)")
    ap.add_argument("--temperature-only", action="store_true", help="add a temperature-only mode")
    ap.add_argument(
        "--threads", type=int, help="engine threads (default: the server's); 1 suffers least "
        "from other work on a busy machine",
    )  # fmt: skip
    args = ap.parse_args()

    serve_args = ["--parallel", "1", "--n-ctx", "2048"]
    if args.backend:
        serve_args += ["--backend", args.backend]
    if args.model:
        serve_args += ["--model", args.model]
    # Stop the server on SIGTERM (e.g. from `timeout`) as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_before = os.getloadavg()[0]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    modes = {**MODES, "T0.8 only": TEMPERATURE_ONLY} if args.temperature_only else MODES
    tally = {name: Tally() for name in modes}
    # mode / greedy on the same prompt, back to back
    pairs: dict[str, list[float]] = {name: [] for name in modes if name != "greedy"}
    with tempfile.TemporaryDirectory() as tmp:
        env = {"STRATA_ENGINE_THREADS": str(args.threads)} if args.threads else None
        srv = Server(serve_args, Path(tmp) / "server.log", env=env)
        try:
            srv.wait_ready(timeout=600)
            with httpx.Client(base_url=srv.base, timeout=600) as client:
                engine = client.get("/v1/strata/backend").json()["engine"]
                print(
                    f"backend {engine['backend']}, n_vocab {engine['n_vocab']:,}, "
                    f"{args.requests} requests x {args.max_tokens} tokens x {args.rounds} "
                    f"round(s) per mode, --parallel 1, threads {args.threads or 'default'}",
                    flush=True,
                )
                decode(client, prompts[0], 8, 0, MODES["greedy"])  # warm-up
                for rnd in range(args.rounds):
                    for i, prompt in enumerate(prompts):
                        rate: dict[str, float] = {}
                        for name, mode in modes.items():
                            n, secs = decode(client, prompt, args.max_tokens, 1000 * rnd + i, mode)
                            t = tally[name]
                            if n > 1 and secs > 0:
                                t.tokens += n - 1
                                t.seconds += secs
                                rate[name] = (n - 1) / secs
                                t.rates.append(rate[name])
                        for name in pairs:
                            if name in rate and "greedy" in rate:
                                pairs[name].append(rate[name] / rate["greedy"])
                        line = ", ".join(f"{k} {v:.1f}" for k, v in rate.items())
                        print(f"  round {rnd + 1} prompt {i + 1}: {line} tok/s", flush=True)
        finally:
            srv.stop()

    for name, t in tally.items():
        rates = ", ".join(f"{r:.1f}" for r in t.rates)
        median = statistics.median(t.rates) if t.rates else 0.0
        print(
            f"{name:<10} {t.rate:7.1f} tok/s over {t.tokens} tokens in {t.seconds:.2f} s "
            f"(median {median:.1f}; per request: {rates})"
        )
    greedy = tally["greedy"].rate
    for name, ratios in pairs.items():
        ratio = tally[name].rate / greedy if greedy else 0.0
        verdict = "meets" if ratio >= 0.95 else "misses"
        paired = statistics.median(ratios) if ratios else 0.0
        print(
            f"{name} / greedy = {ratio:.3f} ({verdict} the 0.95 target); median per-prompt "
            f"ratio {paired:.3f} ({', '.join(f'{r:.3f}' for r in ratios)})"
        )
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
