"""One Ray Serve replica: the configured models' Strata engines (one, or one per
[models.NAME] table, loaded and unloaded as on a server without Ray) behind Strata's own
app (every route, streams included), driven in-process through ``asgi.call``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ray import serve

from strata_core.api.app import create_app
from strata_core.api.launch import log_for, model_specs
from strata_core.api.pool import ModelPool
from strata_core.ops.config import Config
from strata_core.ops.logs import console_logging
from strata_core.scale.asgi import HttpRequest, Lifespan, call


def replica_log(base: str | None, replica: str) -> Path | None:
    """The engine log of one replica: ``<stem>-<replica><suffix>`` beside ``base``."""
    if base is None:
        return None
    p = Path(base)
    return p.with_name(f"{p.stem}-{replica}{p.suffix}")


class StrataReplica:
    """``config``: the server's Config as JSON; ``engine_log``: the log path that each
    replica's engine log is named after (None: the replica's console)."""

    async def __init__(self, config: str, engine_log: str | None, log_level: str) -> None:  # type: ignore[misc]
        console_logging(log_level)
        cfg = Config.model_validate_json(config)
        self.replica = serve.get_replica_context().replica_id.unique_id
        logs = log_for(replica_log(engine_log, self.replica), cfg.models or [None])
        self.pool = ModelPool(model_specs(cfg, logs), cfg.server.max_loaded, cfg.server.idle_ttl_s,
                              sleep_idle_s=cfg.server.sleep_idle_s)
        self.app = create_app(self.pool)
        self.app.state.replica = {"id": self.replica, "pid": os.getpid()}
        self.lifespan = Lifespan(self.app)
        await self.lifespan.start()

    async def __call__(self, req: dict[str, Any]) -> AsyncIterator[dict[str, Any] | bytes]:
        """``req``: the front's request (``HttpRequest`` fields; ``key`` and ``avoid`` are
        the router's). Yields the status and headers (with ``x-strata-replica``), then
        the body's chunks."""
        http = HttpRequest(req["method"], req["path"], req.get("query", ""), req.get("headers", []),
                           req.get("body", b""))  # fmt: skip
        async for part in call(self.app, http):
            if isinstance(part, dict):
                part["headers"].append(("x-strata-replica", self.replica))
            yield part

    def check_health(self) -> None:
        """Ray Serve restarts a replica where a loaded model's engine supervisor has stopped
        (an engine itself is restarted by its supervisor, in the replica)."""
        if any(not service.engine.supervised for service in self.pool.loaded()):
            raise RuntimeError("an engine's supervisor is not running")

    async def __del__(self) -> None:
        await self.lifespan.stop()
