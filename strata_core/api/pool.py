"""The models one server serves, each its own engine: the request's ``model`` picks one.
A model loads with the server, or on its first request (``preload = false``); with
``max_loaded`` the idle model used longest ago is stopped to make room, and with
``idle_ttl_s`` a model unused that long is stopped (it loads again when asked for).
With a catalog ([server] catalog) every model of the hub's cache is served too, the
list refreshed when clients ask for it or name a model not yet known."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from strata_core.api.launch import CatalogSource, ModelSpec
from strata_core.api.service import Service
from strata_core.ops import catalog
from strata_core.schema.errors import ApiError

log = logging.getLogger("strata.pool")


@dataclass(eq=False)
class Loaded:
    """One model's place in the pool: its running Service, if any."""

    spec: ModelSpec
    service: Service | None = None
    last_used: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

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
        source: CatalogSource | None = None,
    ) -> None:  # fmt: skip
        if not specs:
            raise ValueError("a server needs at least one model")
        self.models = {s.name: Loaded(s) for s in specs}
        self.default = specs[0].name
        self.max_loaded, self.idle_ttl_s = max_loaded, idle_ttl_s
        self.source = source
        self._configured = set(self.models)
        self._reaper: asyncio.Task[None] | None = None

    def names(self) -> list[str]:
        self.refresh()
        return list(self.models)

    def refresh(self) -> list[catalog.Entry]:
        """With a catalog: add the models that appeared in the cache, forget idle ones that
        left it (a configured model stays, and is not listed twice). The cache's models."""
        if self.source is None:
            return []
        configured = {self.models[n].spec.path.resolve() for n in self._configured}
        entries = [e for e in self.source.entries() if e.path.resolve() not in configured]
        for e in entries:
            if e.name not in self.models and (spec := self.source.spec(e)) is not None:
                self.models[e.name] = Loaded(spec)
        here = {e.name for e in entries}
        for name, m in list(self.models.items()):
            if name not in here and name not in self._configured and m.service is None:
                del self.models[name]
        return entries

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
        if self.idle_ttl_s > 0:
            self._reaper = asyncio.create_task(self._reap())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
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

    async def _load(self, m: Loaded) -> None:
        async with m.lock:
            if m.service is not None:
                return
            self._make_room(m)
            service = m.spec.service()
            log.info("loading model %s", m.spec.name)
            await service.engine.start()
            if not service.engine.ready.is_set():
                why = service.engine.start_error or "the engine did not start"
                await service.engine.close()
                raise ApiError(503, f"the model {m.spec.name!r} could not be loaded: {why}",
                               type="server_error", code="engine_unavailable")  # fmt: skip
            await service.prepare()
            m.service, m.last_used = service, time.monotonic()

    async def unload_idle(self, name: str) -> None:
        """Stop a model's engine now if no request is running on it (Ollama's keep_alive 0)."""
        m = self.models.get(name)
        if m is not None and m.service is not None and m.idle:
            log.info("unloading model %s (keep_alive 0)", name)
            await self._unload(m)

    async def drop(self, name: str) -> None:
        """Stop and forget a model (its files were removed)."""
        m = self.models.get(name)
        if m is not None and name not in self._configured:
            await self._unload(m)
            self.models.pop(name, None)

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
        assert service is not None
        asyncio.get_running_loop().create_task(service.engine.close())

    async def _unload(self, m: Loaded) -> None:
        service, m.service = m.service, None
        if service is not None:
            await service.engine.close()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.idle_ttl_s / 2))
            now = time.monotonic()
            for m in self.models.values():
                if not m.idle:  # a long request ends with the model just used
                    m.last_used = now
                elif m.service is not None and now - m.last_used > self.idle_ttl_s:
                    log.info("unloading model %s, idle for %.0f s", m.spec.name, now - m.last_used)
                    await self._unload(m)
