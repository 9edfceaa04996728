"""Operator configuration: a TOML file validated by pydantic.

Precedence, highest first: command-line options, ``STRATA_<SECTION>_<KEY>`` environment
variables, the file, defaults. An unknown key or a bad value refuses to start, with a
message naming it.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from strata_core.schema.requests import MinP, Penalty, RepetitionPenalty, Temperature, TopP
from strata_core.schema.sampling import LlamaSampling

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


#: Most GPUs one model may use (llama.cpp's ``llama_max_devices()``).
MAX_DEVICES = 16
SPLIT_MODES = ("none", "layer", "tensor")


def comma_list(value: Any) -> Any:
    """A list key given as one string (an environment variable): its comma-separated items."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_key: str | None = None
    #: Most model engines running at once ([models.NAME] tables): loading another stops the
    #: one used longest ago that is idle; 0: no limit.
    max_loaded: int = Field(default=0, ge=0)
    #: Stop a model's engine after this many seconds without a request (it loads again on
    #: the next one); 0: never.
    idle_ttl_s: float = Field(default=0.0, ge=0.0)
    #: Let a model's engine sleep after this many seconds without a request: the process
    #: stops (its memory freed) and the next request wakes it, paying the load again; the
    #: model is listed as sleeping, not unloaded. One model or several; 0: never.
    sleep_idle_s: float = Field(default=0.0, ge=0.0)
    #: Largest request body, in bytes; a larger one is refused with 413.
    max_body_bytes: int = Field(default=8 << 20, ge=1024)
    #: Deepest nesting of arrays and objects in a request body (a JSON schema counts).
    max_json_depth: int = Field(default=64, ge=4, le=500)
    #: Engine requests (one per choice) allowed to wait for a slot; beyond that a request
    #: is refused with 429 and Retry-After. 0: no limit.
    max_queued: int = Field(default=256, ge=0)
    #: Seconds one request may run before it is cancelled and answered 504; 0: no limit.
    request_timeout: float = Field(default=600.0, ge=0)
    #: Serve every model in the hub's cache too (``strata models``; pulled ones included),
    #: each loaded on its first request, under max_loaded and idle_ttl_s.
    catalog: bool = False
    #: Let clients load and unload LoRA adapters by path (vLLM's /v1/load_lora_adapter,
    #: /v1/unload_lora_adapter): off, they answer 403, as vLLM keeps them off by default.
    lora_loading: bool = False
    #: Most media items (images, audio clips) one request may carry.
    max_media_per_request: int = Field(default=8, ge=0)
    #: Whether image and audio parts may name an http(s) URL the server fetches; off, only
    #: data URLs (base64) are taken.
    fetch_media: bool = False
    #: Largest media item fetched from a URL, in bytes.
    fetch_media_max_bytes: int = Field(default=20 << 20, ge=1024)
    #: Seconds a media fetch may take, redirects included.
    fetch_media_timeout: float = Field(default=10.0, gt=0)
    #: The hosts media is fetched from (``example.com``, or ``*.example.com`` for its
    #: subdomains), at the first URL and at every redirect; empty: any public host.
    media_domains: list[str] = Field(default_factory=list)
    #: Networks (CIDR, e.g. ``10.0.0.0/8``) whose addresses media may be fetched from
    #: though they are not public; empty: loopback, link-local, private, multicast and
    #: reserved addresses are refused.
    media_networks: list[str] = Field(default_factory=list)
    #: A file whose first line is the API key (a mounted secret); instead of api_key.
    api_key_file: str | None = None
    #: Origins a browser may call the API from (CORS), e.g. ``https://app.example.com``,
    #: or ``*`` for any; empty: no CORS headers, so browsers refuse cross-origin calls.
    cors_origins: list[str] = Field(default_factory=list)
    #: Serve HTTPS with this certificate (PEM, its chain after it) and private key.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: Export a trace span per request over OTLP/HTTP to this collector
    #: (``http://collector:4318/v1/traces``; needs ``strata[otel]``); None: no tracing.
    otlp_traces_endpoint: str | None = None
    #: The directory ``POST /slots/{id}?action=save|restore`` keep slots' caches in
    #: (llama-server's --slot-save-path); None: slot actions are refused (501).
    slot_save_path: str | None = None

    _lists = field_validator("media_domains", "media_networks", "cors_origins", mode="before")(comma_list)

    @field_validator("media_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for n in value:
            try:
                ipaddress.ip_network(n)
            except ValueError:
                raise ValueError(f"{n!r} is not a network in CIDR form (e.g. 10.0.0.0/8, fd00::/8)") from None
        return value

    @model_validator(mode="after")
    def _one_key_and_both_tls_files(self) -> ServerConfig:
        if self.api_key and self.api_key_file:
            raise ValueError("api_key and api_key_file are both set: keep one")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("TLS needs both ssl_certfile and ssl_keyfile (or neither)")
        return self

    def key(self) -> str | None:
        """The API key: api_key, or api_key_file's first line."""
        if not self.api_key_file:
            return self.api_key
        try:
            lines = Path(self.api_key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"[server] api_key_file = {self.api_key_file!r}: cannot read it: {exc.strerror}") from None
        if not lines or not lines[0].strip():
            raise ConfigError(f"[server] api_key_file = {self.api_key_file!r} is empty: write the key on its first line")
        return lines[0].strip()
    #: The web page at ``/`` (chat with the models, watch the engine work); false: ``/`` is a 404.
    web_ui: bool = True


#: The KV cache types llama.cpp takes (its ``--cache-type-k`` / ``-v`` names).
CACHE_TYPES = ("f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
CacheType = Literal["f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]


class LoraAdapter(_Section):
    """One LoRA adapter (a GGUF made for the model): applied at ``scale`` to every request
    that names no scales of its own (``lora`` in the request, as llama-server takes it)."""

    path: str = Field(min_length=1)
    scale: float = Field(default=1.0, allow_inf_nan=False)
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")

    def label(self) -> str:
        """Its name, else its file's stem."""
        return self.name or Path(self.path).stem


def _unique_names(adapters: list[LoraAdapter] | None) -> list[LoraAdapter] | None:
    names = [a.label() for a in adapters or ()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"LoRA adapter names must be unique; {twice[0]!r} appears more than once (set name)")
    return adapters


#: A CPU's slots under parallel = "auto": its step cost grows with every row.
CPU_PARALLEL = 4
MAX_PARALLEL = 256


def check_parallel(value: Any) -> Any:
    """``parallel``: "auto" or a whole number of slots in [1, MAX_PARALLEL]."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str) and value.strip().isdigit():  # STRATA_ENGINE_PARALLEL=8, --parallel 8
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'parallel = {value!r}: expected "auto" or a whole number of slots')
    if not 1 <= value <= MAX_PARALLEL:
        raise ValueError(f'parallel = {value}: expected 1 to {MAX_PARALLEL} slots, or "auto"')
    return value


def slots_for(parallel: int | Literal["auto"], on_gpu: bool) -> int | Literal["auto"]:
    """What the engine is asked for: "auto" is sized by the engine on a GPU (from its free
    memory), and is ``CPU_PARALLEL`` on a CPU."""
    if parallel == "auto" and not on_gpu:
        return CPU_PARALLEL
    return parallel


class EngineConfig(_Section):
    backend: str = "auto"
    model: str = "default"
    n_ctx: int = Field(default=4096, ge=64, le=1 << 20)
    #: Slots decoded together. "auto": on a GPU, as many as the device's free memory holds
    #: at n_ctx each (engine/fit.py; at most 256); on a CPU, ``CPU_PARALLEL``.
    parallel: int | Literal["auto"] = Field(default="auto")
    n_batch: int = Field(default=512, ge=16, le=65536)
    threads: int | None = Field(default=None, ge=1, le=1024)
    n_gpu_layers: int | None = Field(default=None, ge=-1)
    flash_attn: bool | None = None
    #: Greedy tokens picked by llama.cpp inside the decode (its backend sampling), so that
    #: only their ids leave the device, not a logits row each; a request with logprobs,
    #: sampling, bias, penalties or a grammar still gets its rows. None: on a GPU.
    device_sampling: bool | None = None
    devices: str | None = None
    #: How one model spreads over several GPUs (llama.cpp's ``--split-mode``): "none" (all
    #: on ``main_gpu``), "layer" (whole layers and their KV per GPU, in turn), "tensor" (each
    #: layer's weights and KV split across the GPUs, computed in parallel).
    split_mode: Literal["none", "layer", "tensor"] = "layer"
    #: The share of the model each GPU takes, in device order (llama.cpp's ``--tensor-split``,
    #: e.g. [3, 1]); unset: in proportion to each GPU's free memory.
    tensor_split: list[float] | None = None
    #: The GPU holding the whole model with split_mode "none" (an index among the visible ones).
    main_gpu: int = Field(default=0, ge=0, lt=MAX_DEVICES)
    #: Host memory (MiB) for slot caches saved when their slot moves on to another prompt,
    #: so a later request sharing their prefix loads them instead of prefilling; 0: none.
    prompt_cache_mib: int = Field(default=256, ge=0)
    #: How the KV cache stores keys and values (llama-server's -ctk / -ctv): a quantised
    #: type holds more context per slot in less memory; a quantised V needs flash attention.
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    #: LoRA adapters loaded with the model: [{path, scale, name}]
    lora: list[LoraAdapter] = Field(default_factory=list)
    _lora_names = field_validator("lora")(_unique_names)
    #: Use this llama-cpp-python instead of building one: a directory holding the
    #: ``llama_cpp`` package, or a wheel file.
    llama_cpp: str | None = None
    #: A Jinja chat template file used instead of the one the GGUF carries (or lacks).
    chat_template: str | None = None
    #: The model's multimodal projector (an ``mmproj`` GGUF, llama-server's ``--mmproj``):
    #: with it the model takes images (and audio, where the projector encodes it).
    mmproj: str | None = None

    @field_validator("parallel", mode="before")
    @classmethod
    def _slots(cls, value: Any) -> Any:
        return check_parallel(value)

    @field_validator("split_mode", mode="before")
    @classmethod
    def _row_is_superseded(cls, value: Any) -> Any:
        if value == "row":
            raise ValueError(
                '"row" is superseded by "tensor" in this llama.cpp (each layer split across the '
                'GPUs, in parallel): use split_mode = "tensor", or "layer"'
            )
        return value

    @field_validator("tensor_split", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):  # STRATA_ENGINE_TENSOR_SPLIT="3,1", like --tensor-split
            return [v for v in value.replace("/", ",").split(",") if v.strip()]
        return value

    @model_validator(mode="after")
    def _split_fits(self) -> EngineConfig:
        split = self.tensor_split
        if split is not None:
            if not split or len(split) > MAX_DEVICES:
                raise ValueError(f"tensor_split = {split}: expected 1 to {MAX_DEVICES} proportions, one per GPU")
            if any(not 0.0 <= x < float("inf") for x in split) or not any(split):
                raise ValueError(f"tensor_split = {split}: expected proportions >= 0, at least one above 0")
            if self.split_mode == "none":
                raise ValueError(
                    f'tensor_split = {split} has no effect with split_mode = "none" (the model stays on '
                    'main_gpu): drop tensor_split, or set split_mode = "layer" or "tensor"'
                )
        if self.main_gpu and self.split_mode != "none":
            raise ValueError(
                f'main_gpu = {self.main_gpu} acts only with split_mode = "none" (split_mode is '
                f'"{self.split_mode}", which uses every visible GPU): drop main_gpu, or set split_mode = "none"'
            )
        n = len([d for d in (self.devices or "").split(",") if d.strip()])
        if n and split is not None and len(split) != n:
            raise ValueError(f"tensor_split = {split} has {len(split)} proportions for devices = {self.devices!r} "
                             f"({n} GPUs): give one per device")  # fmt: skip
        if n and self.main_gpu >= n:
            raise ValueError(f"main_gpu = {self.main_gpu} is not among devices = {self.devices!r}: "
                             f"expected an index in 0..{n - 1} (of the devices listed, in their order)")  # fmt: skip
        return self


class SamplingConfig(_Section, LlamaSampling):
    """Defaults for fields a request leaves out; the request always wins (llama-server's
    further fields, by its names: LlamaSampling)."""

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
    #: backend runs on its matrix-vector kernels, and there 7 paid where 4 hardly did
    #: (bench/results/2026-12-03-cuda-h200-window-shape.md). Where rows cost more, the
    #: adaptive policy proposes fewer.
    k: int = Field(default=7, ge=1, le=32)
    #: mode "draft": a GGUF sharing the target's vocabulary (a path, an alias or an hf: reference).
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


class ModelConfig(_Section):
    """One model of a server serving several (``[models.NAME]``; clients name it NAME):
    its own engine process. A key left out is [engine]'s; ``speculative`` replaces the
    [speculative] table for this model, ``sampling`` sets keys of [sampling] for it."""

    path: str = Field(min_length=1)  # a GGUF path, an alias, or hf:OWNER/REPO[:QUANT][@REVISION]
    backend: str | None = None
    #: a Jinja chat template file instead of the GGUF's
    chat_template: str | None = None
    parallel: int | Literal["auto"] | None = None
    n_ctx: int | None = Field(default=None, ge=64, le=1 << 20)
    threads: int | None = Field(default=None, ge=1, le=1024)
    mmproj: str | None = None  # its multimodal projector GGUF ([engine] mmproj)
    speculative: SpeculativeConfig | None = None
    #: LoRA adapters loaded with this model (else [engine] lora): [{path, scale, name}]
    lora: list[LoraAdapter] | None = None
    _lora_names = field_validator("lora")(_unique_names)
    #: false: the engine starts on the model's first request instead of with the server.
    preload: bool = True
    #: sampling defaults of this model's own, each over [sampling]'s (``[models.NAME.sampling]``)
    sampling: SamplingConfig | None = None

    @field_validator("parallel", mode="before")
    @classmethod
    def _slots(cls, value: Any) -> Any:
        return check_parallel(value)


class ClusterConfig(_Section):
    """Serve through Ray Serve replicas (``strata serve --replicas N``; ``pip install
    'strata[ray]'``), each replica one engine of the same model."""

    #: replicas of the engine; 0: no Ray, the engine runs in the server's process tree.
    replicas: int = Field(default=0, ge=0, le=1024)
    #: an existing Ray cluster (``ray://host:10001`` or ``auto``); None: start a local one.
    address: str | None = None
    #: autoscale between these many replicas (both set), aiming at this many requests
    #: in flight per replica.
    min_replicas: int | None = Field(default=None, ge=0)
    max_replicas: int | None = Field(default=None, ge=1)
    target_ongoing_requests: float = Field(default=2.0, gt=0)
    #: how a request picks its replica: ``prefix`` (the replica that served its prompt's
    #: leading text, unless that one is busy), ``least_loaded`` (Ray Serve's default: the
    #: less loaded of two), ``random`` (a baseline for benchmarks).
    routing: Literal["prefix", "least_loaded", "random"] = "prefix"
    #: CPUs reserved for each replica on the cpu backend (its engine's threads).
    cpus_per_replica: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> ClusterConfig:
        lo, hi = self.min_replicas, self.max_replicas
        if (lo is None) != (hi is None):
            raise ValueError("autoscaling needs both min_replicas and max_replicas (or neither)")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_replicas = {lo} is above max_replicas = {hi}")
        return self


class ResponsesConfig(_Section):
    """The Responses API (/v1/responses)."""

    #: Responses kept in memory for ``store: true`` and ``previous_response_id`` (the
    #: oldest is dropped first); 0 keeps none, and both parameters are refused.
    store_size: int = Field(default=256, ge=0, le=1_000_000)


class ToolsConfig(_Section):
    """Tool calling on models whose chat template never reads ``tools``."""

    #: Show such a model the tools in its system message and constrain its reply to a
    #: JSON object (a response or calls; text/generic_tools.py); false: tools on such a
    #: model are refused with a 400. A template that reads tools keeps its own format.
    generic: bool = True


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)

    def for_model(self, name: str) -> Config:
        """This configuration as one model's engine sees it: [models.NAME] over [engine]
        (and over [speculative] when it has its own)."""
        m = self.models[name]
        engine = {"model": m.path, "backend": m.backend, "parallel": m.parallel, "n_ctx": m.n_ctx,
                  "threads": m.threads, "chat_template": m.chat_template, "lora": m.lora, "mmproj": m.mmproj}  # fmt: skip
        update = {k: v for k, v in engine.items() if v is not None}
        out = self.model_copy(update={"engine": self.engine.model_copy(update=update), "models": {}})
        if m.speculative is not None:
            out = out.model_copy(update={"speculative": m.speculative})
        if m.sampling is not None:  # key by key: what the model's table leaves out is [sampling]'s
            own = m.sampling.model_dump(exclude_unset=True)
            out = out.model_copy(update={"sampling": self.sampling.model_copy(update=own)})
        return out


def check_split(split_mode: str, flash_attn: bool | None, n_gpu_layers: int) -> None:
    """Refuse at start what llama.cpp refuses for ``split_mode``, given the flash attention
    and offload the engine gets (the configuration's, or the backend's defaults); the KV
    cache types tensor mode needs are check_cache_types' to refuse."""
    if split_mode != "tensor":
        return
    if flash_attn is False:
        raise ConfigError(
            '[engine] split_mode = "tensor" needs flash attention, which is off (flash_attn, or the '
            'backend\'s default): set flash_attn = true, or split_mode = "layer"'
        )
    if n_gpu_layers == 0:
        raise ConfigError(
            '[engine] split_mode = "tensor" splits the layers on the GPUs, and n_gpu_layers = 0 (or the '
            'backend\'s default) puts none there: use a GPU backend, or split_mode = "layer"'
        )


def check_cache_types(cache_type_k: str, cache_type_v: str, flash_attn: bool | None, split_mode: str) -> None:
    """Refuse at start the KV cache types llama.cpp refuses, given the flash attention the
    engine gets (the configuration's, or the backend's default) and the split mode."""
    if split_mode == "tensor":
        for key, value in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v)):
            if value != "f16":
                raise ConfigError(f'[engine] {key} = "{value}": split_mode = "tensor" needs an f16 KV cache '
                                  f'(set {key} = "f16", or split_mode = "layer")')  # fmt: skip
    if cache_type_v not in ("f16", "bf16") and flash_attn is False:
        raise ConfigError(
            f'[engine] cache_type_v = "{cache_type_v}" is quantised, which llama.cpp allows only with flash '
            'attention, and flash_attn is off (flash_attn, or the backend\'s default): set flash_attn = true, '
            'or cache_type_v = "f16"'
        )


def split_settings(split_mode: str, tensor_split: list[float] | None, main_gpu: int) -> EngineConfig:
    """The split keys under the configuration's rules, for an engine that any client may
    start (ConfigError naming the key)."""
    keys = {"split_mode": split_mode, "tensor_split": tensor_split, "main_gpu": main_gpu}
    return _validate({"engine": keys}, "engine options").engine


SECTIONS = ("server", "engine", "sampling", "speculative", "cluster", "responses", "tools")
#: Short environment names from the design, e.g. STRATA_BACKEND=cuda.
ENV_SHORTHANDS = {"STRATA_BACKEND": ("engine", "backend"), "STRATA_MODEL": ("engine", "model")}


def _describe(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        if e["type"] == "extra_forbidden":
            table, known = _table_at(loc[:-1])
            where = f"[{table}] " if table else ""
            lines.append(
                f"{origin}: {where}unknown key {loc[-1]!r} (known: {', '.join(known)})"
            )
        elif e["type"] == "value_error" and isinstance(e.get("input"), Mapping):
            # a rule across a section's keys: its message names them
            where = f"[{loc[0]}] " if loc else ""
            lines.append(f"{origin}: {where}{e['msg'].removeprefix('Value error, ')}")
        else:
            key = ".".join(loc)
            lines.append(f"{origin}: {key} = {e.get('input')!r}: {e['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def _table_at(path: list[str]) -> tuple[str, list[str]]:
    """The TOML table at ``path`` (``["models", "big", "speculative"]``) and its keys."""
    cls: type[BaseModel] = Config
    parts = iter(path)
    for part in parts:
        if cls is Config and part == "models":
            next(parts, None)  # the model's NAME
            cls = ModelConfig
            continue
        ann = cls.model_fields[part].annotation if part in cls.model_fields else None
        table = [t for t in (ann, *typing.get_args(ann)) if isinstance(t, type) and issubclass(t, BaseModel)]
        cls = table[0] if table else cls
    return ".".join(path), list(cls.model_fields)


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
