"""The kernels' ceiling: llama.cpp's ``llama-batched-bench`` on the same model and slots.

    python -m bench.ceiling [--slots 64] [--npl 1 16 64] [--npp 128] [--ntg 128] [--kvu both]

``llama-batched-bench`` (built by bench.peers in the engine's own CMake tree, so sources
and flags are Strata's) prefills B prompts of --npp tokens and then decodes --ntg tokens
for each of the B sequences in one batch a step: its S_TG (generated tokens per second at
B sequences) is the decode rate with no server, no scheduler and no sampling, the most a
server on these kernels can stream at concurrency B. ``bench.serving --ceiling`` runs it
beside the servers and prints their tokens/s as fractions of it.

--kvu says how the KV cache is laid out: ``on`` one buffer for every sequence (llama.cpp's
``-kvu``, llama-server's default with automatic slots), ``off`` a stream per sequence (as
Strata's engine and llama-server with ``-np N`` keep it), ``both`` each in turn.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from bench.launch import Flags

#: Context per sequence the runs need: prompt and generated tokens, with room to spare.
CTX_PER_SLOT = 320


def batched_bench_argv(flags: Flags, npl: list[int], npp: int, ntg: int, kvu: bool, binary: str | None = None) -> list[str]:
    """llama-batched-bench's command line for ``flags`` (model, threads, GPU layers, flash
    attention) at the batch sizes ``npl``; its context holds ``flags.parallel`` slots."""
    from bench.peers import peer_binary

    backend, model, threads, ngl, fa = flags.resolved()
    slots = max(flags.parallel, *npl)
    ctx = slots * max(CTX_PER_SLOT, npp + ntg + 64)
    return [binary or str(peer_binary(backend, "llama-batched-bench")), "-m", model,
            "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, npl)),
            "-c", str(ctx), "-b", "2048", "-ub", "512", "-t", str(threads), "-tb", str(threads),
            "-ngl", str(ngl), "-fa", "on" if fa else "off", "-kvu" if kvu else "-no-kvu",
            "--output-format", "jsonl"]  # fmt: skip


def parse(output: str) -> dict[int, dict[str, float]]:
    """The jsonl lines of llama-batched-bench's output, by batch size B."""
    rows: dict[int, dict[str, float]] = {}
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            rows[int(row["pl"])] = {"s_tg": float(row["speed_tg"]), "s_pp": float(row["speed_pp"]),
                                    "t_tg": float(row["t_tg"]), "t_pp": float(row["t_pp"])}  # fmt: skip
    return rows


def ceiling(flags: Flags, npl: list[int], npp: int = 128, ntg: int = 128, kvu: bool = False,
            binary: str | None = None, log: Path | None = None) -> dict[int, dict[str, float]]:  # fmt: skip
    """llama-batched-bench's figures by batch size (``s_tg``: generated tokens/s)."""
    argv = batched_bench_argv(flags, npl, npp, ntg, kvu, binary)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if log is not None:
        log.write_text(" ".join(argv) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed ({done.returncode}): {done.stderr[-2000:]}")
    rows = parse(done.stdout + done.stderr)
    if not rows:
        raise RuntimeError(f"llama-batched-bench printed no results: {(done.stdout + done.stderr)[-2000:]}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=None)
    ap.add_argument("--model", default="default")
    ap.add_argument("--slots", type=int, default=64, help="the server's slots (the context holds as many sequences)")
    ap.add_argument("--npl", type=int, nargs="+", default=[1, 16, 64], help="batch sizes B (sequences decoding together)")
    ap.add_argument("--npp", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--ntg", type=int, default=128, help="tokens generated per sequence")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ngl", type=int, help="layers on the GPU (default: the backend's)")
    ap.add_argument("--kvu", choices=["on", "off", "both"], default="both")
    ap.add_argument("--binary", help="this llama-batched-bench instead of the one bench.peers builds")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    flags = Flags(backend=args.backend, model=args.model, parallel=args.slots, threads=args.threads, ngl=args.ngl)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for kvu in {"on": [True], "off": [False], "both": [False, True]}[args.kvu]:
        name = "kvu" if kvu else "per-slot"
        out[name] = rows = ceiling(flags, args.npl, args.npp, args.ntg, kvu, args.binary)
        for b, r in sorted(rows.items()):
            print(f"{name:<8} B={b:<4} S_TG {r['s_tg']:9.1f} tok/s  S_PP {r['s_pp']:9.1f} tok/s  "
                  f"step {r['t_tg'] / args.ntg * 1e3:7.2f} ms", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
