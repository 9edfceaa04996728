"""Pulls from the hub that HTTP routes start (Ollama's ``/api/pull``, the router's ``POST
/models``): the listing is read first, so a bad reference, a missing quant or an
unreachable hub is the request's own error; then the files are fetched on a thread, each
progress report brought to the event loop. ``Downloads`` keeps the router's pulls in
flight, their progress for ``GET /models`` and their events for ``GET /models/sse``, and
stops one when asked (``POST /models/unload``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from strata_core.api.pool import ModelPool
from strata_core.ops import hub
from strata_core.ops.models import ModelError
from strata_core.schema.errors import ApiError

log = logging.getLogger("strata.pool")

Report = Callable[[hub.HubFile, int, "int | None"], None]


def check_managed(pool: ModelPool, what: str) -> None:
    """Pulls and deletes change the hub's cache, which other tools share: only a server that
    serves it ([server] catalog) lets clients do that (403 otherwise)."""
    if pool.source is None:
        raise ApiError(403, f"{what} is off on this server: it changes the hub's cache, which only a server "
                       "with [server] catalog = true manages (or use `strata pull` / `strata models rm`)",
                       type="permission_error", code="model_management_off")  # fmt: skip


def hub_ref(text: str, param: str = "model") -> hub.HubRef:
    """``OWNER/REPO[:QUANT][@REVISION]`` (``hf:`` optional); 400 naming what is wrong."""
    try:
        return hub.parse_ref(text if hub.is_ref(text) else hub.PREFIX + text)
    except ModelError as exc:
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None


def pull_error(exc: ModelError) -> ApiError:
    """A pull's failure as the request's error: 404 for what the hub does not have; 502
    (an upstream that failed: the client's request was fine) for a hub that cannot be
    reached or sent what was refused."""
    if isinstance(exc, hub.NotOnHub):
        return ApiError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, hub.HubUnreachable):
        return ApiError(502, str(exc), type="server_error", code="hub_unreachable")
    return ApiError(502, str(exc), type="server_error", code="pull_failed")


async def plan(ref: hub.HubRef) -> hub.Plan:
    """What ``ref`` fetches, read from the hub's listing; the request's error when it cannot be."""
    try:
        return await asyncio.to_thread(hub.plan, ref)
    except ModelError as exc:
        raise pull_error(exc) from None


class Stopped(Exception):
    """A download stopped when asked (what it fetched is kept: the next pull resumes it)."""


def start(planned: hub.Plan, report: Report, stop: threading.Event | None = None) -> asyncio.Future[hub.Pulled]:
    """Fetch the plan's files on a thread; ``report`` is called on the event loop; once
    ``stop`` is set the download ends (Stopped) at its next chunk."""
    loop = asyncio.get_running_loop()

    def progress(f: hub.HubFile, done: int, total: int | None) -> None:
        if stop is not None and stop.is_set():
            raise Stopped(f"the download of {planned.name} was stopped")
        loop.call_soon_threadsafe(report, f, done, total)

    return asyncio.ensure_future(asyncio.to_thread(hub.pull, planned.ref, progress, False, planned))


def file_url(planned: hub.Plan, f: hub.HubFile) -> str:
    return f"{hub.endpoint()}/{planned.ref.repo}/resolve/{planned.commit}/{f.name}"


class Downloads:
    """The router's pulls in flight, by the model's name (``OWNER/REPO:QUANT``): each file's
    bytes so far by URL (llama-server's ``progress``), told as ``download_progress`` and
    ended by ``download_finished`` or ``download_failed`` (with the reason)."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool, self.events = pool, pool.events
        self.progress: dict[str, dict[str, dict[str, int]]] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._stops: dict[str, threading.Event] = {}

    def begin(self, planned: hub.Plan) -> None:
        name = planned.name
        self.progress[name] = {file_url(planned, f): {"done": 0, "total": f.size or 0} for f in planned.files}
        self.events.publish(name, "status_change", {"status": "downloading"})

        def report(f: hub.HubFile, done: int, total: int | None) -> None:
            files = self.progress.get(name)
            if files is not None:
                files[file_url(planned, f)] = {"done": done, "total": total or f.size or 0}
                self.events.publish(name, "download_progress", dict(files))

        self._stops[name] = threading.Event()
        task = start(planned, report, self._stops[name])
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._end(name, t))

    def _end(self, name: str, task: asyncio.Future[hub.Pulled]) -> None:
        self._tasks.discard(task)
        self.progress.pop(name, None)
        self._stops.pop(name, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            log.info("downloaded %s", name)
            self.pool.refresh()  # the catalog lists it now
            self.events.publish(name, "download_finished", {})
            return
        why = str(exc) if isinstance(exc, (ModelError, Stopped)) else f"{type(exc).__name__}: {exc}"
        log.error("the download of %s failed: %s", name, why)
        self.events.publish(name, "download_failed", {"reason": why})

    def stop(self, name: str) -> bool:
        """Stop a download in flight (at its next chunk); False when there is none."""
        if name not in self._stops:
            return False
        self._stops[name].set()
        return True

    def close(self) -> None:
        for stop in self._stops.values():
            stop.set()
        for task in self._tasks:
            task.cancel()
