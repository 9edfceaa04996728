"""Ollama's API over the shared chat path, for clients that speak only ``/api/*``:
``/api/chat``, ``/api/generate``, ``/api/embed`` (and the older ``/api/embeddings``),
``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull`` and
``/api/delete``. Errors on these routes are Ollama's ``{"error": "..."}``.

Replies stream as NDJSON (``stream`` is true unless the request says false); the last
object has ``done: true``, ``done_reason`` and the counts and durations (nanoseconds,
measured here) Ollama reports. Models are named as the server names them (``strata
models``: ``OWNER/REPO:QUANT``), with or without ``:latest``; pulls and deletes act on
the hub's cache (strata_core.ops.catalog) and, with ``[server] catalog``, on what is served.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from strata_core.api import downloads, openapi
from strata_core.api.blocks import Block, Closed, Grew, blocks_of, stream_blocks
from strata_core.api.embeddings import normalized, token_inputs, with_specials
from strata_core.api.infill import fim_prompt
from strata_core.api.messages_input import arguments_object
from strata_core.api.ollama_input import (
    SAMPLING,
    Generation,
    OllamaChat,
    OllamaEmbed,
    OllamaEmbeddings,
    OllamaGenerate,
    OllamaModelName,
    OllamaOptions,
)
from strata_core.api.pool import Loaded, ModelPool
from strata_core.api.service import (
    ChatRun,
    Names,
    Service,
    engine_unavailable,
    json_body,
    until_done,
)
from strata_core.api.status import pool_of
from strata_core.api.stream import collect, reconciled
from strata_core.client.reader import EngineUnavailable
from strata_core.contract.events import Usage
from strata_core.ops import catalog, hub
from strata_core.ops.models import ModelError
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import BaseRequest, parse_request
from strata_core.text.choice import Delta
from strata_core.text.infill import FimTokens

router = APIRouter()

PREFIX = "/api/"
#: The Ollama release whose API this follows (clients check it before using newer fields).
OLLAMA_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_DONE = {"type": "object", "required": ["model", "created_at", "done"]}


def owns(path: str) -> bool:
    return path.startswith(PREFIX)


def error_body(exc: ApiError) -> dict[str, Any]:
    return {"error": exc.message}


#: /api/pull and /api/delete change the hub's cache, which other tools share: only a server
#: that serves it ([server] catalog) lets clients do that.
MANAGED = {403: {"description": "model management is off ([server] catalog = false)",
                 "content": {"application/json": {"schema": ERROR}}}}  # fmt: skip


def route(body: type[Any] | None, what: str, reply: dict[str, Any], stream: bool = False,
          managing: bool = False) -> dict[str, Any]:  # fmt: skip
    """A route's OpenAPI details with Ollama's error object for every status."""
    if body is not None:
        details = openapi.route(body, what, reply, stream=False, error_schema=ERROR)
    else:
        errors = {code: {**e, "content": {"application/json": {"schema": ERROR}}} for code, e in openapi.COMMON_ERRORS.items()}
        details = {"summary": what, "responses": {200: {"description": what, "content": {"application/json": {"schema": reply}}}, **errors}}  # fmt: skip
    if stream:  # one JSON object a line: no schema for the whole body
        details["responses"][200]["content"][NDJSON] = {}
    if managing:
        details["responses"].update(MANAGED)
    return details


def check_managed(request: Request, what: str) -> None:
    downloads.check_managed(pool_of(request), what)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def entry_for(request: Request, name: str) -> Loaded:
    """The served model ``name`` means (``:latest`` dropped if needed); Ollama's 404."""
    pool = pool_of(request)
    for candidate in (name, name.removesuffix(":latest")):
        try:
            return pool.entry(candidate)
        except ApiError:
            continue
    raise ApiError(404, f"model {name!r} not found (this server serves {', '.join(pool.names())}; pull it "
                   "with /api/pull or `strata pull`)", param="model", code="model_not_found")  # fmt: skip


async def service_named(request: Request, name: str) -> tuple[Service, int]:
    """The model's Service (loaded now if needed) and the load's duration in ns."""
    entry = entry_for(request, name)
    t0 = time.perf_counter_ns()
    service = await pool_of(request).service(entry.spec.name)
    return service, time.perf_counter_ns() - t0


# ---- generation --------------------------------------------------------------------------


