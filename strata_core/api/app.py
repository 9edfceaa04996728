"""The FastAPI app: one Service, the routes of each API family, and what every route
shares (start-up, the API key, errors in the family's shape, health and metrics)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from strata_core.api import completions, messages, responses, tokenize
from strata_core.api.service import Service
from strata_core.errors import ApiError


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
        path = request.url.path
        if key and (path.startswith("/v1/") or path in tokenize.PATHS):
            given = {request.headers.get("authorization")}
            if messages.owns(path):  # Anthropic's clients send the key as x-api-key
                given.add(f"Bearer {request.headers.get('x-api-key')}")
            if f"Bearer {key}" not in given:
                raise ApiError(401, "invalid or missing API key", code="invalid_api_key",
                               type="authentication_error")  # fmt: skip

    app = FastAPI(title="Strata", lifespan=lifespan, dependencies=[Depends(auth)])
    app.state.service = service
    app.state.responses = responses.ResponseStore(service.config.responses.store_size)
    for family in (completions, responses, messages, tokenize):
        app.include_router(family.router)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        body = messages.error_body(exc) if messages.owns(request.url.path) else exc.body()
        return JSONResponse(body, status_code=exc.status)

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
