"""Serving benchmark: Strata beside llama.cpp's llama-server (same pinned sources and
flags) and, with --llama-cpp-python, llama-cpp-python's server, in one run: same model,
slots, threads and prompts.

    python -m bench.serving --concurrency 1 4 --requests 8 --max-tokens 128

The servers take turns for --rounds rounds, each started afresh every round, so drift in
the machine's load falls on all of them; the figures pool every round and the per-round
rates show the spread. With --waves every server runs throughout and they take turns every
wave of c requests (ABBA), so drift slower than a wave falls on all alike; each wave starts
and ends with its own ramp, and --requests counts the requests of each concurrency
(--requests / c waves). --control runs a second Strata server, strata-b, as a peer: its
ratio shows what two identical servers differ by in the run; --control-env KEY=VALUE sets
a variable for strata-b alone (``STRATA_ENGINE_DEVICE_SAMPLING=true``), so the ratio is that
variable's effect against the same run's noise.

Reports per server and concurrency: aggregate output tokens/s, TTFT and ITL (streamed
chunks) p50 and p99, errors, and the ratio of Strata to each peer. With --ceiling it also
runs llama-batched-bench from the same tree on the same model and slots (bench.ceiling)
and prints each server's tokens/s as a fraction of the kernels' S_TG at B = c. Requests send
``ignore_eos`` (as vLLM's benchmark does), so every reply runs to --max-tokens on every
server: two servers' greedy texts part where their numerics differ, and one that ends a
reply early would otherwise hold fewer tokens in the same wave's time (--stop-at-eos lets
replies end).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path

from bench.launch import Flags, Running, launch
from bench.load import Load, abba, run_load


def kinds(args: argparse.Namespace) -> dict[str, str]:
    """Each server's name and kind, in the order they start."""
    out = {"strata": "strata", "llama-server": "llama-server"}
    if args.control:  # started after llama-server: what two identical servers differ by in this run
        out["strata-b"] = "strata"
    if args.llama_cpp_python:
        out["llama-cpp-python"] = "llama-cpp-python"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=2048, help="context per slot")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--ngl", type=int, help="layers on the GPU (default: the backend's, for every server)")
    ap.add_argument("--llama-server", help="this llama-server binary instead of the one bench.peers builds")
    ap.add_argument("--llama-cpp-python", action="store_true", help="also run llama-cpp-python's server")
    ap.add_argument("--repeat-prompts", action="store_true",
                    help="reuse the same prompts at every concurrency (measures the peers' prompt caches)")
    ap.add_argument("--rounds", type=int, default=3, help="servers alternate this many times; figures pool all rounds")
    ap.add_argument("--waves", action="store_true",
                    help="run every server throughout and take turns every wave of c requests (ABBA), not every round")
    ap.add_argument("--control", action="store_true",
                    help="a second Strata server, strata-b, whose ratio to strata is the bench's own noise")
    ap.add_argument("--control-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for strata-b alone (implies --control; repeatable)")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="let replies end at the model's end-of-generation token; by default requests send "
                         "ignore_eos, so every server generates --max-tokens for each and a reply that two "
                         "servers' numerics end at different lengths does not count as speed")
    ap.add_argument("--ceiling", action="store_true",
                    help="also run llama-batched-bench (bench.ceiling) and print tokens/s as fractions of its S_TG")
    ap.add_argument("--ceiling-npp", type=int, default=32, help="the ceiling's prompt tokens (about the load's prompts)")
    ap.add_argument("--logs", type=Path, help="a folder for the servers' logs (default: a temporary one)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    control_env = dict(kv.split("=", 1) for kv in args.control_env)
    args.control = args.control or bool(control_env)
    extra = None if args.stop_at_eos else {"ignore_eos": True}
    flags = Flags(backend=args.backend, model=args.model, parallel=max(args.concurrency), n_ctx=args.n_ctx,
                  threads=args.threads, ngl=args.ngl)  # fmt: skip
    names = kinds(args)
    pooled: dict[str, dict[int, Load]] = {}
    rates: dict[str, dict[int, list[float]]] = {}

    def record(rnd: int, name: str, c: int, r: Load) -> None:
        pooled.setdefault(name, {}).setdefault(c, Load()).add(r)
        rates.setdefault(name, {}).setdefault(c, []).append(r.tok_s)
        print(f"round {rnd} {name:<17} c={c:<3} {r.line()}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)

        def start(name: str) -> AbstractContextManager[Running]:
            env = control_env if name == "strata-b" else None
            return launch(names[name], flags, logs / f"{name}.log", env=env, binary=args.llama_server)

        def tag(rnd: int, c: int, wave: str = "") -> str | None:
            return None if args.repeat_prompts else f"round {rnd} c{c}{wave}"

        if args.waves:  # every server runs throughout; they take turns every wave of c requests
            with ExitStack() as stack:
                running: dict[str, Running] = {name: stack.enter_context(start(name)) for name in names}
                for rnd in range(args.rounds):
                    for c in args.concurrency:
                        got = {name: Load() for name in names}
                        for wave in range(max(1, args.requests // c)):
                            for name in abba(list(names), rnd + wave):
                                got[name].add(run_load(running[name].base, c, c, args.max_tokens,
                                                       tag=tag(rnd, c, f" w{wave}"), extra=extra, first=wave * c))
                        for name, r in got.items():
                            record(rnd, name, c, r)
        else:  # one server at a time, each started afresh for every round
            for rnd in range(args.rounds):
                for name in names:
                    with start(name) as srv:
                        for c in args.concurrency:
                            record(rnd, name, c, run_load(srv.base, c, args.requests, args.max_tokens,
                                                          tag=tag(rnd, c), extra=extra))
    table: dict[str, dict[int, dict[str, object]]] = {}
    print(f"pooled over {args.rounds} rounds:")
    for name, by_c in pooled.items():
        for c, r in by_c.items():
            table.setdefault(name, {})[c] = {
                "tok_s": r.tok_s, "ttft_p50_ms": r.pct("ttft", 0.5), "ttft_p99_ms": r.pct("ttft", 0.99),
                "itl_p50_ms": r.pct("itl", 0.5), "itl_p99_ms": r.pct("itl", 0.99), "tokens": r.tokens,
                "errors": len(r.errors), "round_tok_s": rates[name][c],
            }  # fmt: skip
            spread = ", ".join(f"{x:.1f}" for x in rates[name][c])
            print(f"{name:<17} c={c:<3} {r.line()}  (rounds: {spread})", flush=True)
    for peer in [n for n in pooled if n != "strata"]:
        for c in args.concurrency:
            s, p = pooled["strata"][c], pooled[peer][c]
            print(f"strata / {peer} c={c}: tokens/s x{s.tok_s / p.tok_s:.3f}, "
                  f"TTFT x{s.pct('ttft', 0.5) / p.pct('ttft', 0.5):.3f}, ITL x{s.pct('itl', 0.5) / p.pct('itl', 0.5):.3f}")
    if args.ceiling:
        print_ceiling(flags, args, table)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


def print_ceiling(flags: Flags, args: argparse.Namespace, table: dict[str, dict[int, dict[str, object]]]) -> None:
    """The kernels' S_TG at B = each concurrency (a KV stream per slot, as both servers keep
    it), and each server's tokens/s as a fraction of it, beside its TTFT p50 / p99."""
    from bench.ceiling import ceiling

    rows = ceiling(flags, list(args.concurrency), args.ceiling_npp, args.max_tokens, kvu=False, binary=None)
    servers = list(table.items())
    for c in args.concurrency:
        s_tg = rows[c]["s_tg"]
        print(f"ceiling c={c:<3} llama-batched-bench S_TG {s_tg:.1f} tok/s (B={c}, npp {args.ceiling_npp}, "
              f"ntg {args.max_tokens})")  # fmt: skip
        for name, by_c in servers:
            r = by_c[c]
            tok_s = float(r["tok_s"])  # type: ignore[arg-type]
            r["of_s_tg"] = tok_s / s_tg
            print(f"  {name:<17} {tok_s:9.1f} tok/s = {tok_s / s_tg:6.1%} of S_TG, "
                  f"TTFT p50 {r['ttft_p50_ms']:.1f} ms p99 {r['ttft_p99_ms']:.1f} ms", flush=True)  # fmt: skip
        table.setdefault("ceiling", {})[c] = {"s_tg": s_tg, "s_pp": rows[c]["s_pp"]}


if __name__ == "__main__":
    main()
