"""What the host-side sampler costs per token, on synthetic float32 logits.

    python -m bench.sampler_cost [--vocab 49152 248320] [--seconds 1.0] [--rows 1 64]

Rows are LLM-shaped (a noisy tail plus a head of 40 tokens holding most of the mass), a
fresh row every call from a pool, with a 512-token history; position advances every call.
Prints the median and 90th percentile microseconds per sample() call, then for
llama.cpp's further stages (each on top of a sampled chain) the median microseconds per
row of one batched call (batch_sampler.sample_rows) at each ``--rows``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import numpy as np

from strata_core.contract.options import SamplingParams
from strata_core.engine.batch_sampler import Row, sample_rows
from strata_core.engine.sampler import sample, top_logprobs
from strata_core.engine.stages import SamplerState

CONFIGS = {
    "greedy (default request)": SamplingParams(),
    "full chain: T0.8 top_k40 top_p0.95 + penalties/64": SamplingParams(
        temperature=0.8,
        top_k=40,
        top_p=0.95,
        penalty_repeat=1.1,
        penalty_freq=0.2,
        penalty_present=0.2,
        penalty_last_n=64,
        seed=1,
    ),
    "greedy + penalties/64": SamplingParams(penalty_repeat=1.1, penalty_last_n=64),
    "T0.8 (no cut)": SamplingParams(temperature=0.8, seed=1),
    "T0.8 top_p0.95 (no top_k)": SamplingParams(temperature=0.8, top_p=0.95, seed=1),
    "T0.8 min_p0.05": SamplingParams(temperature=0.8, min_p=0.05, seed=1),
}


CHAIN = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
#: llama.cpp's further stages, each alone on top of CHAIN (the "+ nothing" row is the base)
STAGES: dict[str, dict[str, Any]] = {
    "+ nothing (T0.8 top_k40 top_p0.95 min_p0.05)": {},
    "+ typical_p 0.9": {"typical_p": 0.9},
    "+ top_n_sigma 1.0": {"top_n_sigma": 1.0},
    "+ xtc 0.5 / 0.1": {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    "+ dry 0.8 (last 64)": {"dry_multiplier": 0.8},
    "+ dynatemp 0.5": {"dynatemp_range": 0.5},
    "+ min_keep 5": {"min_keep": 5},
    "+ samplers (llama.cpp's order)": {"samplers": "edskypmxt"},
    "+ adaptive-p 0.5": {"adaptive_target": 0.5, "samplers": "edskympxta"},
    "mirostat 2 (replaces the cuts)": {"mirostat": 2},
    "mirostat 1 (replaces the cuts)": {"mirostat": 1},
}


def rows(n_vocab: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for _ in range(count):
        x = rng.normal(0.0, 2.0, n_vocab).astype(np.float32)
        x[rng.choice(n_vocab, 40, replace=False)] = rng.uniform(10.0, 18.0, 40).astype(np.float32)
        out.append(x)
    return out


def measure(fn, pool: list[np.ndarray], seconds: float) -> list[float]:
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline or len(times) < 20:
        x = pool[i % len(pool)]
        t0 = time.perf_counter_ns()
        fn(x, i)
        times.append((time.perf_counter_ns() - t0) / 1e3)
        i += 1
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[49_152, 248_320])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"numpy {np.__version__}; microseconds per token: median (p90)")
    for n_vocab in args.vocab:
        pool = rows(n_vocab, 8, rng)
        history = rng.integers(0, n_vocab, 512).tolist()
        print(f"\nn_vocab = {n_vocab:,}")
        for name, params in CONFIGS.items():
            t = measure(lambda x, i, p=params, h=history: sample(x, p, h, i), pool, args.seconds)
            print(f"  {name:<52} {statistics.median(t):9.1f} ({np.percentile(t, 90):9.1f})")
        t = measure(lambda x, i: top_logprobs(x, 20), pool, args.seconds)
        print(
            f"  {'top_logprobs(k=20)':<52} {statistics.median(t):9.1f} ({np.percentile(t, 90):9.1f})"
        )
        stage_costs(np.stack(pool), history, args.rows, args.seconds)


def stage_costs(pool: np.ndarray, history: list[int], counts: list[int], seconds: float) -> None:
    """Microseconds per row of one sample_rows call, each further stage on, at each row count."""
    print(f"  {'further stages, us per row at rows =':<52} " + " ".join(f"{n:>9}" for n in counts))
    for name, extra in STAGES.items():
        params = dataclasses.replace(CHAIN, **extra)
        cells = []
        for n in counts:
            x = np.resize(pool, (n, pool.shape[1]))

            def step(_: np.ndarray, i: int, x: np.ndarray = x, n: int = n, p: SamplingParams = params) -> None:
                sample_rows(x, [Row(p, history, i * n + j, 0, None, SamplerState()) for j in range(n)])

            cells.append(statistics.median(measure(step, [x], seconds)) / n)
        print(f"  {name:<52} " + " ".join(f"{c:9.1f}" for c in cells))


if __name__ == "__main__":
    main()
