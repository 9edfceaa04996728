"""When a speculative window pays, and how long it should be (docs/architecture.md,
"Speculative decoding").

A window of k drafts adds k rows to a decode step. What a row costs is measured, not
assumed: ``StepCost`` averages the seconds of each decode-and-sample step by the rows it
held. On a GPU a row costs next to nothing until the batch is large; on a CPU, whose
matrix kernels are compute-bound, a step of five rows takes more than three times one of
one row, so a window pays only when most of it is kept. What a draft is worth is
measured too: ``Acceptance`` tracks the chance that a draft token is kept after those
before it were, from real windows and from drafts that were only recorded and then
checked against the tokens the slot went on to emit ("shadow" drafts, which cost no
decode), and ``Calibration`` measures how much of that promise the windows it opened
kept. ``window_size`` then picks the k that maximises the expected tokens per second of
the step, and 0 when no window beats an ordinary step.

A change of the batch's shape has a price of its own on a GPU: llama.cpp builds and
plans a graph again for a new shape, and replays a captured CUDA graph only for a shape
it has captured (one per shape in Strata's CUDA build, docs/backends/cuda.md "Source
edits"; one for all as released). ``StepCost`` measures that price (``switch``), and a
slot keeps the window size it had unless another pays for the change, padding the window
with filler rows when the n-gram index drafts fewer tokens than it holds. On a CPU the
price is nil and the window follows the drafts, opening only where it promises a clear
gain (``CPU_MARGIN``): there the best windows promise a few percent beside other slots,
less than the cores' step times wander.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_core.engine.averages import moving_average

MARGIN = 1.03
#: On a CPU a window's rows cost nearly what they compute, so at a few slots the best
#: windows promise a few percent, and the two cores' step times wander by more than that
#: (bench/results/2026-12-06-cpu-waves.md): there a window opens only where it promises this many times a
#: plain step's rate.
CPU_MARGIN = 1.10


def expected_kept(alpha: Any, k: int) -> Any:
    """Expected drafts kept from a window of k, each kept with probability ``alpha`` once
    those before it were (the run stops at the first miss)."""
    if alpha >= 1:
        return k
    return alpha * (1 - alpha**k) / (1 - alpha)


def _best(rate: Callable[[int], float], k_max: int, was: int, margin: float = MARGIN) -> int:
    """The k in 0..k_max of the highest rate, where the incumbent ``was`` keeps its place
    unless another beats it by ``margin`` (step times are measured amid noise)."""
    best_k = was if was <= k_max else 0
    best = margin * rate(best_k)
    for k in range(k_max + 1):
        if k != best_k and (r := rate(k)) > best:
            best_k, best = k, r
    return best_k


def window_size(
    alpha: float, k_max: int, seconds: Callable[[int], float], rows: int, tokens: float,
    drafts: int | None = None, was: int = 0, switch: float = 0.0, trust: float = 1.0, margin: float = MARGIN,
) -> int:  # fmt: skip
    """The number of window rows (0..k_max) that maximises a step's expected tokens per second.

    The step holds ``rows`` rows so far, expected to yield ``tokens`` tokens; a window of
    k rows carries up to ``drafts`` real drafts (default k_max; rows past them are filler,
    expected to keep nothing) and adds ``expected_kept(alpha, min(k, drafts))`` tokens;
    ``seconds(n)`` is what a step of n rows takes. ``was`` is the slot's window in the
    previous step: any other size changes the batch's shape, which costs ``switch`` more
    seconds (a GPU runs a changed shape without its captured graph). ``trust`` scales the
    drafts a window is expected to keep (``Calibration``). The incumbent size
    keeps its place unless another promises ``margin`` times its rate, since step times
    are measured amid the machine's noise; 0 means the step is best left as it is.
    """
    drafts = k_max if drafts is None else drafts

    def rate(k: int) -> float:
        extra = 0.0 if k == was else switch
        return (tokens + trust * expected_kept(alpha, min(k, drafts))) / (seconds(rows + k) + extra)

    return _best(rate, k_max, was, margin)


def uniform_window(
    offers: Sequence[tuple[float, int]], k_max: int, seconds: Callable[[int], float], rows: int,
    tokens: float, was: int = 0, switch: float = 0.0, trust: float = 1.0,
) -> int:  # fmt: skip
    """One window size w (0..k_max) for every slot in ``offers`` (each ``(alpha, drafts)``:
    its w rows hold its drafts, then filler) that maximises the step's expected tokens per
    second; the step holds ``rows`` rows without the windows, expected to yield ``tokens``.

    Where the KV cache keeps a stream per sequence, llama.cpp splits a batch whose
    sequences hold unequal row counts into several micro-batches (``micro_batches``), each
    computed on its own and in a shape of its own, so a GPU replays no captured graph for
    any of them. Equal windows keep the step one micro-batch. ``was`` is the previous
    step's w: another changes the batch's shape, which costs ``switch``; it keeps its
    place unless another promises ``MARGIN`` times its rate, as in ``window_size``.
    """

    # kept[w]: the drafts all windows of w rows are expected to keep, summed over the
    # offers a power of alpha at a time (a slot's j-th draft is kept with alpha**j, and
    # rows past its drafts keep nothing): asked for each w on every step of many slots
    kept = [0.0] * (k_max + 1)
    for alpha, drafts in offers:
        term, total = 1.0, 0.0
        for w in range(1, min(drafts, k_max) + 1):
            term *= alpha
            total += term
            kept[w] += total
        for w in range(max(drafts, 0) + 1, k_max + 1):
            kept[w] += total

    def rate(w: int) -> float:
        return (tokens + trust * kept[w]) / (seconds(rows + len(offers) * w) + (0.0 if w == was else switch))

    return _best(rate, k_max, was)


def isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares weighted by
    ``weights`` (adjacent values out of order are pooled into their weighted mean)."""
    blocks: list[tuple[float, float, int]] = []  # (mean, weight, values pooled)
    for value, weight in zip(values, weights, strict=True):
        block = (value, weight, 1)
        while blocks and blocks[-1][0] > block[0]:
            (m0, w0, n0), (m1, w1, n1) = blocks.pop(), block
            block = ((m0 * w0 + m1 * w1) / (w0 + w1), w0 + w1, n0 + n1)
        blocks.append(block)
    return [mean for mean, _, n in blocks for _ in range(n)]


