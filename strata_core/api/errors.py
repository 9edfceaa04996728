"""Every failure as an error object in the shape of the request's API family (OpenAI's,
Anthropic's on its routes, Ollama's on its): docs/reliability.md, "What each failure
answers"."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from strata_core.api import messages, ollama
from strata_core.api.pool import ModelPool
from strata_core.api.service import engine_unavailable
from strata_core.client.reader import EngineUnavailable
from strata_core.schema.errors import ApiError, internal_error

log = logging.getLogger("strata.api")

#: Codes of the HTTP errors Starlette raises itself (an unknown route, a wrong method).
HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def install_error_handlers(app: FastAPI, pool: ModelPool) -> None:
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
