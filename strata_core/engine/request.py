"""Per-request state: a ``Request`` as submitted and what it has produced, and the
``Slot`` (one llama.cpp sequence) it runs in, with the tokens whose KV that sequence holds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strata_core.engine.budget import ThinkBudget
from strata_core.engine.grammar import GrammarMatcher
from strata_core.engine.media_runs import MediaItem
from strata_core.engine.sampler import SamplingParams
from strata_core.engine.stages import SamplerState

#: A logit bias as sorted (id, value) pairs: what an argmax picked in the decode is taken
#: under (``Request.device_key``, ``Llama.greedy_on_device``).
DeviceKey = tuple[tuple[int, float], ...]
#: What ``Slot.first`` keeps of a prompt's first token: its logits row, or the decode's pick
#: with the bias it was picked under.
FirstKept = np.ndarray | tuple[DeviceKey, int]


@dataclass
class Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop_ids: frozenset[int]
    logprobs: int | None
    logprobs_processed: bool = False  # report the sampled-from distribution, not the raw one
    generated: int = 0
    cached: int = 0
    spec_k: int = 0  # most tokens a window may propose; 0 = no speculation
    spec_draft: bool = False  # windows come from the draft model, not n-gram lookup
    #: decoded in a batch of its own and without windows, so its numerics never depend on
    #: what else runs (exact seeded replay on backends whose kernels follow batch shape)
    isolate: bool = False
    grammar: GrammarMatcher | None = None  # constrained decoding: the mask before each sample
    budget: ThinkBudget | None = None  # a reasoning budget: the closing marker once it is spent
    #: LoRA scales of its own (None: the configured ones); such a request is isolated, and
    #: its slot's cache, computed under them, is dropped when it ends
    lora: tuple[float, ...] | None = None
    media: dict[int, MediaItem] = field(default_factory=dict)  # the prompt's media items, by placeholder
    #: what its picks carry from token to token (DRY's breakers, Mirostat's mu, ...)
    sampling: SamplerState = field(default_factory=SamplerState)
    #: speculation's own state for it (speculation/state.py), given when it is submitted;
    #: opaque here: a request knows nothing of how its windows are decided
    spec: Any = None
    t_arrive: float = field(default_factory=time.perf_counter)
    t_first: float = 0.0
    t_admit: float = 0.0  # when it took a slot (its queue time ends)
    plain: bool = field(init=False)  # greedy over the raw row, no grammar: an argmax
    #: its tokens need nothing of a row but the argmax after a logit bias (greedy, no
    #: allowed list, penalties, grammar, logprobs or draft model): llama.cpp may pick them
    #: in the decode (Llama.greedy_on_device) with this bias, as sorted (id, bias) pairs
    #: (empty: none); None where the rows are needed
    device_key: DeviceKey | None = field(init=False)

    def __post_init__(self) -> None:
        p = self.params
        self.plain = p.plain and self.grammar is None
        needs_rows = self.grammar is not None or self.logprobs is not None or self.spec_draft
        self.device_key = tuple(sorted(p.bias.items())) if p.biased_argmax and not needs_rows else None

    # What speculation's state says of the request, for its stats and traces (nothing
    # before it drafted).
    @property
    def drafted(self) -> int:
        return self.spec.drafted if self.spec is not None else 0

    @property
    def accepted(self) -> int:
        return self.spec.accepted if self.spec is not None else 0

    @property
    def acceptance(self) -> Any:
        return self.spec.acceptance if self.spec is not None else None

    @property
    def shadow(self) -> Any:
        return self.spec.shadow if self.spec is not None else None

    @property
    def ngrams(self) -> Any:
        return self.spec.ngrams if self.spec is not None else None


@dataclass
class Slot:
    seq: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV is in this sequence
    req: Request | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to decode
    last: int | None = None  # sampled, not yet decoded
    reused: bool = False  # its request started from a cached prefix worth keeping, and no copy was made since
    #: by prompt length, the logits row that gave a request on this cache its first token,
    #: while the cache holds that prompt: the same prompt again samples its first token
    #: from it, computing nothing and exactly as the first time. Where the decode picked
    #: it (``device``) only the token is known, kept with the bias it was picked under
    #: (``Request.device_key``): it serves a request of that key alone.
    first: dict[int, FirstKept] = field(default_factory=dict)
    device: bool = False  # its request's greedy rows are picked in the decode (``Request.device_key``)

    @property
    def decoding(self) -> bool:
        """Its request's prompt is in and a sampled token waits to be decoded."""
        return self.req is not None and self.last is not None and not self.pending

    def first_for(self, req: Request, n: int) -> bool:
        """Whether the first token of ``req``'s prompt of ``n`` tokens can come from what
        ``first`` keeps."""
        kept = self.first.get(n)
        return kept is not None and (isinstance(kept, np.ndarray) or kept[0] == req.device_key)

    def history(self, n: int, ahead: list[int] | None = None) -> list[int]:
        """The last ``n`` tokens (-1: all) before the next row, window drafts ``ahead`` taken
        as kept: what its penalties and DRY read."""
        if n == 0:
            return []
        tokens = self.cached + ahead if ahead else self.cached
        return tokens if n < 0 else tokens[-n:]

    def forget(self) -> None:
        """Its cache is gone (the caller emptied the sequence): nothing of it is reused."""
        self.cached, self.first, self.reused = [], {}, False

    def clear(self) -> None:
        """The request leaves the slot (its cache stays)."""
        self.req, self.pending, self.last = None, [], None


#: First-token rows a cache keeps (Slot.first), the latest prompts'.
FIRST_ROWS = 4
