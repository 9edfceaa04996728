"""Speculation on against off, in one run, on the default model (greedy unless
--temperature is given).

    python bench/speculative.py [--requests 4] [--max-tokens 128] [--modes off ngram draft]
        [--draft-model PATH | --draft-layers 28] [--threshold 0.1] [--temperature 0]

Workloads: copy-heavy (repeat or lightly edit a given passage or code) and open-ended,
at concurrency 1 and 4. Prints tokens/s for each mode, each mode's ratio to off, and the
acceptance (accepted / drafted tokens) from the responses' usage. Mode ``draft`` uses
--draft-model, or else a copy of the model keeping its first --draft-layers blocks
(self-speculation sharing the vocabulary).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strata_core.testing.harness import Server  # noqa: E402

# Long enough that a faithful copy runs past --max-tokens: the copy-heavy figure then
# measures copying, not the chat around it.
PASSAGE = (
    "The lighthouse stood at the edge of the cliff for two hundred years. Every night its "
    "keeper climbed the ninety steps, trimmed the wick, and watched the ships pass safely "
    "through the narrow channel below. In winter the storms came from the north, and the "
    "waves broke so high against the rocks that the spray reached the windows of the lamp "
    "room. The keeper kept a logbook on the table by the stairs, and in it he wrote the name "
    "of every ship, the hour it passed, and the state of the sea. When the keeper grew old, "
    "his daughter learned to tend the light, and she kept the logbook in the same careful "
    "hand. Years later, when the light was finally automated, the logbooks were carried down "
    "the ninety steps and placed in the town library, where visitors still read them on "
    "rainy afternoons."
)
CODE = """def summarize(orders):
    totals = {}
    counts = {}
    for order in orders:
        customer = order.customer
        amount = order.price * order.quantity
        if order.discount:
            amount -= amount * order.discount
        totals[customer] = totals.get(customer, 0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    report = []
    for customer, total in sorted(totals.items()):
        average = total / counts[customer]
        report.append(f"{customer}: {total:.2f} ({counts[customer]} orders, avg {average:.2f})")
    return "\\n".join(report)
"""
WORKLOADS = {
    "copy-heavy": [
        f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}",
        f"Rewrite this function, renaming `orders` to `purchases`, and change nothing else:\n\n{CODE}",
        f"Copy this text and replace 'lighthouse' with 'tower':\n\n{PASSAGE}",
        f"Quote this code back to me unchanged:\n\n{CODE}",
    ],
    "open-ended": [
        "Write a short story about a dragon who learns to bake.",
        "Explain why the sky is blue.",
        "Give me five ideas for a birthday party.",
        "Describe a walk through a forest in autumn.",
    ],
}


def one(base: str, prompt: str, max_tokens: int, temperature: float = 0.0) -> tuple[int, int, int]:
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    if temperature:
        body |= {"temperature": temperature, "seed": 1}
    u = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600).json()["usage"]
    spec = u.get("speculative", {})
    return u["completion_tokens"], spec.get("drafted_tokens", 0), spec.get("accepted_tokens", 0)


def load(
    base: str, prompts: list[str], concurrency: int, requests: int, max_tokens: int, temperature: float
) -> dict[str, float]:
    jobs = [prompts[i % len(prompts)] for i in range(requests)]
    one(base, prompts[0], 4)  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: one(base, p, max_tokens, temperature), jobs))
    wall = time.perf_counter() - t0
    tokens, drafted, accepted = (sum(col) for col in zip(*results, strict=True))
    return {"tok_s": tokens / wall, "tokens": tokens, "drafted": drafted, "accepted": accepted}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="default")
    ap.add_argument("--modes", nargs="+", choices=["off", "ngram", "draft"], default=["off", "ngram", "draft"])
    ap.add_argument("--draft-model", help="a GGUF sharing the model's vocabulary (mode draft)")
    ap.add_argument("--draft-layers", type=int, default=28, help="blocks kept when no --draft-model is given")
    ap.add_argument("--threshold", type=float, default=0.1, help="the draft model's confidence gate")
    ap.add_argument("--k", type=int, default=4, help="most tokens one window proposes")
    ap.add_argument("--temperature", type=float, default=0.0)
    a = ap.parse_args()
    modes = ["off", *(m for m in a.modes if m != "off")]
    table: dict[tuple[str, str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        draft = a.draft_model
        if "draft" in modes and not draft:
            from strata_core.models import resolve_model
            from strata_core.testing.models import write_truncated

            draft = str(Path(tmp) / "draft.gguf")
            write_truncated(resolve_model(a.model).path, Path(draft), a.draft_layers)
        for mode in modes:
            cfg = Path(tmp) / f"{mode}.toml"
            text = f'[speculative]\nmode = "{mode}"\nk = {a.k}\n'
            if mode == "draft":
                text += f'draft_model = "{draft}"\nthreshold = {a.threshold}\n'
            cfg.write_text(text)
            srv = Server(["--config", str(cfg), "--model", a.model, "--parallel", "4"], Path(tmp) / f"{mode}.log")
            try:
                srv.wait_ready()
                for name, prompts in WORKLOADS.items():
                    for c in (1, 4):
                        r = load(srv.base, prompts, c, a.requests * c, a.max_tokens, a.temperature)
                        table[(mode, name, c)] = r
                        print(f"spec {mode:<5} {name:<10} c={c}: {r['tok_s']:7.1f} tok/s  "
                              f"({r['tokens']:.0f} tokens, accepted {r['accepted']:.0f}/{r['drafted']:.0f})", flush=True)  # fmt: skip
            finally:
                srv.stop()
    for mode in modes[1:]:
        for name in WORKLOADS:
            for c in (1, 4):
                on, off = table[(mode, name, c)], table[("off", name, c)]
                acc = on["accepted"] / on["drafted"] if on["drafted"] else 0.0
                print(f"{mode:<5} {name:<10} c={c}: on/off tokens/s x{on['tok_s'] / off['tok_s']:.3f}, "
                      f"acceptance {acc:.2f} ({on['accepted']:.0f}/{on['drafted']:.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
