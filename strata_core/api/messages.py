"""Anthropic's Messages API over the shared chat path: ``POST /v1/messages`` (one message,
or its event stream) and ``POST /v1/messages/count_tokens``; errors on these routes are
Anthropic-shaped (``{"type": "error", "error": {"type", "message"}}``).

The request becomes a chat request (messages_input.py); its one choice's pieces become
blocks (blocks.py), and each block a content block: ``thinking``, ``text`` or
``tool_use``. Usage follows Anthropic's split: ``input_tokens`` are the prompt's tokens
that were not found cached, ``cache_read_input_tokens`` those that were.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from strata_core.api import bodies, openapi
from strata_core.api.blocks import Block, Grew, Opened, blocks_of, stream_blocks
from strata_core.api.messages_input import CountTokensRequest, MessagesRequest, arguments_object
from strata_core.api.service import (
    ChatRun,
    Names,
    engine_unavailable,
    json_body,
    service_for,
    until_done,
)
from strata_core.api.stream import collect
from strata_core.client.reader import EngineUnavailable
from strata_core.contract.events import Usage
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import parse_request
from strata_core.text.choice import Delta

router = APIRouter()

PREFIX = "/v1/messages"

#: Anthropic's error type for each status (any other 5xx is an api_error).
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


def owns(path: str) -> bool:
    """Whether ``path`` is one of this family's routes (its errors, its API key header)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_body(exc: ApiError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def stop_reason(finish: str, stop_sequence: str | None) -> str:
    if finish == "length":
        return "max_tokens"
    if finish == "tool_calls":
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt - usage.cached, "output_tokens": usage.completion,
        "cache_read_input_tokens": usage.cached, "cache_creation_input_tokens": 0,
    }  # fmt: skip


def content_block(block: Block, whole: bool = True) -> dict[str, Any]:
    """``block`` as a content block; ``whole`` False: as it starts, before its text."""
    text = block.text if whole else ""
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": text, "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": text}
    return {"type": "tool_use", "id": block.call_id, "name": block.name,
            "input": arguments_object(block.text) if whole else {}}  # fmt: skip


def message_body(mid: str, model: str, content: list[dict[str, Any]], stop: str | None,
                 stop_sequence: str | None, usage: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop, "stop_sequence": stop_sequence, "usage": usage}  # fmt: skip


@router.post(PREFIX, **openapi.route(MessagesRequest, "a message", {"type": "object", "required": ["id", "type", "role", "content", "stop_reason", "usage"]}, anthropic=True))
async def create_message(request: Request) -> Response:
    req = parse_request(MessagesRequest, await json_body(request))
    service = await service_for(request, req.model)
    run = await service.start_chat(req.chat_request(), Names("messages", "max_tokens"))
    mid = f"msg_{uuid.uuid4().hex}"
    headers = {"x-strata-seed": str(run.seed)}
    if req.stream:
        events = stream_events(mid, service.model_id, run)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    try:
        whole = await until_done(request, collect(run.pieces), service.config.server.request_timeout or None)
    except EngineUnavailable as exc:
        raise engine_unavailable(exc) from None
    content = [content_block(b) for b in blocks_of(whole)]
    stop = stop_reason(whole.finish, whole.stop_sequence)
    body = message_body(mid, service.model_id, content, stop, whole.stop_sequence, usage_body(whole.usage))
    return JSONResponse(body, headers=headers)


@router.post(PREFIX + "/count_tokens", **openapi.route(CountTokensRequest, "a token count", {"type": "object", "required": ["input_tokens"]}, stream=False, anthropic=True))
async def count_tokens(request: Request) -> dict[str, int]:
    req = parse_request(CountTokensRequest, await json_body(request))
    service = await service_for(request, req.model)
    service.ready()
    prompt, _ = await service.chat_prompt(req.chat_request())
    return {"input_tokens": len(prompt)}


async def stream_events(mid: str, model: str, run: ChatRun) -> AsyncIterator[bytes]:
    """``message_start``, a ``ping``, each content block's ``content_block_start``, deltas
    and ``content_block_stop``, then ``message_delta`` (stop reason, usage) and
    ``message_stop``; an ``error`` event when the engine fails."""

    def event(kind: str, **fields: Any) -> bytes:
        return bodies.event_sse(kind, {"type": kind, **fields})

    start_usage = {"input_tokens": run.prompt_tokens, "output_tokens": 0}
    yield event("message_start", message=message_body(mid, model, [], None, None, start_usage))
    yield event("ping")
    last = Delta("")
    try:
        async for ev in stream_blocks(run.pieces):
            if isinstance(ev, Delta):
                last = ev
            elif isinstance(ev, Opened):
                yield event("content_block_start", index=ev.block.index, content_block=content_block(ev.block, False))
            elif isinstance(ev, Grew):
                yield event("content_block_delta", index=ev.block.index, delta=block_delta(ev.block, ev.text))
            else:
                yield event("content_block_stop", index=ev.block.index)
    except EngineUnavailable as exc:
        yield event("error", error={"type": "overloaded_error", "message": f"the engine failed: {exc}"})
        return
    stop = stop_reason(last.finish or "stop", last.stop_sequence)
    delta = {"stop_reason": stop, "stop_sequence": last.stop_sequence}
    yield event("message_delta", delta=delta, usage=usage_body(last.usage or Usage()))
    yield event("message_stop")


def block_delta(block: Block, text: str) -> dict[str, Any]:
    if block.kind == "reasoning":
        return {"type": "thinking_delta", "thinking": text}
    if block.kind == "text":
        return {"type": "text_delta", "text": text}
    return {"type": "input_json_delta", "partial_json": text}
