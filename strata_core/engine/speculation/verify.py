"""Speculative decoding: verifying windows over probability rows (numpy).

Two kinds of drafts (docs/architecture.md, "Speculative decoding"):

* point-mass drafts (n-gram lookup): the target samples every window row with the normal
  sampler, and a draft is kept while it equals the target's own sample (``verify_exact``);
  greedy and seeded runs emit the same tokens with speculation on and off.
* drafts with a known q (draft model): the gated proposal. The gate
  admits A = {x : q(x) >= tau}; the retained measure mu is q on A and 0 elsewhere, not
  renormalised, and the missing mass 1 - sum(mu) is an explicit NULL outcome. The drafter
  draws D ~ q and offers it if the gate admits it, else NULL; so it offers x with
  probability mu(x). An offered x is accepted with probability min(1, p(x) / mu(x));
  rejection and NULL emit a sample of r = (p - mu)+ / sum((p - mu)+). Then
  P(emit x) = min(p, mu)(x) + (1 - sum(min(p, mu))) * r(x) = min(p, mu)(x) + (p - mu)+(x)
  = p(x), since 1 - sum(min(p, mu)) = sum(p - min(p, mu)) = sum((p - mu)+).
  The proof holds for any admitted set; a q equal to tau passes (``admitted``: q >= tau).

p is the distribution the target actually samples from (after its whole sampling chain).
Every function takes its rows as numpy arrays or Python sequences; a row of Fractions
stays exact (object arrays), which is how the tests enumerate outcomes exactly.
Randomness enters only as explicit uniforms in [0, 1). A window's outcome depends only on
the draws at its rows up to the emitted one, so the next window may reuse the positions of
discarded rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from strata_core.contract.options import SamplingParams
from strata_core.engine import philox
from strata_core.engine.sampler import probabilities

NULL: Final = -1  # a proposal the gate refused: no token offered at that row

# Philox stream ids of the draft-model path; the target's ordinary sampler uses stream 0.
STREAM_PROPOSE: Final = 1
STREAM_ACCEPT: Final = 2
STREAM_EMIT: Final = 3


class WindowUniforms(NamedTuple):
    accept: Sequence[Any]  # accept[i]: the accept test of drafted row i
    emit: Sequence[Any]  # emit[i]: the residual or bonus draw, read only at the emitting row


class WindowResult(NamedTuple):
    accepted: int  # drafted tokens kept
    token: int  # the token emitted after them


def verify_exact(target_samples: Sequence[int], draft: Sequence[int]) -> int:
    """How many draft tokens equal the target's own samples at their rows, in order.

    target_samples[i] is the target's sample at window row i (len(draft) + 1 rows); the
    window emits draft[:n] + [target_samples[n]].
    """
    if len(target_samples) != len(draft) + 1:
        raise ValueError(
            f"{len(target_samples)} target samples for {len(draft)} draft tokens: "
            "expected one per draft token plus the row after them"
        )
    for n, (t, d) in enumerate(zip(target_samples, draft, strict=False)):
        if t != d:
            return n
    return len(draft)


def _row(x: npt.ArrayLike) -> np.ndarray:
    """A 1-d row: object arrays (Fractions) stay exact, anything else becomes float64."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"a probability row must be 1-d, got shape {a.shape}")
    return a if a.dtype == object else a.astype(np.float64, copy=False)


def admitted(q: Any, tau: Any) -> Any:
    """The confidence gate, elementwise: a token is admitted when its q reaches tau."""
    return q >= tau


def retained_measure(q: npt.ArrayLike, tau: Any) -> np.ndarray:
    """mu: q on admitted tokens, 0 elsewhere; not renormalised (NULL has 1 - sum(mu))."""
    q = _row(q)
    return np.where(admitted(q, tau), q, 0 * q)


def draw(weights: npt.ArrayLike, u: Any) -> int:
    """Inverse CDF in id order: the first id whose running mass exceeds u * total."""
    w = _row(weights)
    c = np.cumsum(w)
    if not c.size or not c[-1] > 0:
        raise ValueError("cannot draw from a row with no positive mass")
    i = int(np.searchsorted(c, u * c[-1], side="right"))
    return i if i < w.size else int(np.flatnonzero(w > 0)[-1])  # rounding ran off the end


def propose(q: npt.ArrayLike, tau: Any, u: Any) -> int:
    """The drafter's gated draw: D ~ q, offered if the gate admits it, else NULL."""
    q = _row(q)
    x = draw(q, u)
    return x if admitted(q[x], tau) else NULL


