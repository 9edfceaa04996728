"""A request plus the operator's ``[sampling]`` defaults -> the engine's options
(options.GenOptions).

The request's own value wins; a field it leaves out or sends as null takes the default.
A neutral value is left at the options' default, which is never sent, so a request that
asks for nothing is greedy and costs the engine nothing: temperature absent or 0 is
greedy, and then top_p, top_k, min_p and the seed are left out too (they cannot change
an argmax). Penalties, logit bias and ``allowed_token_ids`` do change a greedy pick, so
they are kept either way. ``penalty_last_n`` follows llama.cpp: 0 turns the penalties off,
a penalty without a window uses :data:`DEFAULT_PENALTY_LAST_N`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from strata_core.contract.options import DEFAULT_ORDER, GenOptions, SamplingParams
from strata_core.ops.config import SamplingConfig
from strata_core.schema.requests import BaseRequest

#: The engine's window for penalties when neither the request nor the config gives one.
DEFAULT_PENALTY_LAST_N = 64

_PENALTIES = (
    # (request/config field, option, neutral value)
    ("repetition_penalty", "penalty_repeat", 1.0),
    ("frequency_penalty", "penalty_freq", 0.0),
    ("presence_penalty", "penalty_present", 0.0),
)

#: The request parameter behind each option, for errors that name it.
REQUEST_PARAMS = {
    "bias": "logit_bias", "allowed": "allowed_token_ids", "penalty_repeat": "repetition_penalty",
    "penalty_freq": "frequency_penalty", "penalty_present": "presence_penalty", "logprobs": "top_logprobs",
}  # fmt: skip


def resolve_seed(req_seed: int | None) -> int:
    """The request's seed, or a fresh one the server reports back to the client."""
    return req_seed if req_seed is not None else secrets.randbits(63)


def _pick(req: BaseRequest, defaults: SamplingConfig, name: str) -> Any:
    value = getattr(req, name)
    return getattr(defaults, name) if value is None else value


def gen_options(req: BaseRequest, defaults: SamplingConfig, *, seed: int, max_tokens: int | None) -> GenOptions:
    """The engine options for one choice of ``req``: its sampling and logprobs, with
    ``seed`` (normally ``resolve_seed(req.seed)``, used only when it samples) and
    ``max_tokens`` (the server's, once checked against the context)."""
    kw: dict[str, Any] = {}
    temperature = _pick(req, defaults, "temperature")
    if temperature:
        kw.update(temperature=temperature, seed=seed)
        for name in ("top_p", "top_k", "min_p"):
            if (value := _pick(req, defaults, name)) is not None:
                kw[name] = value
    window = _pick(req, defaults, "penalty_last_n")
    if window is None:
        window = DEFAULT_PENALTY_LAST_N
    if window > 0:
        for name, option, neutral in _PENALTIES:
            value = _pick(req, defaults, name)
            if value is not None and value != neutral:
                kw[option] = value
        if any(option in kw for _, option, _ in _PENALTIES):
            kw["penalty_last_n"] = window
    bias = {t: b for t, b in (req.logit_bias or {}).items() if b != 0.0}
    if bias:
        kw["bias"] = bias
    if req.allowed_token_ids is not None:
        kw["allowed"] = tuple(req.allowed_token_ids)
    kw.update(req.llama_sampling(defaults, sampled=bool(temperature)))
    alternatives = req.logprob_alternatives()
    mode = req.logprobs_mode if alternatives is not None and req.logprobs_mode else "raw"
    return GenOptions(max_tokens=max_tokens, sampling=SamplingParams(**kw), logprobs=alternatives, logprobs_mode=mode)


def max_new_tokens(req: BaseRequest, defaults: SamplingConfig) -> int | None:
    """The most tokens the request may generate (its own limit, else the operator's),
    or None: until a stop or the end of the context."""
    asked = req.max_new_tokens()
    return asked if asked is not None else defaults.max_tokens


def check_defaults(defaults: SamplingConfig) -> None:
    """Refuse defaults that contradict each other; each field's range is SamplingConfig's job.

    Raises ValueError naming the key, so a typo'd config cannot quietly change sampling.
    """
    if defaults.penalty_last_n == 0:
        for field, _, neutral in _PENALTIES:
            value = getattr(defaults, field)
            if value is not None and value != neutral:
                raise ValueError(
                    f"[sampling] penalty_last_n = 0 turns the penalties off, but {field} = "
                    f"{value} is set (remove {field}, or set penalty_last_n >= 1)"
                )


# ---- the layers of a model's defaults -------------------------------------------------

#: The GGUF ``general.sampling.*`` keys Strata applies (llama.cpp applies these too, with
#: ``sequence``, ``xtc_*`` and ``mirostat*``, samplers Strata lacks), and the field each sets.
GGUF_SAMPLING = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "penalty_last_n": "penalty_last_n", "penalty_repeat": "repetition_penalty",
                 "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold", "mirostat": "mirostat",
                 "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta", "sequence": "samplers"}  # fmt: skip

#: What each default is when nothing sets it (None: no limit).
STRATA_DEFAULTS: dict[str, Any] = {
    "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "penalty_last_n": DEFAULT_PENALTY_LAST_N, "max_tokens": None,
    "xtc_probability": 0.0, "xtc_threshold": 0.1, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
    "samplers": DEFAULT_ORDER,
}  # fmt: skip


@dataclass(frozen=True)
class ModelDefaults:
    """A model's sampling defaults, lowest layer first: Strata's, its GGUF's, the
    configuration's ([sampling] with [models.NAME.sampling] over it)."""

    sampling: SamplingConfig  # what a request leaves out takes from here
    sources: dict[str, str]  # field -> "strata", "gguf" or "config"
    ignored: dict[str, Any]  # GGUF keys Strata does not apply, or whose value is out of range

    def view(self) -> dict[str, dict[str, Any]]:
        """Each default's value and where it came from (/v1/models, ``strata doctor``)."""
        return {name: {"value": _or(getattr(self.sampling, name), default), "source": self.sources[name]}
                for name, default in STRATA_DEFAULTS.items()}  # fmt: skip


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def layer_defaults(gguf: dict[str, Any], config: SamplingConfig) -> ModelDefaults:
    """The defaults of a model whose GGUF says ``gguf`` (``general.sampling.`` stripped),
    under the configuration's ``config``: a key the configuration sets wins."""
    from_gguf: dict[str, Any] = {}
    ignored: dict[str, Any] = {}
    for key, value in gguf.items():
        name = GGUF_SAMPLING.get(key)
        try:
            if name is None:
                raise ValueError(key)
            if key == "sequence":  # llama.cpp's sampler names, ';' between them
                value = str(value).split(";")
            from_gguf[name] = getattr(SamplingConfig.model_validate({name: value}), name)
        except ValueError:  # pydantic's ValidationError is one
            ignored[key] = value
    configured = {n for n in STRATA_DEFAULTS if getattr(config, n) is not None}
    merged = config.model_copy(update={n: v for n, v in from_gguf.items() if n not in configured})
    sources = {n: "config" if n in configured else "gguf" if n in from_gguf else "strata" for n in STRATA_DEFAULTS}
    return ModelDefaults(merged, sources, ignored)
