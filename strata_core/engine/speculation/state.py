"""Speculation's per-request state: what it has learnt of one request's drafts. The request
holds it (``Request.spec``) without knowing its shape; the ``Speculator`` gives it one when
it is submitted (``attach``) and is its only writer."""

from __future__ import annotations

from dataclasses import dataclass, field

from strata_core.engine.request import Request
from strata_core.engine.speculation.cost import Acceptance, Shadow
from strata_core.engine.speculation.ngram import NgramIndex


@dataclass
class SpecState:
    drafted: int = 0  # draft tokens its windows offered (filler rows not counted)
    accepted: int = 0  # of them, kept
    acceptance: Acceptance = field(default_factory=Acceptance)  # of n-gram drafts, real or shadow
    shadow: Shadow | None = None  # an n-gram draft recorded instead of decoded
    ngrams: NgramIndex | None = None  # n-gram speculation: the prompt and emitted tokens


def state(req: Request) -> SpecState:
    """The request's speculation state (made here for a request never submitted to an
    engine, as a bench may hand one straight to the scheduler)."""
    if req.spec is None:
        req.spec = SpecState()
    st: SpecState = req.spec
    return st
