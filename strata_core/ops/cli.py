"""The ``strata`` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from strata_core import __version__
from strata_core.ops.build import (
    BuildError,
    find_engine,
    list_engines,
    strata_home,
)
from strata_core.ops.config import Config, ConfigError, load_config
from strata_core.ops.logs import console_logging
from strata_core.ops.models import ModelError, mmproj_path, projector_inputs, resolve_model
from strata_core.ops.plugins import BackendError, Registry, load_registry, select_backend


def _fail(msg: str) -> int:
    print(f"strata: error: {msg}", file=sys.stderr)
    return 2


def backend_rows(reg: Registry) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, lb in sorted(reg.backends.items()):
        probe = lb.backend.probe()
        rows.append(
            {
                "name": name,
                "distribution": lb.distribution,
                "version": lb.version,
                "status": probe.status.value,
                "reason": probe.reason,
                "verified_on_hardware": lb.backend.verified_on_hardware,
                "build_verified": lb.backend.build_verified,
                "devices": [vars(d) for d in probe.devices],
                "toolchain": dict(probe.toolchain),
            }
        )
    for b in reg.broken:
        rows.append(
            {
                "name": b.name,
                "distribution": b.distribution,
                "version": b.version,
                "status": "broken",
                "reason": b.error,
                "verified_on_hardware": False,
                "build_verified": False,
                "devices": [],
                "toolchain": {},
            }
        )
    return rows


def cmd_backends(args: argparse.Namespace) -> int:
    rows = backend_rows(load_registry())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        if r["verified_on_hardware"]:
            note = ""
        elif r["build_verified"]:
            note = "  [build verified, unverified on hardware]"
        else:
            note = "  [unverified on hardware]"
        print(f"{r['name']:<6} {r['status']:<21} {r['distribution']} {r['version']}{note}")
        print(f"       {r['reason']}")
        for d in r["devices"]:
            mem = f", {d['memory_mib']} MiB" if d.get("memory_mib") else ""
            print(f"       device {d['index']}: {d['name']}{mem}")
    return 0


def _config(args: argparse.Namespace) -> Config:
    overrides = {
        "engine": {
            "backend": getattr(args, "backend", None),
            "model": getattr(args, "model", None),
            "parallel": getattr(args, "parallel", None),
            "n_ctx": getattr(args, "n_ctx", None),
            "mmproj": getattr(args, "mmproj", None),
        },
        "server": {"host": getattr(args, "host", None), "port": getattr(args, "port", None),
                   "otlp_traces_endpoint": getattr(args, "otlp_traces_endpoint", None),
                   "sleep_idle_s": getattr(args, "sleep_idle_seconds", None)},  # fmt: skip
        "cluster": {"replicas": getattr(args, "replicas", None)},
        "speculative": {
            "draft_model": getattr(args, "draft_model", None),
            "mode": "draft" if getattr(args, "draft_model", None) else None,
        },
    }
    return load_config(getattr(args, "config", None), overrides=overrides)


def cmd_engine_build(args: argparse.Namespace) -> int:
    from strata_core.api.launch import engine_for

    cfg = _config(args)
    backend, build = engine_for(cfg, build_only=True)
    print(f"{backend.name} engine: {build.path.parent}")
    return 0


def cmd_engine_list(args: argparse.Namespace) -> int:
    builds = list_engines()
    if not builds:
        print("no engines built yet; run `strata engine build`")
    for b in builds:
        print(f"{b.backend:<6} {b.meta.get('llama_cpp_python', '?')}  {b.path.parent}")
        print(f"       {' '.join(b.meta.get('cmake_args', []))}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.template:
        return _doctor_template(args.template)
    print(f"strata {__version__}, python {sys.version.split()[0]}")
    try:
        cfg = _config(args)
    except ConfigError as exc:
        print(f"config: {exc}")
        return 1
    reg = load_registry()
    for r in backend_rows(reg):
        print(f"backend {r['name']}: {r['status']} - {r['reason']}")
        for d in r["devices"]:
            mem = f", {d['memory_mib']} MiB" if d.get("memory_mib") else ""
            print(f"  device {d['index']}: {d['name']}{mem}")
    try:
        backend = select_backend(reg, cfg.engine.backend)
        print(f"selected backend: {backend.name}")
        build = find_engine(backend.name, backend.build_spec())
        if build:
            print(f"engine build: {build.path.parent}")
            print(f"  flags: {' '.join(build.meta.get('cmake_args', []))}")
        else:
            print(f"engine build: none yet (run `strata engine build --backend {backend.name}`)")
    except (BackendError, BuildError) as exc:
        print(f"selected backend: none ({exc})")
    try:
        if cfg.engine.model.startswith("hf:"):  # doctor downloads nothing
            print(f"model: {cfg.engine.model} (a hub reference: `strata pull` or `strata serve` fetches it)")
            return 0
        m = resolve_model(cfg.engine.model)
        print(f"model: {m.id} ({m.path})")
        mmproj = mmproj_path(cfg.engine.mmproj) if cfg.engine.mmproj else None
        print(f"  inputs: {', '.join(projector_inputs(mmproj))}" + (f" (projector {mmproj})" if mmproj else ""))
        _doctor_sampling(m.path, cfg)
        for name in cfg.models:
            one = cfg.for_model(name)
            if not one.engine.model.startswith("hf:"):
                print(f"model {name}: {one.engine.model}")
                _doctor_sampling(resolve_model(one.engine.model).path, one)
    except ModelError as exc:
        print(f"model: {exc}")
    return 0


def _doctor_sampling(path: Path, cfg: Config) -> None:
    """A model's sampling defaults, each with where it came from (strata, gguf, config)."""
    from strata_core.api.launch import model_defaults

    defaults = model_defaults(path, cfg)
    shown = ", ".join(f"{k}={v['value']} ({v['source']})" for k, v in defaults.view().items())
    print(f"  sampling defaults: {shown}")
    if defaults.ignored:
        print(f"  not applied from the GGUF: {', '.join(f'{k}={v}' for k, v in defaults.ignored.items())}")


