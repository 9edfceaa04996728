"""Decode speed of one request at a time under different request settings, through a real
``strata serve --parallel 1`` on the default model (or a running server, --base):

- ``sampling``: greedy (temperature 0) against sampled (temperature 0.8, top_p 0.95,
  top_k 40 and repetition / frequency / presence penalties); --temperature-only adds
  temperature 0.8 alone (what most clients send: no cut, so the sampler sees the whole
  vocabulary). Target: sampled / greedy >= 0.95.
- ``logprobs``: greedy with top_logprobs=20 against without (the same tokens either way).
  Target: >= 0.9.

    python -m bench.decode_speed sampling [--requests 5] [--max-tokens 128] [--rounds 1] [--temperature-only]
    python -m bench.decode_speed logprobs [--requests 3] [--max-tokens 128] [--rounds 6] [--base URL]

Each round streams every prompt once in each setting, back to back, the settings taking
turns in ABBA order so drift in the machine's load hits all alike. A request's decode
speed is (tokens - 1) / (last content chunk - first), so prompt processing is left out.
Prints each setting's rate over all its tokens, its median, its ratio to the first
setting against the target, and the median of the back-to-back per-prompt ratios, which a
burst of load from other work on the machine disturbs less; and the load averages before
and after, to judge how quiet the machine was.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.launch import Flags, launch
from bench.load import PROMPTS, abba, chat, one

SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "repetition_penalty": 1.1,
           "frequency_penalty": 0.2, "presence_penalty": 0.2}  # fmt: skip
#: Each comparison: its settings (the first is the baseline), target ratio, slot context.
COMPARISONS: dict[str, tuple[dict[str, dict[str, Any]], float, int]] = {
    "sampling": ({"greedy": {"temperature": 0}, "sampled": SAMPLED}, 0.95, 2048),
    "logprobs": ({"without": {}, "top_logprobs=20": {"logprobs": True, "top_logprobs": 20}}, 0.9, 1024),
}


@dataclass
class Tally:
    tokens: int = 0  # tokens after the first, i.e. the ones the decode time covers
    seconds: float = 0.0
    rates: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def measure(base: str, settings: dict[str, dict[str, Any]], prompts: list[str], rounds: int, max_tokens: int
            ) -> tuple[dict[str, Tally], dict[str, list[float]]]:  # fmt: skip
    """Every setting's tally and, for each but the first, its back-to-back ratios to the first."""
    names = list(settings)
    tally = {name: Tally() for name in names}
    pairs: dict[str, list[float]] = {name: [] for name in names[1:]}
    for p in prompts:  # warm up: load pages, fill the prefix cache alike for all
        one(base, chat(p, 8))
    for rnd in range(rounds):
        for i, prompt in enumerate(prompts):
            rate: dict[str, float] = {}
            for name in abba(names, rnd * len(prompts) + i):
                reply = one(base, chat(prompt, max_tokens, seed=1000 * rnd + i, **settings[name]))
                if reply.error is not None:
                    raise RuntimeError(f"{name}: {reply.error}")
                if reply.decode_rate is not None:
                    t = tally[name]
                    t.tokens += reply.tokens - 1
                    t.seconds += (reply.tokens - 1) / reply.decode_rate
                    rate[name] = reply.decode_rate
                    t.rates.append(rate[name])
            for name in pairs:
                if name in rate and names[0] in rate:
                    pairs[name].append(rate[name] / rate[names[0]])
            line = ", ".join(f"{k} {v:.1f}" for k, v in rate.items())
            print(f"  round {rnd + 1} prompt {i + 1}: {line} tok/s", flush=True)
    return tally, pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("compare", choices=list(COMPARISONS))
    ap.add_argument("--requests", type=int, help="prompts per setting and round (sampling 5, logprobs 3)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, help="sampling 1, logprobs 6")
    ap.add_argument("--backend", help="as for strata serve (default: the configuration's)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--temperature-only", action="store_true", help="sampling: add a temperature-only setting")
    ap.add_argument("--threads", type=int, help="engine threads (default: the server's); 1 suffers least "
                    "from other work on a busy machine")  # fmt: skip
    ap.add_argument("--base", help="a running server instead, e.g. http://127.0.0.1:8000")
    a = ap.parse_args()
    settings, target, n_ctx = COMPARISONS[a.compare]
    if a.temperature_only:
        settings = {**settings, "T0.8 only": {"temperature": 0.8}}
    requests = a.requests or (5 if a.compare == "sampling" else 3)
    rounds = a.rounds or (1 if a.compare == "sampling" else 6)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        base = a.base
        if base is None:
            flags = Flags(backend=a.backend, model=a.model, parallel=1, n_ctx=n_ctx, threads=a.threads)
            base = stack.enter_context(launch("strata", flags, Path(tmp) / "server.log", timeout=600)).base
        print(f"{a.compare}: {requests} prompts x {a.max_tokens} tokens x {rounds} round(s) per setting, "
              f"one request at a time, threads {a.threads or 'default'}", flush=True)  # fmt: skip
        tally, pairs = measure(base, settings, prompts, rounds, a.max_tokens)
    for name, t in tally.items():
        median = statistics.median(t.rates) if t.rates else 0.0
        print(f"{name:<16} {t.rate:7.1f} tok/s over {t.tokens} tokens in {t.seconds:.2f} s (median {median:.1f}, "
              f"min {min(t.rates, default=0):.1f}, max {max(t.rates, default=0):.1f})")  # fmt: skip
    first = list(settings)[0]
    for name, ratios in pairs.items():
        ratio = tally[name].rate / tally[first].rate if tally[first].rate else 0.0
        verdict = "meets" if ratio >= target else "misses"
        paired = statistics.median(ratios) if ratios else 0.0
        print(f"{name} / {first} = {ratio:.3f} ({verdict} the {target} target); median back-to-back ratio "
              f"{paired:.3f} ({', '.join(f'{r:.3f}' for r in ratios)})")  # fmt: skip
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