def accepts(p_x: Any, mu_x: Any, u: Any) -> bool:
    """Accept an offered token with probability min(1, p(x) / mu(x))."""
    if not mu_x > 0:
        raise ValueError(f"an offered token needs mu(x) > 0, got {mu_x}")
    return bool(u * mu_x < p_x)


def residual(p: npt.ArrayLike, mu: npt.ArrayLike) -> np.ndarray:
    """The normalised positive part of p - mu: what rejection and NULL sample from."""
    p, mu = _row(p), _row(mu)
    r = np.maximum(p - mu, 0 * p)
    total = r.sum()
    # zero mass means rejection and NULL have probability 0; only rounding gets here
    return r / total if total > 0 else p


def verify_window(
    p_rows: Sequence[npt.ArrayLike] | np.ndarray,
    q_rows: Sequence[npt.ArrayLike] | np.ndarray,
    drafted: Sequence[int],
    tau: Any,
    uniforms: WindowUniforms,
) -> WindowResult:
    """Verify a gated draft-model window.

    drafted[i] is the drafter's ``propose`` outcome at row i under q_rows[i]: a token, or
    NULL as the last entry (drafting stops there). p_rows[i] is the target's distribution
    at row i, one row per drafted token plus one. The window stops at the first rejection
    or NULL and emits a residual sample there; if every token is kept, the extra row of
    p_rows is sampled ordinarily (a row with no attempted proposal).
    """
    offered = len(drafted) - (1 if drafted and drafted[-1] == NULL else 0)
    if NULL in drafted[:offered]:
        raise ValueError(f"drafted={list(drafted)} has NULL before its end: drafting stops at NULL")
    if len(q_rows) != len(drafted):
        raise ValueError(f"{len(q_rows)} q rows for {len(drafted)} proposals: expected one each")
    if len(p_rows) != offered + 1:
        raise ValueError(
            f"{len(p_rows)} p rows for {offered} offered tokens: expected {offered + 1}"
        )
    if tau < 0:
        raise ValueError(f"tau={tau} is out of range: expected >= 0")
    for i, x in enumerate(drafted):
        p, mu = _row(p_rows[i]), retained_measure(q_rows[i], tau)
        if x == NULL or not accepts(p[x], mu[x], uniforms.accept[i]):
            return WindowResult(i, draw(residual(p, mu), uniforms.emit[i]))
    return WindowResult(offered, draw(p_rows[offered], uniforms.emit[offered]))


def window_uniforms(seed: int, position: int, rows: int) -> WindowUniforms:
    """The accept and emit uniforms of a window whose row 0 samples ``position``."""
    rng = range(position, position + rows)
    return WindowUniforms(
        [philox.uniform(seed, pos, STREAM_ACCEPT) for pos in rng],
        [philox.uniform(seed, pos, STREAM_EMIT) for pos in rng],
    )


# ---- a draft model's proposals: what the drafter and the scheduler call


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)  # a sampled window may end with NULL
    q_rows: list[np.ndarray] | None = None  # what each was drawn from; None: point masses
    filler: int = 0  # trailing tokens that only pad the window to its size (no drafts)
    promised: float = 0.0  # drafts the n-gram policy expected the window to keep

    @property
    def offered(self) -> list[int]:
        """The tokens the target decodes and verifies (a final NULL offers none)."""
        return self.tokens[:-1] if self.tokens and self.tokens[-1] == NULL else self.tokens


def sampled_proposal(
    row: np.ndarray, params: SamplingParams, history: Sequence[int], tau: float
) -> tuple[int, np.ndarray]:
    """A gated proposal (or NULL) for the position after ``history`` (the whole context)
    from the draft's logits ``row``, and q, the distribution it was drawn from."""
    q = probabilities(row, params, history)
    return propose(q, tau, philox.uniform(params.seed, len(history), STREAM_PROPOSE)), q


def verify_proposal(
    p_row: Callable[[int], np.ndarray], prop: Proposal, tau: float, seed: int, position: int
) -> WindowResult:
    """Verify a sampled proposal whose row 0 samples ``position``; p_row(j) is the target's
    distribution at row j, computed only for the rows the verifier reaches."""
    assert prop.q_rows is not None
    rows = len(prop.offered) + 1
    p_rows = _LazyRows(functools.cache(p_row), rows)
    return verify_window(p_rows, prop.q_rows, prop.tokens, tau, window_uniforms(seed, position, rows))


class _LazyRows(Sequence[np.ndarray]):
    """A window's target rows, each computed when the verifier first reads it."""

    def __init__(self, row: Callable[[int], np.ndarray], n: int) -> None:
        self._row, self._n = row, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, j: int) -> np.ndarray:  # type: ignore[override]  # no slices needed
        if not 0 <= j < self._n:
            raise IndexError(j)
        return self._row(j)