class Timing:
    """Ollama's durations (ns), measured at the server: the whole request, the model's
    load, the prompt (until the first piece), the reply (after it)."""

    def __init__(self, load_ns: int) -> None:
        self.start = time.perf_counter_ns() - load_ns
        self.load = load_ns
        self.first: int | None = None

    async def tap(self, pieces: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        """``pieces``, noting when the first one came."""
        async for d in pieces:
            if self.first is None:
                self.first = time.perf_counter_ns()
            yield d

    def fields(self, usage: Usage) -> dict[str, int]:
        end = time.perf_counter_ns()
        first = self.first or end
        return {"total_duration": end - self.start, "load_duration": self.load,
                "prompt_eval_count": usage.prompt, "prompt_eval_duration": max(0, first - self.start - self.load),
                "eval_count": usage.completion, "eval_duration": end - first}  # fmt: skip


def tool_calls_body(calls: list[Block]) -> list[dict[str, Any]]:
    """Call blocks as Ollama's calls: arguments as the object the model wrote."""
    return [{"function": {"index": i, "name": c.name, "arguments": arguments_object(c.text)}}
            for i, c in enumerate(calls)]  # fmt: skip


def done_reason(finish: str) -> str:
    return "length" if finish == "length" else "stop"


def content(chat: bool, text: str, thinking: str = "", calls: list[Block] | None = None) -> dict[str, Any]:
    """A chunk's text: a chat's ``message``, a generation's ``response``."""
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = tool_calls_body(calls)
        return {"message": message}
    out: dict[str, Any] = {"response": text}
    if thinking:
        out["thinking"] = thinking
    return out


async def ndjson(model: str, run: ChatRun, chat: bool, timing: Timing, after: Callable[[], Awaitable[None]]) -> AsyncIterator[bytes]:
    """A streamed reply: a line per piece, then the last with ``done`` and the stats; an
    ``error`` line when the engine fails. ``after`` runs when it ends (keep_alive 0)."""

    def line(obj: dict[str, Any]) -> bytes:
        return json.dumps({"model": model, "created_at": now_iso(), **obj}, ensure_ascii=False).encode() + b"\n"

    last = Delta("")
    calls = 0
    try:
        async for ev in stream_blocks(timing.tap(run.pieces)):
            if isinstance(ev, Delta):
                last = ev
            elif isinstance(ev, Grew) and ev.block.kind != "call":
                reasoning = ev.block.kind == "reasoning"
                yield line({**content(chat, "" if reasoning else ev.text, ev.text if reasoning else ""), "done": False})
            elif isinstance(ev, Closed) and ev.block.kind == "call" and chat:  # a call, once whole
                body = content(chat, "", calls=[ev.block])
                body["message"]["tool_calls"][0]["function"]["index"] = calls
                calls += 1
                yield line({**body, "done": False})
        stats = timing.fields(last.usage or Usage())
        yield line({**content(chat, ""), "done": True, "done_reason": done_reason(last.finish or "stop"), **stats})
    except EngineUnavailable as exc:
        yield json.dumps({"error": f"the engine failed: {exc}"}).encode() + b"\n"
    finally:
        await after()


async def answer(request: Request, service: Service, run: ChatRun, chat: bool, timing: Timing,
                 body: Generation) -> Response:  # fmt: skip
    pool = pool_of(request)

    async def after() -> None:
        if body.unload_after():
            await pool.unload_idle(service.model_id)

    headers = {"x-strata-seed": str(run.seed)}
    if body.stream:
        return StreamingResponse(ndjson(service.model_id, run, chat, timing, after), media_type=NDJSON,
                                 headers=headers)  # fmt: skip
    try:
        whole = await until_done(request, collect(timing.tap(run.pieces)), service.config.server.request_timeout or None)
    except EngineUnavailable as exc:
        raise engine_unavailable(exc) from None
    finally:
        await after()
    if run.constraint is not None:
        whole = reconciled(whole, run.constraint)
    reply = {"model": service.model_id, "created_at": now_iso(),
             **content(chat, whole.text, whole.reasoning, [b for b in blocks_of(whole) if b.kind == "call"] if chat else None),
             "done": True, "done_reason": done_reason(whole.finish), **timing.fields(whole.usage)}  # fmt: skip
    return JSONResponse(reply, headers=headers)


def check_context(service: Service, options: OllamaOptions | None) -> None:
    n = options.num_ctx if options is not None else None
    if n is not None and n > service.n_ctx:
        raise ApiError(400, f"options.num_ctx = {n} is more than this server's context for the model "
                       f"({service.n_ctx} tokens, the operator's n_ctx); send at most {service.n_ctx}",
                       param="options.num_ctx", code="invalid_value")  # fmt: skip


async def load_only(request: Request, body: Generation, chat: bool) -> Response:
    """A request with nothing to generate loads the model (``keep_alive`` 0: unloads it)."""
    pool = pool_of(request)
    entry = entry_for(request, body.model)
    if body.unload_after():
        await pool.unload_idle(entry.spec.name)
        reason = "unload"
    else:
        await pool.service(entry.spec.name)
        reason = "load"
    return JSONResponse({"model": entry.spec.name, "created_at": now_iso(), **content(chat, ""),
                         "done": True, "done_reason": reason})  # fmt: skip


@router.post("/api/chat", **route(OllamaChat, "a chat reply (Ollama)", _DONE, stream=True))
async def chat(request: Request) -> Response:
    body = parse_request(OllamaChat, await json_body(request))
    if not body.messages:
        return await load_only(request, body, chat=True)
    req = body.chat_request()
    service, load_ns = await service_named(request, body.model)
    check_context(service, body.options)
    timing = Timing(load_ns)
    run = await service.start_chat(req, Names("messages", "options.num_predict", "format"))
    return await answer(request, service, run, True, timing, body)


@router.post("/api/generate", **route(OllamaGenerate, "a generation (Ollama)", _DONE, stream=True))
async def generate(request: Request) -> Response:
    body = parse_request(OllamaGenerate, await json_body(request))
    if not body.prompt and not body.system:
        return await load_only(request, body, chat=False)
    service, load_ns = await service_named(request, body.model)
    check_context(service, body.options)
    timing = Timing(load_ns)
    if body.suffix:
        run = await fim_run(service, body)
    elif body.raw:
        run = await raw_run(service, body.completion_request())
    else:
        run = await service.start_chat(body.chat_request(), Names("prompt", "options.num_predict", "format"))
    return await answer(request, service, run, False, timing, body)


async def raw_run(service: Service, req: BaseRequest) -> ChatRun:
    """``raw``: the prompt's text as it is, no chat template."""
    service.ready()
    prompt = await service.tokenize(str(getattr(req, "prompt", "")))
    run = await service.start_run(req, [prompt], Names("prompt", "options.num_predict", "format"))
    return ChatRun(run.choices[0], len(prompt), run.seed, run.constraint)


async def fim_run(service: Service, body: OllamaGenerate) -> ChatRun:
    """``suffix``: the prompt and the suffix around the model's FIM tokens (what Continue's
    autocomplete sends), no chat template."""
    if body.system:
        raise ApiError(400, "system does not go with suffix: a fill-in-the-middle prompt has no chat turns",
                       param="system", code="invalid_value")  # fmt: skip
    service.ready()
    prompt = await fim_prompt(service, body.prompt or "", body.suffix or "", "suffix")
    req = body.completion_request()
    run = await service.start_run(req, [prompt], Names("prompt", "options.num_predict", "format"))
    return ChatRun(run.choices[0], len(prompt), run.seed, run.constraint)


# ---- embeddings --------------------------------------------------------------------------

_EMBED = {"type": "object", "required": ["model", "embeddings"]}


@router.post("/api/embed", **route(OllamaEmbed, "embeddings (Ollama)", _EMBED))
async def embed(request: Request) -> dict[str, Any]:
    body = parse_request(OllamaEmbed, await json_body(request))
    service, load_ns = await service_named(request, body.model)
    timing = Timing(load_ns)
    texts = [body.input] if isinstance(body.input, str) else body.input
    vectors, n = await embeddings_of(request, service, texts, body.truncate)
    if body.dimensions is not None and body.dimensions != len(vectors[0]):
        raise ApiError(400, f"this model's embeddings have {len(vectors[0])} dimensions and cannot be shortened; "
                       "leave dimensions out", param="dimensions", code="unsupported_value")  # fmt: skip
    stats = timing.fields(Usage(prompt=n))
    return {"model": service.model_id, "embeddings": [normalized(v).tolist() for v in vectors],
            "total_duration": stats["total_duration"], "load_duration": load_ns, "prompt_eval_count": n}  # fmt: skip


@router.post("/api/embeddings", **route(OllamaEmbeddings, "an embedding (Ollama's older route)",
                                        {"type": "object", "required": ["embedding"]}))  # fmt: skip
async def embeddings(request: Request) -> dict[str, Any]:
    body = parse_request(OllamaEmbeddings, await json_body(request))
    service, _ = await service_named(request, body.model)
    vectors, _n = await embeddings_of(request, service, [body.prompt], truncate=True)
    return {"embedding": list(vectors[0])}  # as the model gives it, not normalised (as Ollama's)


async def embeddings_of(request: Request, service: Service, texts: list[str], truncate: bool) -> tuple[list[Any], int]:
    """Each text's vector (not normalised) and the tokens embedded; ``truncate``: a text
    longer than the engine embeds at once is cut, else refused."""
    service.ready()
    if "embeddings" not in service.engine.info.get("capabilities", ()):
        raise ApiError(400, "this model gives no embeddings", param="model", code="unsupported_value")
    if not all(texts):
        raise ApiError(400, "input strings must not be empty", param="input", code="invalid_value")
    if truncate:
        limit = int(service.engine.info["embeddings"]["max_tokens"])
        inputs = [(await with_specials(service, t))[:limit] for t in texts]
    else:
        inputs = await token_inputs(service, texts)
    timeout = service.config.server.request_timeout or None

    async def each() -> list[Any]:
        return [await service.engine.embed(ids) for ids in inputs]  # one at a time, as embed_all

    try:
        vectors = await until_done(request, each(), timeout)
    except EngineUnavailable as exc:
        raise engine_unavailable(exc) from None
    return vectors, sum(map(len, inputs))


# ---- models ------------------------------------------------------------------------------


def parameter_size(n: int | None) -> str:
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def model_row(name: str, path: Path) -> dict[str, Any]:
    """A model as /api/tags and /api/ps list it."""
    facts = catalog.facts_or_none(path)
    stat = path.stat()
    blob = path.resolve().name
    digest = blob if len(blob) == 64 else hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    details = {"parent_model": "", "format": "gguf", "family": facts.architecture or "",
               "families": [facts.architecture] if facts.architecture else [],
               "parameter_size": parameter_size(facts.parameters), "quantization_level": facts.file_type or ""}  # fmt: skip
    modified = datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"name": name, "model": name, "modified_at": modified, "size": stat.st_size, "digest": digest,
            "details": details}  # fmt: skip


