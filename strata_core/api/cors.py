"""CORS for browser clients on other origins ([server] cors_origins): off by default,
so a browser page elsewhere cannot call the API with a user's reach."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

#: what a browser may read of an answer besides the simple headers
EXPOSED = ["Retry-After"]


def add_cors(app: FastAPI, origins: Sequence[str]) -> None:
    """Answer preflights and mark answers for ``origins`` (``*``: any). Starlette's CORS
    middleware is plain ASGI: streamed chunks pass through it untouched. No credentials:
    the API key travels in a header the browser's script sets itself."""
    if not origins:
        return
    app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=["*"], allow_headers=["*"],
                       expose_headers=EXPOSED, max_age=600)  # fmt: skip
