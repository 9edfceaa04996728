"""The models one server serves, each its own engine: the request's ``model`` picks one.
A model loads with the server, or on its first request (``preload = false``), or when
asked (``POST /models/load``); with ``max_loaded`` the idle model used longest ago is
stopped to make room, with ``sleep_idle_s`` a model unused that long sleeps (its engine
stops; the next request wakes it), and with ``idle_ttl_s`` it is unloaded.
With a catalog ([server] catalog) every model of the hub's cache is served too, the
list refreshed when clients ask for it or name a model not yet known.

Each model's state (``STATES``) has one writer, ``ModelPool._set``, which publishes every
change on ``events`` (``GET /models/sse``); a load that fails leaves the model ``failed``
with the reason, and the next load tries again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata_core.api.launch import CatalogSource, ModelSpec
from strata_core.api.metrics import ModelCounts, ModelStates
from strata_core.api.model_events import ModelEvents
from strata_core.api.service import Service
from strata_core.ops import catalog
from strata_core.schema.errors import ApiError

log = logging.getLogger("strata.pool")

#: A model's states: ``failed`` is unloaded after a load that failed (``Loaded.reason`` says why).
STATES = ("unloaded", "loading", "loaded", "sleeping", "failed")


@dataclass(eq=False)
class Loaded:
    """One model's place in the pool: its running Service, if any, its state and counts."""

    spec: ModelSpec
    service: Service | None = None
    last_used: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: str = "unloaded"
    reason: str = ""  # why the last load failed
    exit_code: int | None = None  # the failed engine's exit code, if it exited
    loads: int = 0
    failures: int = 0

    @property
    def idle(self) -> bool:
        return self.service is None or self.service.engine.in_flight == 0


def adapter_names(m: Loaded) -> set[str]:
    """The names of a model's LoRA adapters: its engine's, else (not loaded) the configured ones."""
    if m.service is not None:
        return {a["name"] for a in m.service.adapters.listing()}
    return {a.label() for a in m.spec.config.engine.lora}


