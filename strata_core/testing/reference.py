"""Greedy reference runs for numeric parity between backends.

    python -m strata_core.testing.reference --model M.gguf --out ref.json

runs the fixed prompts on the CPU engine and records, for each, the first 32 greedy
tokens with their logprobs and the top-2 margin at every position. The conformance
kit compares another backend's run with this record (or with a live CPU run).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from strata_core.contract import protocol as proto
from strata_core.ops.hub import sha256_of
from strata_core.testing.harness import EngineProcess

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "東京 is the capital of Japan. Its population is",
)
N_TOKENS = 32


@dataclass
class Run:
    prompt: str
    ids: list[int]
    tokens: list[int]
    logprobs: list[float]
    margins: list[float]  # top-1 minus top-2 logprob at each position


def greedy_runs(engine: EngineProcess) -> list[Run]:
    runs = []
    for i, text in enumerate(PROMPTS):
        engine.send(proto.Tokenize(f"tk{i}", text, True))
        ids = list(engine.expect(proto.Tokens).ids)
        events = engine.run(f"ref{i}", ids, max_tokens=N_TOKENS, logprobs=2)
        tokens = [e.id for e in events if isinstance(e, proto.Token)]
        lps = [e for e in events if isinstance(e, proto.Logprob)]
        runs.append(
            Run(
                text,
                ids,
                tokens,
                [e.logprob for e in lps],
                [e.top[0][1] - e.top[1][1] if len(e.top) > 1 else float("inf") for e in lps],
            )
        )
    return runs


def main() -> None:
    from strata_core.backends.cpu import CpuBackend
    from strata_core.ops.build import ensure_engine
    from strata_core.ops.models import resolve_model

    ap = argparse.ArgumentParser(prog="python -m strata_core.testing.reference")
    ap.add_argument("--model", default="default")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    model = resolve_model(a.model).path
    engine = EngineProcess(CpuBackend(), ensure_engine(CpuBackend()), model)
    try:
        runs = greedy_runs(engine)
    finally:
        engine.close()
    record = {"model_sha256": sha256_of(model), "runs": [asdict(r) for r in runs]}
    a.out.write_text(json.dumps(record, indent=1))
    print(f"wrote {a.out}: {len(runs)} prompts x {N_TOKENS} tokens")


if __name__ == "__main__":
    main()
