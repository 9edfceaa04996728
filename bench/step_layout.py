"""What one decode step costs by how its rows are laid out over the sequences.

    python bench/step_layout.py [--backend cuda] [--model M] [--slots 4] [--context 200]
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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_LAYOUTS = ["1,1,1,1", "2,2,2,2", "8,1,1,1", "8,8,1,8", "8,8,8,8", "1,1,0,1", "8,8,0,8", "1", "8"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--context", type=int, default=200, help="tokens cached in each sequence")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--layouts", nargs="+", default=DEFAULT_LAYOUTS)
    a = ap.parse_args()

    from strata_core.ops.build import ensure_engine
    from strata_core.ops.config import load_config
    from strata_core.ops.models import resolve_model
    from strata_core.ops.plugins import load_registry

    backend = load_registry().get(a.backend)
    sys.path.insert(0, str(ensure_engine(backend).path))
    # libllama before numpy, as in the engine: the other order crashes model loading on CUDA
    from strata_core.engine.llama import Batch, Llama, ModelOptions  # isort: skip
    import numpy as np

    from strata_core.engine.speculation.cost import micro_batches

    d = backend.engine_defaults()
    m = Llama(ModelOptions(path=str(resolve_model(a.model).path), n_ctx=a.context + 64, n_seq=a.slots,
                           n_batch=512, threads=load_config().engine.threads, n_gpu_layers=d.n_gpu_layers,
                           flash_attn=d.flash_attn))  # fmt: skip
    m.warm_up()
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


if __name__ == "__main__":
    main()
