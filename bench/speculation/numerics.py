"""Numerics and costs of libllama's decode as speculation lays out its batches, the model
loaded in this process.

``tvd``: windowed vs singleton: do the target's logits at a position verified inside a
speculative window equal those computed one token at a time?

    python -m bench.speculation tvd [--backend cpu] [--model M] [--context 8 32 96 256] [--window 5]
        [--flash-attn on|off|auto] [--pad N]

For each context length, decodes a greedy continuation one token at a time on one
sequence and as one window on another, and prints per window row the largest |Δ logit|,
the total variation distance between the two softmax distributions, and whether the
rows are bitwise equal. --pad N decodes each singleton step beside N tokens of a third
sequence, to tell a batch-size effect (the pad changes the rows) from an attention one.
Threads: engine.threads of the configuration (e.g. STRATA_ENGINE_THREADS=1).

``layout``: what one decode step costs by how its rows are laid out over the sequences.

    python -m bench.speculation layout [--backend cuda] [--model M] [--slots 4] [--context 200]
        [--repeat 20] [--layouts 1,1,1,1 8,1,1,1 8,8,8,8 ...]

Each sequence (a slot) holds ``--context`` cached tokens; a layout gives the rows each
sequence adds to the step (``1`` a plain row, ``8`` a row and a window of seven, ``0`` an
idle slot). For each layout: the micro-batches llama.cpp splits it into (a KV stream per
sequence: ``adaptive.micro_batches``), the median milliseconds of ``--repeat`` steps of that
layout in a row (``llama_decode`` and the logits of every row, as the scheduler reads
them), and the median of steps that alternate it with the plain layout, where a GPU replays
no captured graph. The rows are trimmed after each step, so every step sees the same cache.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.speculation.inproc import load_llama

DEFAULT_LAYOUTS = ["1,1,1,1", "2,2,2,2", "8,1,1,1", "8,8,1,8", "8,8,8,8", "1,1,0,1", "8,8,0,8", "1", "8"]


def add(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ap = sub.add_parser("tvd", help="a window's logits against one token at a time")
    ap.set_defaults(run=tvd)
    ap.add_argument("--model", default="default")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--context", type=int, nargs="+", default=[8, 32, 96, 256])
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--flash-attn", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--pad", type=int, default=0, help="other-sequence tokens beside each singleton step")
    ap = sub.add_parser("layout", help="one decode step's cost by how its rows lie over the sequences")
    ap.set_defaults(run=layout)
    ap.add_argument("--model", default="default")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--context", type=int, default=200, help="tokens cached in each sequence")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--layouts", nargs="+", default=DEFAULT_LAYOUTS)


def tvd(a: argparse.Namespace) -> None:
    m = load_llama(a.backend, a.model, 1024, 3, warm_up=False, flash_attn={"on": True, "off": False}.get(a.flash_attn))
    import numpy as np

    from strata_core.engine.llama import Batch

    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x.astype(np.float64) - x.max())
        return e / e.sum()

    b = Batch(512)
    rng = np.random.default_rng(0)
    worst = 0.0
    for n_ctx in a.context:
        prompt = [int(t) for t in rng.integers(100, 20000, size=n_ctx)]
        for seq in (0, 1, 2):
            m.seq_trim(seq, 0)
            b.clear()
            b.add(prompt[:-1], 0, seq, "none")
            m.decode(b)
        toks, rows = [prompt[-1]], []
        for i in range(a.window):
            b.clear()
            b.add_one(toks[-1], n_ctx - 1 + i, 0)
            if a.pad:
                m.seq_trim(2, n_ctx - 1)
                b.add(rng.integers(100, 20000, size=a.pad), n_ctx - 1, 2, "none")
            m.decode(b)
            rows.append(m.logits(0).copy())
            toks.append(int(np.argmax(rows[-1])))
        b.clear()
        b.add(toks[: a.window], n_ctx - 1, 1, "all")
        m.decode(b)
        for j in range(a.window):
            w = m.logits(j)
            tvd = 0.5 * float(np.abs(softmax(w) - softmax(rows[j])).sum())
            worst = max(worst, tvd)
            print(f"context {n_ctx:4d} row {j}: max|Δlogit| {np.abs(w - rows[j]).max():.3g}  "
                  f"TVD {tvd:.3g}  bitwise {np.array_equal(w, rows[j])}")  # fmt: skip
    print(f"largest TVD: {worst:.3g}")


def layout(a: argparse.Namespace) -> None:
    m = load_llama(a.backend, a.model, a.context + 64, a.slots)
    import numpy as np

    from strata_core.engine.llama import Batch
    from strata_core.engine.ubatch import micro_batches

    b = Batch(512)
    rng = np.random.default_rng(0)
    for seq in range(a.slots):
        b.clear()
        b.add(rng.integers(100, 20000, size=a.context), 0, seq, "none")
        m.decode(b)
    m.synchronize()

    def step(rows: list[int]) -> float:
        b.clear()
        for seq, n in enumerate(rows):
            if n:
                b.add(rng.integers(100, 20000, size=n), a.context, seq, "all")
        t0 = time.perf_counter()
        m.decode(b)
        for i in range(b.n):
            m.logits(i)
        secs = time.perf_counter() - t0
        for seq, n in enumerate(rows):
            if n:
                m.seq_trim(seq, a.context)
        return secs * 1e3

    plain = [1] * a.slots
    print(f"{a.slots} sequences of {a.context} cached tokens, median of {a.repeat} steps")
    print(f"{'layout':<14} {'rows':>4} {'micro-batches':>13} {'steady ms':>10} {'alternating ms':>15}")
    for layout in a.layouts:
        rows = [int(x) for x in layout.split(",")] + [0] * a.slots
        rows = rows[: a.slots]
        parts = micro_batches([(seq, n) for seq, n in enumerate(rows)])
        for _ in range(3):  # the first steps of a shape pay for its set-up
            step(rows)
        steady = statistics.median(step(rows) for _ in range(a.repeat))
        alternating = statistics.median([step(rows), step(plain)][0] for _ in range(a.repeat))
        print(f"{layout:<14} {sum(rows):>4} {parts:>13} {steady:>10.2f} {alternating:>15.2f}", flush=True)