_LIST = {"type": "object", "required": ["models"]}


@router.get("/api/tags", **route(None, "the models this server serves (Ollama)", _LIST))
async def tags(request: Request) -> dict[str, Any]:
    pool = pool_of(request)
    pool.names()  # the catalog refreshed
    return {"models": [model_row(name, m.spec.path) for name, m in pool.models.items()]}


@router.get("/api/ps", **route(None, "the models loaded now (Ollama)", _LIST))
async def ps(request: Request) -> dict[str, Any]:
    pool = pool_of(request)
    rows = []
    for name, m in pool.models.items():
        if m.service is None:
            continue
        ttl = pool.idle_ttl_s
        expires = datetime.now(timezone.utc) + timedelta(seconds=ttl if ttl else 365 * 86400)
        rows.append({**model_row(name, m.spec.path), "expires_at": expires.isoformat().replace("+00:00", "Z"),
                     "size_vram": 0, "context_length": m.service.n_ctx})  # fmt: skip
    return {"models": rows}


@router.get("/api/version", **route(None, "the Ollama API version followed", {"type": "object", "required": ["version"]}))
async def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}


@router.post("/api/show", **route(OllamaModelName, "a model's details (Ollama)", {"type": "object", "required": ["details"]}))
async def show(request: Request) -> dict[str, Any]:
    body = parse_request(OllamaModelName, await json_body(request))
    entry = entry_for(request, body.model_name)
    spec = entry.spec
    facts = catalog.facts_or_none(spec.path)
    template = spec.chat_template or facts.chat_template or ""
    row = model_row(spec.name, spec.path)
    arch = facts.architecture or ""
    info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": facts.parameters}
    if facts.context_length:
        info[f"{arch}.context_length"] = facts.context_length
    capabilities = ["completion"]
    if template and ("tools" in template or spec.config.tools.generic):
        capabilities.append("tools")
    if "<think>" in template or "enable_thinking" in template:
        capabilities.append("thinking")
    if entry.service is not None and FimTokens.of(entry.service.engine.info.get("fim")):
        capabilities.append("insert")  # Ollama's name for generate's suffix (fill-in-the-middle)
    # the context a request's options.num_ctx may ask for (clients such as Continue read it here)
    n_ctx = entry.service.n_ctx if entry.service is not None else spec.config.engine.n_ctx
    return {"modelfile": f"FROM {spec.path}\n", "parameters": parameters(spec, n_ctx), "template": template, "details": row["details"],
            "model_info": info, "capabilities": capabilities, "modified_at": row["modified_at"]}  # fmt: skip


