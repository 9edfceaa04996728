"""``strata serve --replicas N``: a Ray cluster (an existing one, or a local one started
here), a Ray Serve deployment of ``StrataReplica`` with Strata's router, and the front
server (front.py) on the configured host and port."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from strata_core.api.launch import model_specs
from strata_core.ops.config import Config

log = logging.getLogger("strata.scale")

APP_NAME = "strata"


def import_ray() -> Any:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ValueError("--replicas needs Ray Serve: pip install 'strata[ray]' (or set [cluster] "
                         "replicas = 0 to serve without Ray)") from None  # fmt: skip
    return ray, serve


def actor_options(cfg: Config, backends: set[str]) -> dict[str, Any]:
    """A replica's resources, given the backends its models run on: one GPU when any is a
    GPU backend, and its CPUs when any runs on the cpu backend (as many engine threads,
    unless [engine] threads says otherwise)."""
    opts: dict[str, Any] = {"num_cpus": cfg.cluster.cpus_per_replica if "cpu" in backends else 0}
    if backends - {"cpu"}:
        opts["num_gpus"] = 1
    return opts


def deployment_options(cfg: Config, backends: set[str]) -> dict[str, Any]:
    from ray.serve.config import RequestRouterConfig

    from strata_core.engine.fit import AUTO_MOST
    from strata_core.scale.router import StrataRouter

    c = cfg.cluster
    # before a replica's engine says how many slots "auto" gave it: AUTO_MOST on a GPU
    slots = cfg.engine.parallel if isinstance(cfg.engine.parallel, int) else AUTO_MOST
    opts: dict[str, Any] = {
        "name": "StrataReplica",
        "ray_actor_options": actor_options(cfg, backends),
        # a replica queues beyond its engine's slots itself (continuous batching)
        "max_ongoing_requests": max(4 * slots, 16),
        "health_check_period_s": 2,
        "health_check_timeout_s": 30,
        "graceful_shutdown_timeout_s": 5,
    }
    if c.routing != "least_loaded":
        opts["request_router_config"] = RequestRouterConfig(
            request_router_class=StrataRouter,  # type: ignore[arg-type]
            request_router_kwargs={"policy": c.routing, "busy": slots},
        )
    if c.min_replicas is not None:
        opts["autoscaling_config"] = {
            "min_replicas": c.min_replicas, "max_replicas": c.max_replicas,
            "target_ongoing_requests": c.target_ongoing_requests,
        }  # fmt: skip
    else:
        opts["num_replicas"] = c.replicas
    return opts


def replica_config(cfg: Config, backends: set[str]) -> Config:
    """The replicas' configuration: where a model runs on the cpu backend, engines run as
    many threads as their replica has CPUs, so replicas on one host do not fight over
    cores ([engine] threads, or a model table's, says otherwise)."""
    if "cpu" in backends and cfg.engine.threads is None:
        threads = max(1, int(cfg.cluster.cpus_per_replica))
        return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"threads": threads})})
    return cfg


def serve_cluster(cfg: Config, log_level: str, engine_log: Path | None) -> int:
    import uvicorn

    from strata_core.api.cors import add_cors
    from strata_core.api.tls import scheme, tls_options
    from strata_core.scale.front import create_front
    from strata_core.scale.replica import StrataReplica

    ray, serve = import_ray()
    tls = tls_options(cfg.server)
    # every model resolved and its engine built once here, before the replicas need them
    specs = model_specs(cfg, lambda _: None)
    backends = {s.backend.name for s in specs}
    names, on = ", ".join(s.name for s in specs), ", ".join(sorted(backends))
    cfg = replica_config(cfg, backends)
    c = cfg.cluster
    print(f"Strata: starting {'a local Ray cluster' if c.address is None else 'Ray at ' + c.address}",
          flush=True)  # fmt: skip
    ray.init(address=c.address, include_dashboard=False, logging_level=logging.WARNING,
             **({} if c.address else {"object_store_memory": 256 << 20}))  # fmt: skip
    serve.start(http_options={"location": "NoServer"})
    deployment = serve.deployment(StrataReplica).options(**deployment_options(cfg, backends))
    print(f"Strata: starting {c.replicas} replicas of {names} on {on}", flush=True)
    handle = serve.run(
        deployment.bind(cfg.model_dump_json(), str(engine_log) if engine_log else None, log_level),
        name=APP_NAME, route_prefix=None,
    )  # fmt: skip
    streaming = handle.options(stream=True)

    async def replicas(req: dict[str, Any]) -> AsyncIterator[dict[str, Any] | bytes]:
        gen = streaming.remote(req)
        try:
            async for part in gen:
                yield part
        finally:
            gen.cancel()

    host, port = cfg.server.host, cfg.server.port

    async def announce() -> None:
        print(f"Strata serving {names} on {scheme(cfg.server)}://{host}:{port}/v1 ({c.replicas} Ray Serve replicas, "
              f"backend {on}, routing {c.routing})", flush=True)  # fmt: skip

    app = create_front(replicas, on_ready=announce)
    add_cors(app, cfg.server.cors_origins)  # the front answers preflights: it forwards no OPTIONS
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, **tls)
    finally:
        if c.address is not None:  # someone else's cluster: take only our application down
            serve.delete(APP_NAME)
        ray.shutdown()  # a local cluster stops with its driver, replicas and engines included
    return 0
