"""The FastAPI app: OpenAI routes over one EngineClient."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from strata_core import bodies
from strata_core import protocol as proto
from strata_core.chat import FALLBACK_TEMPLATE, ChatTemplate, TemplateError
from strata_core.choice import ChatShape, ChoiceText, Delta, carry
from strata_core.config import Config
from strata_core.errors import ApiError
from strata_core.grammars import grammar_error, llguidance_grammar
from strata_core.metrics import Metrics
from strata_core.models import ALIASES
from strata_core.reader import EngineClient, EngineUnavailable, Finished
from strata_core.reasoning import prompt_opens_think
from strata_core.requests import BaseRequest, ChatRequest, CompletionRequest, parse_request
from strata_core.sampling import resolve_seed, sampling_keys
from strata_core.stream import Collected, collect, sse_stream
from strata_core.structured import Constraint, constraint_for, reconcile_choice
from strata_core.text import decode
from strata_core.tools import (
    call_grammar,
)

log = logging.getLogger("strata.server")
T = TypeVar("T")


@dataclass
class Service:
    config: Config
    model_id: str
    engine: EngineClient
    backend_info: dict[str, Any] = field(default_factory=dict)
    pieces: list[bytes] = field(default_factory=list)
    template: ChatTemplate | None = None
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        slots = self.config.engine.parallel
        self.metrics = Metrics(
            queue_depth=lambda: max(0, self.engine.in_flight - slots),
            busy_slots=lambda: min(self.engine.in_flight, slots),
            cancelled=lambda: self.engine.done_reasons["cancelled"],
        )

    async def prepare(self) -> None:
        """Learn the vocabulary and chat template once the engine is ready."""
        await self.engine.wait_ready()
        info = self.engine.info
        self.pieces = await self.engine.vocab()
        self.template = ChatTemplate(
            info.get("chat_template") or FALLBACK_TEMPLATE,
            bos_token=info.get("bos_text", ""),
            eos_token=info.get("eos_text", ""),
        )

    @property
    def n_ctx(self) -> int:
        return int(self.engine.info["n_ctx"])

    # ---- prompts -----------------------------------------------------------------------

    async def tokenize(self, text: str) -> list[int]:
        ids = await self.engine.tokenize(text, special=True)
        bos = self.engine.info.get("bos")
        if self.engine.info.get("add_bos") and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    async def chat_prompt(self, req: ChatRequest) -> tuple[list[int], ChatShape]:
        """The prompt's token ids, and how the reply will be cut up."""
        assert self.template is not None
        dialect = self.template.tool_dialect
        if req.tools and dialect is None:
            raise ApiError(
                400,
                "this model's chat template does not support tools (it never reads them), "
                "so the model would not see them; leave tools out",
                param="tools",
                code="unsupported_value",
            )
        mode = req.tool_mode()
        tools = None if mode == "none" else [t.template_view() for t in req.tools or ()]
        messages = [m.template_view() for m in req.messages]
        try:
            text = self.template.render(
                messages, add_generation_prompt=True, tools=tools, **(req.chat_template_kwargs or {})
            )
        except TemplateError as exc:
            raise ApiError(400, f"the chat template failed: {exc}", param="messages") from None
        shape = ChatShape(prompt_opens_think(text), None if mode == "none" else dialect)
        return await self.engine.tokenize(text, special=True), shape

    def tool_grammar(self, req: ChatRequest) -> str | None:
        """The GEN ``grammar`` value forcing a call for tool_choice required / named."""
        mode = req.tool_mode()
        if mode not in ("required", "named"):
            return None
        dialect = self.template.tool_dialect if self.template is not None else None
        assert dialect is not None  # chat_prompt refused tools without one
        if "grammar" not in self.engine.info.get("capabilities", ()):
            raise ApiError(
                400,
                f"tool_choice {mode!r} needs constrained decoding, which this engine does not "
                "offer (no 'grammar' capability); send tool_choice 'auto'",
                param="tool_choice",
                code="unsupported_value",
            )
        tools = [t.template_view() for t in req.forced_tools()]
        grammar = call_grammar(tools, dialect, parallel=req.parallel_tool_calls is not False)
        problem = grammar_error(llguidance_grammar("lark", grammar))
        if problem:
            raise ApiError(
                400,
                f"the tools' parameters cannot be enforced: {problem}",
                param="tools",
                code="invalid_value",
            )
        return proto.encode_grammar("lark", grammar)

    def check_lengths(self, prompt: list[int], req: BaseRequest, param: str) -> int:
        """The max_tokens to send; 400 when the prompt or the request exceed the context."""
        n_ctx, n = self.n_ctx, len(prompt)
        if n >= n_ctx:
            raise ApiError(
                400,
                f"the prompt has {n} tokens but the model's context holds {n_ctx}",
                param=param,
                code="context_length_exceeded",
            )
        max_new = req.max_new_tokens()
        if max_new is None:
            max_new = self.config.sampling.max_tokens
        if max_new is not None and n + max_new > n_ctx:
            field = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            raise ApiError(
                400,
                f"{field} = {max_new} does not fit: the prompt has {n} tokens and the "
                f"context holds {n_ctx}, leaving {n_ctx - n}",
                param=field,
                code="context_length_exceeded",
            )
        return max_new if max_new is not None else n_ctx - n

    # ---- one choice --------------------------------------------------------------------

    def start_choice(
        self,
        prompt: list[int],
        keys: dict[str, str],
        stops: list[str],
        alternatives: int | None = None,
        echo: str = "",
        shape: ChatShape | None = None,
    ) -> AsyncIterator[Delta]:
        """Send GEN now (so an unavailable engine fails before the first byte).

        ``alternatives``: logprobs with that many alternatives per token, None for none;
        ``echo``: text shown before the generated text (completions' ``echo``);
        ``shape``: a chat reply's reasoning / tool-call split (None: plain text).
        """
        try:
            stream = self.engine.generate(prompt, keys)
        except EngineUnavailable as exc:
            raise ApiError(503, f"the engine is unavailable: {exc}", type="server_error",
                           code="engine_unavailable") from None
        self.metrics.requests.inc()
        return self._follow(stream, ChoiceText(self.pieces, stops, alternatives, shape), echo)

    async def _follow(self, stream: Any, choice: ChoiceText, echo: str) -> AsyncIterator[Delta]:
        t0 = time.perf_counter()
        last = t0
        # entries released with no text (a stop, a think tag): sent with the next piece
        carried = Delta("")
        try:
            if echo:
                yield Delta(echo)
            async for batch in stream.events():
                end = batch[-1] if isinstance(batch[-1], Finished) else None
                evs = batch[:-1] if end is not None else batch
                if evs:
                    now = time.perf_counter()
                    (self.metrics.itl if last != t0 else self.metrics.ttft).observe(now - last)
                    for _ in evs[1:]:  # tokens that arrived with it
                        self.metrics.itl.observe(0.0)
                    last = now
                if evs and not choice.stopped:
                    piece = carry(carried, choice.push(*evs))
                    if choice.stopped:
                        self.engine.cancel(stream.rid)
                    if piece.shows():
                        carried = Delta("")
                        yield piece
                    else:
                        carried = piece
                if end is not None:
                    yield self._last_piece(end, choice, carried)
                    return
        finally:
            if not stream.finished:
                self.engine.cancel(stream.rid)

    def _last_piece(self, ev: Finished, choice: ChoiceText, carried: Delta) -> Delta:
        """The choice's last piece once the engine is done: the rest of its text, the
        finish reason and the usage."""
        if ev.error is not None or ev.reason == "error":
            self.metrics.errors.inc()
            raise EngineUnavailable(ev.error or "the engine failed the request")
        usage = bodies.Usage(
            prompt=int(ev.stats.get("prompt", 0)),
            completion=int(ev.stats.get("gen", 0)),
            cached=int(ev.stats.get("cached", 0)),
            drafted=int(ev.stats.get("drafted", 0)),
            accepted=int(ev.stats.get("accepted", 0)),
        )
        self.metrics.spec_drafted.inc(usage.drafted)
        self.metrics.spec_accepted.inc(usage.accepted)
        self.metrics.prompt_tokens.inc(usage.prompt)
        self.metrics.cached_tokens.inc(usage.cached)
        self.metrics.gen_tokens.inc(usage.completion)
        tail = carry(carried, choice.end())
        finish = "stop" if choice.stopped or ev.reason != "length" else "length"
        tail.tool_calls = choice.tool_calls
        if finish == "stop" and tail.tool_calls:
            finish = "tool_calls"
        tail.finish, tail.usage = finish, usage
        return tail