def parameters(spec: Any, n_ctx: int) -> str:
    """A Modelfile's PARAMETER lines: the context, and the sampling defaults the model's
    GGUF or the configuration set (Strata's own are left out, as Ollama leaves its own)."""
    option = {field: name for name, field in SAMPLING.items()}
    view = spec.defaults.view() if spec.defaults is not None else {}
    own = [f"{option[k]} {v['value']}" for k, v in view.items() if v["source"] != "strata" and k in option]
    return "\n".join([f"num_ctx {n_ctx}", *own])


@router.delete("/api/delete", **route(OllamaModelName, "the model's files removed (Ollama)", {"type": "object"}, managing=True))
async def delete(request: Request) -> dict[str, Any]:
    body = parse_request(OllamaModelName, await json_body(request))
    check_managed(request, "deleting models")
    local = catalog.find(body.model_name)
    if local is None:
        raise ApiError(404, f"model {body.model_name!r} not found among the local models (the hub's cache)",
                       param="model", code="model_not_found")  # fmt: skip
    await pool_of(request).drop(local.name)
    catalog.remove(local)
    return {}


@router.post("/api/pull", **route(OllamaModelName, "the pull's progress (Ollama)", {"type": "object", "required": ["status"]}, stream=True,
                                      managing=True))  # fmt: skip
