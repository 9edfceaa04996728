"""The engine contract: every option a GEN command carries, typed, in one place
(docs/architecture.md, "Engine protocol").

The server builds one ``GenOptions`` from the validated request and the operator's
defaults (api/sampling_defaults.py); ``encode`` writes it as GEN ``key=value`` pairs,
leaving out every value equal to its default, so a plain greedy request costs the engine
nothing to read; the engine ``decode``s the pairs back into the same type. A value is checked where it is
built (``__post_init__``: ranges that hold on any model) and against the model by
``check`` (token ids against the vocabulary) — on both sides: the server answers a 400
naming the request's parameter, and the engine refuses what any other client sends.

A key's name on the wire is its field's name; its encoding is the field's ``Codec``.
Adding a GEN option is one field here and its use where it acts.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

#: Most logprob alternatives per token (OpenAI's ``top_logprobs`` limit).
MAX_ALTERNATIVES = 20
LOGPROBS_MODES = ("raw", "processed")
SPEC_MODES = ("off", "ngram", "draft")  # "draft" needs an engine started with a draft model


class OptionError(ValueError):
    """A GEN option that is malformed or out of range; ``key`` is its name on the wire."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class Codec(NamedTuple):
    encode: Callable[[Any], str]
    decode: Callable[[str], Any]


def _number(text: str) -> float:
    return float(text)  # repr() below round-trips: the engine gets the very float sent


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t)


def _pairs(text: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for item in text.split(","):
        tok, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"expected id:value, got {item!r}")
        out[int(tok)] = float(value)
    return out


def _texts_encode(texts: tuple[str, ...]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(texts)).encode()).decode()


def _texts_decode(text: str) -> tuple[str, ...]:
    items = json.loads(base64.urlsafe_b64decode(text.encode()))
    if not isinstance(items, list) or not all(isinstance(t, str) for t in items):
        raise ValueError("expected a list of strings")
    return tuple(items)


INT = Codec(str, int)
FLOAT = Codec(lambda x: repr(float(x)), _number)
TEXT = Codec(str, str)
FLAG = Codec(lambda b: "1" if b else "0", lambda s: {"1": True, "0": False}[s])
IDS = Codec(lambda ids: ",".join(str(t) for t in ids), _ids)
TEXTS = Codec(_texts_encode, _texts_decode)  # strings of any bytes, as base64 of a JSON list
BIAS = Codec(lambda m: ",".join(f"{t}:{float(v)!r}" for t, v in sorted(m.items())), _pairs)


def _opt(default: Any, codec: Codec) -> Any:
    if isinstance(default, dict):  # a mutable default: each instance gets a copy
        return field(default_factory=lambda: dict(default), metadata={"codec": codec})
    return field(default=default, metadata={"codec": codec})


def _check(key: str, ok: bool, value: object, expected: str) -> None:
    if not ok:
        raise OptionError(key, f"{key}={value} is out of range: expected {expected}")


def _one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(key, f"{key}={value!r} is not supported: expected {', '.join(choices[:-1])} or {choices[-1]}")


#: llama.cpp's sampler letters (common/sampling.cpp) and names (llama-server's ``samplers``).
STAGES: Mapping[str, str] = {
    "e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
    "m": "min_p", "x": "xtc", "t": "temperature", "a": "adaptive_p", "i": "infill",
}  # fmt: skip
#: The chain's order when a request gives none: llama.cpp's, but min_p before top_p (Strata's
#: order since its first sampler; seeded replies of the same request stay the same).
DEFAULT_ORDER = "edskympxt"
DRY_BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's default sequence breakers


