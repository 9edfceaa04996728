"""A reply's pieces (choice.Delta) into what the client receives: one choice whole
(``collect``, then ``Collected.choice`` for the body) or the SSE chunks of a stream
(``sse_stream``), with the logprobs of each."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from strata_core.api import bodies
from strata_core.api.metrics import Counter
from strata_core.client.reader import EngineUnavailable
from strata_core.contract.events import Usage
from strata_core.schema.errors import ApiError, internal_error
from strata_core.text.choice import Delta, joined
from strata_core.text.logprobs import Entry
from strata_core.text.structured import Constraint, reconcile_choice
from strata_core.text.tools import ToolCall

log = logging.getLogger("strata.api")


def timed_out(timeout: float | None) -> ApiError:
    return ApiError(504, f"the request ran longer than {timeout} s and was cancelled (the operator's "
                    "[server] request_timeout)", type="server_error", code="timeout")  # fmt: skip


@dataclass
class Collected:
    """One choice, whole."""

    text: str
    finish: str
    usage: Usage
    entries: list[Entry] | None  # None: logprobs were not asked for
    reasoning: str = ""
    reasoning_entries: list[Entry] | None = None
    tool_calls: list[ToolCall] | None = None
    stop_sequence: str | None = None  # the stop string that ended it, if one did

    def choice(self, index: int, chat: bool) -> bodies.Choice:
        lp = logprobs_body(self.entries, chat, reasoning=self.reasoning_entries)
        return bodies.Choice(index, self.text, self.finish, lp, self.reasoning, self.tool_calls)


async def collect(it: AsyncIterator[Delta]) -> Collected:
    """A non-streamed choice: its pieces joined."""
    whole = Delta("")  # text, reasoning and entries so far
    async for d in it:
        whole.text += d.text
        whole.reasoning += d.reasoning
        whole.entries = joined(whole.entries, d.entries)
        whole.reasoning_entries = joined(whole.reasoning_entries, d.reasoning_entries)
        if d.finish is not None:
            return Collected(
                whole.text, d.finish, d.usage or Usage(), whole.entries,
                whole.reasoning, whole.reasoning_entries or None, d.tool_calls, d.stop_sequence,
            )  # fmt: skip
    raise EngineUnavailable("the engine ended the request without DONE")


def reconciled(r: Collected, constraint: Constraint) -> Collected:
    """A structured choice as returned: structured.reconcile_choice's content and entries."""
    text, entries = reconcile_choice(r.text, r.entries, constraint.schema)
    return dataclasses.replace(r, text=text, entries=entries)


def logprobs_body(
    entries: list[Entry] | None,
    chat: bool,
    offset: int = 0,
    reasoning: list[Entry] | None = None,
) -> dict[str, Any] | None:
    if entries is None:
        return None
    if chat:
        return bodies.chat_logprobs(entries, reasoning)
    return bodies.completion_logprobs(entries, offset)


def chat_parts(d: Delta) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """A streamed piece as chat deltas with their logprobs: the reasoning first, then the
    content and tool calls (the last part takes the finish reason)."""
    parts: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    if d.reasoning or d.reasoning_entries:
        lp = None if d.entries is None else bodies.chat_logprobs([], d.reasoning_entries)
        parts.append(({"reasoning_content": d.reasoning} if d.reasoning else {}, lp))
    delta: dict[str, Any] = {}
    if d.text:
        delta["content"] = d.text
    if d.calls:
        delta["tool_calls"] = [c.body() for c in d.calls]
    if delta or d.entries or d.finish is not None or not parts:
        parts.append((delta, logprobs_body(d.entries, True)))
    return parts


async def sse_stream(
    rid: str,
    model: str,
    iters: list[AsyncIterator[Delta]],
    chat: bool,
    include_usage: bool,
    prompts: list[list[int]],
    n: int,
    timeout: float | None = None,
    bugs: Counter | None = None,
) -> AsyncIterator[bytes]:
    """The SSE chunks of a streamed reply: each choice's pieces as they come (a chat's role
    chunk first), an error chunk if the engine fails, a choice fails otherwise (``bugs``
    counts those) or ``timeout`` seconds pass, the usage chunk when asked for, then
    ``[DONE]``."""
    created = bodies.now()
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()
    # One timer for the whole stream puts the timeout in the queue (a wait_for around each
    # get cost a task per token on Python < 3.12).
    timer = None if timeout is None else asyncio.get_running_loop().call_later(
        timeout, queue.put_nowait, (-1, timed_out(timeout)))  # fmt: skip

    async def pump(i: int, it: AsyncIterator[Delta]) -> None:
        try:
            async for d in it:
                await queue.put((i, d))
            await queue.put((i, None))
        except BaseException as exc:  # noqa: BLE001 - delivered to the stream
            await queue.put((i, exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iters)]
    usage = Usage(prompt=sum(len(p) for p in prompts))
    open_choices = len(iters)
    offsets = [0] * len(iters)  # where each choice's next entry starts in its text
    try:
        if chat:
            for i in range(len(iters)):
                yield bodies.sse(bodies.chat_chunk(rid, model, created, i, {"role": "assistant", "content": ""}, None))
        while open_choices:
            i, item = await queue.get()
            if item is None:
                open_choices -= 1
                continue
            if isinstance(item, BaseException):
                yield bodies.sse(stream_error(item, bugs).body())
                yield bodies.sse("[DONE]")
                return
            if item.usage is not None:
                usage.add_choice(item.usage, first_of_prompt=i % n == 0)
            if chat:
                parts = chat_parts(item)
                for k, (delta, lp) in enumerate(parts):
                    finish = item.finish if k == len(parts) - 1 else None
                    yield bodies.sse(bodies.chat_chunk(rid, model, created, i, delta, finish, lp))
            elif item.text or item.finish or item.entries:
                lp = logprobs_body(item.entries, chat, offsets[i])
                offsets[i] += sum(len(e.token) for e in item.entries or ())
                yield bodies.sse(
                    bodies.completion_chunk(rid, model, created, i, item.text, item.finish, lp)
                )
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            yield bodies.sse(bodies.usage_chunk(rid, model, created, obj, usage))
        yield bodies.sse("[DONE]")
    finally:
        if timer is not None:
            timer.cancel()
        for t in tasks:
            t.cancel()


def stream_error(exc: BaseException, bugs: Counter | None) -> ApiError:
    """The error event that ends a stream: what the engine or a limit said, else a bug's 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, EngineUnavailable):
        msg = str(exc) or type(exc).__name__
        return ApiError(503, f"the engine failed: {msg}", type="server_error", code="engine_unavailable")
    if bugs is not None:
        bugs.inc()
    log.error("internal error in a stream", exc_info=exc)
    return internal_error(exc)