async def pull(request: Request) -> Response:
    """Ollama's pull: the hub's listing is read first (a bad name is a 400, one the hub
    lacks a 404, a hub that cannot be reached a 502, before any line); then one line per
    progress report of each file (``status``, ``digest``, ``total``, ``completed``), and
    ``success`` (alone, with ``"stream": false``)."""
    body = parse_request(OllamaModelName, await json_body(request))
    check_managed(request, "pulling models")
    repo, quant = catalog.normalize(body.model_name)
    planned = await downloads.plan(downloads.hub_ref(repo + (f":{quant}" if quant else "")))
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def progress(f: hub.HubFile, done: int, total: int | None) -> None:
        digest = f"sha256:{f.sha256}" if f.sha256 else f.name
        events.put_nowait({"status": f"pulling {f.name}", "digest": digest, "total": total or f.size or 0,
                           "completed": done})  # fmt: skip

    task = downloads.start(planned, progress)
    task.add_done_callback(lambda _: events.put_nowait({}))
    pool = pool_of(request)
    if not body.stream:
        await finished_pull(task, pool)
        return JSONResponse({"status": "success"})

    async def lines() -> AsyncIterator[bytes]:
        yield b'{"status":"pulling manifest"}\n'
        while ev := await events.get():
            yield json.dumps(ev).encode() + b"\n"
        try:
            await finished_pull(task, pool)
        except ApiError as exc:  # the status line is sent: the error is the last line, as Ollama's
            yield json.dumps({"error": exc.message}).encode() + b"\n"
            return
        yield b'{"status":"verifying sha256 digest"}\n{"status":"success"}\n'

    return StreamingResponse(lines(), media_type=NDJSON)


async def finished_pull(task: asyncio.Future[hub.Pulled], pool: ModelPool) -> None:
    """The pull's end: the catalog refreshed, or its error as Ollama's."""
    try:
        await task
    except ModelError as exc:
        raise downloads.pull_error(exc) from None
    pool.refresh()


#: What Ollama's clients look for at the root (api/web.py's ``/`` answers it to them).
ROOT_TEXT = "Ollama is running"
