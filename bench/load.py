"""One streaming load generator for every bench script that times HTTP: streamed chat
completions against an OpenAI-compatible server (Strata, llama-server, llama-cpp-python),
``concurrency`` at a time, each one's time to first token (TTFT), gaps between streamed
content chunks (ITL), completion tokens (the usage chunk's, else the content chunks) and
error, and the aggregates: output tokens/s over the wall time, TTFT and ITL percentiles.

    load = run_load(base, concurrency=4, requests=16, max_tokens=128)
    load.tok_s, load.pct("ttft", 0.5), load.pct("itl", 0.99), load.errors

``one`` streams a single request, for scripts that time one request at a time.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten year old.",
    "List ten facts about the planet Mars, one per line.",
    "Describe the water cycle in detail.",
    "Write a letter to a friend describing your last holiday.",
    "What are the main causes of the French Revolution? Answer at length.",
    "Give step by step instructions for baking bread.",
    "Summarise the plot of a detective novel you invent.",
]
# A stream that stalls for a minute fails the request rather than hanging the run.
TIMEOUT = httpx.Timeout(600, read=60)


def chat(content: str | list[dict[str, Any]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A streamed chat completion's body: one user message, or these messages; greedy
    unless ``extra`` says otherwise."""
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    return {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **extra}  # fmt: skip


@dataclass
class Reply:
    """One streamed request as the client saw it."""

    sent: float  # time.perf_counter() when it was sent
    times: list[float] = field(default_factory=list)  # the arrival of each content chunk
    text: str = ""
    usage: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def tokens(self) -> int:
        """Completion tokens: the usage chunk's (llama-cpp-python sends none: the content chunks)."""
        return self.usage["completion_tokens"] if self.usage else len(self.times)

    @property
    def ttft(self) -> float | None:
        return self.times[0] - self.sent if self.times else None

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second from the first content chunk to the last (prompt processing
        left out): (tokens - 1) / that time."""
        if self.tokens < 2 or len(self.times) < 2:
            return None
        return (self.tokens - 1) / (self.times[-1] - self.times[0])


async def stream(client: httpx.AsyncClient, base: str, body: dict[str, Any]) -> Reply:
    """Send ``body`` to ``base``/v1/chat/completions and read its stream; a failure (a status
    other than 200, an error event, a dropped connection, a timeout) is the reply's error."""
    reply = Reply(time.perf_counter())
    try:
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
            reply.headers = dict(r.headers)
            if r.status_code != 200:
                reply.error = f"{r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return reply
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    reply.error = f"error event: {json.dumps(ev['error'])[:300]}"
                if ev.get("usage"):
                    reply.usage = ev["usage"]
                delta = ev["choices"][0].get("delta", {}) if ev.get("choices") else {}
                if delta.get("content"):
                    reply.times.append(time.perf_counter())
                    reply.text += delta["content"]
    except httpx.HTTPError as e:
        reply.error = f"{type(e).__name__}: {e}"
    return reply


def one(base: str, body: dict[str, Any]) -> Reply:
    """One streamed request on a connection of its own."""

    async def go() -> Reply:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            return await stream(client, base, body)

    return asyncio.run(go())


@dataclass
class Load:
    """The replies of one or more runs and the wall time they took."""

    replies: list[Reply] = field(default_factory=list)
    wall: float = 0.0

    def add(self, other: Load) -> None:
        """Pool another run into this one."""
        self.replies += other.replies
        self.wall += other.wall

    @property
    def ok(self) -> list[Reply]:
        return [r for r in self.replies if r.error is None]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.replies if r.error is not None]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.ok)

    @property
    def tok_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.tokens / self.wall if self.wall else math.nan

    def samples(self, what: str) -> list[float]:
        """Every answered request's ``ttft`` or every gap between its chunks (``itl``), in seconds."""
        if what == "ttft":
            return [r.ttft for r in self.ok if r.ttft is not None]
        return [x for r in self.ok for x in r.itl]

    def pct(self, what: str, q: float) -> float:
        """The ``q`` quantile of ``samples(what)`` (interpolated: 0.5 is the median), in
        milliseconds; NaN where there are none. No numpy here: the in-process diagnostics load
        libllama before it."""
        xs = sorted(self.samples(what))
        if not xs:
            return math.nan
        pos = q * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return (xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)) * 1e3

    def speculative(self) -> tuple[int, int]:
        """(drafted, accepted) tokens, from usage.speculative where a server reports it."""
        spec = [(r.usage or {}).get("speculative") or {} for r in self.ok]
        return sum(s.get("drafted_tokens", 0) for s in spec), sum(s.get("accepted_tokens", 0) for s in spec)

    def line(self) -> str:
        """tokens/s, TTFT and ITL p50 and p99, tokens, errors: one line."""
        errors = f", {len(self.errors)} errors" if self.errors else ""
        return (f"{self.tok_s:8.1f} tok/s  TTFT p50 {self.pct('ttft', 0.5):7.1f} p99 {self.pct('ttft', 0.99):7.1f} ms"
                f"  ITL p50 {self.pct('itl', 0.5):6.2f} p99 {self.pct('itl', 0.99):6.2f} ms  "
                f"({self.tokens} tokens{errors})")  # fmt: skip


async def load(
    base: str, concurrency: int, requests: int, max_tokens: int, prompts: Sequence[str] = PROMPTS,
    tag: str | None = None, extra: dict[str, Any] | None = None, first: int = 0, warm_up: bool = True,
) -> Load:  # fmt: skip
    """``requests`` streamed chats from ``prompts`` (cycling, from the ``first``-th),
    ``concurrency`` at a time, after one short uncounted request (``warm_up``). With a
    ``tag``, each prompt starts with it and its index, so no server answers from a cache of
    an earlier run's prompts (llama-server keeps whole prompts in host memory); only the
    chat template's own preamble is shared, as between real users."""
    out = Load()
    sem = asyncio.Semaphore(concurrency)
    # No keep-alive: llama-server closes streamed connections that a pool would reuse.
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        if warm_up:
            await stream(client, base, chat(PROMPTS[0], 8))

        async def guarded(i: int) -> None:
            prompt = prompts[(first + i) % len(prompts)]
            async with sem:
                body = chat(prompt if tag is None else f"[{tag}-{i}] {prompt}", max_tokens, **(extra or {}))
                out.replies.append(await stream(client, base, body))

        t0 = time.perf_counter()
        await asyncio.gather(*(guarded(i) for i in range(requests)))
        out.wall = time.perf_counter() - t0
    return out


def run_load(base: str, concurrency: int, requests: int, max_tokens: int, **kw: Any) -> Load:
    """``load`` from synchronous code."""
    return asyncio.run(load(base, concurrency, requests, max_tokens, **kw))


def abba(names: list[str], turn: int) -> list[str]:
    """The order in which ``names`` take ``turn``: as given on even turns, reversed on odd
    ones (A B, B A, A B, ...), so drift slower than a turn falls on all of them alike."""
    return names if turn % 2 == 0 else names[::-1]
