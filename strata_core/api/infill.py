"""Code infill for editors: llama-server's ``POST /infill`` in its shapes (what llama.vim
and llama.vscode call), and the prompt that OpenAI's ``suffix`` on ``/v1/completions`` and
Ollama's on ``/api/generate`` make: the text around the cursor between the model's FIM
tokens (text/infill.py's layout, llama-server's). A model without FIM tokens is refused
with a 400 naming the field that asked for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field, create_model

from strata_core.api import openapi
from strata_core.api.service import (
    Names,
    Service,
    engine_unavailable,
    json_body,
    service_for,
    until_done,
)
from strata_core.api.stream import Collected, collect
from strata_core.client.reader import EngineUnavailable
from strata_core.contract.events import Usage
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import CompletionRequest, Strict, parse_request
from strata_core.text.choice import Delta
from strata_core.text.infill import (
    CHUNK_SEPARATOR,
    FILE_NAME,
    REPO_NAME,
    FimTokens,
    Pieces,
    infill_prompt,
)

router = APIRouter()

#: the reply's outline (llama-server's completion object), for the OpenAPI document
REPLY = {"type": "object", "required": ["content", "stop", "tokens_predicted", "tokens_evaluated"]}


class ExtraFile(Strict):
    filename: str = "tmp"
    text: str


#: the usual sampling fields by llama-server's names, checked as /v1/completions checks them
SAMPLING = ("n_predict", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty",
            "repeat_last_n", "presence_penalty", "frequency_penalty", "ignore_eos")  # fmt: skip
#: those that /v1/completions spells otherwise
OPENAI_NAMES = {"n_predict": "max_tokens", "repeat_penalty": "repetition_penalty", "repeat_last_n": "penalty_last_n"}
_Sampling: type[Strict] = create_model("_Sampling", __base__=Strict, **{k: (Any, None) for k in SAMPLING})  # type: ignore[call-overload]


class InfillRequest(_Sampling):  # type: ignore[misc,valid-type]
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraFile] = Field(default_factory=list)
    prompt: str = ""
    model: str | None = None
    stream: bool = False
    cache_prompt: bool | None = None  # a hint: the prompt cache is always on

    def completion(self, prompt: list[int]) -> CompletionRequest:
        """The request as a completion of ``prompt`` (a 400 names llama-server's field)."""
        body = {OPENAI_NAMES.get(k, k): v for k, v in self.model_dump(exclude_none=True).items() if k in (*SAMPLING, "stream")}
        if isinstance(body.get("max_tokens"), int) and body["max_tokens"] < 0:
            del body["max_tokens"]  # n_predict -1: until the model stops or the context ends
        try:
            return parse_request(CompletionRequest, {**body, "prompt": prompt})
        except ApiError as exc:
            name = {v: k for k, v in OPENAI_NAMES.items()}.get(exc.param or "", exc.param)
            exc.message, exc.param = exc.message.replace(f"'{exc.param}'", f"'{name}'"), name
            raise


async def fim_prompt(
    service: Service, prefix: str, suffix: str, param: str, extra: Sequence[ExtraFile] = (), prompt: str = ""
) -> list[int]:
    """The infill prompt's ids for ``prefix`` and ``suffix`` (and ``extra`` files, and the
    start of the middle, ``prompt``); 400 naming ``param`` when the model has no FIM tokens."""
    info = service.engine.info
    fim = FimTokens.of(info.get("fim"))
    if fim is None:
        raise ApiError(400, f"{param} asks for fill-in-the-middle, and the model {service.model_id} has no FIM "
                       "tokens (FIM_PRE, FIM_SUF, FIM_MID in its vocabulary): use a code model trained "
                       "for infill", param=param, code="unsupported_value")  # fmt: skip

    async def plain(text: str) -> list[int]:
        return await service.tokenize(text, add_bos=False, special=False) if text else []

    files = [(await plain(f.filename + "\n"), await plain(f.text)) for f in extra]
    pieces = Pieces(await plain(prefix), await plain(suffix),
                    await service.tokenize(prompt, add_bos=False) if prompt else [], files,
                    await plain(REPO_NAME), await plain(FILE_NAME), await plain(CHUNK_SEPARATOR))  # fmt: skip
    bos = info.get("bos") if info.get("add_bos") else None
    return infill_prompt(fim, pieces, int(info["n_batch"]), service.n_ctx, bos)


@router.post("/infill", **openapi.route(InfillRequest, "the middle's text (llama-server)", REPLY))
async def infill(request: Request) -> Response:
    body = parse_request(InfillRequest, await json_body(request))
    service = await service_for(request, body.model)
    service.ready()
    with service.admission(1):
        prompt = await fim_prompt(service, body.input_prefix, body.input_suffix, "input_suffix", body.input_extra,
                                  body.prompt)  # fmt: skip
    req = body.completion(prompt)
    run = await service.start_run(req, [prompt], Names("input_prefix", "n_predict"))
    timeout = service.config.server.request_timeout or None
    if body.stream:
        return StreamingResponse(_events(service, run.choices[0], len(prompt)), media_type="text/event-stream")
    try:
        done = await until_done(request, collect(run.choices[0]), timeout)
    except EngineUnavailable as exc:
        raise engine_unavailable(exc) from None
    return JSONResponse(final(service, done, len(prompt), done.text))


async def _events(service: Service, pieces: AsyncIterator[Delta], n_prompt: int) -> AsyncIterator[str]:
    """llama-server's stream: one ``data:`` object a piece, the last one with ``stop`` true
    (or an ``error`` object, when the engine fails it)."""
    text, n = "", 0
    try:
        async for d in pieces:
            text += d.text
            if d.finish is not None:
                done = Collected(text, d.finish, d.usage or Usage(), None, stop_sequence=d.stop_sequence)
                yield sse(final(service, done, n_prompt, d.text))
                return
            n += 1
            yield sse({"index": 0, "content": d.text, "tokens": [], "stop": False, "id_slot": -1,
                       "tokens_predicted": n, "tokens_evaluated": n_prompt})  # fmt: skip
    except (EngineUnavailable, ApiError) as exc:
        err = exc if isinstance(exc, ApiError) else engine_unavailable(exc)
        yield sse(err.body())


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def final(service: Service, done: Collected, n_prompt: int, content: str) -> dict[str, Any]:
    """The last object: the rest of the text, why it stopped, the counts."""
    u = done.usage
    stop_type = "limit" if done.finish == "length" else "word" if done.stop_sequence else "eos"
    return {"index": 0, "content": content, "tokens": [], "id_slot": -1, "stop": True, "model": service.model_id,
            "tokens_predicted": u.completion, "tokens_evaluated": n_prompt, "has_new_line": "\n" in done.text,
            "truncated": False, "stop_type": stop_type, "stopping_word": done.stop_sequence or "",
            "tokens_cached": u.cached,
            "timings": {"cache_n": u.cached, "prompt_n": n_prompt - u.cached, "predicted_n": u.completion}}  # fmt: skip

