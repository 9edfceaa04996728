"""OpenAI's Responses API over the shared chat path: ``POST /v1/responses`` (one body, or
the documented event stream), ``GET`` and ``DELETE /v1/responses/{id}`` for stored ones.

The request becomes a chat request (responses_input.py); its one choice's pieces become
blocks (blocks.py), and each block an output item: ``reasoning``, ``message`` (one
``output_text`` part) or ``function_call``. Stateless unless ``store: true``: then the
response and its conversation are kept in a bounded in-memory store ([responses]
store_size) that ``previous_response_id`` continues from.
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from strata_core.api import bodies, openapi
from strata_core.api.blocks import Block, Grew, Opened, blocks_of, stream_blocks
from strata_core.api.responses_input import ResponsesRequest, assistant_message
from strata_core.api.service import (
    ChatRun,
    Names,
    Service,
    engine_unavailable,
    json_body,
    service_for,
    until_done,
)
from strata_core.api.stream import collect, reconciled
from strata_core.client.reader import EngineUnavailable
from strata_core.contract.events import Usage
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import parse_request
from strata_core.text.choice import Delta
from strata_core.text.logprobs import Entry

router = APIRouter()


@dataclass
class Stored:
    body: dict[str, Any]
    conversation: list[dict[str, Any]]  # the chat messages, this response's output last


class ResponseStore:
    """Stored responses, at most ``size``; the oldest is dropped first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def history(self, req: ResponsesRequest) -> list[dict[str, Any]]:
        """The conversation ``req`` continues ([] when it starts one); 400 when it asks
        for a store this server does not keep, or names a response it does not hold."""
        for name in ("store", "previous_response_id"):
            if getattr(req, name) and not self.size:
                raise ApiError(400, f"'{name}' is not available: this server keeps no responses "
                               "([responses] store_size = 0); send the whole conversation as input",
                               param=name, code="unsupported_parameter")  # fmt: skip
        if req.previous_response_id is None:
            return []
        stored = self._items.get(req.previous_response_id)
        if stored is None:
            raise ApiError(400, f"previous response {req.previous_response_id!r} is not stored here "
                           f"(only responses created with store: true are kept, the last {self.size})",
                           param="previous_response_id", code="previous_response_not_found")  # fmt: skip
        return stored.conversation

    def put(self, rid: str, stored: Stored) -> None:
        self._items[rid] = stored
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, rid: str) -> Stored:
        stored = self._items.get(rid)
        if stored is None:
            raise ApiError(404, f"no stored response with id {rid!r}", param="response_id", code="not_found")
        return stored

    def delete(self, rid: str) -> None:
        self.get(rid)
        del self._items[rid]


def store_of(request: Request) -> ResponseStore:
    return request.app.state.responses  # type: ignore[no-any-return]