def _doctor_template(path: str) -> int:
    """How Strata would read and force tool calls with the chat template in ``path``."""
    from strata_core.text.chat import ChatTemplate, TemplateError
    from strata_core.text.tool_setup import report

    try:
        source = Path(path).expanduser().read_text(encoding="utf-8")
        lines = report(ChatTemplate(source))
    except (OSError, TemplateError) as exc:
        return _fail(f"--template {path}: {exc}")
    print(f"template {path}")
    for line in lines:
        print(f"  {line}")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from strata_core.ops import hub

    ref = hub.parse_ref(args.reference)
    pulled = hub.pull(ref)
    mmproj = f" (mmproj {pulled.mmproj})" if pulled.mmproj else ""
    print(f"{ref.repo}:{pulled.quant} {pulled.path}{mmproj}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from strata_core.ops import catalog

    if args.sub == "rm":
        entry = catalog.find(args.name)
        if entry is None:
            return _fail(f"no local model {args.name!r} (see `strata models`)")
        catalog.remove(entry)
        print(f"removed {entry.name}")
        return 0
    rows: list[dict[str, Any]] = []
    for e in catalog.local_models():
        facts = catalog.facts_or_none(e.path)
        rows.append({"name": e.name, "quant": e.quant, "size": e.size, "architecture": facts.architecture,
                     "context_length": facts.context_length, "chat_template": facts.chat_template is not None,
                     "path": str(e.path), "mmproj": str(e.mmproj) if e.mmproj else None})  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no local models; fetch one with `strata pull OWNER/REPO[:QUANT]`")
    for r in rows:
        ctx = r["context_length"] or "?"
        print(f"{r['name']:<48} {r['size'] / 1e9:6.2f} GB  {r['architecture'] or '?':<10} ctx {ctx:<7} {r['path']}")
    return 0


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def engine_log_path(args: argparse.Namespace, port: int) -> Path | None:
    """Where the engine's stderr (llama.cpp's log) goes: ``--engine-log``, or
    $STRATA_HOME/logs/engine-<port>.log; None (the console) with ``--log-level debug``."""
    if args.engine_log:
        path = Path(args.engine_log)
    elif args.log_level in ("debug", "trace"):
        return None
    else:
        path = strata_home() / "logs" / f"engine-{port}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create {path.parent} for the engine's log: {exc} (set STRATA_HOME "
                         "or pass --engine-log PATH)") from None  # fmt: skip
    return path.absolute()


