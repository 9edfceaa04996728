"""What n-gram speculation costs each step, with both modes in one engine process.

    python bench/spec_host.py [--backend cuda] [--model M] [--slots 4] [--concurrency 1 4]
        [--waves 8] [--max-tokens 128] [--k 7] [--workloads copy-heavy open-ended]

bench/speculative.py compares two servers, so a difference it shows is the code's or the
processes': where the system placed each one's threads, what shares their cores. Here one
scheduler, on one model and one thread, serves both modes: each wave of c requests (c
from --concurrency) runs with speculation on (``spec_k`` = --k) or off (0), the modes
taking turns in ABBA order, for --waves waves per mode. Every step is traced as the
engine's ``STRATA_STEP_TRACE`` does (the device is waited for apart from the host).

For each workload, c and mode it prints tokens per second over the waves, then the mode's
steps as bench/trace_steps.py summarises a trace: by decoding slots and kind, the median
milliseconds of the whole step, of ``llama_decode`` (building the batch and launching the
work; on a CPU, the work itself), of waiting for the device, of sampling and verifying the
rows, and of the rest (admitting requests, prefill, drafting, sizing windows). On plain
steps (no window) the two modes should differ only by drafting: the rest runs the same code.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--waves", type=int, default=8, help="waves of c requests per mode")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=7, help="most tokens one window proposes")
    ap.add_argument("--workloads", nargs="+", default=["copy-heavy", "open-ended"])
    a = ap.parse_args()

    from strata_core.build import ensure_engine
    from strata_core.config import load_config
    from strata_core.models import resolve_model
    from strata_core.plugins import load_registry

    backend = load_registry().get(a.backend)
    sys.path.insert(0, str(ensure_engine(backend).path))
    # libllama before numpy, as in the engine: the other order crashes model loading on CUDA
    from strata_core.engine.llama import Llama, ModelOptions  # isort: skip

    from bench.serving import abba
    from bench.speculative import WORKLOADS
    from bench.trace_steps import summarise
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request
    from strata_core.options import SamplingParams
    from strata_core.text.chat import FALLBACK_TEMPLATE, ChatTemplate

    d = backend.engine_defaults()
    m = Llama(ModelOptions(path=str(resolve_model(a.model).path), n_ctx=1024, n_seq=a.slots, n_batch=512,
                           threads=load_config().engine.threads, n_gpu_layers=d.n_gpu_layers,
                           flash_attn=d.flash_attn))  # fmt: skip
    m.warm_up()
    facts = m.facts()
    template = ChatTemplate(facts["chat_template"] or FALLBACK_TEMPLATE)
    eog = frozenset(facts["eog"])
    steps: list[dict[str, Any]] = []
    sched = Engine(m, lambda event: None, adaptive=True, shape_costs=m.on_gpu, trace=steps.append)
    print(f"{a.backend}, {a.slots} slots, k={a.k}, {a.waves} waves of c requests per mode, "
          f"{a.max_tokens} tokens each")  # fmt: skip
    modes = {"off": 0, "ngram": a.k}
    for name in a.workloads:
        prompts = [m.tokenize(template.render([{"role": "user", "content": p}]).encode(), False, True)
                   for p in WORKLOADS[name]]  # fmt: skip
        for c in a.concurrency:
            wall: dict[str, float] = defaultdict(float)
            by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for wave in range(a.waves):
                for mode in abba(list(modes), wave):
                    first = len(steps)
                    for i in range(c):
                        prompt = prompts[(wave * c + i) % len(prompts)]
                        sched.submit(Request(f"{mode}-{wave}-{i}", list(prompt), SamplingParams(), a.max_tokens,
                                             eog, None, spec_k=modes[mode]))  # fmt: skip
                    t0 = time.perf_counter()
                    while sched.busy:
                        sched.step()
                    wall[mode] += time.perf_counter() - t0
                    by_mode[mode] += steps[first:]
            print(f"\n{name} c={c}")
            for mode in modes:
                tokens = sum(s["emitted"] for s in by_mode[mode])
                print(f"  {mode:<6} {tokens / wall[mode]:8.1f} tok/s ({tokens} tokens)")
            for mode in modes:
                print(f"  {mode}:")
                summarise(by_mode[mode])


if __name__ == "__main__":
    main()
