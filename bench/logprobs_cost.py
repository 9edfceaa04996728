"""What logprobs cost in decode speed: greedy tokens/s with top_logprobs=20 against without.

    python bench/logprobs_cost.py [--rounds 6] [--max-tokens 128] [--threads N] [--base URL]

Starts ``strata serve`` on the default model (CPU backend, unless --base names a running
server) and streams the same greedy chat requests one at a time, alternating the two
settings so drift on a shared machine hits both alike. Decode speed of one request is
(tokens - 1) / (last chunk - first chunk); greedy output is the same either way, so both
settings decode the very same tokens. Prints the median of each, their ratio (the
target is >= 0.9) and the median ratio of back-to-back pairs, which drift disturbs less.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strata_core.testing.harness import Server  # noqa: E402

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten year old.",
    "Describe the water cycle in detail.",
]


def decode_speed(base: str, prompt: str, max_tokens: int, top_logprobs: int | None) -> tuple[float, int]:
    body: dict[str, object] = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if top_logprobs is not None:
        body |= {"logprobs": True, "top_logprobs": top_logprobs}
    times: list[float] = []
    tokens = 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    if tokens < 2 or len(times) < 2:
        raise RuntimeError(f"too short a reply to time ({tokens} tokens)")
    return (tokens - 1) / (times[-1] - times[0]), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="requests per setting and prompt")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--base", help="a running Strata server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--server-args", default="--backend cpu --parallel 1 --n-ctx 1024")
    ap.add_argument("--threads", type=int, help="engine threads (STRATA_ENGINE_THREADS); "
                    "1 is steadier on a busy machine")  # fmt: skip
    args = ap.parse_args()
    server = None
    base = args.base
    if base is None:
        log = Path(tempfile.mkdtemp()) / "server.log"
        env = {"STRATA_ENGINE_THREADS": str(args.threads)} if args.threads else None
        server = Server(args.server_args.split(), log, env=env)
        server.wait_ready()
        base = server.base
    try:
        for p in PROMPTS:  # warm up: load pages, fill the prefix cache alike for both
            decode_speed(base, p, 8, None)
        speeds: dict[str, list[float]] = {"without": [], "top_logprobs=20": []}
        pairs: list[float] = []  # with / without, back to back on one prompt
        for r in range(args.rounds):
            for p in PROMPTS:
                order = [("without", None), ("top_logprobs=20", 20)]
                got = {}
                for name, k in order if r % 2 == 0 else order[::-1]:
                    got[name], _ = decode_speed(base, p, args.max_tokens, k)
                    speeds[name].append(got[name])
                pairs.append(got["top_logprobs=20"] / got["without"])
        print(f"greedy decode, one request at a time, {args.max_tokens} max tokens, "
              f"{args.rounds * len(PROMPTS)} requests per setting")  # fmt: skip
        for name, v in speeds.items():
            print(f"  {name:<18} median {statistics.median(v):7.1f} tok/s  "
                  f"(min {min(v):.1f}, max {max(v):.1f})")  # fmt: skip
        ratio = statistics.median(speeds["top_logprobs=20"]) / statistics.median(speeds["without"])
        print(f"ratio of medians with/without: {ratio:.3f} (target >= 0.9)")
        print(f"median of back-to-back ratios: {statistics.median(pairs):.3f} "
              f"(steadier on a shared machine)")  # fmt: skip
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
