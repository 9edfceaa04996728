"""Assemble OpenAI response bodies and SSE chunks from finished or streaming choices."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strata_core.logprobs import Entry, legacy
from strata_core.tools import ToolCall


@dataclass
class Usage:
    prompt: int = 0
    completion: int = 0
    cached: int = 0
    drafted: int = 0  # speculative tokens proposed / accepted (an extension)
    accepted: int = 0

    def add_choice(self, other: Usage, first_of_prompt: bool) -> None:
        """Fold one choice's usage in; its prompt's cache counts once per prompt."""
        self.completion += other.completion
        self.drafted += other.drafted
        self.accepted += other.accepted
        if first_of_prompt:
            self.cached += other.cached

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }
        if self.drafted:
            out["speculative"] = {"drafted_tokens": self.drafted, "accepted_tokens": self.accepted}
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


def chat_logprobs(
    entries: Sequence[Entry], reasoning: Sequence[Entry] | None = None
) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs``: one entry per token of the content, and
    (as vLLM and llama-server do) ``reasoning_content`` for the reasoning's tokens."""
    out: dict[str, Any] = {"content": [e.chat() for e in entries], "refusal": None}
    if reasoning:
        out["reasoning_content"] = [e.chat() for e in reasoning]
    return out


def completion_logprobs(entries: Sequence[Entry], text_offset0: int = 0) -> dict[str, Any]:
    """A completion choice's (or chunk's) legacy ``logprobs``; offsets count from
    ``text_offset0``, where the entries' text starts in the choice's text."""
    return legacy(entries, text_offset0)


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
        "usage": usage.body(),
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
        "usage": usage.body(),
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
        "usage": usage.body(),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
