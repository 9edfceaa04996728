"""Code infill for editors: llama-server's ``POST /infill`` in its shapes (what llama.vim
and llama.vscode call), and the prompt that OpenAI's ``suffix`` on ``/v1/completions`` and
Ollama's on ``/api/generate`` make: the text around the cursor between the model's FIM
tokens (text/infill.py's layout, llama-server's). A model without FIM tokens is refused
with a 400 naming the field that asked for it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field, create_model

from strata_core.api import openapi
from strata_core.api.bodies import sse
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
from strata_core.schema.sampling import FIELDS
from strata_core.text.choice import Delta
from strata_core.text.infill import (
    CHUNK_SEPARATOR,
    FILE_NAME,
    REPO_NAME,
    EditorLimits,
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
    time: Any = None  # when the editor picked the chunk (llama.vim, llama.vscode): not used


#: the usual sampling fields by llama-server's names, checked as /v1/completions checks them
SAMPLING = ("n_predict", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty",
            "repeat_last_n", "presence_penalty", "frequency_penalty", "ignore_eos", "n_cmpl", "logit_bias",
            *FIELDS)  # fmt: skip
#: those that /v1/completions spells otherwise
OPENAI_NAMES = {"n_predict": "max_tokens", "repeat_penalty": "repetition_penalty", "repeat_last_n": "penalty_last_n",
                "n_cmpl": "n"}  # fmt: skip
_Sampling: type[Strict] = create_model("_Sampling", __base__=Strict, **{k: (Any, None) for k in SAMPLING})  # type: ignore[call-overload]


class InfillRequest(_Sampling):  # type: ignore[misc,valid-type]
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraFile] = Field(default_factory=list)
    prompt: str = ""
    model: str | None = None
    stream: bool = False
    cache_prompt: bool | None = None  # a hint: the prompt cache is always on
    # the editors' stops (text/infill.py's EditorLimits)
    n_indent: int | None = Field(default=None, ge=0)
    t_max_predict_ms: int | None = Field(default=None, ge=-1)
    # llama-server reads no t_max_prompt_ms (a to-do there) and neither does Strata
    t_max_prompt_ms: int | None = None
    response_fields: list[str] | None = None
    return_tokens: bool | None = None
    id_slot: int | None = Field(default=None, ge=-1)

    def completion(self, prompt: list[int]) -> CompletionRequest:
        """The request as a completion of ``prompt`` (a 400 names llama-server's field)."""
        body = {OPENAI_NAMES.get(k, k): v for k, v in self.model_dump(exclude_none=True).items() if k in (*SAMPLING, "stream")}
        if body.get("samplers") in ([], ""):
            del body["samplers"]  # llama.vim's [] asks for no order of its own
        if isinstance(body.get("max_tokens"), int) and body["max_tokens"] < 0:
            del body["max_tokens"]  # n_predict -1: until the model stops or the context ends
        if self.n_predict == 0 and not isinstance(self.n_predict, bool):
            body["max_tokens"] = 1  # llama-server, asked for none, generates one token (the prompt into the cache)
        try:
            return parse_request(CompletionRequest, {**body, "prompt": prompt})
        except ApiError as exc:
            name = {v: k for k, v in OPENAI_NAMES.items()}.get(exc.param or "", exc.param)
            exc.message, exc.param = exc.message.replace(f"'{exc.param}'", f"'{name}'"), name
            raise

    def check(self, slots: int) -> None:
        """400s for what Strata does not do (a slot beyond the engine's, several streamed)."""
        if self.id_slot is not None and self.id_slot >= slots:
            raise ApiError(400, f"invalid slot id {self.id_slot}: this model has slots 0..{slots - 1}",
                           param="id_slot", code="invalid_value")  # fmt: skip
        if self.stream and isinstance(self.n_cmpl, int) and self.n_cmpl > 1:
            raise ApiError(400, "n_cmpl above 1 is not supported with stream: one completion a streamed request",
                           param="n_cmpl", code="unsupported_value")  # fmt: skip

    def limits(self) -> EditorLimits:
        return EditorLimits(self.n_indent or 0, -1 if self.t_max_predict_ms is None else self.t_max_predict_ms)


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
    body.check(service.slots)
    with service.admission(1):
        prompt = await fim_prompt(service, body.input_prefix, body.input_suffix, "input_suffix", body.input_extra,
                                  body.prompt)  # fmt: skip
    req = body.completion(prompt)
    made: list[EditorLimits] = []
    sent = time.monotonic()
    run = await service.start_run(req, [prompt], Names("input_prefix", "n_predict"), limits=lambda: _keep(made, body.limits()))
    reply = Reply(service.model_id, body, len(prompt), sent)
    if body.stream:
        return StreamingResponse(_events(reply, run.choices[0], made[0]), media_type="text/event-stream")
    timeout = service.config.server.request_timeout or None
    try:
        done = [await until_done(request, collect(c), timeout) for c in run.choices]
    except EngineUnavailable as exc:
        raise engine_unavailable(exc) from None
    finals = [reply.final(d, lim, d.text, i) for i, (d, lim) in enumerate(zip(done, made, strict=True))]
    return JSONResponse(finals[0] if len(finals) == 1 else finals)


def _keep(made: list[EditorLimits], limits: EditorLimits) -> EditorLimits:
    made.append(limits)
    return limits


async def _events(reply: Reply, pieces: AsyncIterator[Delta], limits: EditorLimits) -> AsyncIterator[bytes]:
    """llama-server's stream: one ``data:`` object a piece, the last one with ``stop`` true
    (or an ``error`` object, when the engine fails it)."""
    text, n, sent_ids = "", 0, 0
    try:
        async for d in pieces:
            text += d.text
            if d.finish is not None:
                done = Collected(text, d.finish, d.usage or Usage(), None, stop_sequence=d.stop_sequence)
                yield sse(reply.final(done, limits, d.text, 0, since=sent_ids))
                return
            n += 1
            ids, sent_ids = limits.ids[sent_ids:], len(limits.ids)
            yield sse({"index": 0, "content": d.text, "tokens": ids if reply.body.return_tokens else [], "stop": False,
                       "id_slot": reply.id_slot, "tokens_predicted": n, "tokens_evaluated": reply.n_prompt})  # fmt: skip
    except (EngineUnavailable, ApiError) as exc:
        err = exc if isinstance(exc, ApiError) else engine_unavailable(exc)
        yield sse(err.body())


@dataclass
class Reply:
    """What the reply objects share: the model, the request, its prompt's length and when
    it was sent (``time.monotonic``)."""

    model: str
    body: InfillRequest
    n_prompt: int
    sent: float

    @property
    def id_slot(self) -> int:
        return -1 if self.body.id_slot is None else self.body.id_slot

    def final(self, done: Collected, limits: EditorLimits, content: str, index: int, since: int = 0) -> dict[str, Any]:
        """The last object: the rest of the text (``content``), why it stopped, the counts
        and times, cut to ``response_fields``; ``since``: the token ids already streamed."""
        u = done.usage
        n_gen = len(limits.ids) if limits.why else u.completion  # not the tokens made before the cancel landed
        stop_type = "limit" if limits.why or done.finish == "length" else "word" if done.stop_sequence else "eos"
        obj = {"index": index, "content": content, "id_slot": self.id_slot,
               "tokens": limits.ids[since:] if self.body.return_tokens else [],
               "stop": True, "model": self.model, "tokens_predicted": n_gen, "tokens_evaluated": self.n_prompt,
               "has_new_line": "\n" in done.text, "truncated": False, "stop_type": stop_type,
               "stopping_word": done.stop_sequence or "",
               # the tokens the slot's cache holds now: the prompt and all but the last token
               "tokens_cached": self.n_prompt + max(n_gen - 1, 0),
               "timings": timings(u.cached, self.n_prompt - u.cached, n_gen, self.sent, limits.t_first)}  # fmt: skip
        fields = self.body.response_fields
        return picked(fields, obj) if fields else obj


def timings(cache_n: int, prompt_n: int, predicted_n: int, sent: float, first: float | None) -> dict[str, Any]:
    """llama-server's ``timings``: the prompt's time until the first token, the rest the
    generation's (both as this process saw them)."""
    now = time.monotonic()
    first = now if first is None else first
    prompt_ms, predicted_ms = (first - sent) * 1000, (now - first) * 1000
    return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(prompt_n, 1), "prompt_per_second": 1000 * prompt_n / max(prompt_ms, 1e-9),
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / max(predicted_n, 1),
            "predicted_per_second": 1000 * predicted_n / max(predicted_ms, 1e-9)}  # fmt: skip


def picked(paths: list[str], obj: dict[str, Any]) -> dict[str, Any]:
    """``response_fields``: only those fields, each under its own path as the key (a path
    with slashes reaches into objects: ``timings/prompt_n``); a missing one is left out."""
    out = {}
    for path in paths:
        node: Any = obj
        for key in path.split("/"):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            out[path] = node
    return out
