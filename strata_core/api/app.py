"""The FastAPI app: one Service, the routes of each API family, and what every route
shares (start-up, the API key, OpenAI-shaped errors, health and metrics)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from strata_core.api import completions
from strata_core.api.openapi import COMMON_ERRORS, document
from strata_core.api.service import Service, engine_unavailable
from strata_core.errors import ApiError, internal_error
from strata_core.reader import EngineUnavailable

log = logging.getLogger("strata.api")

#: Codes of the HTTP errors Starlette raises itself (an unknown route, a wrong method).
HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


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

    async def auth(request: Request) -> None:
        # A dependency, not a middleware: an HTTP middleware would wrap every streamed
        # chunk in an extra task hand-off.
        key = service.config.server.api_key
        if key and request.url.path.startswith("/v1/") and not key_matches(request, key):
            raise ApiError(401, "invalid or missing API key (send Authorization: Bearer <key> or "
                           "x-api-key: <key>)", code="invalid_api_key", type="authentication_error")  # fmt: skip

    app = FastAPI(title="Strata", lifespan=lifespan, dependencies=[Depends(auth)], responses=COMMON_ERRORS)
    app.state.service = service
    app.include_router(completions.router)

    app.openapi = lambda: document(app)  # type: ignore[method-assign]

    # Every failure is an OpenAI error object (docs/reliability.md, "What each failure answers").
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(EngineUnavailable)
    async def engine_gone(request: Request, exc: EngineUnavailable) -> JSONResponse:
        return error_response(engine_unavailable(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, "http_error")
        message = f"{exc.detail}: {request.method} {request.url.path}"
        return error_response(ApiError(exc.status_code, message, code=code, headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        # A bug: Starlette re-raises it after this answer, and uvicorn logs the traceback.
        service.metrics.internal_errors.inc()
        log.error("internal error in %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error_response(internal_error(exc))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": service.model_id, "object": "model", "created": 0, "owned_by": "strata"}],
        }

    @app.get("/health", responses={503: {"description": "the engine is starting",
                                         "content": {"application/json": {"schema": {"type": "object"}}}}})  # fmt: skip
    async def health() -> JSONResponse:
        if service.engine.ready.is_set():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/strata/backend")
    async def backend() -> dict[str, Any]:
        info = {k: v for k, v in service.engine.info.items() if k not in {"eog", "chat_template"}}
        return {**service.backend_info, "engine": info, "restarts": service.engine.restarts}

    return app


def key_matches(request: Request, key: str) -> bool:
    """The API key as a bearer token or (Anthropic's clients) ``x-api-key``, compared in
    constant time so the answer's timing does not spell the key."""
    want = key.encode()
    bearer = request.headers.get("authorization", "")
    sent = [bearer[7:] if bearer[:7].lower() == "bearer " else "", request.headers.get("x-api-key", "")]
    return any(hmac.compare_digest(s.encode(), want) for s in sent)


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

