"""The soak's request mix (bench.soak): each kind sends one request (two for a seeded
replay) and judges what came back as one Outcome.

Non-streamed requests go through the official openai client; streamed ones through
httpx, reading the SSE lines directly, because the SDK ends a stream that stops without
``[DONE]`` silently, and that is one of the things the soak looks for.

Verdicts: ``ok`` (a whole answer that passes its kind's checks), ``invalid`` (a whole
answer that does not), ``failed`` (an OpenAI-shaped error, ``{"error": {"message",
"type", "code", ...}}``, as the status or as an event of a stream), ``cancelled`` (the
client gave up on purpose) and ``lost`` (anything else: an error body that is not
OpenAI-shaped, a stream that ended without ``[DONE]`` or an error event, a dropped
connection, a timeout the client did not ask for). Which failures are expected (503
``engine_unavailable`` while the engine restarts) is for the soak to decide: it knows
when it killed the engine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
import openai

OK, INVALID, FAILED, CANCELLED, LOST = "ok", "invalid", "failed", "cancelled", "lost"
SSE = 200  # the status of a failure that arrived as an error event inside a stream


@dataclass
class Outcome:
    kind: str
    verdict: str
    detail: str = ""
    status: int | None = None  # HTTP status of a failure (SSE: an error event in a stream)
    code: str | None = None  # the error's code
    latency: float = 0.0  # seconds from sending to the verdict
    at: float = 0.0  # time.monotonic() at the verdict


@dataclass
class Ctx:
    base: str
    http: httpx.AsyncClient
    sdk: openai.AsyncOpenAI


@dataclass
class Expect:
    """What a whole answer must satisfy."""

    n: int = 1
    max_tokens: int = 16
    stops: tuple[str, ...] = ()
    top: int | None = None  # logprob alternatives asked for (None: no logprobs)
    schema: dict[str, Any] | None = None  # json_schema the content must validate against


@dataclass
class Choice:
    """One choice of an answer, as received (whole, or assembled from a stream)."""

    text: str = ""
    finish: str | None = None
    spelled: str | None = None  # the text the logprob entries spell; None: no logprobs
    alternatives: list[int] = field(default_factory=list)  # alternatives per entry


def problem(expect: Expect, choices: dict[int, Choice], completion_tokens: int | None) -> str | None:
    """What is wrong with a whole answer, or None."""
    if sorted(choices) != list(range(expect.n)):
        return f"choices {sorted(choices)} for n={expect.n}"
    for i, c in choices.items():
        if c.finish not in ("stop", "length"):
            return f"choice {i}: finish_reason {c.finish!r}"
        hit = next((s for s in expect.stops if s in c.text), None)
        if hit is not None:
            return f"choice {i}: stop string {hit!r} in {c.text!r}"
        if expect.top is not None:
            if c.spelled is None:
                return f"choice {i}: no logprobs"
            if c.spelled != c.text:
                return f"choice {i}: logprobs spell {c.spelled!r}, content is {c.text!r}"
            if any(not 1 <= a <= expect.top for a in c.alternatives):
                return f"choice {i}: alternatives per entry {c.alternatives}, asked for {expect.top}"
        if expect.schema is not None and c.finish == "stop":
            try:
                jsonschema.validate(json.loads(c.text), expect.schema)
            except (ValueError, jsonschema.ValidationError) as exc:
                return f"choice {i}: {c.text!r} is not valid under the schema: {str(exc)[:200]}"
    if completion_tokens is None:
        return "no usage"
    if completion_tokens > expect.n * expect.max_tokens:
        return f"{completion_tokens} completion tokens, at most {expect.n * expect.max_tokens} asked for"
    return None


def openai_error(obj: Any) -> tuple[str | None, str] | None:
    """(code, message) of an OpenAI-shaped error body, else None."""
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return None
    if not isinstance(err.get("type"), str) or "code" not in err:
        return None
    return err["code"], err["message"]


def error_reply(kind: str, status: int, body: bytes) -> Outcome:
    """A reply whose status is not 200: failed if its body is an OpenAI error, else lost."""
    try:
        shaped = openai_error(json.loads(body))
    except ValueError:
        shaped = None
    if shaped is None:
        return Outcome(kind, LOST, f"HTTP {status}, a body that is not an OpenAI error: {body[:200]!r}", status)
    return Outcome(kind, FAILED, shaped[1], status, shaped[0])


# ---- the two ways a request travels ------------------------------------------------------


async def via_sdk(
    kind: str, call: Awaitable[Any], expect: Expect, cancel_on_timeout: bool = False
) -> tuple[Outcome, Any]:
    """A non-streamed request through the openai client: its outcome, and the reply."""
    try:
        reply = await call
    except openai.APITimeoutError:
        if cancel_on_timeout:
            return Outcome(kind, CANCELLED, "the client's timeout"), None
        return Outcome(kind, LOST, "no reply within the client's timeout"), None
    except openai.APIStatusError as exc:
        return error_reply(kind, exc.status_code, exc.response.content), None
    except (openai.APIError, ValueError) as exc:  # a dropped connection, a body that is not JSON
        return Outcome(kind, LOST, f"{type(exc).__name__}: {exc}"), None
    choices = sdk_choices(reply)
    usage = reply.usage.completion_tokens if reply.usage is not None else None
    bad = problem(expect, choices, usage)
    return (Outcome(kind, INVALID, bad) if bad else Outcome(kind, OK)), reply


def sdk_choices(reply: Any) -> dict[int, Choice]:
    out = {}
    for c in reply.choices:
        if hasattr(c, "message"):  # a chat completion
            got = Choice(c.message.content or "", c.finish_reason)
            if c.logprobs is not None and c.logprobs.content is not None:
                got.spelled = b"".join(bytes(e.bytes or []) for e in c.logprobs.content).decode("utf-8", "replace")
                got.alternatives = [len(e.top_logprobs) for e in c.logprobs.content]
        else:
            got = Choice(c.text, c.finish_reason)
            if c.logprobs is not None and c.logprobs.tokens is not None:
                got.spelled = "".join(c.logprobs.tokens)
                got.alternatives = [len(t) for t in c.logprobs.top_logprobs or []]
        out[c.index] = got
    return out


async def via_sse(
    ctx: Ctx, kind: str, path: str, body: dict[str, Any], expect: Expect, close_after: int | None = None
) -> Outcome:
    """A streamed request through httpx; with ``close_after``, the client closes the stream
    after that many chunks (a cancellation)."""
    events: list[dict[str, Any]] = []
    error: Any = None
    done = False
    try:
        async with ctx.http.stream("POST", ctx.base + path, json={**body, "stream": True}) as r:
            if r.status_code != 200:
                return error_reply(kind, r.status_code, await r.aread())
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    ev = json.loads(data)
                except ValueError:
                    return Outcome(kind, LOST, f"an SSE event that is not JSON: {data[:200]!r}")
                if isinstance(ev, dict) and "error" in ev:
                    error = ev
                    continue
                events.append(ev)
                if close_after is not None and len(events) >= close_after:
                    return Outcome(kind, CANCELLED, f"closed after {close_after} chunks")
    except httpx.TimeoutException:
        return Outcome(kind, LOST, f"the stream stalled past the client's timeout after {len(events)} chunks")
    except httpx.HTTPError as exc:
        return Outcome(kind, LOST, f"{type(exc).__name__} after {len(events)} chunks: {exc}")
    if error is not None:
        shaped = openai_error(error)
        if shaped is None:
            return Outcome(kind, LOST, f"an error event that is not an OpenAI error: {error!r:.200}")
        return Outcome(kind, FAILED, shaped[1], SSE, shaped[0])
    if not done:
        return Outcome(kind, LOST, f"the stream ended without [DONE] or an error, after {len(events)} chunks")
    try:
        choices, usage = sse_choices(events)
    except (KeyError, TypeError, AttributeError) as exc:
        return Outcome(kind, INVALID, f"a malformed chunk: {exc!r}")
    bad = problem(expect, choices, usage)
    return Outcome(kind, INVALID, bad) if bad else Outcome(kind, OK)


def sse_choices(events: list[dict[str, Any]]) -> tuple[dict[int, Choice], int | None]:
    """The choices a stream's chunks assemble, and the usage chunk's completion tokens."""
    out: dict[int, Choice] = {}
    usage = None
    spelled: dict[int, list[bytes]] = {}
    for ev in events:
        if ev.get("usage"):
            usage = ev["usage"]["completion_tokens"]
        for c in ev["choices"]:
            got = out.setdefault(c["index"], Choice())
            if "delta" in c:  # chat
                got.text += c["delta"].get("content") or ""
                entries = (c.get("logprobs") or {}).get("content")
                if entries is not None:
                    spelled.setdefault(c["index"], []).extend(bytes(e["bytes"] or []) for e in entries)
                    got.alternatives += [len(e["top_logprobs"]) for e in entries]
            else:
                got.text += c["text"]
                lp = c.get("logprobs")
                if lp is not None:
                    got.spelled = (got.spelled or "") + "".join(lp["tokens"])
                    got.alternatives += [len(t) for t in lp["top_logprobs"]]
            if c.get("finish_reason") is not None:
                if got.finish is not None:
                    raise KeyError(f"choice {c['index']} finished twice")
                got.finish = c["finish_reason"]
    for i, parts in spelled.items():
        out[i].spelled = b"".join(parts).decode("utf-8", "replace")
    return out, usage


# ---- the kinds -----------------------------------------------------------------------------

CHAT_PROMPTS = [
    "Write two sentences about the sea.",
    "Name five fruits, separated by commas.",
    "Explain what a compiler does, briefly.",
    "Count from 1 to 30.",
    "Tell me a short joke about cats.",
    "What is the capital of Italy? Answer in one sentence.",
]
TEXT_PROMPTS = ["The capital of France is", "Once upon a time, in a quiet village,", "def fibonacci(n):",
                "A list of colours: red, green,", "The three laws of motion are"]  # fmt: skip
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "population": {"type": "integer"},
        "coastal": {"type": "boolean"},
    },
    "required": ["city", "population", "coastal"],
    "additionalProperties": False,
}
CITY_PROMPT = "Describe a city as JSON with its name, population and whether it lies on the coast."


def chat_prompt(rng: random.Random) -> str:
    """One of a few prompts, half of them tagged with a number: some prompts repeat
    (cached prefixes are reused), some are new."""
    p = rng.choice(CHAT_PROMPTS)
    return f"(note {rng.randrange(10**6)}) {p}" if rng.random() < 0.5 else p


async def chat(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(max_tokens=rng.randint(8, 32))
    call = ctx.sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": chat_prompt(rng)}],
        max_tokens=e.max_tokens, temperature=rng.choice([0.0, 0.8]),
    )  # fmt: skip
    return (await via_sdk("chat", call, e))[0]


async def chat_stream(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(max_tokens=rng.randint(8, 32))
    body = {"model": "default", "messages": [{"role": "user", "content": chat_prompt(rng)}],
            "max_tokens": e.max_tokens, "temperature": rng.choice([0.0, 0.8]),
            "stream_options": {"include_usage": True}}  # fmt: skip
    return await via_sse(ctx, "chat-stream", "/v1/chat/completions", body, e)


async def chat_logprobs(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(max_tokens=rng.randint(8, 24), top=2)
    call = ctx.sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": chat_prompt(rng)}],
        max_tokens=e.max_tokens, logprobs=True, top_logprobs=2,
    )  # fmt: skip
    return (await via_sdk("chat-logprobs", call, e))[0]


async def chat_json(ctx: Ctx, rng: random.Random) -> Outcome:
    """json_schema (strict), streamed or not; a finished answer must validate."""
    e = Expect(max_tokens=64, schema=CITY)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    if rng.random() < 0.5:
        body = {"model": "default", "messages": [{"role": "user", "content": CITY_PROMPT}], "max_tokens": e.max_tokens, "response_format": fmt,
                "stream_options": {"include_usage": True}}  # fmt: skip
        return await via_sse(ctx, "chat-json", "/v1/chat/completions", body, e)
    call = ctx.sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": CITY_PROMPT}],
        max_tokens=e.max_tokens, response_format=fmt,
    )  # fmt: skip
    return (await via_sdk("chat-json", call, e))[0]


async def chat_stop(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(max_tokens=32, stops=(",", "."))
    call = ctx.sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Name five fruits, separated by commas."}],
        max_tokens=e.max_tokens, stop=list(e.stops), temperature=rng.choice([0.0, 0.8]),
    )  # fmt: skip
    return (await via_sdk("chat-stop", call, e))[0]


async def chat_stream_n2(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(n=2, max_tokens=rng.randint(8, 24), top=1)
    body = {"model": "default", "messages": [{"role": "user", "content": chat_prompt(rng)}], "n": 2,
            "max_tokens": e.max_tokens, "temperature": 0.8, "logprobs": True, "top_logprobs": 1,
            "stream_options": {"include_usage": True}}  # fmt: skip
    return await via_sse(ctx, "chat-stream-n2", "/v1/chat/completions", body, e)


async def completion_logprobs(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(max_tokens=rng.randint(8, 24), top=3)
    call = ctx.sdk.completions.create(
        model="default", prompt=rng.choice(TEXT_PROMPTS), max_tokens=e.max_tokens, logprobs=3,
    )  # fmt: skip
    return (await via_sdk("completion-logprobs", call, e))[0]


async def completion_stream_stop(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(max_tokens=rng.randint(8, 32), stops=("\n", "."))
    body = {"model": "default", "prompt": rng.choice(TEXT_PROMPTS), "max_tokens": e.max_tokens,
            "stop": list(e.stops), "temperature": 0.8, "stream_options": {"include_usage": True}}  # fmt: skip
    return await via_sse(ctx, "completion-stream-stop", "/v1/completions", body, e)


async def completion_n2(ctx: Ctx, rng: random.Random) -> Outcome:
    e = Expect(n=2, max_tokens=rng.randint(8, 24))
    call = ctx.sdk.completions.create(
        model="default", prompt=rng.choice(TEXT_PROMPTS), max_tokens=e.max_tokens, n=2, temperature=0.8,
    )  # fmt: skip
    return (await via_sdk("completion-n2", call, e))[0]


async def cancel_stream(ctx: Ctx, rng: random.Random) -> Outcome:
    """A long stream the client closes after a few chunks."""
    body = {"model": "default", "messages": [{"role": "user", "content": chat_prompt(rng)}], "max_tokens": 96,
            "stream_options": {"include_usage": True}}  # fmt: skip
    return await via_sse(ctx, "cancel-stream", "/v1/chat/completions", body, Expect(max_tokens=96),
                         close_after=rng.randint(2, 5))  # fmt: skip


async def cancel_timeout(ctx: Ctx, rng: random.Random) -> Outcome:
    """A long non-streamed request the client gives up on after a short timeout (if the
    answer comes first, it is judged as any other)."""
    e = Expect(max_tokens=96)
    call = ctx.sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": chat_prompt(rng)}],
        max_tokens=e.max_tokens, timeout=rng.uniform(0.3, 1.5),
    )  # fmt: skip
    return (await via_sdk("cancel-timeout", call, e, cancel_on_timeout=True))[0]


async def seed_replay(ctx: Ctx, rng: random.Random) -> Outcome:
    """A sampled request that names a seed, sent twice: it must replay token for token,
    whatever runs beside it (README: exact_seed_replay)."""
    e = Expect(max_tokens=16)
    seed, prompt = rng.randrange(2**31), chat_prompt(rng)
    texts = []
    for _ in range(2):
        call = ctx.sdk.chat.completions.create(
            model="default", messages=[{"role": "user", "content": prompt}],
            max_tokens=e.max_tokens, temperature=1.0, seed=seed,
        )  # fmt: skip
        out, reply = await via_sdk("seed-replay", call, e)
        if out.verdict != OK:
            return out
        texts.append(reply.choices[0].message.content)
    if texts[0] != texts[1]:
        return Outcome("seed-replay", INVALID, f"seed {seed} replayed {texts[1]!r}, first {texts[0]!r}")
    return Outcome("seed-replay", OK)


Kind = Callable[[Ctx, random.Random], Awaitable[Outcome]]
#: name: (kind, weight in the mix)
KINDS: dict[str, tuple[Kind, int]] = {
    "chat": (chat, 3),
    "chat-stream": (chat_stream, 3),
    "chat-logprobs": (chat_logprobs, 2),
    "chat-json": (chat_json, 2),
    "chat-stop": (chat_stop, 1),
    "chat-stream-n2": (chat_stream_n2, 1),
    "completion-logprobs": (completion_logprobs, 2),
    "completion-stream-stop": (completion_stream_stop, 2),
    "completion-n2": (completion_n2, 1),
    "cancel-stream": (cancel_stream, 2),
    "cancel-timeout": (cancel_timeout, 1),
    "seed-replay": (seed_replay, 1),
}
