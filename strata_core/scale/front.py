"""The front server of a Ray Serve deployment: Strata's routes, each request forwarded
whole to a replica (picked by the router from the request's routing key) and its response
relayed as it comes. A request is tried again on another replica while nothing of its
response has reached the client: when its replica dies first, or answers 503 (its engine
is restarting, or its models are all busy); where every replica it tried answered that
its engine is starting (as when one replica was replaced while another's engine
restarts), it waits a little longer each time, for at most ``RETRY_FOR`` seconds. Once a
stream has begun, a replica's death ends it with an error event."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from strata_core.scale.prefix import routing_key
from strata_core.schema.errors import ApiError

log = logging.getLogger("strata.front")

#: Tries of one request on replicas that fail before answering, before its error goes to
#: the client.
ATTEMPTS = 4
#: Seconds the front keeps trying a request that replicas refuse with 503 while their
#: engines (re)start (an engine on a CPU is back within a few seconds), waiting from
#: ``BACKOFF`` seconds, twice as long each time, up to 1 s, once every replica was tried.
RETRY_FOR = 15.0
BACKOFF = 0.05

#: Headers of a replica's response not relayed (the front's server sets its own).
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "date", "server"}


class Replicas(Protocol):
    """What the front needs of the deployment: one request in, its parts out."""

    def __call__(self, req: dict[str, Any]) -> AsyncIterator[dict[str, Any] | bytes]: ...


def unavailable(why: str) -> ApiError:
    return ApiError(503, f"no replica could serve the request: {why}", type="server_error",
                    code="engine_unavailable")  # fmt: skip


def error_code(body: bytes | None) -> str | None:
    """The ``error.code`` of an error response's body, if it holds one."""
    try:
        return str(json.loads(body or b"")["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def sse_error(err: ApiError) -> bytes:
    return f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()


async def first_part(parts: AsyncIterator[dict[str, Any] | bytes]) -> tuple[dict[str, Any], bytes | None]:
    """The response's status and headers, and its first chunk (None: it has no body)."""
    head = await anext(parts)
    assert isinstance(head, dict), "a replica answers with its status first"
    chunk = await anext(parts, None)
    assert not isinstance(chunk, dict)
    return head, chunk


async def relay(
    parts: AsyncIterator[dict[str, Any] | bytes], chunk: bytes | None, sse: bool
) -> AsyncIterator[bytes]:
    if chunk is not None:
        yield chunk
    try:
        async for part in parts:
            assert isinstance(part, bytes)
            yield part
    except Exception as exc:  # the replica died mid-response
        log.warning("a replica failed while streaming: %s", exc)
        if sse:
            yield sse_error(ApiError(503, f"the replica serving this stream failed: {exc}",
                                     type="server_error", code="engine_unavailable"))  # fmt: skip


def create_front(replicas: Replicas, on_ready: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if on_ready is not None:
            await on_ready()
        yield

    app = FastAPI(title="Strata (Ray Serve front)", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.api_route("/{path:path}", methods=["GET", "POST", "DELETE"])
    async def forward(request: Request, path: str) -> Response:
        body = await request.body()
        req: dict[str, Any] = {
            "method": request.method, "path": request.url.path, "query": request.url.query,
            "headers": [(k, v) for k, v in request.headers.items() if k.lower() != "host"],
            "body": body, "key": routing_key(request.url.path, body) if body else None, "avoid": [],
        }  # fmt: skip
        why, failures, wait = "no attempt", 0, BACKOFF
        deadline = time.monotonic() + RETRY_FOR
        while failures < ATTEMPTS:
            parts = replicas(req)
            try:
                head, chunk = await first_part(parts)
            except (StopAsyncIteration, AssertionError) as exc:
                why, failures = f"a replica sent no response ({exc})", failures + 1
                continue
            except Exception as exc:  # the replica died before answering: try another
                why, failures = str(exc) or type(exc).__name__, failures + 1
                log.warning("attempt %d: a replica failed before answering: %s", failures, why)
                await asyncio.sleep(0.2 * (failures - 1))
                continue
            headers = {k: v for k, v in head["headers"] if k.lower() not in HOP_HEADERS}
            replica = headers.get("x-strata-replica")
            if head["status"] == 503 and replica:
                fresh = replica not in req["avoid"]  # else every replica was tried
                starting = error_code(chunk) == "engine_unavailable"
                if fresh or (starting and time.monotonic() + wait < deadline):
                    await parts.aclose()  # type: ignore[attr-defined]
                    why = (chunk or b"").decode(errors="replace")
                    if fresh:  # its engine is (re)starting, or its models busy: another replica
                        req["avoid"].append(replica)
                    else:  # every engine tried is starting: give them time
                        await asyncio.sleep(wait)
                        wait = min(2 * wait, 1.0)
                    continue
            sse = headers.get("content-type", "").startswith("text/event-stream")
            return StreamingResponse(relay(parts, chunk, sse), status_code=head["status"], headers=headers)
        raise unavailable(why)

    return app
