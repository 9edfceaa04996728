"""The engine options of one choice (contract/options.GenOptions): the request's sampling
and logprobs over the operator's defaults (sampling_defaults.py), the token limit the
context leaves, how the engine runs it (alone for an exact seeded replay, or with
speculative windows), its grammar, LoRA scales and reasoning budget."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from strata_core.api.lora import LoraAdapters
from strata_core.api.sampling_defaults import REQUEST_PARAMS, gen_options, max_new_tokens
from strata_core.client.reader import EngineClient
from strata_core.contract.options import GenOptions, OptionError
from strata_core.ops.config import Config
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import BaseRequest
from strata_core.text.choice import ChatShape


class ChoiceOptions:
    def __init__(self, engine: EngineClient, config: Config, adapters: LoraAdapters) -> None:
        self.engine, self.config, self.adapters = engine, config, adapters
        #: a closing reasoning marker's token ids, by its text (tokenized once)
        self._think_close: dict[str, tuple[int, ...]] = {}

    def check_lengths(self, prompt: list[int], req: BaseRequest, param: str, limit_param: str | None = None) -> int:
        """The max_tokens to send; 400 when the prompt or the request exceed the context.
        ``param`` names the prompt, ``limit_param`` the token limit (else the request's own)."""
        n_ctx, n = int(self.engine.info["n_ctx"]), len(prompt)
        if n >= n_ctx:
            raise ApiError(
                400,
                f"the prompt has {n} tokens but the model's context holds {n_ctx}",
                param=param,
                code="context_length_exceeded",
            )
        max_new = max_new_tokens(req, self.config.sampling)
        if max_new is not None and n + max_new > n_ctx:
            name = limit_param or (
                "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            )
            raise ApiError(
                400,
                f"{name} = {max_new} does not fit: the prompt has {n} tokens and the "
                f"context holds {n_ctx}, leaving {n_ctx - n}",
                param=name,
                code="context_length_exceeded",
            )
        return max_new if max_new is not None else n_ctx - n

    def lora_scales(self, req: BaseRequest) -> dict[int, float] | None:
        """A request's ``lora`` as adapter id -> scale (an adapter named as its ``model``:
        that one alone at 1; None: the default scales); 400 for an adapter the model lacks."""
        if req.lora is None:
            named = self.adapters.id_of(req.model)
            return None if named is None else {named: 1.0}
        usable = self.adapters.usable()
        scales: dict[int, float] = {}
        for entry in req.lora:
            if entry.id not in usable:
                raise ApiError(400, f"lora names adapter {entry.id}, but this model has {len(usable)} (GET "
                               "/lora-adapters lists them)", param="lora", code="invalid_value")  # fmt: skip
            scales[entry.id] = entry.scale
        return scales

    def build(self, req: BaseRequest, *, seed: int, max_tokens: int, grammar: str | None) -> GenOptions:
        """The engine options of one choice: the request's sampling and logprobs, the
        operator's defaults, and how the engine runs it (alone for an exact seeded replay,
        or with speculative windows)."""
        cfg = self.config
        try:
            opts = gen_options(req, cfg.sampling, seed=seed, max_tokens=max_tokens)
        except OptionError as exc:
            raise self._invalid(exc) from None
        if req.seed is not None and cfg.sampling.exact_seed_replay:
            opts = opts.replace(isolate=True)
        elif cfg.speculative.mode != "off" and req.speculative is not False:
            opts = opts.replace(spec=cfg.speculative.mode)
        if grammar is not None:
            opts = opts.replace(grammar=grammar)
        if (lora := self.lora_scales(req)) is not None:
            opts = opts.replace(lora=lora)
        if req.ignore_eos:  # an end-of-generation token's logit is -inf, as llama-server sets it
            eog = dict.fromkeys(self.engine.info.get("eog") or [], -math.inf)
            opts = opts.replace(sampling=replace(opts.sampling, bias={**opts.sampling.bias, **eog}))
        try:
            opts.check(int(self.engine.info["n_vocab"]))
        except OptionError as exc:
            raise self._invalid(exc) from None
        return opts

    @staticmethod
    def _invalid(exc: OptionError) -> ApiError:
        param = REQUEST_PARAMS.get(exc.key, exc.key)
        return ApiError(400, f"invalid {param}: {exc}", param=param, code="invalid_value")

    async def think_budget(self, req: BaseRequest, shape: ChatShape | None) -> dict[str, Any]:
        """The GenOptions fields of a chat's ``reasoning_budget`` (none without one): the
        budget, the closing marker's ids and whether the prompt opened the reasoning."""
        budget = getattr(req, "reasoning_budget", None)
        if budget is None or shape is None:
            return {}
        if "think_budget" not in self.engine.info.get("capabilities", ()):
            raise ApiError(400, "this engine cannot bound reasoning (no 'think_budget' capability); leave "
                           "reasoning_budget out", param="reasoning_budget", code="unsupported_value")  # fmt: skip
        close = f"\n{shape.think[1]}\n\n"  # the family's closing marker (text/tool_formats.py)
        if close not in self._think_close:
            self._think_close[close] = tuple(await self.engine.tokenize(close, special=True))
        return {"think_budget": budget, "think_close": self._think_close[close], "think_open": shape.thinking}
