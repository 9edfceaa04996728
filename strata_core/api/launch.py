"""From configuration to engines: each model the server serves, with the name clients
use, its own configuration, backend, engine build and engine command. A ModelSpec makes
a fresh Service (its engine not started yet) each time the model is loaded."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata_core.api.sampling_defaults import ModelDefaults, layer_defaults
from strata_core.api.service import Service
from strata_core.client.reader import EngineClient, EngineCommand, engine_command
from strata_core.ops import catalog
from strata_core.ops.backend_spec import Backend
from strata_core.ops.build import EngineBuild, ensure_engine
from strata_core.ops.config import (
    Config,
    ConfigError,
    EngineConfig,
    check_cache_types,
    check_split,
    slots_for,
)
from strata_core.ops.models import (
    ALIASES,
    ResolvedModel,
    mmproj_path,
    projector_inputs,
    resolve_model,
)
from strata_core.ops.plugins import load_registry, select_backend
from strata_core.text.chat import ChatTemplate, TemplateError
from strata_core.text.tool_setup import PROBE_TOOL

log = logging.getLogger("strata.launch")


def offload(e: EngineConfig, backend: Backend) -> tuple[int, bool]:
    """The engine's n_gpu_layers and flash attention: the configuration's, else the backend's."""
    d = backend.engine_defaults()
    return (d.n_gpu_layers if e.n_gpu_layers is None else e.n_gpu_layers,
            d.flash_attn if e.flash_attn is None else e.flash_attn)  # fmt: skip


def engine_for(cfg: Config, build_only: bool = False) -> tuple[Backend, EngineBuild]:
    """The backend [engine] names and its engine build (built now if needed), after the
    checks that need the backend (a split llama.cpp refuses), before a build that may take
    minutes. ``build_only``: the engine is built, not run, so a backend whose toolchain is
    there but that sees no device will do."""
    backend = select_backend(load_registry(), cfg.engine.backend, for_build=build_only,
                             engine_given=bool(cfg.engine.llama_cpp))  # fmt: skip
    n_gpu_layers, flash_attn = offload(cfg.engine, backend)
    check_split(cfg.engine.split_mode, flash_attn, n_gpu_layers)
    check_cache_types(cfg.engine.cache_type_k, cfg.engine.cache_type_v, flash_attn, cfg.engine.split_mode)
    return backend, ensure_engine(backend, cfg.engine.llama_cpp, log=lambda m: print(m, file=sys.stderr))


@dataclass(frozen=True)
class ModelSpec:
    """One served model: ``name`` is what clients send as ``model`` (``aliases`` too)."""

    name: str
    config: Config
    path: Path
    backend: Backend
    build: EngineBuild
    command: EngineCommand
    log_path: Path | None
    preload: bool = True
    aliases: frozenset[str] = field(default_factory=frozenset)
    #: its multimodal projector: configured (mmproj), or found beside a pulled model
    mmproj: Path | None = None
    #: the operator's chat template text ([engine] / [models.NAME] chat_template)
    chat_template: str | None = None
    #: its sampling defaults and where each came from (``config.sampling`` holds them)
    defaults: ModelDefaults | None = None

    @functools.cached_property
    def inputs(self) -> list[str]:
        """What the model takes (text, image, audio), read from its projector's header."""
        return projector_inputs(self.mmproj)

    def service(self) -> Service:
        """A new Service over a new (not yet started) engine client."""
        service = Service(self.config, self.name, EngineClient(self.command, self.log_path),
                          chat_template=self.chat_template)  # fmt: skip
        service.backend_info = self.info()
        service.adapters.model = self.path  # adapters loaded at run time are checked against it
        return service

    def info(self) -> dict[str, Any]:
        build = self.build.meta
        return {
            "backend": self.backend.name,
            "build": {k: build.get(k) for k in ("cmake_args", "llama_cpp_python", "site")},
            "devices": [vars(d) for d in self.backend.probe().devices],
            "engine_log": str(self.log_path) if self.log_path else None,
            "model_file": str(self.path),
            "mmproj": str(self.mmproj) if self.mmproj else None,
            "inputs": self.inputs,
        }


