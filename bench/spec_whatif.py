"""N-gram speculation on a GPU's step costs, simulated on any machine.

    python bench/spec_whatif.py [--model M] [--slots 4] [--concurrency 1 4] [--waves 6]
        [--max-tokens 128] [--k 7] [--workloads copy-heavy open-ended]
        [--base-ms 1.30] [--row-ms 0.097] [--plain-switch-ms 1.26] [--window-switch-ms 3.05]

One scheduler on the real engine (the CPU's, by default) serves waves of c requests with
speculation on and off in turn, as bench/spec_host.py does, but the scheduler runs on a
virtual clock: each decode advances it by what a GPU step of that many rows costs, and
by more where the batch's shape changed since the last decode. The default costs are the
default model's on an H100 (docs/backends/cuda.md, 2026-12-06 (evening)): a steady step
of one row 1.30 ms, each further row 0.097 ms, a plain step after a change of shape 1.26
ms more, a window after one 3.05 ms more. The tokens are the real model's (greedy), so
what a window keeps is real; only time is modelled. Host time is left out: it is in the
measured step costs. Prints, per workload and c, tokens per virtual second for each mode,
their ratio, the steps and windows, and the drafts kept.

It answers what a change of the window policy does on a GPU before a GPU is at hand; the
figures that count are bench/speculative.py's on the GPU itself.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class GpuClock:
    """A virtual clock that a decode of n rows advances by a GPU's cost for them."""

    def __init__(self, base: float, row: float, plain_switch: float, window_switch: float) -> None:
        self.now = 0.0
        self.base, self.row, self.plain_switch, self.window_switch = base, row, plain_switch, window_switch
        self.last_rows = 0
        self.switches = [0, 0]  # decodes after a change of shape: plain, windowed

    def perf_counter(self) -> float:
        return self.now

    def decode(self, rows: int, decoding: int) -> None:
        """A decode of ``rows`` rows of which ``decoding`` are the slots' own tokens (the
        rest are windows), or a prefill (``decoding`` 0)."""
        secs = self.base + self.row * (rows - 1) if rows <= 64 else self.base + self.row * 63 + 0.005e-3 * (rows - 64)
        if rows != self.last_rows and decoding:
            secs += self.window_switch if rows > decoding else self.plain_switch
            self.switches[rows > decoding] += 1
        self.last_rows = rows
        self.now += secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--waves", type=int, default=6, help="waves of c requests per mode")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--workloads", nargs="+", default=["copy-heavy", "open-ended"])
    ap.add_argument("--base-ms", type=float, default=1.30)
    ap.add_argument("--row-ms", type=float, default=0.097)
    ap.add_argument("--plain-switch-ms", type=float, default=1.26)
    ap.add_argument("--window-switch-ms", type=float, default=3.05)
    a = ap.parse_args()

    from strata_core.ops.build import ensure_engine
    from strata_core.ops.config import load_config
    from strata_core.ops.models import resolve_model
    from strata_core.ops.plugins import load_registry

    backend = load_registry().get("cpu")
    sys.path.insert(0, str(ensure_engine(backend).path))
    from strata_core.engine.llama import Llama, ModelOptions  # isort: skip

    from bench.serving import abba
    from bench.speculative import WORKLOADS
    from strata_core.contract.options import SamplingParams
    from strata_core.engine import loop, runner
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request
    from strata_core.text.chat import FALLBACK_TEMPLATE, ChatTemplate

    clock = GpuClock(a.base_ms / 1e3, a.row_ms / 1e3, a.plain_switch_ms / 1e3, a.window_switch_ms / 1e3)
    loop.time = runner.time = types.SimpleNamespace(perf_counter=clock.perf_counter)  # type: ignore[assignment]
    m = Llama(ModelOptions(path=str(resolve_model(a.model).path), n_ctx=1024, n_seq=a.slots, n_batch=512,
                           threads=load_config().engine.threads))  # fmt: skip
    m.warm_up()
    real_decode = m.decode
    prefilling = [False]

    def decode(batch: Any) -> None:
        real_decode(batch)
        seqs = len(set(batch.seq[: batch.n].tolist()))  # a plain step has one row per sequence
        clock.decode(batch.n, 0 if prefilling[0] else seqs)

    m.decode = decode  # type: ignore[method-assign]
    facts = m.facts()
    template = ChatTemplate(facts["chat_template"] or FALLBACK_TEMPLATE)
    eog = frozenset(facts["eog"])
    steps: list[dict[str, Any]] = []
    sched = Engine(m, lambda event: None, adaptive=True, shape_costs=True, trace=steps.append)
    real_prefill = sched._prefill

    def prefill(*args: Any) -> None:
        prefilling[0] = True
        try:
            real_prefill(*args)
        finally:
            prefilling[0] = False

    sched._prefill = prefill  # type: ignore[method-assign]
    modes = {"off": 0, "ngram": a.k}
    print(f"{a.slots} slots, k={a.k}, {a.waves} waves per mode; GPU costs: {a.base_ms} ms + {a.row_ms} ms a row, "
          f"switch {a.plain_switch_ms} / {a.window_switch_ms} ms")  # fmt: skip
    for name in a.workloads:
        prompts = [m.tokenize(template.render([{"role": "user", "content": p}]).encode(), False, True)
                   for p in WORKLOADS[name]]  # fmt: skip
        for c in a.concurrency:
            virt: dict[str, float] = defaultdict(float)
            stats: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            for wave in range(a.waves):
                for mode in abba(list(modes), wave):
                    first = len(steps)
                    reqs = []
                    for i in range(c):
                        prompt = prompts[(wave * c + i) % len(prompts)]
                        reqs.append(Request(f"{mode}-{wave}-{i}", list(prompt), SamplingParams(), a.max_tokens,
                                            eog, None, spec_k=modes[mode]))  # fmt: skip
                        sched.submit(reqs[-1])
                    t0, switched = clock.now, list(clock.switches)
                    while sched.busy:
                        sched.step()
                    virt[mode] += clock.now - t0
                    st = stats[mode]
                    st["tokens"] += sum(s["emitted"] for s in steps[first:])
                    st["steps"] += sum(1 for s in steps[first:] if "rows" in s)
                    st["windows"] += sum(1 for s in steps[first:] if s.get("windows"))
                    st["drafted"] += sum(r.drafted for r in reqs)
                    st["kept"] += sum(r.accepted for r in reqs)
                    st["to plain"] += clock.switches[0] - switched[0]
                    st["to windows"] += clock.switches[1] - switched[1]
            rate = {mode: stats[mode]["tokens"] / virt[mode] for mode in modes}
            print(f"{name} c={c}: ngram/off x{rate['ngram'] / rate['off']:.3f}")
            for mode in modes:
                st = stats[mode]
                print(f"  {mode:<6} {rate[mode]:8.1f} tok/s  {st['tokens']} tokens, {st['steps']} decode steps, "
                      f"{st['windows']} with windows, {st['kept']}/{st['drafted']} drafts kept, "
                      f"shape changed to plain {st['to plain']}, to windows {st['to windows']}")  # fmt: skip


if __name__ == "__main__":
    main()
