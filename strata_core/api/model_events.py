"""What happens to the served models, as llama-server's router tells ``GET /models/sse``:
each event ``{"model", "event", "data"}`` (``status_change``, ``download_progress``,
``download_finished``, ``download_failed``, ``model_remove``, ``models_reload``) goes to
every subscriber's queue. Published on the event loop's thread only."""

from __future__ import annotations

import asyncio
from typing import Any

#: Events a subscriber that does not read may hold before the oldest are dropped.
BACKLOG = 1000


class ModelEvents:
    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def subscribe(self) -> asyncio.Queue[dict[str, Any] | None]:
        """A queue of every event published from now until ``unsubscribe``; None in it:
        the server stops."""
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(BACKLOG)
        if self._closed:
            queue.put_nowait(None)
        self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        self._queues.discard(queue)

    def publish(self, model: str, event: str, data: dict[str, Any] | None = None) -> None:
        ev: dict[str, Any] = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for queue in self._queues:
            self._put(queue, ev)

    def close(self) -> None:
        """End every subscriber's stream (the server stops: it waits for open responses to
        end, and these never would). Safe from any thread or a signal handler."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._end)

    def _end(self) -> None:
        self._closed = True
        for queue in self._queues:
            self._put(queue, None)

    @staticmethod
    def _put(queue: asyncio.Queue[dict[str, Any] | None], ev: dict[str, Any] | None) -> None:
        if queue.full():  # a subscriber that stopped reading loses its oldest events, not the server's memory
            queue.get_nowait()
        queue.put_nowait(ev)