def model_spec(
    cfg: Config, name: str | None, log_path: Path | None, preload: bool = True, model: ResolvedModel | None = None
) -> ModelSpec:
    """The spec of the model [engine] describes, or ``model`` (named ``name``, or after its file)."""
    model = model or resolve_model(cfg.engine.model)
    defaults = model_defaults(model.path, cfg)
    cfg = cfg.model_copy(update={"sampling": defaults.sampling})
    spec = cfg.speculative
    mmproj = mmproj_path(cfg.engine.mmproj) if cfg.engine.mmproj else model.mmproj
    draft = resolve_model(spec.draft_model) if spec.mode == "draft" and spec.draft_model else None
    backend, build = engine_for(cfg)
    e = cfg.engine
    n_gpu_layers, flash_attn = offload(e, backend)
    command = engine_command(
        str(model.path),
        site=str(build.path),
        env=backend.engine_env(e),
        n_ctx=context_for(model.path, e.n_ctx),
        parallel=slots_for(e.parallel, on_gpu=n_gpu_layers != 0 and backend.name != "cpu"),
        n_batch=e.n_batch,
        threads=e.threads,
        n_gpu_layers=n_gpu_layers,
        flash_attn=flash_attn,
        backend=backend.name,
        spec_k=spec.k,
        draft_model=str(draft.path) if draft else None,
        spec_threshold=spec.threshold,
        spec_adaptive=spec.adaptive,
        prompt_cache_mib=e.prompt_cache_mib,
        split_mode=e.split_mode,
        tensor_split=e.tensor_split,
        main_gpu=e.main_gpu,
        cache_types=(e.cache_type_k, e.cache_type_v),
        loras=[(str(Path(a.path).expanduser()), a.scale) for a in e.lora],
        mmproj=str(mmproj) if mmproj else None,
        device_sampling=e.device_sampling,
    )
    # One model served: the aliases clients send for "the model" ("default") name it, whatever
    # its file, as before several models could be served; [models.NAME] are named exactly.
    aliases = frozenset(ALIASES) if name is None else frozenset()
    return ModelSpec(name or model.id, cfg, model.path, backend, build, command, log_path, preload, aliases,
                     mmproj, template_file(e.chat_template), defaults)  # fmt: skip


def model_defaults(path: Path, cfg: Config) -> ModelDefaults:
    """The sampling defaults of the model in ``path``: its GGUF's under ``cfg``'s."""
    defaults = layer_defaults(catalog.facts_or_none(path).sampling, cfg.sampling)
    if defaults.ignored:
        log.info("%s: general.sampling keys not applied (no such sampler, or out of range): %s",
                 path.name, ", ".join(f"{k}={v}" for k, v in defaults.ignored.items()))  # fmt: skip
    return defaults


def context_for(path: Path, n_ctx: int) -> int:
    """``n_ctx``, no larger than the context the model was trained on (its GGUF's)."""
    trained = catalog.facts_or_none(path).context_length
    if trained and n_ctx > trained:
        log.info("%s was trained on a context of %d tokens: n_ctx %d lowered to it", path.name, trained, n_ctx)
        return trained
    return n_ctx


def template_file(path: str | None) -> str | None:
    """The chat template in ``path`` (None: the GGUF's), read and rendered now so a bad
    one refuses to start: it must render a user's message, plainly or (a template made for
    tool use only) with a tool offered."""
    if path is None:
        return None
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"chat_template = {path!r}: cannot read it: {exc.strerror}") from None
    hi = [{"role": "user", "content": "hi"}]
    try:
        ChatTemplate(text).render(hi)
    except TemplateError as exc:
        try:
            ChatTemplate(text).render(hi, tools=[PROBE_TOOL])
        except TemplateError:
            raise ConfigError(f"chat_template = {path!r}: {exc}") from None
    return text


def model_specs(cfg: Config, log_path: Callable[[str | None], Path | None]) -> list[ModelSpec]:
    """Every model ``cfg`` serves: its [models.NAME] tables in order, or else the one
    model of [engine]. ``log_path(name)``: where that model's engine logs (name None:
    the only model)."""
    if not cfg.models:
        return [model_spec(cfg, None, log_path(None))]
    return [
        model_spec(cfg.for_model(name), name, log_path(name), m.preload) for name, m in cfg.models.items()
    ]


class CatalogSource:
    """The models of the hub's cache as the pool serves them ([server] catalog): one spec
    per local model, named as ``strata models`` names it, loaded on its first request."""

    def __init__(self, cfg: Config, log_path: Callable[[str | None], Path | None]) -> None:
        self.cfg, self.log_path = cfg, log_path

    def entries(self) -> list[catalog.Entry]:
        return catalog.local_models()

    def spec(self, entry: catalog.Entry) -> ModelSpec | None:
        """``entry``'s spec; None (logged) when it cannot be served."""
        model = ResolvedModel(entry.name, entry.path, entry.mmproj)
        try:
            return model_spec(self.cfg, entry.name, self.log_path(entry.name), preload=False, model=model)
        except ValueError as exc:
            log.warning("catalog: cannot serve %s: %s", entry.name, exc)
            return None


def log_for(base: Path | None, names: Iterable[str | None]) -> Callable[[str | None], Path | None]:
    """Engine log paths: ``base`` for the only model, ``<stem>-<name><suffix>`` beside it
    for each of several."""
    several = len(list(names)) > 1

    def path(name: str | None) -> Path | None:
        if base is None or name is None or not several:
            return base
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)  # OWNER/REPO:QUANT
        return base.with_name(f"{base.stem}-{safe}{base.suffix}")

    return path
