"""The FastAPI app: the served models (a ModelPool of Services), the routes of each API
family, and what every route shares (start-up, the API key, errors in the family's
shape, health and metrics)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from strata_core.api import completions, embeddings, messages, ollama, rerank, responses, tokenize
from strata_core.api.openapi import COMMON_ERRORS, document
from strata_core.api.pool import ModelPool
from strata_core.api.service import engine_unavailable
from strata_core.api.web import add_web_routes
from strata_core.client.reader import EngineUnavailable
from strata_core.schema.errors import ApiError, internal_error

log = logging.getLogger("strata.api")

#: Codes of the HTTP errors Starlette raises itself (an unknown route, a wrong method).
HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def lora_adapters(entry: Any) -> list[dict[str, Any]]:
    """The configured adapters of a pool entry, in id order."""
    adapters = entry.spec.config.engine.lora
    return [{"id": i, "name": a.label(), "path": a.path, "scale": a.scale} for i, a in enumerate(adapters)]


def model_card(name: str, entry: Any) -> dict[str, Any]:
    """A served model as /v1/models lists it: the inputs it takes, its LoRA adapters."""
    adapters = lora_adapters(entry)
    return {"id": name, "object": "model", "created": 0, "owned_by": "strata", "inputs": entry.spec.inputs,
            **({"lora_adapters": adapters} if adapters else {})}  # fmt: skip


def create_app(pool: ModelPool, on_ready: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    config = pool.models[pool.default].spec.config

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await pool.start()
        except ApiError as exc:
            await pool.close()
            raise RuntimeError(exc.message) from None
        if on_ready is not None:
            await on_ready()
        yield
        await pool.close()

    async def auth(request: Request) -> None:
        # A dependency, not a middleware: an HTTP middleware would wrap every streamed
        # chunk in an extra task hand-off.
        key = config.server.api_key
        path = request.url.path
        guarded = path.startswith("/v1/") or path in tokenize.PATHS or ollama.owns(path)
        if key and guarded and not key_matches(request, key):
            raise ApiError(401, "invalid or missing API key (send Authorization: Bearer <key> or "
                           "x-api-key: <key>)", code="invalid_api_key", type="authentication_error")  # fmt: skip

    app = FastAPI(title="Strata", lifespan=lifespan, dependencies=[Depends(auth)], responses=COMMON_ERRORS)
    app.state.pool = pool
    app.state.server_config = config.server
    app.state.responses = responses.ResponseStore(config.responses.store_size)
    add_web_routes(app, config.server.web_ui)
    for family in (completions, responses, messages, embeddings, rerank, tokenize, ollama):
        app.include_router(family.router)

    app.openapi = lambda: document(app)  # type: ignore[method-assign]

    # Every failure is an OpenAI error object (docs/reliability.md, "What each failure answers").
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(EngineUnavailable)
    async def engine_gone(request: Request, exc: EngineUnavailable) -> JSONResponse:
        return error_response(request, engine_unavailable(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, "http_error")
        message = f"{exc.detail}: {request.method} {request.url.path}"
        return error_response(request, ApiError(exc.status_code, message, code=code, headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        # A bug: Starlette re-raises it after this answer, and uvicorn logs the traceback.
        service = pool.first
        if service is not None:
            service.metrics.internal_errors.inc()
        log.error("internal error in %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(request, internal_error(exc))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [model_card(name, pool.models[name]) for name in pool.names()]
        return {"object": "list", "data": data}

    @app.get("/lora-adapters")
    async def get_lora_adapters(model: str | None = None) -> list[dict[str, Any]]:
        """The model's LoRA adapters (llama-server's shape, with their names): ``id`` is what
        a request's ``lora`` names, ``scale`` what a request without one gets."""
        return lora_adapters(pool.entry(model))

    @app.get("/health", responses={503: {"description": "the engine is starting",
                                         "content": {"application/json": {"schema": {"type": "object"}}}}})  # fmt: skip
    async def health() -> JSONResponse:
        """ok when the engine of every loaded model is ready (the server answers only once
        the models that load with it are loaded)."""
        if all(s.engine.ready.is_set() for s in pool.loaded()):
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(model: str | None = None) -> PlainTextResponse:
        """The first model's series, or ``?model=NAME``'s (an unloaded model has none)."""
        service = pool.entry(model).service
        text = service.metrics.render() if service is not None else ""
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/strata/backend")
    async def backend(model: str | None = None) -> dict[str, Any]:
        """The first model's backend, engine and restarts (or ``?model=NAME``'s), and
        every model's backend and whether it is loaded."""
        entry = pool.entry(model)
        service = entry.service
        engine = service.engine if service is not None else None
        info = {k: v for k, v in (engine.info if engine else {}).items() if k not in {"eog", "chat_template"}}
        every = {m.spec.name: {"backend": m.spec.backend.name, "loaded": m.service is not None, "inputs": m.spec.inputs}
                 for m in pool.models.values()}  # fmt: skip
        # a Ray Serve replica says which one it is (strata_core/scale/replica.py)
        replica = {"replica": app.state.replica} if hasattr(app.state, "replica") else {}
        return {**entry.spec.info(), "engine": info, "restarts": engine.restarts if engine else 0,
                "models": every, **replica}  # fmt: skip

    return app


def key_matches(request: Request, key: str) -> bool:
    """The API key as a bearer token or (Anthropic's clients) ``x-api-key``, compared in
    constant time so the answer's timing does not spell the key."""
    want = key.encode()
    bearer = request.headers.get("authorization", "")
    sent = [bearer[7:] if bearer[:7].lower() == "bearer " else "", request.headers.get("x-api-key", "")]
    return any(hmac.compare_digest(s.encode(), want) for s in sent)


def error_response(request: Request, exc: ApiError) -> JSONResponse:
    """The error in the shape of the request's API family (Anthropic's on its routes)."""
    path = request.url.path
    if messages.owns(path):
        body = messages.error_body(exc)
    elif ollama.owns(path):
        body = ollama.error_body(exc)
    else:
        body = exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)

