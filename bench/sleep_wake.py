"""What the first request after a sleep costs: ``strata serve --sleep-idle-seconds S``,
a one-token completion to the awake model (after a warm-up one), then, once ``GET /models``
says it sleeps, the same request (which wakes it), ``--rounds`` times; the medians."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.launch import Flags, launch

BODY = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}


def timed(base: str) -> float:
    began = time.perf_counter()
    httpx.post(f"{base}/v1/completions", json=BODY, timeout=600).raise_for_status()
    return time.perf_counter() - began


def wait_asleep(base: str) -> None:
    while httpx.get(f"{base}/models", timeout=60).json()["data"][0]["status"]["value"] != "sleeping":
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--backend")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=2.0, help="--sleep-idle-seconds")
    args = ap.parse_args(argv)
    log = Path(tempfile.mkdtemp(prefix="sleep-wake-")) / "server.log"
    awake, woken = [], []
    with launch("strata", Flags(args.backend, args.model), log, ["--sleep-idle-seconds", str(args.sleep)]) as srv:
        for _ in range(args.rounds):
            timed(srv.base)
            awake.append(timed(srv.base))
            wait_asleep(srv.base)
            woken.append(timed(srv.base))
    print(f"awake:       {' '.join(f'{t:.3f}' for t in awake)} s, median {statistics.median(awake):.3f} s")
    print(f"after sleep: {' '.join(f'{t:.3f}' for t in woken)} s, median {statistics.median(woken):.3f} s")


if __name__ == "__main__":
    main()
