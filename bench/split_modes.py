"""One model on two GPUs (docs/backends/cuda.md, "Several GPUs"): an 8B-shaped random model
served with split_mode none, layer and tensor. Each mode's greedy output (64 tokens on 8
prompts) is compared with mode none's, a divergence reported with the top-2 logprob margin
where it happens; then tokens/s at each concurrency, beside llama-server run with the same
split flags (``-sm``), one server at a time.

    python -m bench.split_modes --devices 0,1 --json split.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.launch import Flags, launch
from bench.load import PROMPTS, run_load
from strata_core.ops.build import strata_home
from strata_core.ops.models import default_model_path
from strata_core.testing.models import write_tokenizer

MODES = ("none", "layer", "tensor")


def random_8b() -> Path:
    """The 8B-shaped model with random F16 weights (about 16 GB), written once."""
    path = strata_home() / "models" / "strata-random-8b.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            tok = Path(tmp) / "tokenizer.gguf"
            write_tokenizer(default_model_path(), tok)
            part = path.with_suffix(".part")
            subprocess.run([sys.executable, "-m", "strata_core.testing.models", "random", "--tokenizer", str(tok),
                            "--shape", "8b", str(part)], check=True)  # fmt: skip
            part.rename(path)
    return path


def greedy(base: str, max_tokens: int) -> list[list[dict[str, Any]]]:
    """Each prompt's greedy tokens, each with its top-2 alternatives."""
    out = []
    for prompt in PROMPTS:
        body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "logprobs": True, "top_logprobs": 2}  # fmt: skip
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        out.append(r.json()["choices"][0]["logprobs"]["content"])
    return out


def margin(entry: dict[str, Any]) -> float:
    top = sorted((t["logprob"] for t in entry["top_logprobs"]), reverse=True)
    return top[0] - top[1] if len(top) > 1 else float("inf")


def compare(mode: str, ref: list[list[dict[str, Any]]], got: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Where ``got`` first leaves ``ref`` on each prompt, with both sides' top-2 margins there."""
    diverged = []
    for p, (a, b) in enumerate(zip(ref, got, strict=True)):
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x["token"] != y["token"]), min(len(a), len(b)))
        if i == len(a) == len(b):
            continue
        row = {"prompt": p, "at": i, "none": a[i]["token"] if i < len(a) else None,
               mode: b[i]["token"] if i < len(b) else None,
               "margin_none": margin(a[i]) if i < len(a) else None,
               f"margin_{mode}": margin(b[i]) if i < len(b) else None}  # fmt: skip
        diverged.append(row)
        print(f"  {mode} diverges from none on prompt {p} at token {i}: {row}", flush=True)
    if not diverged:
        print(f"  {mode}: greedy output identical to none on all {len(ref)} prompts", flush=True)
    return diverged


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="0,1", help="the GPUs, as nvidia-smi numbers them")
    ap.add_argument("--model", help="a GGUF instead of the 8B-shaped random model")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=2048, help="context per slot")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--llama-server", help="this llama-server binary instead of the one bench.peers builds")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    model = str(Path(args.model) if args.model else random_8b())
    flags = Flags(backend="cuda", model=model, parallel=max(args.concurrency), n_ctx=args.n_ctx,
                  threads=args.threads, ngl=999, flash_attn=True)  # fmt: skip
    gpus = {"CUDA_VISIBLE_DEVICES": args.devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    outputs: dict[str, list[list[dict[str, Any]]]] = {}
    report: dict[str, Any] = {"model": model, "devices": args.devices, "divergences": {}, "tok_s": {}}
    logs = Path(tempfile.mkdtemp(prefix="bench-split-"))
    print(f"server logs: {logs}", flush=True)
    for mode in args.modes:
        runs = {  # (extra arguments, environment)
            "strata": ([], {"STRATA_ENGINE_DEVICES": args.devices, "STRATA_ENGINE_SPLIT_MODE": mode}),
            "llama-server": (["-sm", mode, "-fit", "off"], gpus),
        }
        for name, (extra, env) in runs.items():
            log = logs / f"{name}-{mode}.log"
            with launch(name, flags, log, extra, env, binary=args.llama_server, timeout=900) as srv:
                if name == "strata":
                    outputs[mode] = greedy(srv.base, args.greedy_tokens)
                    if mode != "none" and "none" in outputs:
                        report["divergences"][mode] = compare(mode, outputs["none"], outputs[mode])
                for c in args.concurrency:
                    r = run_load(srv.base, c, args.requests, args.max_tokens, tag=f"{mode} c{c}")
                    report["tok_s"].setdefault(mode, {}).setdefault(name, {})[c] = r.tok_s
                    print(f"{mode:<6} {name:<12} c={c:<3} {r.line()}", flush=True)
    for mode, by_server in report["tok_s"].items():
        for c in args.concurrency:
            s, p = by_server["strata"][c], by_server["llama-server"][c]
            print(f"{mode:<6} c={c:<3} strata {s:8.1f}  llama-server {p:8.1f} tok/s  (x{s / p:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
