"""OpenAI's ``/v1/chat/completions`` and ``/v1/completions`` over the shared request path
(service.py): request -> prompts and engine options -> choices -> one body or SSE chunks
(bodies.py, stream.py)."""

from __future__ import annotations

import asyncio
from typing import cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from strata_core.api import bodies, openapi
from strata_core.api.infill import fim_prompt
from strata_core.api.service import (
    Names,
    Run,
    Service,
    engine_unavailable,
    json_body,
    service_for,
    until_done,
)
from strata_core.api.stream import collect, reconciled, sse_stream
from strata_core.client.reader import EngineUnavailable
from strata_core.contract.events import Usage
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import BaseRequest, ChatRequest, CompletionRequest, parse_request
from strata_core.text.detokenize import decode

router = APIRouter()


@router.post("/v1/chat/completions", **openapi.route(ChatRequest, "a chat completion"))
async def chat_completions(request: Request) -> Response:
    req = parse_request(ChatRequest, await json_body(request))
    service = await service_for(request, req.model)
    service.ready()
    with service.admission(req.n):
        prompt, shape = await service.chat_prompt(req)
    tool_grammar = await service.tool_grammar(req, shape, "response_format")
    run = await service.start_run(req, [prompt], Names("messages"), shape, tool_grammar)
    return await respond(service, request, req, run, [prompt])


@router.post("/v1/completions", **openapi.route(CompletionRequest, "a completion"))
async def completions(request: Request) -> Response:
    req = parse_request(CompletionRequest, await json_body(request))
    service = await service_for(request, req.model)
    service.ready()
    p = req.prompt
    texts: list[str] | None = None
    if isinstance(p, str):
        texts = [p]
    elif isinstance(p[0], str):
        texts = cast(list[str], p)
    many = isinstance(p, list) and isinstance(p[0], (str, list))
    if req.suffix and texts is None:
        raise ApiError(400, "suffix goes with a text prompt (the text before the insertion point), not token ids",
                       param="suffix", code="invalid_value")  # fmt: skip
    with service.admission(req.n * (len(p) if many else 1)):
        if texts is not None and req.suffix:
            prompts = [await fim_prompt(service, s, req.suffix, "suffix") for s in texts]
        elif texts is not None:
            prompts = [await service.tokenize(s) for s in texts]
        elif isinstance(p[0], list):
            prompts = [list(x) for x in cast(list[list[int]], p)]
        else:
            prompts = [list(cast(list[int], p))]
    for ids in prompts:
        service.check_token_ids(ids, "prompt")
    echoes = None
    if req.echo:  # the prompt as sent; token ids as their text
        echoes = texts if texts is not None else [decode(service.pieces, ids) for ids in prompts]
    run = await service.start_run(req, prompts, Names("prompt"), echoes=echoes)
    return await respond(service, request, req, run, prompts, echoed=echoes is not None)


async def respond(
    service: Service, request: Request, req: BaseRequest, run: Run, prompts: list[list[int]], echoed: bool = False
) -> Response:
    """Answer with every choice of ``run`` (``n`` per prompt): a chat for a chat request,
    else a completion."""
    chat = isinstance(req, ChatRequest)
    rid = bodies.new_id("chatcmpl" if chat else "cmpl")
    iters, seed, constraint = run.choices, run.seed, run.constraint
    headers = {"x-strata-seed": str(seed)}
    timeout = service.config.server.request_timeout or None
    # an adapter named as the model answers by its own name, as vLLM's do
    model = req.model if req.model and req.lora is None and service.adapters.id_of(req.model) is not None else service.model_id
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        stream = sse_stream(rid, model, iters, chat, include_usage, prompts, req.n,
                            timeout=timeout, bugs=service.metrics.internal_errors)  # fmt: skip
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
    try:
        results = await until_done(request, asyncio.gather(*(collect(i) for i in iters)), timeout)
    except EngineUnavailable as exc:
        raise engine_unavailable(exc) from None
    usage = Usage(prompt=sum(len(p) for p in prompts))
    for i, r in enumerate(results):
        usage.add_choice(r.usage, first_of_prompt=i % req.n == 0)
    if constraint is not None and not echoed:  # an echoed prompt is not part of the value
        results = [reconciled(r, constraint) for r in results]
    choices = [r.choice(i, chat) for i, r in enumerate(results)]
    build = bodies.chat_response if chat else bodies.completion_response
    return JSONResponse(build(rid, model, choices, usage, seed), headers=headers)