def exposure_warning(cfg: Config) -> str | None:
    """A warning when the server would listen beyond this machine with no API key."""
    host = cfg.server.host
    if cfg.server.api_key or cfg.server.api_key_file or host in ("localhost", "::1") or host.startswith("127."):
        return None
    return (f"strata: warning: serving on {host} without an API key: anyone who can reach this port can "
            "use the model (set [server] api_key or STRATA_SERVER_API_KEY, or serve on --host 127.0.0.1)")  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> int:
    import faulthandler
    import signal

    import uvicorn

    from strata_core.api.app import StoppingServer, create_app
    from strata_core.api.launch import CatalogSource, log_for, model_specs
    from strata_core.api.pool import ModelPool
    from strata_core.api.sampling_defaults import check_defaults
    from strata_core.api.tls import scheme, tls_options

    cfg = _config(args)
    if warning := exposure_warning(cfg):
        print(warning, file=sys.stderr, flush=True)
    for sampling in [cfg.sampling, *(cfg.for_model(name).sampling for name in cfg.models)]:
        check_defaults(sampling)
    tls = tls_options(cfg.server)
    host, port = cfg.server.host, cfg.server.port
    log_path = engine_log_path(args, port)
    if cfg.cluster.replicas:
        from strata_core.scale.serve import serve_cluster

        console_logging(args.log_level)
        return serve_cluster(cfg, args.log_level, log_path)
    logs = log_for(log_path, [*(cfg.models or [None]), *(["catalog"] if cfg.server.catalog else [])])
    specs = model_specs(cfg, logs)
    source = CatalogSource(cfg, logs) if cfg.server.catalog else None
    pool = ModelPool(specs, cfg.server.max_loaded, cfg.server.idle_ttl_s, source, cfg.server.sleep_idle_s)
    console_logging(args.log_level)
    for spec in specs:
        where = f"; the engine logs to {spec.log_path}" if spec.log_path else ""
        when = "" if spec.preload else " (on its first request)"
        print(f"Strata: loading {spec.name} on {spec.backend.name}{when}{where}", flush=True)

    async def announce() -> None:
        for spec in specs:
            service = pool.entry(spec.name).service
            kv = f"; {service.kv_summary()}" if service is not None and service.kv_summary() else ""
            print(
                f"Strata serving {spec.name} on {scheme(cfg.server)}://{host}:{port}/v1 "
                f"(backend {spec.backend.name}, model file {spec.path}{kv})",
                flush=True,
            )
        if cfg.server.web_ui:
            print(f"Strata web page: http://{host}:{port}/", flush=True)

    app = create_app(pool, on_ready=announce)
    # `kill -USR1` on the server prints every thread's stack to the console (the engine's
    # go to its log): what a hung request waits on, without a debugger (README, "Logs and metrics")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    config = uvicorn.Config(app, host=host, port=port, log_level=args.log_level, **tls)
    StoppingServer(config, pool.events.close).run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="strata", description="OpenAI-compatible LLM serving")
    ap.add_argument("--version", action="store_true", help="show versions of strata and its plugins")
    sub = ap.add_subparsers(dest="command")

    p = sub.add_parser("backends", help="list backends and whether they can run here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backends)

    eng = sub.add_parser("engine", help="build or list native engines").add_subparsers(dest="sub")
    p = eng.add_parser("build", help="build (or reuse) the engine for a backend")
    p.add_argument("--backend")
    p.add_argument("--config")
    p.set_defaults(func=cmd_engine_build)
    p = eng.add_parser("list", help="list built engines")
    p.set_defaults(func=cmd_engine_list)

    p = sub.add_parser("doctor", help="report backends, devices, engine build and model")
    p.add_argument("--backend")
    p.add_argument("--config")
    p.add_argument("--template", help="only report the tool-call format a chat template file gets, with an example call")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("pull", help="fetch a GGUF model from the Hugging Face hub into its cache")
    p.add_argument("reference", help="OWNER/REPO[:QUANT][@REVISION] (QUANT defaults to Q4_K_M)")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("models", help="list the local models (the hub's cache), or remove one")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models, sub=None)
    msub = p.add_subparsers(dest="sub")
    rm = msub.add_parser("rm", help="remove a local model's files")
    rm.add_argument("name", help="OWNER/REPO:QUANT, as `strata models` lists it")

    p = sub.add_parser("serve", help="serve a model behind the OpenAI API")
    p.add_argument("--config", help="TOML config file (also $STRATA_CONFIG)")
    p.add_argument("--backend", help="cpu, cuda, hip, sycl, metal or auto")
    p.add_argument("--model", help="path to a GGUF file, an alias (default), or hf:OWNER/REPO[:QUANT][@REVISION]")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--parallel", help="parallel slots, or auto (as many as the GPU's free memory holds)")
    p.add_argument("--n-ctx", type=int, help="context per slot")
    p.add_argument("--draft-model", help='speculate with this draft GGUF (sets [speculative] mode = "draft")')
    p.add_argument("--mmproj", help="the model's multimodal projector GGUF: it takes images (and audio)")
    p.add_argument("--sleep-idle-seconds", type=float, metavar="S",
                   help="stop a model's engine after S seconds without a request; the next one wakes it ([server] sleep_idle_s)")  # fmt: skip
    p.add_argument("--replicas", type=int,
                   help="serve through this many Ray Serve replicas, one engine each (needs "
                        "strata[ray]; sets [cluster] replicas)")  # fmt: skip
    p.add_argument("--otlp-traces-endpoint", metavar="URL",
                   help="export a trace span per request over OTLP/HTTP to this collector, e.g. "
                        "http://collector:4318/v1/traces (needs strata[otel])")  # fmt: skip
    p.add_argument("--log-level", default="warning", choices=LOG_LEVELS,
                   help="what the console shows (default warning); debug and trace also show the "
                        "engine's log (llama.cpp)")  # fmt: skip
    p.add_argument("--engine-log", metavar="PATH",
                   help="append the engine's log here (default $STRATA_HOME/logs/engine-<port>.log)")  # fmt: skip
    p.set_defaults(func=cmd_serve)
    return ap


def print_versions() -> None:
    print(f"strata {__version__}")
    reg = load_registry()
    for name, lb in sorted(reg.backends.items()):
        print(f"  backend {name}: {lb.distribution} {lb.version}")
    for b in reg.broken:
        print(f"  backend {b.name}: {b.distribution} {b.version} BROKEN: {b.error}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.version:
        print_versions()
        return 0
    if not getattr(args, "func", None):
        build_parser().print_help()
        return 0
    try:
        return int(args.func(args))
    except (ConfigError, BackendError, BuildError, ModelError, ValueError) as exc:
        return _fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
