"""Speculation in one engine process, both modes on one scheduler, one model and one
thread: each wave of c requests (c from --concurrency) runs with speculation on
(``spec_k`` = --k) or off (0), the modes taking turns in ABBA order, for --waves waves per
mode. ``servers`` compares two servers, so a difference it shows is the code's or the
processes' (where the system placed each one's threads, what shares their cores); here
it can only be the code's.

``host``: what n-gram speculation costs each step, on the real clock.

    python -m bench.speculation host [--backend cuda] [--model M] [--slots 4] [--concurrency 1 4]
        [--waves 8] [--max-tokens 128] [--k 7] [--workloads copy-heavy open-ended]

Every step is traced as the engine's ``STRATA_STEP_TRACE`` does (the device is waited for
apart from the host). For each workload, c and mode it prints tokens per second over the
waves, then the mode's steps as ``trace`` summarises a trace: by decoding slots and kind,
the median milliseconds of the whole step, of ``llama_decode`` (building the batch and
launching the work; on a CPU, the work itself), of waiting for the device, of sampling
and verifying the rows, and of the rest (admitting requests, prefill, drafting, sizing
windows). On plain steps (no window) the two modes should differ only by drafting: the
rest runs the same code.

``whatif``: n-gram speculation on a GPU's step costs, simulated on any machine.

    python -m bench.speculation whatif [--model M] [--slots 4] [--concurrency 1 4] [--waves 6]
        [--max-tokens 128] [--k 7] [--workloads copy-heavy open-ended]
        [--base-ms 1.30] [--row-ms 0.097] [--plain-switch-ms 1.26] [--window-switch-ms 3.05]

The scheduler runs on the real CPU engine but on a virtual clock: each decode advances it
by what a GPU step of that many rows costs, and by more where the batch's shape changed
since the last decode. The default costs are the default model's on an H100
(bench/results/2026-12-06-cuda-h100-graph-per-shape.md): a steady step of one row 1.30 ms, each
further row 0.097 ms, a plain step after a change of shape 1.26 ms more, a window after
one 3.05 ms more. The tokens are the real model's (greedy), so what a window keeps is
real; only time is modelled. Host time is left out: it is in the measured step costs.
Prints, per workload and c, tokens per virtual second for each mode, their ratio, the
steps and windows, and the drafts kept. It answers what a change of the window policy
does on a GPU before a GPU is at hand; the figures that count are ``servers``' on the
GPU itself.
"""

from __future__ import annotations

import argparse
import time
import types
from collections import defaultdict
from collections.abc import Iterator
from itertools import groupby
from typing import Any

from bench.speculation.inproc import Wave, add_wave_args, load_llama, run_waves
from bench.speculation.trace import summarise


