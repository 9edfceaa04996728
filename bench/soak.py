"""Soak: a real ``strata serve`` under a mixed load for a while, its engine killed now and
then; nothing may be lost and nothing may grow (docs/reliability.md).

    python -m bench.soak [--minutes 30] [--concurrency 16] [--kill-every 300] [--first-kill S]
        [--stall S] [--parallel 4] [--n-ctx 1024] [--backend cpu] [--model default] [--seed 0]
        [--hang 120] [--max-rss-growth 0.5] [--max-fd-growth 32] [--json PATH] [--log PATH]

Starts the server on the default model, warms it up with one request of each kind, then
keeps --concurrency requests in flight for --minutes, drawn from bench.soak_mix:
chat and completions, streamed and not, logprobs, json_schema, stop strings, n=2, a
seeded replay, and client-side cancellations (a stream closed after a few chunks, a
client timeout). Every --kill-every seconds (first at --first-kill) the engine gets
SIGKILL; the server answers 503 ``engine_unavailable`` until it has restarted it. With
--stall, the engine is stopped (SIGSTOP) that long before each kill, while new requests
arrive: a hung engine that then dies.

Reports requests ok / failed (by status and code) / cancelled / lost / invalid, p50 and
p99 latency of the answers, each kill's recovery time, and the resident memory (VmRSS)
of the server and the engine and the server's open descriptors at start and end.
Exits 1 when a request is lost, an answer fails its checks, an error is unexpected,
memory or descriptors grow past the bounds, the engine does not come back, or engine
requests are still running once the load has stopped. Linux only (it reads /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import openai

try:
    import httpx2 as sdk_httpx  # the openai SDK's own fork of httpx, from its version 3
except ImportError:
    import httpx as sdk_httpx  # type: ignore[no-redef]

from bench.launch import Flags, launch
from bench.soak_mix import CANCELLED, FAILED, INVALID, KINDS, LOST, OK, SSE, Ctx, Outcome
from strata_core.ops.config import load_config
from strata_core.testing.harness import Server

#: Failures a 503 engine_unavailable may still cause after the engine is back: answers
#: already on their way when it recovered.
GRACE_S = 5.0
#: No kill this close to the end, so the run ends on a restarted engine.
LAST_KILL_MARGIN_S = 15.0
RECOVERY_TIMEOUT_S = 120.0
#: Seconds after the load stops for the engine to finish (or cancel) every request.
IDLE_TIMEOUT_S = 20.0
#: Seconds a client keeps an idle connection (uvicorn closes them after 5).
KEEPALIVE_S = 2.0
#: A worker pauses this long after a failure, as a client that retries would.
BACKOFF_S = 0.5
#: llama.cpp's own log lines (``function_name: ...``), left out of the log shown on failure
LLAMA_LOG = re.compile(r"^([a-z_0-9]+: |\.+$|\s*$)")


# ---- /proc -------------------------------------------------------------------------------


def rss_kib(pid: int | None) -> int | None:
    """VmRSS of a process in KiB (None: no such process)."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def engine_pid(server_pid: int) -> int | None:
    """The server's live engine process (a killed one, not yet reaped, has no command line)."""
    for pid in children(server_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"strata_core.engine" in argv:
            return pid
    return None


async def settled_fds(pid: int) -> int:
    """The server's descriptors once closed connections are gone: two equal readings."""
    last = fd_count(pid)
    for _ in range(20):
        await asyncio.sleep(0.25)
        now = fd_count(pid)
        if now == last:
            return now
        last = now
    return last


# ---- the run -------------------------------------------------------------------------------


@dataclass
class Kill:
    at: float  # seconds into the load (of the SIGSTOP, with --stall)
    pid: int | None
    recovered_s: float | None = None  # seconds from SIGKILL until a new engine answered /health


@dataclass
class Sample:
    t: float  # seconds into the load
    server_rss_kib: int | None
    engine_rss_kib: int | None
    engine_pid: int | None
    server_fds: int


def sample(server_pid: int, t: float) -> Sample:
    epid = engine_pid(server_pid)
    return Sample(round(t, 1), rss_kib(server_pid), rss_kib(epid), epid, fd_count(server_pid))


class Load:
    """One phase's clients (the warm-up's, the load's) and the outcomes of its requests.
    The first hang has the server and its engine print their threads' stacks to their logs."""

    def __init__(self, srv: Server, hang_s: float, concurrency: int, out: list[Outcome]) -> None:
        self.srv, self.hang_s, self.out = srv, hang_s, out
        # The clients' own timeouts lie past the hang limit, so a hang is seen as one. They
        # drop idle connections before uvicorn does (5 s): a request sent on a connection
        # the server is closing at that moment fails without reaching it.
        limits: dict[str, Any] = {"max_connections": concurrency + 4, "keepalive_expiry": KEEPALIVE_S}
        http = httpx.AsyncClient(timeout=hang_s + 5, limits=httpx.Limits(**limits))
        sdk = openai.AsyncOpenAI(
            base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=hang_s + 5,
            http_client=openai.DefaultAsyncHttpxClient(limits=sdk_httpx.Limits(**limits)),
        )  # fmt: skip
        self.ctx = Ctx(srv.base, http, sdk)
        self.dumped = False

    async def one(self, name: str, rng: random.Random) -> Outcome:
        t0 = time.monotonic()
        try:
            out = await asyncio.wait_for(KINDS[name][0](self.ctx, rng), self.hang_s)
        except asyncio.TimeoutError:
            out = Outcome(name, LOST, f"no answer within {self.hang_s:.0f} s (a hang)")
            if not self.dumped:
                self.dumped = True
                await asyncio.to_thread(self.srv.dump_stacks)
        out.at = time.monotonic()
        out.latency = out.at - t0
        self.out.append(out)
        return out

    async def worker(self, rng: random.Random, until: float) -> None:
        names, weights = list(KINDS), [w for _, w in KINDS.values()]
        while time.monotonic() < until:
            if (await self.one(rng.choices(names, weights)[0], rng)).verdict == FAILED:
                await asyncio.sleep(BACKOFF_S)

    async def close(self) -> None:
        await self.ctx.http.aclose()
        await self.ctx.sdk.close()


async def healthy(http: httpx.AsyncClient, base: str) -> bool:
    try:
        return (await http.get(f"{base}/health", timeout=2)).status_code == 200
    except httpx.HTTPError:
        return False


async def killer(load: Load, t0: float, at: list[float], a: argparse.Namespace, kills: list[Kill]) -> None:
    """SIGKILL the engine at each of ``at`` (seconds into the load) and time its recovery.
    With ``a.stall``, first SIGSTOP it for that long (a hung engine that then dies) while
    a quarter of --concurrency new requests arrive beside the load, which waits on it."""
    rng = random.Random(a.seed - 1)
    names, weights = list(KINDS), [w for _, w in KINDS.values()]
    server_pid = load.srv.proc.pid
    async with httpx.AsyncClient() as http:
        for t in at:
            await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
            pid = engine_pid(server_pid)
            kill = Kill(round(time.monotonic() - t0, 1), pid)
            kills.append(kill)
            if pid is None:
                continue
            arrivals = []
            if a.stall > 0:
                os.kill(pid, signal.SIGSTOP)
                arrivals = [asyncio.create_task(load.one(name, rng))
                            for name in rng.choices(names, weights, k=max(1, a.concurrency // 4))]  # fmt: skip
                await asyncio.sleep(a.stall)
            os.kill(pid, signal.SIGKILL)
            began = time.monotonic()
            while time.monotonic() - began < RECOVERY_TIMEOUT_S:
                await asyncio.sleep(0.1)
                if engine_pid(server_pid) not in (None, pid) and await healthy(http, load.srv.base):
                    kill.recovered_s = round(time.monotonic() - began, 2)
                    break
            await asyncio.gather(*arrivals)


async def sampler(server_pid: int, t0: float, every: float, samples: list[Sample]) -> None:
    while True:
        await asyncio.sleep(every)
        samples.append(sample(server_pid, time.monotonic() - t0))


async def engine_busy(base: str) -> int:
    """Requests the engine still holds (busy slots + queue), from /metrics; 0 once idle or
    after IDLE_TIMEOUT_S."""
    left = -1
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            try:
                text = (await http.get(f"{base}/metrics", timeout=5)).text
                left = sum(int(float(line.split()[1])) for line in text.splitlines()
                           if line.startswith(("strata_busy_slots ", "strata_queue_depth ")))  # fmt: skip
            except httpx.HTTPError:
                pass
            if left == 0:
                return 0
            await asyncio.sleep(0.5)
    return left


def metric(base: str, name: str) -> float | None:
    try:
        for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    except httpx.HTTPError:
        pass
    return None


def kill_times(a: argparse.Namespace) -> list[float]:
    if a.kill_every <= 0:
        return []
    first = a.kill_every if a.first_kill is None else a.first_kill
    out, t = [], first
    while t <= a.minutes * 60 - LAST_KILL_MARGIN_S:
        out.append(t)
        t += a.kill_every
    return out


async def drive(srv: Server, a: argparse.Namespace) -> dict[str, Any]:
    pid = srv.proc.pid
    outcomes: list[Outcome] = []
    loadavg = [os.getloadavg()]
    warm = Load(srv, a.hang, a.concurrency, outcomes)
    rng = random.Random(a.seed)
    # one of each kind together, so that what is allocated once is in the start figures
    await asyncio.gather(*(warm.one(name, rng) for name in KINDS))
    await warm.close()
    fds_start = await settled_fds(pid)
    start = sample(pid, 0.0)
    cancelled_start = metric(srv.base, "strata_requests_cancelled_total")

    load = Load(srv, a.hang, a.concurrency, outcomes)
    t0 = time.monotonic()
    kills: list[Kill] = []
    samples = [start]
    sampling = asyncio.create_task(sampler(pid, t0, a.sample_every, samples))
    killing = asyncio.create_task(killer(load, t0, kill_times(a), a, kills))
    until = t0 + a.minutes * 60
    await asyncio.gather(*(load.worker(random.Random(a.seed * 1000 + i + 1), until) for i in range(a.concurrency)))
    load_s = time.monotonic() - t0
    await killing
    sampling.cancel()
    await load.close()
    left = await engine_busy(srv.base)
    fds_end = await settled_fds(pid)
    end = sample(pid, time.monotonic() - t0)
    samples.append(end)
    loadavg.append(os.getloadavg())
    start.server_fds, end.server_fds = fds_start, fds_end
    windows = [(t0 + k.at, t0 + k.at + a.stall + (k.recovered_s if k.recovered_s is not None else math.inf)
                + GRACE_S) for k in kills]  # fmt: skip
    outcomes = [settle(o, windows) for o in outcomes]
    for o in outcomes:  # reported as seconds into the load (the warm-up's are negative)
        o.at = round(o.at - t0, 2)
    cancelled_end = metric(srv.base, "strata_requests_cancelled_total")
    engine_cancelled = None
    if cancelled_start is not None and cancelled_end is not None:
        engine_cancelled = int(cancelled_end - cancelled_start)
    rep = report(a, outcomes, kills, samples, start, end, pid, load_s, left, engine_cancelled)
    rep["loadavg"] = {"start": [round(x, 2) for x in loadavg[0]], "end": [round(x, 2) for x in loadavg[1]]}
    return rep


def settle(o: Outcome, windows: list[tuple[float, float]]) -> Outcome:
    """A failure that is OpenAI-shaped but not allowed becomes lost: a 5xx other than 503
    engine_unavailable, and a 503 engine_unavailable outside every kill window."""
    if o.verdict != FAILED or o.status is None:
        return o
    unavailable = o.status in (503, SSE) and o.code == "engine_unavailable"
    if unavailable and not any(a <= o.at <= b for a, b in windows):
        return replace(o, verdict=LOST, detail=f"engine_unavailable outside a kill window: {o.detail}")
    if o.status >= 500 and not unavailable:
        return replace(o, verdict=LOST, detail=f"a {o.status} that is not engine_unavailable: {o.detail}")
    return o


def expected(o: Outcome) -> bool:
    """A failure that says nothing is wrong: the engine restarting, or a full queue."""
    return o.code == "engine_unavailable" or o.status == 429


def pct(xs: list[float], q: float) -> float | None:
    """The nearest-rank percentile, in ms."""
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[max(0, math.ceil(q * len(xs)) - 1)] * 1e3, 1)


def growth(start: int | None, end: int | None) -> float | None:
    return None if not start or end is None else round(end / start - 1, 4)


def report(
    a: argparse.Namespace, outcomes: list[Outcome], kills: list[Kill], samples: list[Sample],
    start: Sample, end: Sample, server_pid: int, load_s: float, left: int, engine_cancelled: int | None,
) -> dict[str, Any]:  # fmt: skip
    verdicts = Counter(o.verdict for o in outcomes)
    by_kind: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    for o in outcomes:
        by_kind[o.kind][o.verdict] += 1
    failed = [o for o in outcomes if o.verdict == FAILED]
    unexpected = [o for o in failed if not expected(o)]
    oks = [o.latency for o in outcomes if o.verdict == OK]
    rep: dict[str, Any] = {
        "config": {k: getattr(a, k) for k in ("minutes", "concurrency", "kill_every", "first_kill", "stall",
                                              "parallel", "n_ctx", "backend", "model", "seed", "hang")},  # fmt: skip
        "load_s": round(load_s, 1),
        "requests": {"total": len(outcomes), **{v: verdicts[v] for v in (OK, FAILED, CANCELLED, LOST, INVALID)}},
        "failed_by": dict(Counter(f"{'sse' if o.status == SSE else o.status} {o.code}" for o in failed)),
        "unexpected_failures": len(unexpected),
        "by_kind": {k: dict(c) for k, c in by_kind.items()},
        "latency_ms": {"p50": pct(oks, 0.5), "p99": pct(oks, 0.99), "max": pct(oks, 1.0)},
        "kills": [asdict(k) for k in kills],
        "server": {
            "pid": server_pid,
            "rss_start_kib": start.server_rss_kib, "rss_end_kib": end.server_rss_kib,
            "rss_growth": growth(start.server_rss_kib, end.server_rss_kib),
            "rss_max_kib": max((x.server_rss_kib or 0 for x in samples), default=None),
            "fds_start": start.server_fds, "fds_end": end.server_fds,
            "fds_growth": end.server_fds - start.server_fds,
        },
        "engine": {
            "pid_start": start.engine_pid, "pid_end": end.engine_pid,
            "rss_start_kib": start.engine_rss_kib, "rss_end_kib": end.engine_rss_kib,
            "rss_growth": growth(start.engine_rss_kib, end.engine_rss_kib),
            "rss_max_kib": max((x.engine_rss_kib or 0 for x in samples), default=None),
        },
        "engine_requests_left": left,
        "engine_cancelled": engine_cancelled,
        "bounds": {"rss_growth": a.max_rss_growth, "fds_growth": a.max_fd_growth,
                   "engine_prompt_cache_mib": prompt_cache_mib()},  # fmt: skip
        "lost_examples": [asdict(o) for o in outcomes if o.verdict == LOST][:20],
        "invalid_examples": [asdict(o) for o in outcomes if o.verdict == INVALID][:20],
        "unexpected_examples": [asdict(o) for o in unexpected][:20],
        "samples": [asdict(s) for s in samples],
    }
    rep["violations"] = violations(rep, a)
    rep["passed"] = not rep["violations"]
    return rep


def violations(rep: dict[str, Any], a: argparse.Namespace) -> list[str]:
    out = []
    req = rep["requests"]
    if req[LOST]:
        out.append(f"{req[LOST]} requests lost")
    if req[INVALID]:
        out.append(f"{req[INVALID]} answers failed their checks")
    if rep["unexpected_failures"]:
        out.append(f"{rep['unexpected_failures']} unexpected errors")
    if not req[OK]:
        out.append("no request was answered")
    for who in ("server", "engine"):
        r = rep[who]
        if r["rss_start_kib"] is None or r["rss_end_kib"] is None:
            out.append(f"the {who}'s RSS could not be read")
            continue
        # the engine fills its host prompt cache by design: that much growth is allowed on top
        allowed = a.max_rss_growth * r["rss_start_kib"] + (rep["bounds"]["engine_prompt_cache_mib"] << 10
                                                           if who == "engine" else 0)  # fmt: skip
        if r["rss_end_kib"] - r["rss_start_kib"] > allowed:
            out.append(f"the {who}'s RSS grew by {r['rss_growth']:.0%}, more than {allowed / 1024:.0f} MiB")
    if rep["server"]["fds_growth"] > a.max_fd_growth:
        out.append(f"the server's descriptors grew by {rep['server']['fds_growth']} (bound {a.max_fd_growth})")
    for k in rep["kills"]:
        if k["pid"] is None:
            out.append(f"no engine to kill at {k['at']} s")
        elif k["recovered_s"] is None:
            out.append(f"the engine killed at {k['at']} s did not come back within {RECOVERY_TIMEOUT_S:.0f} s")
    if rep["engine_requests_left"]:
        out.append(f"{rep['engine_requests_left']} engine requests still running {IDLE_TIMEOUT_S:.0f} s "
                   "after the load stopped")  # fmt: skip
    return out


def prompt_cache_mib() -> int:
    """The engine's host prompt cache budget, from the configuration the server also reads."""
    return load_config().engine.prompt_cache_mib


def exceptions_in(log: Path) -> dict[str, int]:
    """The exceptions in the server's console, each the last line of a traceback, counted."""
    out: Counter[str] = Counter()
    in_traceback = False
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and not line.startswith(" "):
            out[line[:200]] += 1
            in_traceback = False
    return dict(out)


def mib(kib: int | None) -> str:
    return "?" if kib is None else f"{kib / 1024:.1f} MiB"


def pct_str(g: float | None) -> str:
    return "?" if g is None else f"{g:+.1%}"


def show(rep: dict[str, Any]) -> None:
    req, lat, s, e = rep["requests"], rep["latency_ms"], rep["server"], rep["engine"]
    print(f"soak: {rep['load_s']:.0f} s of load, {rep['config']['concurrency']} at a time")
    print(f"requests {req['total']}: ok {req[OK]}, failed {req[FAILED]}, cancelled by the client "
          f"{req[CANCELLED]}, lost {req[LOST]}, invalid {req[INVALID]}")  # fmt: skip
    for key, n in sorted(rep["failed_by"].items()):
        print(f"  failed {key}: {n}")
    print(f"latency of answers: p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms")
    for k in rep["kills"]:
        print(f"engine kill at {k['at']} s (pid {k['pid']}): back after {k['recovered_s']} s")
    print(f"server RSS {mib(s['rss_start_kib'])} -> {mib(s['rss_end_kib'])} ({pct_str(s['rss_growth'])}, "
          f"peak {mib(s['rss_max_kib'])}), fds {s['fds_start']} -> {s['fds_end']} ({s['fds_growth']:+d})")  # fmt: skip
    print(f"engine RSS {mib(e['rss_start_kib'])} -> {mib(e['rss_end_kib'])} ({pct_str(e['rss_growth'])}, "
          f"peak {mib(e['rss_max_kib'])}), pid {e['pid_start']} -> {e['pid_end']}")  # fmt: skip
    print(f"machine load average (1, 5, 15 min): {rep['loadavg']['start']} at the start, "
          f"{rep['loadavg']['end']} at the end")  # fmt: skip
    print(f"engine requests cancelled: {rep['engine_cancelled']}; left running after the load: "
          f"{rep['engine_requests_left']}")  # fmt: skip
    for exc, n in sorted(rep.get("server_exceptions", {}).items(), key=lambda x: -x[1]):
        print(f"  the server's log shows {n} x {exc}")
    for what in ("lost", "invalid", "unexpected"):
        for o in rep[f"{what}_examples"][:5]:
            print(f"  {what}: {o['kind']}: {o['detail']}")
    print("PASS" if rep["passed"] else "FAIL: " + "; ".join(rep["violations"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the load runs")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    ap.add_argument("--kill-every", type=float, default=300.0, help="seconds between engine kills (0: none)")
    ap.add_argument("--first-kill", type=float, help="seconds into the load of the first kill (default: --kill-every)")
    ap.add_argument("--stall", type=float, default=0.0,
                    help="SIGSTOP the engine this many seconds before each SIGKILL (a hung engine that dies)")
    ap.add_argument("--parallel", type=int, default=4, help="the server's slots")
    ap.add_argument("--n-ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default="default")
    ap.add_argument("--seed", type=int, default=0, help="seeds the request mix")
    ap.add_argument("--hang", type=float, default=120.0, help="seconds after which a request counts as hung")
    ap.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS / fd samples")
    ap.add_argument("--max-rss-growth", type=float, default=0.5, help="bound on RSS growth (0.5: +50%%)")
    ap.add_argument("--max-fd-growth", type=int, default=32, help="bound on the server's descriptor growth")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--log", type=Path, help="the server's log (default: a temporary file)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = a.log or Path(tmp) / "server.log"
        flags = Flags(backend=a.backend, model=a.model, parallel=a.parallel, n_ctx=a.n_ctx)
        with launch("strata", flags, log) as srv:
            assert isinstance(srv, Server)
            rep = asyncio.run(drive(srv, a))
        rep["server_exceptions"] = exceptions_in(log)
        show(rep)
        if a.json:
            a.json.write_text(json.dumps(rep, indent=1) + "\n")
        if not rep["passed"]:
            print(f"--- the server's log, its last lines but llama.cpp's ({log}):")
            lines = [x for x in log.read_text(errors="replace").splitlines() if not LLAMA_LOG.match(x)]
            print("\n".join(lines[-40:]))
    return 0 if rep["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
