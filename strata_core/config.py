"""Operator configuration: a TOML file validated by pydantic.

Precedence, highest first: command-line options, ``STRATA_<SECTION>_<KEY>`` environment
variables, the file, defaults. An unknown key or a bad value refuses to start, with a
message naming it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from strata_core.requests import MinP, Penalty, RepetitionPenalty, Temperature, TopP

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_key: str | None = None


class EngineConfig(_Section):
    backend: str = "auto"
    model: str = "default"
    n_ctx: int = Field(default=4096, ge=64, le=1 << 20)
    parallel: int = Field(default=4, ge=1, le=256)
    n_batch: int = Field(default=512, ge=16, le=65536)
    threads: int | None = Field(default=None, ge=1, le=1024)
    n_gpu_layers: int | None = Field(default=None, ge=-1)
    flash_attn: bool | None = None
    devices: str | None = None
    #: Host memory (MiB) for slot caches saved when their slot moves on to another prompt,
    #: so a later request sharing their prefix loads them instead of prefilling; 0: none.
    prompt_cache_mib: int = Field(default=256, ge=0)
    #: Use this llama-cpp-python instead of building one: a directory holding the
    #: ``llama_cpp`` package, or a wheel file.
    llama_cpp: str | None = None


class SamplingConfig(_Section):
    """Defaults for fields a request leaves out; the request always wins."""

    temperature: Temperature = None
    top_p: TopP = None
    top_k: int | None = Field(default=None, ge=0)
    min_p: MinP = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    repetition_penalty: RepetitionPenalty = None
    penalty_last_n: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    #: A request that names a seed is decoded in a batch of its own (no speculative
    #: windows), so it replays token for token whatever runs beside it, on backends whose
    #: kernels depend on the batch's shape. Costs one extra decode per step per such request.
    exact_seed_replay: bool = True


class SpeculativeConfig(_Section):
    """Speculative decoding: n-gram (prompt lookup) drafts, or a draft model's."""

    mode: Literal["off", "ngram", "draft"] = "off"
    #: most tokens one window proposes; 7 fills a batch of 8 rows, which llama.cpp's CUDA
    #: backend runs on its matrix-vector kernels (measured on the H200: copy-heavy x1.92 at
    #: k=7, x1.02 at k=4). Where rows cost more, the adaptive policy proposes fewer.
    k: int = Field(default=7, ge=1, le=32)
    #: mode "draft": a GGUF sharing the target's vocabulary (a path or an alias).
    draft_model: str | None = None
    #: mode "draft": the confidence gate tau; a proposal whose draft probability is
    #: below it ends the window (docs/architecture.md, "Speculative decoding"). 0 offers every draw.
    threshold: float = Field(default=0.1, ge=0.0, le=1.0)
    #: mode "ngram": open a window only where it pays, judged from the measured cost of a
    #: step's rows and each request's acceptance; false opens one at every n-gram match.
    adaptive: bool = True

    @model_validator(mode="after")
    def _draft_needs_a_model(self) -> SpeculativeConfig:
        if self.mode == "draft" and not self.draft_model:
            raise ValueError(
                'mode = "draft" needs draft_model: set [speculative] draft_model to a GGUF '
                "sharing the model's vocabulary (or STRATA_SPECULATIVE_DRAFT_MODEL, or "
                "strata serve --draft-model PATH)"
            )
        return self


class ResponsesConfig(_Section):
    """The Responses API (/v1/responses)."""

    #: Responses kept in memory for ``store: true`` and ``previous_response_id`` (the
    #: oldest is dropped first); 0 keeps none, and both parameters are refused.
    store_size: int = Field(default=256, ge=0, le=1_000_000)


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)


SECTIONS = ("server", "engine", "sampling", "speculative", "responses")
#: Short environment names from the design, e.g. STRATA_BACKEND=cuda.
ENV_SHORTHANDS = {"STRATA_BACKEND": ("engine", "backend"), "STRATA_MODEL": ("engine", "model")}


def _describe(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        if e["type"] == "extra_forbidden":
            section = loc[0] if len(loc) > 1 else None
            known = (
                Config.model_fields[section].annotation.model_fields  # type: ignore[union-attr]
                if section in Config.model_fields
                else Config.model_fields
            )
            where = f"[{section}] " if section else ""
            lines.append(
                f"{origin}: {where}unknown key {loc[-1]!r} (known: {', '.join(known)})"
            )
        else:
            key = ".".join(loc)
            lines.append(f"{origin}: {key} = {e.get('input')!r}: {e['msg']}")
    return "\n".join(lines)


def _env_layer(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    layer: dict[str, dict[str, str]] = {}
    for var, value in env.items():
        if var in ENV_SHORTHANDS:
            section, key = ENV_SHORTHANDS[var]
            layer.setdefault(section, {})[key] = value
            continue
        for section in SECTIONS:
            prefix = f"STRATA_{section.upper()}_"
            if var.startswith(prefix):
                layer.setdefault(section, {})[var[len(prefix) :].lower()] = value
    return layer


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _validate(data: Mapping[str, Any], origin: str) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err, origin)) from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """File, then environment, then command-line overrides (``{"engine": {"backend": ..}}``)."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get("STRATA_CONFIG")
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
        _validate(data, str(p))
    env_layer = _env_layer(env)
    if env_layer:
        _validate(env_layer, "environment (STRATA_*)")
        data = _merge(data, env_layer)
    if overrides:
        clean = {s: {k: v for k, v in kv.items() if v is not None} for s, kv in overrides.items()}
        data = _merge(data, clean)
    return _validate(data, str(path) if path else "configuration")