class StepCost:
    """Seconds per decode step by the rows it holds: a moving average per row count, read
    between and beyond the measured counts along straight lines. Asked a few times per
    slot and step, so it answers from a table rebuilt when a step is added.

    A step is *steady* when the two decodes before it had its shape. Only steady steps
    enter the table; what the others cost beyond it is ``switch``: after a change of
    shape llama.cpp builds its graph again, and a GPU launches every kernel anew until it
    has a capture for the shape, so a window that changes the shape pays for it, and one
    that keeps it does not. The first step of each row count is not counted at all: a batch
    shape the device has not run yet pays for its set-up (kernel choice, buffers), many
    times a later step, and an average seeded with it would keep windows of that size
    away for good. For the same reason one step can at most double an average.

    More rows never cost less: the table is the non-decreasing fit to the averages, each
    weighted by how many steps measured it lately (``WEIGHT_FADE`` a step), so a count
    measured a few times in a slow minute cannot lift one measured every step since. (Raising
    every count to the largest below it did: on two cores, three rows priced from a few
    slow ramp steps set the price of four-slot steps for good, far above what they took;
    windows beside them looked twice as cheap as they were, opened, and lost:
    bench/results/2026-12-06-cpu-speculation-aa-control.md.)"""

    #: a change of shape slows the step that makes it and the next (the GPU re-captures)
    SWITCH_STEPS = 2
    #: what a measurement of a row count weighs in the fit after each later step: about
    #: the last hundred steps count
    WEIGHT_FADE = 0.99

    def __init__(self, decay: float = 0.8) -> None:
        self.decay = decay
        self.measured: dict[int, float] = {}
        self._excess: float | None = None  # average excess of an unsteady step
        self._seen: set[int] = set()  # row counts whose first step went by
        self._steps = 0  # steady steps measured
        self._weight: dict[int, tuple[float, int]] = {}  # row count: (weight, step it was last measured)
        self._rows: list[int] = []  # measured row counts, ascending
        self._secs: list[float] = []  # their averages, fitted non-decreasing
        self._fitted = True  # whether _rows and _secs hold every measurement (fitted when asked)

    def add(self, rows: int, seconds: float, steady: bool = True) -> None:
        if rows not in self._seen:
            self._seen.add(rows)
            return
        if not steady:  # priced against steady steps of the same rows, not a line's guess
            if rows in self.measured and self.known:
                usual = self.seconds(rows)
                self._excess = moving_average(self._excess, min(seconds, 3 * usual) - usual, self.decay)
            return
        prev = self.measured.get(rows)
        self.measured[rows] = moving_average(prev, seconds if prev is None else min(seconds, 2 * prev), self.decay)
        self._steps += 1
        self._weight[rows] = (self._faded(rows) + 1.0, self._steps)
        self._fitted = False

    def _faded(self, rows: int) -> float:
        """The weight of the row count's measurements now."""
        weight, step = self._weight.get(rows, (0.0, self._steps))
        return weight * self.WEIGHT_FADE ** (self._steps - step)

    @property
    def switch(self) -> float:
        """Seconds a change of the batch's shape adds, over the steps it slows."""
        return self.SWITCH_STEPS * max(0.0, self._excess or 0.0)

    @property
    def known(self) -> bool:
        """Whether two row counts were measured, so that ``seconds`` tells them apart."""
        return len(self.measured) >= 2

    def seconds(self, rows: int) -> float:
        """A step of ``rows`` rows; until two row counts were measured every step looks
        alike (1.0), so windows run and get measured."""
        if not self.known:
            return 1.0
        if not self._fitted:  # more rows never cost less: a noisy average must not make a window look free
            self._rows = sorted(self.measured)
            self._secs = isotonic([self.measured[r] for r in self._rows], [self._faded(r) for r in self._rows])
            self._fitted = True
        xs, ys = self._rows, self._secs
        if rows <= xs[0]:
            return ys[0] * rows / xs[0]
        i = bisect.bisect_left(xs, rows)
        if i == len(xs):  # beyond the largest: along the line through the ends
            slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
            return ys[-1] + slope * (rows - xs[-1])
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y1 if x1 == rows else y0 + (y1 - y0) * (rows - x0) / (x1 - x0)


