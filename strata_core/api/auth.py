"""The API key: asked of the OpenAI, Anthropic, Ollama and tokenize routes when the
server has one ([server] api_key or api_key_file); health and metrics stay open."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request

from strata_core.api import ollama, tokenize
from strata_core.schema.errors import ApiError


def guarded(path: str) -> bool:
    return path.startswith("/v1/") or path in tokenize.PATHS or ollama.owns(path)


def require_key(key: str | None) -> Callable[[Request], Awaitable[None]]:
    """The app's dependency that refuses a guarded route without ``key`` (none: open).
    A dependency, not a middleware: an HTTP middleware would wrap every streamed chunk
    in an extra task hand-off."""

    async def auth(request: Request) -> None:
        if key and guarded(request.url.path) and not key_matches(request, key):
            raise ApiError(401, "invalid or missing API key (send Authorization: Bearer <key> or "
                           "x-api-key: <key>)", code="invalid_api_key", type="authentication_error")  # fmt: skip

    return auth


def key_matches(request: Request, key: str) -> bool:
    """The API key as a bearer token or (Anthropic's clients) ``x-api-key``, compared in
    constant time so the answer's timing does not spell the key."""
    want = key.encode()
    bearer = request.headers.get("authorization", "")
    sent = [bearer[7:] if bearer[:7].lower() == "bearer " else "", request.headers.get("x-api-key", "")]
    return any(hmac.compare_digest(s.encode(), want) for s in sent)
