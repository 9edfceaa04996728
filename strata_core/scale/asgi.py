"""Drive an ASGI app in-process: its lifespan, and one HTTP request whose response comes
back as it is sent (the status and headers, then each body chunk), so a replica serves
every route of Strata's app, streams included, without a second HTTP hop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message


@dataclass
class HttpRequest:
    """One request as the front forwards it (plain data, cheap to pickle)."""

    method: str
    path: str
    query: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


class Lifespan:
    """The app's start-up and shut-down (``lifespan.startup`` / ``shutdown``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._in: asyncio.Queue[Message] = asyncio.Queue()
        self._out: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        async def run() -> None:
            await self.app(scope, self._in.get, self._out.put)

        self._task = asyncio.create_task(run())
        await self._in.put({"type": "lifespan.startup"})
        msg = await self._out.get()
        if msg["type"] != "lifespan.startup.complete":
            raise RuntimeError(msg.get("message") or "the app failed to start")

    async def stop(self) -> None:
        await self._in.put({"type": "lifespan.shutdown"})
        await self._out.get()


async def call(app: ASGIApp, req: HttpRequest) -> AsyncIterator[dict[str, Any] | bytes]:
    """Send ``req`` to ``app``: yields ``{"status", "headers"}`` first, then body chunks."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": req.method,
        "scheme": "http", "path": req.path, "raw_path": req.path.encode(), "root_path": "",
        "query_string": req.query.encode(), "server": ("127.0.0.1", 0), "client": ("127.0.0.1", 0),
        "headers": [(k.lower().encode(), v.encode()) for k, v in req.headers],
    }  # fmt: skip
    out: asyncio.Queue[Message | None] = asyncio.Queue()
    sent = False
    disconnected = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(scope, receive, out.put)
        finally:
            await out.put(None)

    task = asyncio.create_task(run())
    try:
        while (msg := await out.get()) is not None:
            if msg["type"] == "http.response.start":
                headers = [(k.decode(), v.decode()) for k, v in msg.get("headers", [])]
                yield {"status": msg["status"], "headers": headers}
            elif msg["type"] == "http.response.body":
                if msg.get("body"):
                    yield bytes(msg["body"])
                if not msg.get("more_body"):
                    break
        await task
    finally:
        # The caller went away (the client disconnected, the front cancelled): tell the app,
        # so its engine requests are cancelled.
        disconnected.set()
        if not task.done():
            task.cancel()
