"""The host's share of a plain decode step, with the device's work taken out.

    python -m bench.host_step [--slots 64] [--steps 300] [--host-argmax]

The engine loop runs ``--slots`` greedy requests over a stand-in for libllama whose
decode computes nothing and whose logits are a fixed random matrix of the default model's
vocabulary (49152): every step samples and emits a token per slot exactly as with a
model, so the step trace's milliseconds are all the host's (building the batch, sampling,
emitting, the scheduler). Prints the medians of the plain steps. It runs the loop of the
strata_core on the import path, this branch's or an older one's (``Scheduler`` in
engine/scheduler.py before the engine was split by role), so two versions can be run
one after the other with PYTHONPATH pointing at each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import types
from typing import Any

import numpy as np


def stub_libllama() -> None:
    """Enough of llama_cpp for engine/llama.py to import: constants and a batch struct."""
    ll = types.ModuleType("llama_cpp.llama_cpp")
    for name in ("POOLING_TYPE_NONE", "POOLING_TYPE_MEAN", "POOLING_TYPE_CLS", "POOLING_TYPE_LAST",
                 "POOLING_TYPE_RANK", "SPLIT_MODE_NONE", "SPLIT_MODE_LAYER", "SPLIT_MODE_TENSOR"):  # fmt: skip
        setattr(ll, f"LLAMA_{name}", 0)
    ll.llama_batch = type("llama_batch", (), {})  # type: ignore[attr-defined]
    pkg = types.ModuleType("llama_cpp")
    pkg.llama_cpp = ll  # type: ignore[attr-defined]
    sys.modules["llama_cpp"], sys.modules["llama_cpp.llama_cpp"] = pkg, ll


class NoDevice:
    """A Llama whose decode does nothing and whose logits rows are a fixed matrix; with
    ``device_greedy`` it picks greedy rows in the decode, as a GPU engine does by default
    (their tokens are the rows' argmax, computed once here: on a device it costs the host
    nothing)."""

    n_batch, n_ctx, n_vocab, on_gpu = 512, 4096, 49_152, False

    def __init__(self, n_seq: int, device_greedy: bool) -> None:
        self.n_seq = n_seq
        self.rows = np.random.default_rng(0).normal(0.0, 2.0, (512, self.n_vocab)).astype(np.float32)
        self.device_greedy = device_greedy
        self.argmax = [int(t) for t in np.argmax(self.rows, axis=1)]

    def greedy_on_device(self, seq: int, bias: tuple[tuple[int, float], ...] | None) -> bool:
        return self.device_greedy or bias is None

    def sampled(self, rows: list[int], n: int) -> list[int]:
        return [self.argmax[i] for i in rows]

    def decode(self, batch: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def outputs(self, n: int) -> np.ndarray:
        return self.rows[:n]

    def logits(self, i: int) -> np.ndarray:
        return self.rows[i]

    def seq_trim(self, seq: int, keep: int) -> None:
        pass

    def use_lora(self, scales: tuple[float, ...] | None) -> None:
        pass

    def is_eog(self, token: int) -> bool:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--host-argmax", action="store_true", help="greedy rows' argmax on the host (the CPU default)")
    a = ap.parse_args()
    stub_libllama()
    from strata_core.contract.options import SamplingParams

    try:
        from strata_core.engine.loop import Engine as Loop
        from strata_core.engine.request import Request
    except ImportError:  # before the split: the scheduler ran the step
        from strata_core.engine.scheduler import Request  # type: ignore[attr-defined,no-redef]
        from strata_core.engine.scheduler import Scheduler as Loop  # type: ignore[no-redef,assignment]
    steps: list[dict[str, Any]] = []
    loop = Loop(NoDevice(a.slots, not a.host_argmax), lambda event: None, trace=steps.append)  # type: ignore[arg-type]
    for i in range(a.slots):
        loop.submit(Request(f"r{i}", [1, 2, 3, 4], SamplingParams(), 1 << 30, frozenset(), None))
    for _ in range(a.steps):
        loop.step()
    plain = [s for s in steps if s.get("n") == a.slots and not s.get("prefill_rows")][a.steps // 10 :]

    def med(key: str) -> float:
        return statistics.median(s.get(key, 0.0) for s in plain)

    print(f"{a.slots} slots, {len(plain)} plain steps: step {med('step_ms'):.3f} ms, of which batch and decode "
          f"{med('decode_ms'):.3f}, sample and emit {med('verify_ms'):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