@dataclass
class FadingRatio:
    """A ratio of two running sums whose older terms fade: each addition first multiplies
    both sums by ``decay`` once per step it spans."""

    part: float
    whole: float
    decay: float

    @property
    def ratio(self) -> float:
        return self.part / self.whole

    def add(self, part: float, whole: float, steps: int = 1) -> None:
        fade = self.decay**steps
        self.part = fade * self.part + part
        self.whole = fade * self.whole + whole


@dataclass
class Acceptance(FadingRatio):
    """The chance a draft token is kept once its predecessors were: kept drafts over tested
    ones (a run's first miss is tested, the rest of the window after it is not), each
    tested token fading older ones by ``decay``, so it remembers some ten tokens. Starts
    at one kept of two tested: a coin flip."""

    part: float = 1.0
    whole: float = 2.0
    decay: float = 0.9

    @property
    def alpha(self) -> float:
        return self.ratio

    def observe(self, offered: int, kept: int) -> None:
        tested = kept + (1 if kept < offered else 0)
        self.add(kept, tested, steps=tested)


@dataclass
class Calibration(FadingRatio):
    """Drafts that windows kept (``part``) against those their acceptance estimates
    promised (``whole``).

    A window opens where its request's recent drafts were kept, and the run of kept
    drafts that raised the estimate tends to end soon after: on the default model's
    copy-heavy text, windows kept some 15-20% fewer drafts than promised. The ratio, each
    window fading older ones by ``decay`` (about fifty remembered), scales every promise
    that decides a window (``window_size``'s ``trust``)."""

    part: float = 1.0
    whole: float = 1.0
    decay: float = 0.98


@dataclass
class Shadow:
    """A draft recorded instead of decoded: ``tokens`` proposed to sit at ``start`` onward
    in the slot's stream. ``check`` scores it once the stream shows a miss or runs past it."""

    start: int
    tokens: list[int]

    def check(self, stream: Sequence[int]) -> int | None:
        """How many of the tokens the stream kept, or None while it cannot tell yet."""
        seen = stream[self.start : self.start + len(self.tokens)]
        kept = 0
        while kept < len(seen) and seen[kept] == self.tokens[kept]:
            kept += 1
        return kept if kept < len(seen) or len(seen) == len(self.tokens) else None