class ModelPool:
    def __init__(
        self, specs: Sequence[ModelSpec], max_loaded: int = 0, idle_ttl_s: float = 0.0,
        source: CatalogSource | None = None, sleep_idle_s: float = 0.0,
    ) -> None:  # fmt: skip
        if not specs:
            raise ValueError("a server needs at least one model")
        self.models = {s.name: Loaded(s) for s in specs}
        self.default = specs[0].name
        self.max_loaded, self.idle_ttl_s, self.sleep_idle_s = max_loaded, idle_ttl_s, sleep_idle_s
        self.source = source
        self.events = ModelEvents()
        self.metrics = ModelStates(self.counts, STATES)
        self._configured = set(self.models)
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # loads asked for, not awaited

    def names(self) -> list[str]:
        self.refresh()
        return list(self.models)

    def refresh(self) -> list[catalog.Entry]:
        """With a catalog: add the models that appeared in the cache, forget idle ones that
        left it (a configured model stays, and is not listed twice). The cache's models."""
        if self.source is None:
            return []
        entries = [e for e in self.source.entries() if not self.configured_path(e.path)]
        for e in entries:
            if e.name not in self.models and (spec := self.source.spec(e)) is not None:
                self.models[e.name] = Loaded(spec)
        here = {e.name for e in entries}
        for name, m in list(self.models.items()):
            if name not in here and name not in self._configured and m.service is None:
                del self.models[name]
                self.events.publish(name, "model_remove")
        return entries

    def counts(self) -> list[ModelCounts]:
        return [ModelCounts(n, m.state, m.loads, m.failures) for n, m in self.models.items()]

    def configured_path(self, path: Path) -> bool:
        """Whether a configured model's file is ``path`` (the catalog does not list it twice)."""
        return path.resolve() in {self.models[n].spec.path.resolve() for n in self._configured}

    def configured(self, name: str) -> bool:
        """Whether ``name`` is a configured model ([models.NAME], or the one model), not the catalog's."""
        return name in self._configured

    def entry(self, model: str | None) -> Loaded:
        """The model a request names (None: the first); 404 naming it when unknown."""
        if model is None:
            return self.models[self.default]
        if model in self.models:
            return self.models[model]
        for m in self.models.values():
            if model.lower() in m.spec.aliases:
                return m
        for m in self.models.values():  # an adapter's name: its base model runs it
            if model in adapter_names(m):
                return m
        if self.source is not None:
            found = catalog.find(model, self.refresh())
            if found is not None and found.name in self.models:
                return self.models[found.name]
        served = ", ".join(repr(n) for n in self.models)
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {served}",
                       param="model", code="model_not_found")  # fmt: skip

    @property
    def first(self) -> Service | None:
        """The first model's Service when it is loaded (health, metrics, backend info)."""
        return self.models[self.default].service

    def loaded(self) -> list[Service]:
        return [m.service for m in self.models.values() if m.service is not None]

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Load every model that loads with the server; raise when one cannot start."""
        for m in self.models.values():
            if m.spec.preload:
                await self._load(m)
        if self.idle_ttl_s > 0 or self.sleep_idle_s > 0:
            self._reaper = asyncio.create_task(self._reap())

    async def close(self) -> None:
        for task in [*self._tasks, *([self._reaper] if self._reaper else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for m in self.models.values():
            await self._unload(m)

    async def service(self, model: str | None) -> Service:
        """The Service of the model a request names, loading it first if needed."""
        m = self.entry(model)
        m.last_used = time.monotonic()
        if m.service is None:
            await self._load(m)
        assert m.service is not None
        return m.service

    def load_soon(self, name: str) -> None:
        """Start loading a model without waiting (``POST /models/load``); a failure is its
        state (``failed``), not an exception."""

        async def load() -> None:
            with contextlib.suppress(ApiError):
                await self._load(self.models[name])

        task = asyncio.get_running_loop().create_task(load())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, m: Loaded) -> None:
        async with m.lock:
            if m.service is not None:
                return
            self._make_room(m)
            log.info("%s model %s", "waking" if m.state == "sleeping" else "loading", m.spec.name)
            self._set(m, "loading")
            service: Service | None = None
            try:
                service = m.spec.service()
                await service.engine.start()
                if not service.engine.ready.is_set():
                    raise LoadFailed(service.engine.start_error or "the engine did not start", service.engine.exit_code)
                await service.prepare()
            except asyncio.CancelledError:  # the server stops while the model loads
                if service is not None:
                    await service.engine.close()
                raise
            except Exception as exc:  # whatever stops a load leaves the model failed, the server up
                if service is not None:
                    await service.engine.close()
                why, code = (exc.why, exc.exit_code) if isinstance(exc, LoadFailed) else (f"{type(exc).__name__}: {exc}", None)
                m.failures += 1
                m.reason, m.exit_code = why, code
                log.error("model %s could not be loaded: %s", m.spec.name, why)
                self._set(m, "failed")
                raise ApiError(503, f"the model {m.spec.name!r} could not be loaded: {why}",
                               type="server_error", code="engine_unavailable") from None  # fmt: skip
            m.service, m.last_used = service, time.monotonic()
            m.loads += 1
            m.reason, m.exit_code = "", None
            self._set(m, "loaded")

    def _set(self, m: Loaded, state: str) -> None:
        """The one writer of a model's state: set it and tell the subscribers (llama-server's
        ``status_change``; a failure is ``unloaded`` with ``failed``, as there)."""
        m.state = state
        self.events.publish(m.spec.name, "status_change", status_data(m))

    async def unload_idle(self, name: str) -> None:
        """Stop a model's engine now if no request is running on it (Ollama's keep_alive 0)."""
        m = self.models.get(name)
        if m is not None and m.service is not None and m.idle:
            log.info("unloading model %s (keep_alive 0)", name)
            await self._unload(m)

    async def unload(self, name: str) -> bool:
        """Stop a model's engine (``POST /models/unload``; running requests finish first, a
        load under way too); a sleeping model is unloaded. False when it was not running."""
        m = self.models[name]
        async with m.lock:  # a load under way ends first
            if m.service is None and m.state != "sleeping":
                return False
            log.info("unloading model %s", name)
            await self._unload(m)
            return True

    async def drop(self, name: str) -> None:
        """Stop and forget a model (its files were removed)."""
        m = self.models.get(name)
        if m is not None and name not in self._configured:
            await self._unload(m)
            self.models.pop(name, None)
            self.events.publish(name, "model_remove")

    def _make_room(self, m: Loaded) -> None:
        """Under ``max_loaded``, stop the idle model used longest ago (in the background)."""
        running = [o for o in self.models.values() if o.service is not None and o is not m]
        if not self.max_loaded or len(running) < self.max_loaded:
            return
        idle = sorted((o for o in running if o.idle), key=lambda o: o.last_used)
        if not idle:
            raise ApiError(503, f"all {len(running)} loaded models are busy (max_loaded = {self.max_loaded}); "
                           f"try {m.spec.name!r} again shortly", type="server_error",
                           code="model_not_loaded")  # fmt: skip
        victim = idle[0]
        service, victim.service = victim.service, None
        log.info("unloading model %s to load %s", victim.spec.name, m.spec.name)
        self._set(victim, "unloaded")
        assert service is not None
        asyncio.get_running_loop().create_task(service.engine.close())

    async def _unload(self, m: Loaded, state: str = "unloaded") -> None:
        service, m.service = m.service, None
        if service is not None:
            self._set(m, state)
            await service.engine.close()
        elif m.state == "sleeping" and state == "unloaded":
            self._set(m, state)

    async def _reap(self) -> None:
        limits = [t for t in (self.sleep_idle_s, self.idle_ttl_s) if t > 0]
        while True:
            await asyncio.sleep(min(5.0, min(limits) / 2))
            now = time.monotonic()
            for m in list(self.models.values()):
                idle_for = now - m.last_used
                if not m.idle:  # a long request ends with the model just used
                    m.last_used = now
                elif self.idle_ttl_s and idle_for > self.idle_ttl_s and m.state in ("loaded", "sleeping"):
                    log.info("unloading model %s, idle for %.0f s", m.spec.name, idle_for)
                    await self._unload(m)
                elif self.sleep_idle_s and idle_for > self.sleep_idle_s and m.service is not None:
                    log.info("model %s sleeps, idle for %.0f s (the next request wakes it)", m.spec.name, idle_for)
                    await self._unload(m, "sleeping")


class LoadFailed(Exception):
    """An engine that did not come up: why (its last words), and its exit code."""

    def __init__(self, why: str, exit_code: int | None) -> None:
        super().__init__(why)
        self.why, self.exit_code = why, exit_code


def status_data(m: Loaded) -> dict[str, Any]:
    """A model's status as llama-server's router writes it (``value``, and for a failed
    load ``failed``, ``exit_code``), with the failure's ``reason``."""
    if m.state != "failed":
        return {"status": m.state}
    code = {} if m.exit_code is None else {"exit_code": m.exit_code}
    return {"status": "unloaded", "failed": True, **code, "reason": m.reason}
