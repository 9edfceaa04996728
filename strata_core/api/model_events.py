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
        self._queues: set[asyncio.Queue[dict[str, Any]]] = set()

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        """A queue of every event published from now until ``unsubscribe``."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(BACKLOG)
        self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._queues.discard(queue)

    def publish(self, model: str, event: str, data: dict[str, Any] | None = None) -> None:
        ev: dict[str, Any] = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for queue in self._queues:
            if queue.full():  # a subscriber that stopped reading loses its oldest events, not the server's memory
                queue.get_nowait()
            queue.put_nowait(ev)