@dataclass
class _Arms:
    """What steps realised per number of decoding slots, with windows allowed (``on``) and
    without (``off``): emitted tokens over wall seconds, the leader's fading older steps,
    the other's since its last trial began."""

    on: FadingRatio = field(default_factory=lambda: FadingRatio(0.0, 0.0, WindowGuard.DECAY))
    off: FadingRatio = field(default_factory=lambda: FadingRatio(0.0, 0.0, WindowGuard.DECAY))
    arm: bool = True  # the arm in force
    left: int = 0  # steps left in its phase
    leader: bool | None = None  # the arm that realised more; None until both were tried
    wait: int = 0  # leader phases before the other arm is tried again
    backoff: int = 2  # WindowGuard.FIRST_WAIT

    def rate(self, arm: bool) -> float:
        r = self.on if arm else self.off
        return r.part / r.whole if r.whole > 0 else 0.0


class WindowGuard:
    """Whether a step may open speculative windows, from what windows realised: emitted
    tokens per wall second of steps with windows allowed against steps without, for each
    number of decoding slots. The cost model (``window_size``, ``uniform_window``) only
    proposes windows; the guard keeps them shut where the steps it let them into emitted
    fewer tokens per second than plain ones, whatever the model predicted (a step the
    model mis-prices, micro-batches, graph captures, Python time for the rows). It is
    shown only steps where the model proposed a window (and the step after a windowed one,
    which pays the change back to plain rows): a step with nothing to propose runs the
    same under either arm, and open-ended text once taught it, by noise, to shut windows
    that copy-heavy text then needed (bench/results/2026-12-05-cuda-h200-guard.md).

    The leader holds for phases of ``PHASE`` steps; the other arm is tried for ``TRIAL``
    steps, first once each, then after ``wait`` of the leader's phases, a wait that
    grows fourfold (to ``MAX_WAIT``) each time a trial confirms the leader, so exploring a
    losing arm costs little; a leader whose rate falls below the other's last one is
    challenged at once."""

    PHASE = 16
    TRIAL = 8
    FIRST_WAIT = 2
    MAX_WAIT = 64
    DECAY = 0.98  # per step of the arm: about fifty steps remembered

    def __init__(self) -> None:
        self._by_n: dict[int, _Arms] = {}

    def allows(self, n: int) -> bool:
        """Whether the next step, with ``n`` decoding slots, may open windows."""
        arms = self._by_n.get(n)
        if arms is None:
            arms = self._by_n[n] = _Arms(left=self.TRIAL)
        return arms.arm

    def add(self, n: int, tokens: int, seconds: float) -> None:
        """A step with ``n`` decoding slots, run under the arm ``allows(n)`` gave, emitted
        ``tokens`` in ``seconds`` (its wall time, to the next step)."""
        arms = self._by_n[n]
        (arms.on if arms.arm else arms.off).add(tokens, seconds)
        arms.left -= 1
        if arms.left > 0:
            return
        if arms.leader is None:  # the first steps try each arm once
            if arms.off.whole == 0:
                arms.arm, arms.left = False, self.TRIAL
                return
            arms.leader, arms.wait = arms.rate(True) >= arms.rate(False), arms.backoff
        elif arms.arm != arms.leader:  # a trial ended
            if arms.rate(arms.arm) > arms.rate(arms.leader):
                arms.leader, arms.backoff = arms.arm, self.FIRST_WAIT
            else:
                arms.backoff = min(4 * arms.backoff, self.MAX_WAIT)
            arms.wait = arms.backoff
        else:
            arms.wait -= 1
            if arms.rate(arms.leader) < arms.rate(not arms.leader):
                arms.wait = 0
        arms.arm = arms.leader if arms.wait > 0 else not arms.leader
        arms.left = self.PHASE
        if arms.arm != arms.leader:  # a trial is judged by what it realises itself
            arms.left = self.TRIAL
            setattr(arms, "on" if arms.arm else "off", FadingRatio(0.0, 0.0, self.DECAY))
