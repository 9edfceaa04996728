"""Assemble OpenAI response bodies and SSE chunks from finished or streaming choices."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class Usage:
    prompt: int = 0
    completion: int = 0
    cached: int = 0

    def body(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


@dataclass
class Choice:
    index: int
    text: str
    finish_reason: str


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
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None,
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
            {"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
            for c in choices
        ],
        "usage": usage.body(),
        "seed": seed,
    }


def chat_chunk(
    rid: str, model: str, created: int, index: int, delta: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def completion_chunk(
    rid: str, model: str, created: int, index: int, text: str, finish: str | None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
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
