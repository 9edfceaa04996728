"""The FastAPI app: the served models (a ModelPool of Services), the routes of each API
family, and what every route shares: start-up, the API key (auth.py), errors in the
family's shape (errors.py), health and metrics (status.py), CORS (cors.py) and request
traces (tracing.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import FrameType

import uvicorn
from fastapi import Depends, FastAPI

from strata_core.api import (
    completions,
    embeddings,
    infill,
    lora,
    messages,
    ollama,
    rerank,
    responses,
    router,
    slots,
    status,
    tokenize,
)
from strata_core.api.auth import require_key
from strata_core.api.cors import add_cors
from strata_core.api.errors import install_error_handlers
from strata_core.api.openapi import COMMON_ERRORS, document
from strata_core.api.pool import ModelPool
from strata_core.api.tracing import start_tracing, stop_tracing
from strata_core.api.web import add_web_routes
from strata_core.schema.errors import ApiError

FAMILIES = (completions, responses, messages, embeddings, rerank, tokenize, infill, slots, ollama, status, lora, router)


def create_app(pool: ModelPool, on_ready: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    config = pool.models[pool.default].spec.config
    server = config.server

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
        if hasattr(app.state, "downloads"):
            app.state.downloads.close()
        await pool.close()
        stop_tracing()

    auth = Depends(require_key(server.key()))
    app = FastAPI(title="Strata", lifespan=lifespan, dependencies=[auth], responses=COMMON_ERRORS)
    app.state.pool = pool
    app.state.server_config = server
    app.state.responses = responses.ResponseStore(config.responses.store_size)
    add_web_routes(app, server.web_ui)  # before the families: it answers a browser's /
    for family in FAMILIES:
        app.include_router(family.router)
    app.openapi = lambda: document(app)  # type: ignore[method-assign]
    install_error_handlers(app, pool)
    add_cors(app, server.cors_origins)
    start_tracing(server.otlp_traces_endpoint)
    return app


class StoppingServer(uvicorn.Server):
    """uvicorn's server, which waits for every open response to end before it stops: told
    to stop, it first ends the endless ones (``GET /models/sse``) through ``on_exit``."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.on_exit()
