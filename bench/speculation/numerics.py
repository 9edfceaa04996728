"""Windowed vs singleton: do the target's logits at a position verified inside a
speculative window equal those computed one token at a time?

    python bench/window_tvd.py [--model M] [--context 8 32 96 256] [--window 5]
        [--flash-attn on|off|auto] [--pad N]

For each context length, decodes a greedy continuation one token at a time on one
sequence and as one window on another, and prints per window row the largest |Δ logit|,
the total variation distance between the two softmax distributions, and whether the
rows are bitwise equal. --pad N decodes each singleton step beside N tokens of a third
sequence, to tell a batch-size effect (the pad changes the rows) from an attention one.
Threads: engine.threads of the configuration (e.g. STRATA_ENGINE_THREADS=1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--context", type=int, nargs="+", default=[8, 32, 96, 256])
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--flash-attn", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--pad", type=int, default=0, help="other-sequence tokens beside each singleton step")
    a = ap.parse_args()

    from strata_core.build import ensure_engine
    from strata_core.config import load_config
    from strata_core.models import resolve_model
    from strata_core.plugins import load_registry

    backend = load_registry().get(a.backend)
    sys.path.insert(0, str(ensure_engine(backend).path))
    # libllama before numpy, as in the engine: the other order crashes model loading on CUDA
    from strata_core.engine.llama import Batch, Llama, ModelOptions  # isort: skip
    import numpy as np

    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x.astype(np.float64) - x.max())
        return e / e.sum()

    d = backend.engine_defaults()
    a.flash_attn = {"on": True, "off": False}.get(a.flash_attn)
    m = Llama(ModelOptions(path=str(resolve_model(a.model).path), n_ctx=1024, n_seq=3, n_batch=512,
                           threads=load_config().engine.threads, n_gpu_layers=d.n_gpu_layers,
                           flash_attn=a.flash_attn))  # fmt: skip
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


if __name__ == "__main__":
    main()