def add(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ap = sub.add_parser("host", help="what n-gram speculation costs each step, both modes in one engine")
    ap.set_defaults(run=host)
    ap.add_argument("--backend", default="cpu")
    add_wave_args(ap, waves=8)
    ap = sub.add_parser("whatif", help="n-gram speculation on a GPU's step costs, simulated on the CPU")
    ap.set_defaults(run=whatif)
    add_wave_args(ap, waves=6)
    ap.add_argument("--base-ms", type=float, default=1.30)
    ap.add_argument("--row-ms", type=float, default=0.097)
    ap.add_argument("--plain-switch-ms", type=float, default=1.26)
    ap.add_argument("--window-switch-ms", type=float, default=3.05)


def host(a: argparse.Namespace) -> None:
    m = load_llama(a.backend, a.model, 1024, a.slots)
    from strata_core.engine.loop import Engine

    steps: list[dict[str, Any]] = []
    engine = Engine(m, lambda event: None, adaptive=True, shape_costs=m.on_gpu, trace=steps.append)
    print(f"{a.backend}, {a.slots} slots, k={a.k}, {a.waves} waves of c requests per mode, "
          f"{a.max_tokens} tokens each")  # fmt: skip
    waves = run_waves(m, engine, steps, a, time.perf_counter)
    for (name, c), cell in groupby(waves, key=lambda w: (w.workload, w.c)):
        wall: dict[str, float] = defaultdict(float)
        by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for w in cell:
            wall[w.mode] += w.seconds
            by_mode[w.mode] += w.steps
        print(f"\n{name} c={c}")
        for mode, mode_steps in by_mode.items():
            tokens = sum(s["emitted"] for s in mode_steps)
            print(f"  {mode:<6} {tokens / wall[mode]:8.1f} tok/s ({tokens} tokens)")
        for mode, mode_steps in by_mode.items():
            print(f"  {mode}:")
            summarise(mode_steps)


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


def whatif(a: argparse.Namespace) -> None:
    m = load_llama("cpu", a.model, 1024, a.slots, n_gpu_layers=0, flash_attn=None)
    from strata_core.engine import loop, runner
    from strata_core.engine.loop import Engine

    clock = GpuClock(a.base_ms / 1e3, a.row_ms / 1e3, a.plain_switch_ms / 1e3, a.window_switch_ms / 1e3)
    loop.time = runner.time = types.SimpleNamespace(perf_counter=clock.perf_counter)  # type: ignore[assignment]
    real_decode = m.decode
    prefilling = [False]

    def decode(batch: Any) -> None:
        real_decode(batch)
        seqs = len(set(batch.seq[: batch.n].tolist()))  # a plain step has one row per sequence
        clock.decode(batch.n, 0 if prefilling[0] else seqs)

    m.decode = decode  # type: ignore[method-assign]
    steps: list[dict[str, Any]] = []
    engine = Engine(m, lambda event: None, adaptive=True, shape_costs=True, trace=steps.append)
    real_prefill = engine._prefill

    def prefill(*args: Any) -> None:
        prefilling[0] = True
        try:
            real_prefill(*args)
        finally:
            prefilling[0] = False

    engine._prefill = prefill  # type: ignore[method-assign,assignment]
    print(f"{a.slots} slots, k={a.k}, {a.waves} waves per mode; GPU costs: {a.base_ms} ms + {a.row_ms} ms a row, "
          f"switch {a.plain_switch_ms} / {a.window_switch_ms} ms")  # fmt: skip

    def switches() -> Iterator[tuple[Wave, list[int]]]:
        """Each wave with the changes of shape in it: to plain steps, to windows."""
        before = list(clock.switches)
        for w in run_waves(m, engine, steps, a, clock.perf_counter):
            yield w, [now - was for now, was in zip(clock.switches, before, strict=True)]
            before = list(clock.switches)

    for (name, c), cell in groupby(switches(), key=lambda ws: (ws[0].workload, ws[0].c)):
        by_mode: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for w, switched in cell:
            st = by_mode[w.mode]
            st["seconds"] += w.seconds
            st["tokens"] += sum(s["emitted"] for s in w.steps)
            st["steps"] += sum(1 for s in w.steps if "rows" in s)
            st["windows"] += sum(1 for s in w.steps if s.get("windows"))
            st["drafted"] += sum(r.drafted for r in w.requests)
            st["kept"] += sum(r.accepted for r in w.requests)
            st["to plain"] += switched[0]
            st["to windows"] += switched[1]
        rate = {mode: st["tokens"] / st["seconds"] for mode, st in by_mode.items()}
        print(f"{name} c={c}: ngram/off x{rate['ngram'] / rate['off']:.3f}", flush=True)
        for mode, st in by_mode.items():
            print(f"  {mode:<6} {rate[mode]:8.1f} tok/s  {st['tokens']:.0f} tokens, {st['steps']:.0f} decode steps, "
                  f"{st['windows']:.0f} with windows, {st['kept']:.0f}/{st['drafted']:.0f} drafts kept, "
                  f"shape changed to plain {st['to plain']:.0f}, to windows {st['to windows']:.0f}", flush=True)  # fmt: skip
