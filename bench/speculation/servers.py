"""``servers``: speculation on against off through real servers, side by side in one run,
on the default model (greedy unless --temperature is given).

    python -m bench.speculation servers [--requests 4] [--max-tokens 128] [--rounds 3]
        [--modes off ngram draft] [--k 7 [4 ...]] [--draft-model PATH | --draft-layers 28]
        [--threshold 0.1] [--temperature 0] [--workloads copy-heavy open-ended] [--concurrency 1 4]
        [--backend cuda] [--waves] [--floor 0.98] [--control] [--trace DIR] [--warmup 1] [--pin]

Workloads: copy-heavy (repeat or lightly edit a given passage or code) and open-ended,
by default at concurrency 1 and 4. One server per mode runs throughout; the modes take
turns within every round, so drift in the machine's load falls on all of them; with
--waves they take turns every wave of c requests (ABBA: off, on, on, off, ...), so drift
slower than a wave cancels (each wave then starts and ends with its own ramp). Prints,
pooled over the rounds: tokens/s, TTFT and ITL p50 and p99 (streamed chunks) for each
mode, each mode's ratios to off (p50s), and the acceptance (accepted / drafted tokens, from the
responses' usage). Several --k values run one server per mode and k (``ngram/k4``).
Mode ``draft`` uses --draft-model, or else a copy of the model keeping its first
--draft-layers blocks (self-speculation sharing the vocabulary). With --floor, exits 1
when any pooled on/off tokens/s ratio falls below it. --control starts one more server
with speculation off, last, as mode ``off-b``: its ratio to off (never held to the floor)
is what two identical servers differ by in this run, through their start order, where
the system placed their threads, and noise. With --trace DIR, each server's
engine writes one JSON line per scheduler step to DIR/<mode>.jsonl
(``STRATA_STEP_TRACE``; summarise with ``python -m bench.speculation trace``).

Before the first round every server serves --warmup waves of each workload and c, not
counted: a batch shape's first steps pay for its set-up on a GPU (kernel choice, graph
capture), and n-gram windows bring more shapes than plain steps. With --pin, the client
(this process) keeps one core and its hyperthread siblings and each server (with its
engine) its own share of the other cores, dealt out in turn, so no two processes compete
for a core and none shares one with the client. A failed request stops the run with
its server's and engine's logs (after having them print their threads' stacks).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.launch import Flags, launch
from bench.load import Load, abba, run_load
from bench.speculation.workloads import WORKLOADS
from strata_core.testing.harness import Server

CONTROL = "off-b"  # --control's second speculation-off server

def pooled(runs: list[Load]) -> Load:
    out = Load()
    for r in runs:
        out.add(r)
    return out


def line(r: Load) -> str:
    drafted, accepted = r.speculative()
    return f"{r.line()}  {f'accepted {accepted}/{drafted}' if drafted else 'no drafts'}"


def siblings(cpu: int) -> set[int]:
    """The logical CPUs sharing ``cpu``'s physical core (itself alone where unknown)."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    out = {cpu}
    if path.exists():
        for part in path.read_text().strip().split(","):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def cores(cpus: set[int]) -> list[set[int]]:
    """``cpus`` grouped by physical core (hyperthread siblings together), lowest first."""
    out: list[set[int]] = []
    for cpu in sorted(cpus):
        if not any(cpu in core for core in out):
            out.append(siblings(cpu) & cpus)
    return out


def placement(cpus: set[int], n: int) -> tuple[set[int], list[set[int]]] | None:
    """With ``n`` servers: the client's share of ``cpus`` (one core and its siblings) and
    each server's (as many of the other cores as every other server gets, dealt out in
    turn, none shared by two; a remainder stays idle); None where there are too few cores
    to give each one."""
    groups = cores(cpus)
    share = (len(groups) - 1) // n
    if share < 1:
        return None
    client, rest = groups[0], groups[1:]
    return client, [set().union(*rest[i::n][:share]) for i in range(n)]


def add(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ap = sub.add_parser("servers", help="speculation on against off through real servers")
    ap.set_defaults(run=run)
    ap.add_argument("--requests", type=int, default=4, help="requests per concurrent stream and round")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="default")
    ap.add_argument("--modes", nargs="+", choices=["off", "ngram", "draft"], default=["off", "ngram", "draft"])
    ap.add_argument("--draft-model", help="a GGUF sharing the model's vocabulary (mode draft)")
    ap.add_argument("--draft-layers", type=int, default=28, help="blocks kept when no --draft-model is given")
    ap.add_argument("--threshold", type=float, default=0.1, help="the draft model's confidence gate")
    ap.add_argument("--k", type=int, nargs="+", default=[7], help="most tokens one window proposes")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--parallel", type=int, default=4, help="slots per server")
    ap.add_argument("--backend", help="the backend the servers run on (default: the configuration's)")
    ap.add_argument("--waves", action="store_true", help="modes take turns every wave of c requests, not every run")
    ap.add_argument("--floor", type=float, help="exit 1 if a pooled on/off tokens/s ratio is below this")
    ap.add_argument("--control", action="store_true",
                    help="a second speculation-off server, off-b, whose ratio to off is the bench's own noise")
    ap.add_argument("--trace", type=Path, help="a folder for each engine's per-step trace")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted waves of each cell per server before round 0")
    ap.add_argument("--pin", action="store_true", help="the client on one core, each server on its own share of the others")