@dataclass
class Reply:
    """What every body of one response repeats: its id, request and creation time."""

    rid: str
    model: str
    req: ResponsesRequest
    created: int

    def body(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        effort = req.reasoning.effort if req.reasoning is not None else None
        choice = req.tool_choice
        return {
            "id": self.rid, "object": "response", "created_at": self.created, "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.model, "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": effort, "summary": None}, "store": bool(req.store),
            "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": choice.model_dump() if choice is not None and not isinstance(choice, str) else choice or "auto",
            "tools": [t.model_dump() for t in req.tools or ()], "truncation": "disabled",
            "usage": usage, "user": req.user, "metadata": req.metadata or {},
            "safety_identifier": req.safety_identifier, "prompt_cache_key": req.prompt_cache_key,
            "prompt_cache_retention": req.prompt_cache_retention, "top_logprobs": req.top_logprobs or 0,
            "max_tool_calls": req.max_tool_calls, "service_tier": "default",
        }  # fmt: skip

    def item_id(self, block: Block) -> str:
        prefix = {"reasoning": "rs", "text": "msg", "call": "fc"}[block.kind]
        return f"{prefix}_{self.rid.removeprefix('resp_')}{block.index:02d}"

    def item(self, block: Block, status: str, whole: bool = True) -> dict[str, Any]:
        """The output item of ``block``; ``whole`` False: as it is added, before its text."""
        text = block.text if whole else ""
        out: dict[str, Any] = {"id": self.item_id(block), "status": status}
        if block.kind == "reasoning":
            parts = [{"type": "reasoning_text", "text": text}] if whole else []
            return {"type": "reasoning", **out, "summary": [], "content": parts}
        if block.kind == "text":
            part = output_text(text, block.entries if whole else [])
            return {"type": "message", **out, "role": "assistant", "content": [part] if whole else []}
        return {"type": "function_call", **out, "call_id": block.call_id, "name": block.name, "arguments": text}


def output_text(text: str, entries: Sequence[Entry] = ()) -> dict[str, Any]:
    """An ``output_text`` part; ``entries``: its tokens' logprobs (include asked for them)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": [bodies.entry_body(e) for e in entries]}


def status_of(finish: str) -> str:
    return "incomplete" if finish == "length" else "completed"


def output_of(reply: Reply, blocks: list[Block], finish: str) -> list[dict[str, Any]]:
    """Every block's item; the last one is incomplete when max_output_tokens cut it."""
    return [reply.item(b, status_of(finish) if b is blocks[-1] else "completed") for b in blocks]


async def usage_body(service: Service, usage: Usage, reasoning: str) -> dict[str, Any]:
    # The engine does not tell reasoning tokens apart: the reasoning is tokenized again.
    thought = len(await service.engine.tokenize(reasoning, special=False)) if reasoning else 0
    return {
        "input_tokens": usage.prompt, "input_tokens_details": {"cached_tokens": usage.cached},
        "output_tokens": usage.completion, "output_tokens_details": {"reasoning_tokens": thought},
        "total_tokens": usage.prompt + usage.completion,
    }  # fmt: skip


def keep(store: ResponseStore, reply: Reply, conversation: list[dict[str, Any]], blocks: list[Block],
         body: dict[str, Any]) -> None:  # fmt: skip
    if not reply.req.store:
        return
    text = "".join(b.text for b in blocks if b.kind == "text")
    calls = [(b.call_id, b.name, b.text) for b in blocks if b.kind == "call"]
    store.put(reply.rid, Stored(body, [*conversation, assistant_message(text, calls)]))


@router.post("/v1/responses", **openapi.route(ResponsesRequest, "a response", {"type": "object", "required": ["id", "object", "status", "output"]}))
async def create_response(request: Request) -> Response:
    req = parse_request(ResponsesRequest, await json_body(request))
    service = await service_for(request, req.model)
    store = store_of(request)
    conversation = req.conversation(store.history(req))
    run = await service.start_chat(req.chat_request(conversation), Names("input", "max_output_tokens", "text.format"))
    reply = Reply(f"resp_{uuid.uuid4().hex}", service.model_id, req, bodies.now())
    headers = {"x-strata-seed": str(run.seed)}
    if req.stream:
        events = stream_events(service, store, reply, conversation, run)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    try:
        whole = await until_done(request, collect(run.pieces), service.config.server.request_timeout or None)
    except EngineUnavailable as exc:
        raise engine_unavailable(exc) from None
    if run.constraint is not None:
        whole = reconciled(whole, run.constraint)
    blocks = blocks_of(whole)
    body = reply.body(status_of(whole.finish), output_of(reply, blocks, whole.finish),
                      await usage_body(service, whole.usage, whole.reasoning))  # fmt: skip
    keep(store, reply, conversation, blocks, body)
    return JSONResponse(body, headers=headers)


async def stream_events(
    service: Service, store: ResponseStore, reply: Reply, conversation: list[dict[str, Any]], run: ChatRun
) -> AsyncIterator[bytes]:
    """The documented event sequence: ``response.created``, ``response.in_progress``, each
    item added, its part added, its deltas, its text done, its part done, the item done,
    then ``response.completed`` (``response.incomplete`` when cut by max_output_tokens;
    ``response.failed`` when the engine fails)."""
    seq = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        return bodies.event_sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

    yield event("response.created", response=reply.body("in_progress", []))
    yield event("response.in_progress", response=reply.body("in_progress", []))
    blocks: list[Block] = []
    last = Delta("")
    reasoning = ""
    try:
        async for ev in stream_blocks(run.pieces):
            if isinstance(ev, Delta):
                last = ev
            elif isinstance(ev, Opened):
                blocks.append(ev.block)
                for kind, fields in opened(reply, ev.block):
                    yield event(kind, **fields)
            elif isinstance(ev, Grew):
                reasoning += ev.text if ev.block.kind == "reasoning" else ""
                kind, fields = grew(reply, ev.block, ev.text, ev.entries)
                yield event(kind, **fields)
            else:
                status = status_of(last.finish) if last.finish else "completed"  # the end closes the last
                for kind, fields in closed(reply, ev.block, status):
                    yield event(kind, **fields)
    except EngineUnavailable as exc:
        error = {"code": "server_error", "message": f"the engine failed: {exc}"}
        yield event("response.failed", response=reply.body("failed", output_of(reply, blocks, "stop"), error=error))
        return
    finish = last.finish or "stop"
    usage = await usage_body(service, last.usage or Usage(), reasoning)
    body = reply.body(status_of(finish), output_of(reply, blocks, finish), usage)
    keep(store, reply, conversation, blocks, body)
    yield event(f"response.{status_of(finish)}", response=body)


Events = list[tuple[str, dict[str, Any]]]


def opened(reply: Reply, block: Block) -> Events:
    at = {"output_index": block.index}
    out: Events = [("response.output_item.added", {**at, "item": reply.item(block, "in_progress", whole=False)})]
    part = {"reasoning": {"type": "reasoning_text", "text": ""}, "text": output_text("")}.get(block.kind)
    if part is not None:
        out.append(("response.content_part.added", {**at, "item_id": reply.item_id(block), "content_index": 0,
                                                    "part": part}))  # fmt: skip
    return out


def grew(reply: Reply, block: Block, text: str, entries: Sequence[Entry] = ()) -> tuple[str, dict[str, Any]]:
    at = {"output_index": block.index, "item_id": reply.item_id(block)}
    if block.kind == "reasoning":
        return "response.reasoning_text.delta", {**at, "content_index": 0, "delta": text}
    if block.kind == "text":
        return "response.output_text.delta", {**at, "content_index": 0, "delta": text,
                                               "logprobs": [bodies.entry_body(e) for e in entries]}  # fmt: skip
    return "response.function_call_arguments.delta", {**at, "delta": text}


def closed(reply: Reply, block: Block, status: str) -> Events:
    at = {"output_index": block.index, "item_id": reply.item_id(block)}
    item = reply.item(block, status)
    out: Events = []
    if block.kind == "reasoning":
        out.append(("response.reasoning_text.done", {**at, "content_index": 0, "text": block.text}))
        out.append(("response.content_part.done", {**at, "content_index": 0, "part": item["content"][0]}))
    elif block.kind == "text":
        out.append(("response.output_text.done", {**at, "content_index": 0, "text": block.text,
                                                   "logprobs": item["content"][0]["logprobs"]}))  # fmt: skip
        out.append(("response.content_part.done", {**at, "content_index": 0, "part": item["content"][0]}))
    else:
        out.append(("response.function_call_arguments.done", {**at, "name": block.name, "arguments": block.text}))
    out.append(("response.output_item.done", {"output_index": block.index, "item": item}))
    return out


@router.get("/v1/responses/{response_id}", responses={404: openapi.REQUEST_ERRORS[404]})
async def get_response(request: Request, response_id: str) -> dict[str, Any]:
    return store_of(request).get(response_id).body


@router.delete("/v1/responses/{response_id}", responses={404: openapi.REQUEST_ERRORS[404]})
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    store_of(request).delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
