"""``trace``: summarise engine step traces (``STRATA_STEP_TRACE``, or ``servers --trace``).

    python -m bench.speculation trace TRACE.jsonl [...]

Groups the decode steps of each trace by decoding slots and by kind: plain (no window),
windowed in one micro-batch, windowed in several; and steps right after a change of the
batch's shape apart from steady ones. For each group: steps, rows and micro-batches per
step, tokens emitted per step, and the median milliseconds of the whole step (to the next
one), of the ``llama_decode`` call, of waiting for the device, of sampling and
verifying the rows and of the rest (admitting requests, prefill, drafting), and the mean
of the rest (drafting runs in few steps, which a median passes over, and the mean is what
it costs the stream); then tokens per second over the group. ``host`` prints its steps
with ``summarise``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def kind(step: dict[str, Any]) -> str:
    if not step.get("windows"):
        return "plain"
    return "window, 1 micro-batch" if step.get("micro_batches", 1) == 1 else "window, split"


def summarise(steps: list[dict[str, Any]]) -> None:
    """Print the decode steps of a trace, grouped as the module says."""
    groups: dict[tuple[int, str, bool], list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        if "rows" in s and "step_ms" in s:
            groups[(s["n"], kind(s), bool(s.get("steady")))].append(s)
    print(f"{'slots':>5} {'kind':<22} {'steady':<6} {'steps':>6} {'rows':>5} {'parts':>5} {'tok':>5} "
          f"{'step ms':>8} {'decode':>7} {'wait':>7} {'verify':>7} {'other':>7} {'mean':>7} {'tok/s':>8}")  # fmt: skip
    for (n, k, steady), group in sorted(groups.items()):
        def med(key: str, group: list[dict[str, Any]] = group) -> float:
            return statistics.median(s.get(key, 0.0) for s in group)

        def mean(key: str, group: list[dict[str, Any]] = group) -> float:
            return sum(s.get(key, 0) for s in group) / len(group)

        rest = [s["step_ms"] - s.get("decode_ms", 0.0) - s.get("wait_ms", 0.0) - s.get("verify_ms", 0.0)
                for s in group]  # fmt: skip
        rate = sum(s["emitted"] for s in group) / sum(s["step_ms"] for s in group) * 1e3
        print(f"{n:>5} {k:<22} {str(steady):<6} {len(group):>6} {mean('rows'):>5.1f} {mean('micro_batches'):>5.1f} "
              f"{mean('emitted'):>5.2f} {med('step_ms'):>8.2f} {med('decode_ms'):>7.2f} {med('wait_ms'):>7.2f} "
              f"{med('verify_ms'):>7.2f} {statistics.median(rest):>7.2f} {sum(rest) / len(rest):>7.3f} {rate:>8.1f}")  # fmt: skip


def add(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ap = sub.add_parser("trace", help="summarise engine step traces")
    ap.set_defaults(run=run)
    ap.add_argument("traces", nargs="+", type=Path, help="STRATA_STEP_TRACE files (JSON lines)")


def run(a: argparse.Namespace) -> None:
    for path in a.traces:
        steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        print(f"{path}: {len(steps)} steps")
        summarise(steps)
