"""llama-server's further sampling fields (typical_p, top_n_sigma, XTC, DRY, dynamic
temperature, Mirostat, adaptive-p, min_keep, samplers), by its names and ranges: one
set of fields that requests (chat, completions), the operator's ``[sampling]`` defaults
and Ollama's ``options`` share.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError

from strata_core.contract.options import STAGES

#: Most DRY sequence breakers a request may send (each is matched against the whole vocabulary).
MAX_BREAKERS = 64

Unit = Annotated[float | None, Field(ge=0.0, le=1.0)]
NonNegative = Annotated[float | None, Field(ge=0.0, allow_inf_nan=False)]
Finite = Annotated[float | None, Field(allow_inf_nan=False)]

#: The fields, in llama-server's names (all the GEN options' names too).
FIELDS = (
    "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "dynatemp_range",
    "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay",
    "min_keep", "samplers",
)  # fmt: skip
#: Those that change a greedy pick too (the rest are cuts and draws of a sampled one).
GREEDY_TOO = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers")


def _names() -> dict[str, str]:
    """llama-server's sampler names and aliases (kebab-case, no dash, nucleus, temp, typ)
    -> its letter."""
    out: dict[str, str] = {}
    for letter, name in STAGES.items():
        out |= {name: letter, name.replace("_", "-"): letter, name.replace("_", ""): letter}
    return out | {"nucleus": "p", "temp": "t", "typ": "y", "typical_p": "y"}


_NAMES = _names()


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message)


class LlamaSampling(BaseModel):
    """The fields; None leaves each to the default (the operator's, else off)."""

    typical_p: Unit = None
    top_n_sigma: Finite = None  # <= 0: off
    xtc_probability: Unit = None
    xtc_threshold: Unit = None  # > 0.5: off
    dry_multiplier: NonNegative = None
    dry_base: Annotated[float | None, Field(ge=1.0, allow_inf_nan=False)] = None
    dry_allowed_length: int | None = Field(default=None, ge=0)
    dry_penalty_last_n: int | None = Field(default=None, ge=-1)  # -1: the whole context
    dry_sequence_breakers: list[str] | None = None
    dynatemp_range: NonNegative = None
    dynatemp_exponent: Finite = None
    mirostat: int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: NonNegative = None
    mirostat_eta: NonNegative = None
    adaptive_target: Annotated[float | None, Field(le=1.0, allow_inf_nan=False)] = None  # < 0: off
    adaptive_decay: Annotated[float | None, Field(ge=0.0, le=0.99)] = None
    min_keep: int | None = Field(default=None, ge=0)
    #: llama-server's order: a list of names or a string of letters; kept as letters
    samplers: list[str] | str | None = None

    @field_validator("dry_sequence_breakers")
    @classmethod
    def _breakers(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(value)):
            raise _invalid("expected a non-empty list of non-empty strings")
        if value is not None and len(value) > MAX_BREAKERS:
            raise _invalid(f"expected at most {MAX_BREAKERS} sequence breakers, got {len(value)}")
        return value

    @field_validator("samplers")
    @classmethod
    def _samplers(cls, value: list[str] | str | None) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            bad = [c for c in value if c not in STAGES]
            letters = value
        else:
            bad = [n for n in value if n.lower() not in _NAMES]
            letters = "".join(_NAMES.get(n.lower(), "") for n in value)
        if not letters and not bad:
            raise _invalid("expected at least one sampler (leave samplers out for the default order)")
        if bad:
            raise _invalid(f"{bad[0]!r} is not a sampler here: expected names among {', '.join(STAGES.values())} "
                           f"(or their letters {''.join(STAGES)})")  # fmt: skip
        return letters

    def llama_sampling(self, defaults: Any, sampled: bool) -> dict[str, Any]:
        """The GEN options these fields set, each the request's or else ``defaults``'s;
        only DRY's when the pick is greedy (the rest cannot change an argmax)."""
        out: dict[str, Any] = {}
        for name in FIELDS if sampled else GREEDY_TOO:
            value = getattr(self, name)
            value = getattr(defaults, name, None) if value is None else value
            if value is not None:
                out[name] = tuple(value) if name == "dry_sequence_breakers" else value
        return out