def run(a: argparse.Namespace) -> None:
    # (name, mode, k): one server each; "off" first, as the others' baseline
    specs = [("off", "off", a.k[0])]
    for m in a.modes:
        if m != "off":
            specs += [(m if len(a.k) == 1 else f"{m}/k{k}", m, k) for k in a.k]
    if a.control:  # started last: what a server's start order and placement alone change
        specs.append((CONTROL, "off", a.k[0]))
    modes = [name for name, _, _ in specs]
    extra = {"temperature": a.temperature} if a.temperature else None
    table: dict[tuple[str, str, int], list[Load]] = {}
    everything = os.sched_getaffinity(0)
    placed = placement(everything, len(specs)) if a.pin else None
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        draft = a.draft_model
        if "draft" in a.modes and not draft:
            from strata_core.ops.models import resolve_model
            from strata_core.testing.models import write_truncated

            draft = str(Path(tmp) / "draft.gguf")
            write_truncated(resolve_model(a.model).path, Path(draft), a.draft_layers)
        servers: dict[str, Server] = {}
        for i, (name, mode, k) in enumerate(specs):
            cfg = Path(tmp) / f"{name.replace('/', '-')}.toml"
            text = f'[speculative]\nmode = "{mode}"\nk = {k}\n'
            if mode == "draft":
                text += f'draft_model = "{draft}"\nthreshold = {a.threshold}\n'
            cfg.write_text(text)
            flags = Flags(backend=a.backend, model=a.model, parallel=a.parallel, n_ctx=4096)
            env = None
            if a.trace:
                a.trace.mkdir(parents=True, exist_ok=True)
                env = {"STRATA_STEP_TRACE": str(a.trace / f"{name.replace('/', '-')}.jsonl")}
            if placed is not None:  # the server and its engine inherit these CPUs
                os.sched_setaffinity(0, placed[1][i])
            srv = stack.enter_context(launch("strata", flags, cfg.with_suffix(".log"), ["--config", str(cfg)], env))
            assert isinstance(srv, Server)
            servers[name] = srv
            os.sched_setaffinity(0, everything)
        if placed is not None:
            os.sched_setaffinity(0, placed[0])
            print(f"client on CPUs {sorted(placed[0])}; "
                  + ", ".join(f"{n} on {sorted(c)}" for n, c in zip(modes, placed[1], strict=True)), flush=True)
        elif a.pin:
            print("--pin: too few cores to give the client and every server their own; not pinned", flush=True)

        def load(mode: str, name: str, c: int, n: int, first: int) -> Load:
            r = run_load(servers[mode].base, c, n, a.max_tokens, prompts=WORKLOADS[name], extra=extra, first=first)
            if r.errors:
                servers[mode].dump_stacks()
                log = servers[mode].log.read_text(errors="replace")
                sys.exit(f"{mode} {name} c={c}: {r.errors[0]}; its server's log ends:\n{log[-12000:]}"
                         f"\nits engine's log ends:\n{servers[mode].engine_log_tail()}")
            return r

        for name in a.workloads:
            for c in a.concurrency:
                for w in range(a.warmup):
                    for mode in modes:
                        load(mode, name, c, c, w * c)
        for rnd in range(a.rounds):
            turn = modes[rnd % len(modes) :] + modes[: rnd % len(modes)]
            for name in a.workloads:
                for c in a.concurrency:
                    # (requests, first prompt) of each turn: one run of them all, or with
                    # --waves one wave of c at a time, each from the next prompt on
                    waves = [(c, w * c) for w in range(a.requests)] if a.waves else [(a.requests * c, 0)]
                    got = {mode: Load() for mode in turn}
                    for i, (n, first) in enumerate(waves):
                        for mode in abba(turn, i):
                            got[mode].add(load(mode, name, c, n, first))
                    for mode in turn:
                        table.setdefault((mode, name, c), []).append(got[mode])
                        print(f"round {rnd} {mode:<8} {name:<10} c={c}: {line(got[mode])}", flush=True)
    print(f"pooled over {a.rounds} rounds:")
    for (mode, name, c), runs in table.items():
        print(f"{mode:<8} {name:<10} c={c}: {line(pooled(runs))}")
    below = []
    for mode in modes[1:]:
        for name in a.workloads:
            for c in a.concurrency:
                on, off = pooled(table[(mode, name, c)]), pooled(table[("off", name, c)])
                drafted, accepted = on.speculative()
                ratio = on.tok_s / off.tok_s
                print(f"{mode:<8} {name:<10} c={c}: on/off tokens/s x{ratio:.3f}, "
                      f"TTFT x{on.pct('ttft', 0.5) / off.pct('ttft', 0.5):.3f}, "
                      f"ITL x{on.pct('itl', 0.5) / off.pct('itl', 0.5):.3f}, "
                      f"acceptance {accepted / drafted if drafted else 0.0:.2f} ({accepted}/{drafted})")  # fmt: skip
                if a.floor is not None and ratio < a.floor and mode != CONTROL:
                    below.append(f"{mode} {name} c={c} x{ratio:.3f}")
    if below:
        print(f"below the floor x{a.floor}: {', '.join(below)}")
        sys.exit(1)

