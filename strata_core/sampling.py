"""A request plus the operator's ``[sampling]`` defaults -> GEN keys for the engine.

The request's own value wins; a field it leaves out or sends as null takes the default.
A neutral value is never sent, so a request that asks for nothing is greedy and costs the
engine nothing: temperature absent or 0 is greedy, and then top_p, top_k, min_p and the
seed are not sent either (they cannot change an argmax). Penalties, logit bias and
``allowed_token_ids`` do change a greedy pick, so they are sent either way.
``penalty_last_n`` follows llama.cpp: 0 turns the penalties off, a penalty without a window
uses :data:`DEFAULT_PENALTY_LAST_N`. ``logprobs=K`` is sent only when the request asks for
logprobs, and ``logprobs_mode`` only when it is ``processed`` (``raw`` is the engine's
default).
"""

from __future__ import annotations

import secrets
from typing import Any

from .config import SamplingConfig
from .requests import BaseRequest

#: The engine's window for penalties when neither the request nor the config gives one.
DEFAULT_PENALTY_LAST_N = 64

_PENALTIES = (
    # (request/config field, GEN key, neutral value)
    ("repetition_penalty", "penalty_repeat", 1.0),
    ("frequency_penalty", "penalty_freq", 0.0),
    ("presence_penalty", "penalty_present", 0.0),
)


def resolve_seed(req_seed: int | None) -> int:
    """The request's seed, or a fresh one the server reports back to the client."""
    return req_seed if req_seed is not None else secrets.randbits(63)


def _num(x: float) -> str:
    # repr round-trips exactly: the engine samples with the very float the client sent.
    return repr(float(x))


def _pick(req: BaseRequest, defaults: SamplingConfig, name: str) -> Any:
    value = getattr(req, name)
    return getattr(defaults, name) if value is None else value


def sampling_keys(
    req: BaseRequest, defaults: SamplingConfig, *, seed: int | None
) -> dict[str, str]:
    """GEN ``key=value`` pairs for ``req``, neutral ones left out.

    ``seed`` is the seed for this request, normally ``resolve_seed(req.seed)``; None falls
    back to ``req.seed``. It is sent only when the request samples (temperature > 0).
    """
    keys: dict[str, str] = {}
    max_tokens = req.max_new_tokens()
    if max_tokens is None:
        max_tokens = defaults.max_tokens
    if max_tokens is not None:
        keys["max_tokens"] = str(max_tokens)

    temperature = _pick(req, defaults, "temperature")
    if temperature:
        keys["temperature"] = _num(temperature)
        top_p = _pick(req, defaults, "top_p")
        if top_p is not None and top_p < 1.0:
            keys["top_p"] = _num(top_p)
        top_k = _pick(req, defaults, "top_k")
        if top_k:
            keys["top_k"] = str(top_k)
        min_p = _pick(req, defaults, "min_p")
        if min_p:
            keys["min_p"] = _num(min_p)

    window = _pick(req, defaults, "penalty_last_n")
    if window is None:
        window = DEFAULT_PENALTY_LAST_N
    if window > 0:
        for field, key, neutral in _PENALTIES:
            value = _pick(req, defaults, field)
            if value is not None and value != neutral:
                keys[key] = _num(value)
        if any(key in keys for _, key, _ in _PENALTIES):
            keys["penalty_last_n"] = str(window)

    if temperature:
        chosen = seed if seed is not None else req.seed
        if chosen is not None:
            keys["seed"] = str(chosen)

    bias = sorted((t, b) for t, b in (req.logit_bias or {}).items() if b != 0.0)
    if bias:
        keys["bias"] = ",".join(f"{t}:{_num(b)}" for t, b in bias)
    if req.allowed_token_ids is not None:
        keys["allowed"] = ",".join(str(t) for t in req.allowed_token_ids)

    top = req.logprob_alternatives()
    if top is not None:
        keys["logprobs"] = str(top)
        if req.logprobs_mode == "processed":
            keys["logprobs_mode"] = "processed"
    return keys


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