# ---- app ---------------------------------------------------------------------------------


def _seed_for_choice(seed: int, i: int) -> int:
    """Distinct, reproducible seeds for the n choices of one request."""
    if i == 0:
        return seed
    x = (seed + 0x9E3779B97F4A7C15 * i) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; cancel it (and so its engine requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise ApiError(499, "client closed the request", code="client_closed")


def _reconciled(r: Collected, constraint: Constraint) -> Collected:
    """A structured choice as returned: structured.reconcile_choice's content and entries."""
    text, entries = reconcile_choice(r.text, r.entries, constraint.schema)
    return dataclasses.replace(r, text=text, entries=entries)


def create_app(service: Service, on_ready: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.engine.start()
        if not service.engine.ready.is_set():
            raise RuntimeError(service.engine.start_error or "the engine did not start")
        await service.prepare()
        if on_ready is not None:
            await on_ready()
        yield
        await service.engine.close()

    cfg = service.config

    async def _auth(request: Request) -> None:
        # A dependency, not a middleware: an HTTP middleware would wrap every streamed
        # chunk in an extra task hand-off.
        key = cfg.server.api_key
        if key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {key}":
                raise ApiError(401, "invalid or missing API key", code="invalid_api_key",
                               type="authentication_error")

    app = FastAPI(title="Strata", lifespan=lifespan, dependencies=[Depends(_auth)])

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None

    def check_model(req: BaseRequest) -> None:
        if req.model is not None and req.model not in {service.model_id, *ALIASES}:
            raise ApiError(
                404,
                f"the model {req.model!r} does not exist; this server serves {service.model_id!r}",
                param="model",
                code="model_not_found",
            )

    def keys_for(req: BaseRequest, max_new: int, seed: int) -> dict[str, str]:
        keys = sampling_keys(req, cfg.sampling, seed=seed)
        keys["max_tokens"] = str(max_new)
        if req.seed is not None and cfg.sampling.exact_seed_replay:
            keys["isolate"] = "1"
        elif cfg.speculative.mode != "off" and req.speculative is not False:
            keys["spec"] = cfg.speculative.mode
        return keys

    def check_token_ids(req: BaseRequest) -> None:
        n_vocab = int(service.engine.info["n_vocab"])
        bad = [t for t in req.allowed_token_ids or () if t >= n_vocab]
        if bad:
            raise ApiError(
                400,
                f"allowed_token_ids holds {bad[0]}, outside the vocabulary "
                f"(token ids are 0..{n_vocab - 1})",
                param="allowed_token_ids",
                code="invalid_value",
            )

    async def respond(
        request: Request,
        req: BaseRequest,
        prompts: list[list[int]],
        param: str,
        chat: bool,
        echoes: list[str] | None = None,
        shape: ChatShape | None = None,
        extra_keys: dict[str, str] | None = None,
    ) -> Response:
        check_model(req)
        check_token_ids(req)
        constraint = constraint_for(req.response_format)
        seed = resolve_seed(req.seed)
        max_new = [service.check_lengths(p, req, param) for p in prompts]
        rid = bodies.new_id("chatcmpl" if chat else "cmpl")
        stops = req.stop_list()
        alternatives = req.logprob_alternatives()
        iters = []
        for pi, prompt in enumerate(prompts):
            echo = echoes[pi] if echoes else ""
            for j in range(req.n):
                keys = keys_for(req, max_new[pi], _seed_for_choice(seed, pi * req.n + j))
                if constraint is not None:
                    keys["grammar"] = constraint.gen_value()
                keys.update(extra_keys or {})
                iters.append(service.start_choice(prompt, keys, stops, alternatives, echo, shape))
        headers = {"x-strata-seed": str(seed)}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                sse_stream(rid, service.model_id, iters, chat, include_usage, prompts, req.n),
                media_type="text/event-stream",
                headers=headers,
            )
        try:
            results = await _until_disconnect(request, asyncio.gather(*(collect(i) for i in iters)))
        except EngineUnavailable as exc:
            raise ApiError(503, f"the engine failed: {exc}", type="server_error",
                           code="engine_unavailable") from None
        usage = bodies.Usage(prompt=sum(len(p) for p in prompts))
        for i, r in enumerate(results):
            usage.add_choice(r.usage, first_of_prompt=i % req.n == 0)
        if constraint is not None and not echoes:  # an echoed prompt is not part of the value
            results = [_reconciled(r, constraint) for r in results]
        choices = [r.choice(i, chat) for i, r in enumerate(results)]
        build = bodies.chat_response if chat else bodies.completion_response
        return JSONResponse(build(rid, service.model_id, choices, usage, seed), headers=headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = parse_request(ChatRequest, await body_of(request))
        await _ready_or_503()
        prompt, shape = await service.chat_prompt(req)
        grammar = service.tool_grammar(req)
        extra = {"grammar": grammar} if grammar is not None else None
        return await respond(request, req, [prompt], "messages", chat=True, shape=shape,
                             extra_keys=extra)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = parse_request(CompletionRequest, await body_of(request))
        await _ready_or_503()
        p = req.prompt
        texts: list[str] | None = None
        if isinstance(p, str):
            texts = [p]
        elif isinstance(p[0], str):
            texts = cast(list[str], p)
        if texts is not None:
            prompts = [await service.tokenize(s) for s in texts]
        elif isinstance(p[0], list):
            prompts = [list(x) for x in cast(list[list[int]], p)]
        else:
            prompts = [list(cast(list[int], p))]
        n_vocab = int(service.engine.info["n_vocab"])
        for ids in prompts:
            bad = [t for t in ids if t >= n_vocab]
            if bad:
                raise ApiError(400, f"prompt token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                               param="prompt", code="invalid_value")
        echoes = None
        if req.echo:  # the prompt as sent; token ids as their text
            echoes = texts if texts is not None else [decode(service.pieces, ids) for ids in prompts]
        return await respond(request, req, prompts, "prompt", chat=False, echoes=echoes)

    async def _ready_or_503() -> None:
        if not service.engine.ready.is_set():
            raise ApiError(503, "the engine is starting; try again shortly", type="server_error",
                           code="engine_unavailable")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": service.model_id, "object": "model", "created": 0, "owned_by": "strata"}],
        }

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.engine.ready.is_set():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/strata/backend")
    async def backend() -> dict[str, Any]:
        info = {k: v for k, v in service.engine.info.items() if k not in {"eog", "chat_template"}}
        return {**service.backend_info, "engine": info, "restarts": service.engine.restarts}

    return app