@dataclass(frozen=True)
class SamplingParams:
    """The sampling chain's settings (engine/sampler.py applies them; the defaults are
    neutral: greedy over the raw row)."""

    temperature: float = _opt(0.0, FLOAT)
    top_k: int = _opt(0, INT)
    top_p: float = _opt(1.0, FLOAT)
    min_p: float = _opt(0.0, FLOAT)
    penalty_repeat: float = _opt(1.0, FLOAT)
    penalty_freq: float = _opt(0.0, FLOAT)
    penalty_present: float = _opt(0.0, FLOAT)
    penalty_last_n: int = _opt(0, INT)
    seed: int = _opt(0, INT)
    bias: Mapping[int, float] = _opt({}, BIAS)
    allowed: tuple[int, ...] | None = _opt(None, IDS)
    # llama.cpp's further samplers (engine/stages.py, engine/dry.py); the defaults are off
    typical_p: float = _opt(1.0, FLOAT)
    top_n_sigma: float = _opt(-1.0, FLOAT)
    xtc_probability: float = _opt(0.0, FLOAT)
    xtc_threshold: float = _opt(0.1, FLOAT)
    dry_multiplier: float = _opt(0.0, FLOAT)
    dry_base: float = _opt(1.75, FLOAT)
    dry_allowed_length: int = _opt(2, INT)
    dry_penalty_last_n: int = _opt(64, INT)  # -1: the whole context
    dry_sequence_breakers: tuple[str, ...] = _opt(DRY_BREAKERS, TEXTS)
    dynatemp_range: float = _opt(0.0, FLOAT)
    dynatemp_exponent: float = _opt(1.0, FLOAT)
    mirostat: int = _opt(0, INT)
    mirostat_tau: float = _opt(5.0, FLOAT)
    mirostat_eta: float = _opt(0.1, FLOAT)
    adaptive_target: float = _opt(-1.0, FLOAT)
    adaptive_decay: float = _opt(0.9, FLOAT)
    min_keep: int = _opt(0, INT)
    #: the stages' order as llama.cpp's letters (``STAGES``); None: ``DEFAULT_ORDER``
    samplers: str | None = _opt(None, TEXT)

    def __post_init__(self) -> None:
        _check("temperature", 0.0 <= self.temperature < math.inf, self.temperature, ">= 0")
        _check("top_k", self.top_k >= 0, self.top_k, ">= 0 (0 = no cut)")
        _check("top_p", 0.0 <= self.top_p <= 1.0, self.top_p, "in [0, 1]")
        _check("min_p", 0.0 <= self.min_p <= 1.0, self.min_p, "in [0, 1]")
        _check("penalty_repeat", 0.0 < self.penalty_repeat < math.inf, self.penalty_repeat, "> 0")
        for name in ("penalty_freq", "penalty_present"):
            _check(name, math.isfinite(getattr(self, name)), getattr(self, name), "finite")
        _check("penalty_last_n", self.penalty_last_n >= 0, self.penalty_last_n, ">= 0 (0 = off)")
        _check("seed", 0 <= self.seed < 1 << 64, self.seed, "in [0, 2**64)")
        for i, v in self.bias.items():
            _check("bias", i >= 0, i, "a token id >= 0")
            _check("bias", v < math.inf, f"{i}:{v}", "a finite value or -inf")
        if self.allowed is not None:
            _check("allowed", len(self.allowed) > 0, "", "at least one token id")
        self._check_stages()

    def _check_stages(self) -> None:
        """llama-server's ranges for its further samplers (and none that cuts every candidate)."""
        for name in ("typical_p", "xtc_probability", "xtc_threshold"):
            _check(name, 0.0 <= getattr(self, name) <= 1.0, getattr(self, name), "in [0, 1]")
        for name in ("top_n_sigma", "dynatemp_exponent", "mirostat_tau", "mirostat_eta", "adaptive_target"):
            _check(name, math.isfinite(getattr(self, name)), getattr(self, name), "finite")
        for name in ("dry_multiplier", "dynatemp_range", "mirostat_tau", "mirostat_eta"):
            _check(name, 0.0 <= getattr(self, name) < math.inf, getattr(self, name), ">= 0")
        _check("dry_base", 1.0 <= self.dry_base < math.inf, self.dry_base, ">= 1")
        _check("dry_allowed_length", self.dry_allowed_length >= 0, self.dry_allowed_length, ">= 0")
        _check("dry_penalty_last_n", self.dry_penalty_last_n >= -1, self.dry_penalty_last_n,
               ">= -1 (0 = off, -1 = the whole context)")  # fmt: skip
        _check("dry_sequence_breakers", bool(self.dry_sequence_breakers) and all(self.dry_sequence_breakers),
               list(self.dry_sequence_breakers), "a non-empty list of non-empty strings")  # fmt: skip
        _check("mirostat", self.mirostat in (0, 1, 2), self.mirostat, "0 (off), 1 or 2")
        _check("adaptive_target", self.adaptive_target <= 1.0, self.adaptive_target, "<= 1 (< 0 = off)")
        _check("adaptive_decay", 0.0 <= self.adaptive_decay <= 0.99, self.adaptive_decay, "in [0, 0.99]")
        _check("min_keep", self.min_keep >= 0, self.min_keep, ">= 0")
        if self.samplers is not None:
            bad = [c for c in self.samplers if c not in STAGES]
            _check("samplers", bool(self.samplers) and not bad, repr(self.samplers),
                   f"at least one stage, among {', '.join(STAGES.values())}")  # fmt: skip

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        neutral = (self.penalty_repeat, self.penalty_freq, self.penalty_present) == (1.0, 0.0, 0.0)
        return self.penalty_last_n > 0 and not neutral and (self.samplers is None or "e" in self.samplers)

    @property
    def order(self) -> str:
        return DEFAULT_ORDER if self.samplers is None else self.samplers

    @property
    def dry(self) -> bool:
        """DRY is on (it adjusts the row, as the penalties do, greedy or not)."""
        on = self.dry_multiplier != 0.0 and self.dry_penalty_last_n != 0
        return on and (self.samplers is None or "d" in self.samplers)

    @property
    def infill(self) -> bool:
        """A sampled pick runs llama.cpp's infill stage (it reads the vocabulary)."""
        return not self.greedy and self.samplers is not None and "i" in self.samplers

    @property
    def extended(self) -> bool:
        """A sampled pick goes through engine/stages.py's chain: a stage beyond top_k /
        min_p / top_p / temperature is on, or the order is the request's own."""
        return (self.samplers is not None or self.mirostat != 0 or self.min_keep > 1 or self.typical_p < 1.0
                or self.top_n_sigma > 0.0 or self.dynatemp_range > 0.0
                or (self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5))  # fmt: skip

    @property
    def stateful(self) -> bool:
        """Its picks keep state from token to token (Mirostat's mu, adaptive-p's average)."""
        adaptive = self.adaptive_target >= 0.0 and "a" in self.order
        return not self.greedy and (self.mirostat != 0 or adaptive)

    @property
    def windowless(self) -> bool:
        """Speculative windows are off for it: a stage whose pick is not a function of the
        row alone (DRY reads tokens a window has not kept, XTC and Mirostat draw, state)."""
        return self.dry or (not self.greedy and self.extended)

    @property
    def history_n(self) -> int:
        """How many of the latest tokens the row's stages read (penalties, DRY); -1: all."""
        n = self.penalty_last_n if self.penalised else 0
        if self.dry:
            n = -1 if self.dry_penalty_last_n < 0 else max(n, self.dry_penalty_last_n)
        return n

    @property
    def biased_argmax(self) -> bool:
        """Greedy over the raw row plus the logit bias, nothing else (``ignore_eos`` is a bias)."""
        return self.greedy and self.allowed is None and not self.penalised and not self.dry

    @property
    def plain(self) -> bool:
        """Greedy over the raw row: the default request, which pays for one argmax."""
        return self.biased_argmax and not self.bias


