"""A step's plan: everything the scheduler decided for one step, in the order it runs.

``Scheduler.schedule`` makes it; the engine loop hands it to the runner a batch at a time,
samples the rows the runner hands back, and the emitter applies the tokens. Nothing is
decoded or written to a slot while the plan is made: the chunks say which prompt tokens
each batch decodes at which positions, and the emitter moves them into the slot's cache
once they are decoded (``Emitter.prefilled``). A new input of a step (one more kind of
batch, a budget, a hint to the runner) is a field here, filled by the scheduler and read
by the loop (docs/architecture.md, "One step").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from strata_core.engine.request import Slot
from strata_core.engine.speculation.policy import Windows


class Chunk(NamedTuple):
    """Prompt tokens of one sequence; ``last``: the prompt's last token, decoded after
    them with logits (its row gives the first token), or None."""

    seq: int
    tokens: list[int]
    pos0: int
    last: int | None = None


@dataclass
class Plan:
    #: the slots whose prompt is in: each decodes its last token (and a window) this step
    decoding: list[Slot] = field(default_factory=list)
    #: slots whose prompt's last chunk is prefilled this step without room for its last
    #: token: that token decodes in this step's decodes too (without a window)
    joined: list[Slot] = field(default_factory=list)
    #: slots whose prompt was cached whole: their first token comes from the row kept
    #: (``Slot.first``), before anything is decoded
    cached_whole: list[Slot] = field(default_factory=list)
    #: prompt chunks decoded together in one batch, and the slots whose first token their
    #: last rows give (in chunk order)
    prefill: list[Chunk] = field(default_factory=list)
    firsts: list[Slot] = field(default_factory=list)
    #: chunks of requests that must replay exactly: a batch each, under its own adapters
    isolated: list[Chunk] = field(default_factory=list)
    #: the decodes: slots sharing a batch (the shared one first, then each isolated slot)
    groups: list[list[Slot]] = field(default_factory=list)
    #: speculation's windows for the decoding slots
    windows: Windows = field(default_factory=lambda: Windows({}, False, False))
    #: rows the shared prefill may take this step (what the decodes leave of the batch,
    #: within the scheduler's per-step token budget)
    budget: int = 0
