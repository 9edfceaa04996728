"""Assemble OpenAI response bodies and SSE chunks from finished or streaming choices."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strata_core.contract.events import Usage
from strata_core.text.logprobs import UNLIKELY, Entry
from strata_core.text.tools import ToolCall


def usage_body(u: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning},
    }
    if u.drafted:
        out["speculative"] = {"drafted_tokens": u.drafted, "accepted_tokens": u.accepted}
    return out


@dataclass
class Choice:
    index: int
    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None = None  # chat_logprobs / completion_logprobs, if asked
    reasoning: str = ""  # chat: the reasoning shown before the content
    tool_calls: list[ToolCall] | None = None  # chat: None when tool calls were not parsed

    def message(self) -> dict[str, Any]:
        """A chat choice's ``message``: content null when the reply is only tool calls."""
        out: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["content"] = self.text or None
            out["tool_calls"] = [c.body() for c in self.tool_calls]
        return out


def _json_lp(x: float) -> float:
    return x if math.isfinite(x) else UNLIKELY


def entry_body(e: Entry) -> dict[str, Any]:
    """One ``choices[i].logprobs.content`` entry of a chat choice."""
    return {
        "token": e.token,
        "logprob": _json_lp(e.logprob),
        "bytes": list(e.bytes),
        "top_logprobs": [
            {"token": a.token, "logprob": _json_lp(a.logprob), "bytes": list(a.bytes)}
            for a in e.top
        ],
    }


def chat_logprobs(
    entries: Sequence[Entry], reasoning: Sequence[Entry] | None = None
) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs``: one entry per token of the content, and
    (as vLLM and llama-server do) ``reasoning_content`` for the reasoning's tokens."""
    out: dict[str, Any] = {"content": [entry_body(e) for e in entries], "refusal": None}
    if reasoning:
        out["reasoning_content"] = [entry_body(e) for e in reasoning]
    return out


def completion_logprobs(entries: Sequence[Entry], text_offset0: int = 0) -> dict[str, Any]:
    """A completion choice's (or chunk's) legacy ``/v1/completions`` logprobs: four
    arrays of equal length.

    ``top_logprobs`` maps each alternative's token text to its logprob, at most the
    aligner's ``alternatives``; when two alternatives read the same (two pieces of one
    character both read U+FFFD) the more likely one keeps the key. ``text_offset`` is
    each token's character offset in the choice's text, from ``text_offset0`` (where the
    entries' text starts: the prompt's length with ``echo``); it does not decrease, and a
    token that completes no character has the offset of the next one.
    """
    offsets = []
    at = text_offset0
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    tops: list[dict[str, float]] = []
    for e in entries:
        top: dict[str, float] = {}
        for a in e.top:
            top.setdefault(a.token, _json_lp(a.logprob))
        tops.append(top)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [_json_lp(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def chat_response(
    rid: str, model: str, choices: list[Choice], usage: Usage, seed: int | None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": c.index,
                "message": c.message(),
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage_body(usage),
        "seed": seed,
    }


def completion_response(
    rid: str, model: str, choices: list[Choice], usage: Usage, seed: int | None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": now(),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {"index": c.index, "text": c.text, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
            for c in choices
        ],
        "usage": usage_body(usage),
        "seed": seed,
    }


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    index: int,
    delta: dict[str, Any],
    finish: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    index: int,
    text: str,
    finish: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }


def usage_chunk(rid: str, model: str, created: int, obj: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_body(usage),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def event_sse(kind: str, data: dict[str, Any]) -> bytes:
    """An SSE event that names its type (the Responses and Messages APIs' streams)."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