@dataclass(frozen=True)
class GenOptions:
    """One GEN request's options besides its prompt."""

    #: most tokens to generate; None: until a stop or the end of the context
    max_tokens: int | None = _opt(None, INT)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: token ids that end the request besides the model's end-of-generation tokens
    stop_ids: tuple[int, ...] = _opt((), IDS)
    #: report each token's logprob and this many alternatives; None: no LP lines
    logprobs: int | None = _opt(None, INT)
    #: ``raw``: the model's distribution (before bias, penalties, grammar, temperature;
    #: renormalised over ``allowed``); ``processed``: the one the token was drawn from
    logprobs_mode: Literal["raw", "processed"] = _opt("raw", TEXT)
    #: constrained decoding (protocol.encode_grammar: ``json_object`` or ``<kind>:<b64>``)
    grammar: str | None = _opt(None, TEXT)
    spec: Literal["off", "ngram", "draft"] = _opt("off", TEXT)
    #: decode in a batch of its own, without windows, so a seeded request replays exactly
    isolate: bool = _opt(False, FLAG)
    #: reasoning budget (engine/budget.py): after this many reasoning tokens the engine emits
    #: ``think_close`` (the closing marker's ids); ``think_open``: the prompt opened the block
    think_budget: int | None = _opt(None, INT)
    think_close: tuple[int, ...] = _opt((), IDS)
    think_open: bool = _opt(False, FLAG)
    #: LoRA adapter scales by adapter id (an adapter left out: 0); empty: the configured scales
    lora: Mapping[int, float] = _opt({}, BIAS)

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            _check("max_tokens", self.max_tokens >= 1, self.max_tokens, ">= 1")
        if self.logprobs is not None:
            _check("logprobs", 0 <= self.logprobs <= MAX_ALTERNATIVES, self.logprobs, f"0..{MAX_ALTERNATIVES}")
        _one_of("logprobs_mode", self.logprobs_mode, LOGPROBS_MODES)
        _one_of("spec", self.spec, SPEC_MODES)
        for i, v in self.lora.items():
            _check("lora", i >= 0 and math.isfinite(v), f"{i}:{v}", "adapter ids >= 0 with finite scales")
        if self.think_budget is not None:
            _check("think_budget", self.think_budget >= 0, self.think_budget, ">= 0")
            _check("think_close", bool(self.think_close), "", "the closing marker's token ids, with think_budget")

    def check(self, n_vocab: int) -> None:
        """Refuse token ids outside a vocabulary of ``n_vocab`` (OptionError naming the key)."""
        s = self.sampling
        for key, ids in (("bias", s.bias), ("allowed", s.allowed or ()), ("stop_ids", self.stop_ids),
                         ("think_close", self.think_close)):  # fmt: skip
            bad = [t for t in ids if not 0 <= t < n_vocab]
            _check(key, not bad, bad[:1] and bad[0], f"token ids in [0, {n_vocab}) (the vocabulary)")

    def encode(self) -> dict[str, str]:
        """The GEN ``key=value`` pairs, values equal to their defaults left out."""
        return {f.name: f.metadata["codec"].encode(v) for obj in (self, self.sampling) for f, v in _set(obj)}

    @classmethod
    def decode(cls, keys: Mapping[str, str]) -> GenOptions:
        """The options GEN ``keys`` spell (unknown keys are the caller's: ``unknown``)."""
        parts: dict[type, dict[str, Any]] = {cls: {}, SamplingParams: {}}
        for key, text in keys.items():
            owner = OWNERS.get(key)
            if owner is None:
                continue
            codec = CODECS[key]
            try:
                parts[owner][key] = codec.decode(text)
            except (ValueError, KeyError):
                raise OptionError(key, f"{key}={text!r} is not valid: expected {_EXPECTED[codec]}") from None
        return cls(sampling=SamplingParams(**parts[SamplingParams]), **parts[cls])

    @staticmethod
    def unknown(keys: Iterable[str]) -> list[str]:
        """The keys no option has (an engine warns about them)."""
        return [k for k in keys if k not in OWNERS]

    def replace(self, **changes: Any) -> GenOptions:
        return dataclasses.replace(self, **changes)


def _set(obj: Any) -> Iterable[tuple[dataclasses.Field[Any], Any]]:
    for f in dataclasses.fields(obj):
        if "codec" not in f.metadata:
            continue
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if (v := getattr(obj, f.name)) != default:
            yield f, v


_EXPECTED = {
    INT: "an integer", FLOAT: "a number", TEXT: "text", FLAG: "0 or 1", IDS: "token ids id,id,...",
    BIAS: "id:value,...", TEXTS: "a base64 JSON list of strings",
}  # fmt: skip
#: Every GEN key: the dataclass that holds it, and its codec.
OWNERS: Mapping[str, type] = {
    f.name: cls for cls in (GenOptions, SamplingParams) for f in dataclasses.fields(cls) if "codec" in f.metadata
}
CODECS: Mapping[str, Codec] = {
    f.name: f.metadata["codec"] for cls in (GenOptions, SamplingParams) for f in dataclasses.fields(cls)
    if "codec" in f.metadata
}  # fmt: skip
