"""Speculation beside the loop: which slots open a window this step, and how a window's
rows are judged (docs/architecture.md, "Speculative decoding").

The loop calls a ``Speculator`` at three points and reads the same with speculation off:
``propose`` (this step's windows, by sequence), ``judge`` (a window's rows, sampled
through the ``WindowRows`` the loop hands in, which also emits each kept token) and
``observe`` (every emitted token, which the n-gram index and shadow drafts learn from).
The policy is measured, not assumed (cost.py): a window opens where it raises the step's
expected tokens per second, drafting pauses where none could, and a guard turns windows
off where they realised less than plain steps.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from strata_core.engine.llama import Llama
from strata_core.engine.request import Request, Slot
from strata_core.engine.sampler import probabilities
from strata_core.engine.speculation.cost import (
    CPU_MARGIN,
    MARGIN,
    Calibration,
    Shadow,
    StepCost,
    WindowGuard,
    expected_kept,
    uniform_window,
    window_size,
)
from strata_core.engine.speculation.drafter import DraftJob, DraftModel
from strata_core.engine.speculation.ngram import NgramIndex
from strata_core.engine.speculation.state import SpecState, state
from strata_core.engine.speculation.verify import Proposal, verify_proposal

#: The draft model drafts only while at most this many slots decode: beyond it the batch
#: already keeps the device busy and its drafting would cost more than it saves. (N-gram
#: windows cost no drafting; the measured step cost decides for them, cost.py.)
SPEC_MAX_SLOTS = 2
SPEC_MAX_WAIT = 32
#: After a step where no window could have paid even had every slot drafted all the
#: tokens it has room for (adaptive), n-gram drafting pauses for 1, 2, 4, ... then at
#: most this many steps: where windows do not pay, drafting and sizing them every step was
#: the whole cost of speculation (bench/results/2026-12-05-cuda-h200-6459081.md), and at
#: 16 slots drafting one step in nine still cost host time in every step
#: (bench/results/2026-12-06-cuda-h100-4ff0d1a.md). Tokens are the same either way; a shadow draft is scored as
#: the tokens it guessed are emitted, and one whose kept drafts make a window pay ends the
#: pause.
NGRAM_MAX_PAUSE = 32
#: After a step where the index drafted nothing at all, the pause is at most this long:
#: whether a draft exists changes with every token, what a window costs and keeps slowly.
NGRAM_MAX_DRY_PAUSE = 8


class WindowRows(Protocol):
    """A window's rows as the loop hands them to ``Speculator.judge``."""

    def logits(self, j: int) -> np.ndarray:
        """The target's logits at row j of the window."""
        ...

    def take(self, j: int, chosen: int | None = None) -> int | None:
        """Sample row j as an ordinary step would (or take ``chosen``, drawn from it) and
        emit the token; None when it ended the request."""
        ...

    def keep(self, token: int) -> None:
        """A token taken from the window is kept: its KV, computed by the window's decode,
        stays in the slot's cache."""
        ...


class Windows:
    """A step's windows: proposals by sequence, and what the step's trace records of them."""

    def __init__(self, drafts: dict[int, Proposal], allowed: bool, guarded: bool) -> None:
        self.drafts, self.allowed, self.guarded = drafts, allowed, guarded

    def rows(self, slot: Slot) -> int:
        """The rows the slot decodes this step: its last token and its window's."""
        return 1 + len(self.drafts[slot.seq].offered) if slot.seq in self.drafts else 1


class Speculator:
    def __init__(
        self, llama: Llama, slots: list[Slot], drafter: DraftModel | None = None, adaptive: bool = True,
        shape_costs: bool = False,
    ) -> None:  # fmt: skip
        self.llama = llama
        self.slots = slots
        self.drafter = drafter
        self.cost = StepCost()  # seconds per decode-and-sample step by rows
        self.calibration = Calibration()  # n-gram windows: drafts kept against promised
        self.adaptive = adaptive  # False: an n-gram window at every match (rows taken as free)
        # Price a change of the batch's shape (cost.StepCost.switch): on a GPU, whose
        # backends replay a captured graph only for a shape run twice in a row. A CPU
        # rebuilds its graph for about a millisecond, lost in its noise; there every step
        # counts as steady and a window follows its drafts.
        self.shape_costs = shape_costs
        # There (GPU) every slot of a step's shared batch takes the same window, so that the
        # step stays one micro-batch (cost.uniform_window): the size the last one used.
        self.window = 0
        self.guard = WindowGuard()  # windows only where they realised more than plain steps
        self.ngram_pause = 0  # steps left without n-gram drafting
        self._next_pause = 1  # the next pause: doubles up to NGRAM_MAX_PAUSE; 1 again where a window opens or could pay
        self._windowed = False  # whether the last step opened windows
        self._rows = 1  # slots decoding in the step under way
        # by sequence (a slot's, kept across its requests): the draft model's back-off
        self._wait = [0] * len(slots)  # decode steps left before the slot drafts again
        self._misses = [0] * len(slots)  # windows in a row that accepted nothing

    # ---- what the loop calls -----------------------------------------------------------

    def propose(self, decoding: list[Slot], waiting_first: bool) -> Windows:
        """This step's windows for the decoding slots. None while a request waits for its
        first token: its first row shares the decode with the windows, and time to first
        token matters more than a draft."""
        self._rows = len(decoding)
        guarded = self.adaptive and any(s.req is not None and s.req.spec_k for s in decoding)
        # The guard judges only steps the cost model would open windows in: a step with
        # nothing to propose runs the same either way and says nothing about windows.
        arm = not guarded or self.guard.allows(len(decoding))
        drafts, proposed = ({}, False) if waiting_first else self._drafts(decoding, run_drafter=arm)
        if not arm:
            self._shadow(drafts)
            drafts = {}
        if not drafts:
            self.window = 0
        # a step back to plain rows after windows pays their change of shape: theirs
        windows = Windows(drafts, arm, guarded and (proposed or self._windowed))
        self._windowed = bool(drafts)
        return windows

    def attach(self, req: Request) -> None:
        """A new request gets its speculation state (``Request.spec``), whether or not it
        will ever draft: its acceptance is read in traces and stats either way."""
        req.spec = SpecState()

    def index(self, group: list[Slot]) -> None:
        """Index the group's last tokens for the next step's drafts (on a GPU, while the
        step computes). While drafting pauses nobody drafts next step, and where the host
        sets a step's pace indexing would lengthen it: the first draft after the pause
        indexes what came meanwhile (NgramIndex.draft)."""
        for slot in group if not self.ngram_pause else ():
            if slot.req is not None and slot.req.spec is not None and slot.req.spec.ngrams is not None:
                slot.req.spec.ngrams.index()

    def judge(self, slot: Slot, prop: Proposal, rows: WindowRows) -> None:
        """Sample the slot's window rows (its plain row when there is no window) and keep
        the drafts they confirm; ``slot.cached`` holds the decoded last token."""
        if prop.q_rows is None:
            self._verify(slot, prop, rows)
        else:
            self._verify_gated(slot, prop, rows)

    def observe(self, req: Request, token: int) -> None:
        """A token the request emitted: the n-gram stream grows and a shadow is scored."""
        st: SpecState | None = req.spec
        if st is not None and st.ngrams is not None:
            st.ngrams.append(token)
            if st.shadow is not None:
                self._score_shadow(req, st)

    def learn_step(self, rows: int, seconds: float, steady: bool) -> None:
        """A decode-and-sample step of ``rows`` rows took ``seconds``."""
        self.cost.add(rows, seconds, steady)

    def learn_guarded(self, slots: int, emitted: int, seconds: float) -> None:
        """A guarded step (see ``Windows.guarded``) emitted so much in its wall time."""
        self.guard.add(slots, emitted, seconds)

    # ---- the policy --------------------------------------------------------------------

    def _drafts(self, decoding: list[Slot], run_drafter: bool = True) -> tuple[dict[int, Proposal], bool]:
        """This step's proposals by sequence, and whether any window was proposed; the draft
        model drafts for all its slots at once (with ``run_drafter`` false it does not run,
        and the slots it would draft for count as proposing)."""
        out: dict[int, Proposal] = {}
        jobs: list[DraftJob] = []
        offers: list[tuple[Slot, list[int], int]] = []  # n-gram slots: drafts, room
        paused = self.ngram_pause > 0
        self.ngram_pause -= paused
        if paused and self.drafter is None:  # nothing drafts this step
            return out, False
        for slot in decoding:
            req, room = slot.req, self._window_room(slot)
            assert req is not None and slot.last is not None
            if not room:
                continue
            # drafts past max_tokens cannot be kept; rows there may still pad a window
            k = min(room, req.max_tokens - req.generated - 1)
            if req.spec_draft and self.drafter is not None and req.grammar is None:
                if self._wait[slot.seq]:  # backing off after windows that kept nothing
                    self._wait[slot.seq] -= 1
                elif len(decoding) <= SPEC_MAX_SLOTS and k > 0:
                    jobs.append(DraftJob(slot.seq, [*slot.cached, slot.last], k, req.params))
                continue
            if not paused:
                offers.append((slot, self._ngram_drafts(slot, k) if k > 0 else [], room))
        drafted = any(tokens for _, tokens, _ in offers)
        if offers and self.adaptive and self.shape_costs:
            if self.window or drafted:  # else no window pays
                self._uniform_windows(offers, len(decoding), out)
        elif offers:
            self._slot_windows(offers, len(decoding), out)
        if offers and self.adaptive:
            if any(slot.seq in out for slot, _, _ in offers) or (drafted and self._could_pay(offers, len(decoding))):
                self._next_pause = 1
            else:
                cap = NGRAM_MAX_PAUSE if drafted else NGRAM_MAX_DRY_PAUSE
                self.ngram_pause, self._next_pause = min(self._next_pause, cap), min(2 * self._next_pause, NGRAM_MAX_PAUSE)
        if jobs and not run_drafter:
            return out, True
        if jobs:
            assert self.drafter is not None
            props = zip(jobs, self.drafter.propose(jobs), strict=True)
            # a slot whose draft is still catching up, or not confident, steps as usual
            out.update((job.seq, prop) for job, prop in props if prop.tokens)
        return out, bool(out)

    def _shadow(self, drafts: dict[int, Proposal]) -> None:
        """Windows the guard refused (n-gram ones: the draft model did not run): their
        drafts are recorded as shadows, as a window sized 0 records them, so what they
        would have kept is still learnt."""
        for seq, prop in drafts.items():
            self._open(self.slots[seq], prop.tokens[: len(prop.tokens) - prop.filler], 0, {})

    def _ngram_drafts(self, slot: Slot, k: int) -> list[int]:
        """Up to ``k`` tokens the n-gram index drafts for the slot (scoring its shadow draft)."""
        req = slot.req
        assert req is not None and slot.last is not None
        st = state(req)
        if st.ngrams is None:  # the stream so far: the prompt, then emitted tokens
            st.ngrams = NgramIndex([*slot.cached, slot.last])
        tokens = st.ngrams.draft(k)
        if req.grammar is not None:  # a token the grammar forbids can never be kept
            tokens = tokens[: req.grammar.valid_prefix(tokens)]
        return tokens

    def _score_shadow(self, req: Request, st: SpecState) -> None:
        """Score the request's shadow draft once its stream shows what it would have kept
        (as each token is emitted, paused or not). Where what it kept makes a window pay
        now, a pause of n-gram drafting ends: a copy resumed after a miss is drafted for
        at once, not after the rest of a pause of up to NGRAM_MAX_PAUSE steps."""
        shadow, ngrams = st.shadow, st.ngrams
        assert shadow is not None and ngrams is not None
        stream = ngrams.tokens
        i = len(stream) - 1 - shadow.start  # the token just emitted is the shadow's i-th guess
        if 0 <= i < len(shadow.tokens) - 1 and stream[-1] == shadow.tokens[i]:
            return  # guessed right, more to come: the common case, in constant time
        if (kept := shadow.check(stream)) is None:
            return
        st.acceptance.observe(len(shadow.tokens), kept)
        st.shadow = None
        if kept and self.ngram_pause and self._window_pays(req):
            self.ngram_pause, self._next_pause = 0, 1

    def _window_pays(self, req: Request) -> bool:
        """Whether a window as long as the request may open would pay in a step like the
        one running, at the request's acceptance (its drafts aside)."""
        n = self._rows
        k, margin = req.spec_k, MARGIN if self.shape_costs else CPU_MARGIN
        return window_size(state(req).acceptance.alpha, k, self.cost.seconds, n, float(n), k, 0, self.cost.switch,
                           self.calibration.ratio, margin) > 0  # fmt: skip

    def _open(self, slot: Slot, tokens: list[int], n: int, out: dict[int, Proposal]) -> float:
        """A window of ``n`` rows for the slot: its drafts, then filler (the last draft
        again) to the size; the drafts it promises to keep. With ``n`` 0 the drafts are
        recorded as a shadow instead, to learn what they would have kept."""
        req = slot.req
        assert req is not None and slot.last is not None
        st = state(req)
        assert st.ngrams is not None
        if not n:
            if tokens and st.shadow is None:
                st.shadow = Shadow(len(st.ngrams.tokens), tokens)
            return 0.0
        filler = max(0, n - len(tokens))
        promised = expected_kept(st.acceptance.alpha, min(n, len(tokens)))
        window = tokens[:n] + [(tokens or [slot.last])[-1]] * filler
        out[slot.seq] = Proposal(window, filler=filler, promised=promised)
        return promised

    def _slot_windows(self, offers: list[tuple[Slot, list[int], int]], rows: int, out: dict[int, Proposal]) -> None:
        """Each slot's window sized on its own, in turn: each must raise the expected tokens
        per second of the step as the windows before it left it (a CPU, where rows cost
        what they compute and a split batch nothing more; or every match, unadaptive)."""
        expect, trust = float(rows), self.calibration.ratio
        for slot, tokens, k in offers:
            if not tokens:
                continue
            req = slot.req
            assert req is not None
            if self.adaptive and out and not self.cost.known:  # one window measures a row count
                n = 0
            elif self.adaptive:  # rows cost what they compute, so a window must beat plain rows by CPU_MARGIN
                n = window_size(state(req).acceptance.alpha, k, self.cost.seconds, rows, expect, len(tokens), 0,
                                self.cost.switch, trust, CPU_MARGIN)  # fmt: skip
            else:
                n = len(tokens)
            promised = self._open(slot, tokens, n, out)
            if n:
                rows, expect = rows + n, expect + trust * promised

    def _uniform_windows(self, offers: list[tuple[Slot, list[int], int]], rows: int, out: dict[int, Proposal]) -> None:
        """One window size for every offering slot (a GPU: the step stays one micro-batch,
        adaptive.uniform_window), padded with filler where a slot drafts fewer tokens."""
        w = self._uniform_size(offers, rows)
        for slot, tokens, _ in offers:
            self._open(slot, tokens, w, out)
        self.window = w

    def _uniform_size(self, offers: list[tuple[Slot, list[int], int]], rows: int, full: bool = False) -> int:
        """The one window size adaptive.uniform_window gives the offering slots for their
        drafts, or (``full``) as if each had drafted as many tokens as it has room for."""
        alphas = [(state(slot.req).acceptance.alpha if slot.req else 0.0, room if full else len(tokens))
                  for slot, tokens, room in offers]  # fmt: skip
        k = min(room for _, _, room in offers)
        return uniform_window(alphas, k, self.cost.seconds, rows, float(rows), self.window, self.cost.switch,
                              self.calibration.ratio)  # fmt: skip

    def _could_pay(self, offers: list[tuple[Slot, list[int], int]], rows: int) -> bool:
        """Whether a window would open had every offering slot drafted as many tokens as
        it has room for (the drafts of this step aside, only the slots' acceptance and the
        step's cost decide)."""
        if self.shape_costs:
            return self._uniform_size(offers, rows, full=True) > 0
        cost, trust = self.cost, self.calibration.ratio
        return any(
            window_size(state(slot.req).acceptance.alpha if slot.req else 0.0, room, cost.seconds, rows, float(rows), room,
                        0, cost.switch, trust, CPU_MARGIN) > 0
            for slot, _, room in offers
        )  # fmt: skip

    def _window_room(self, slot: Slot) -> int:
        """How many rows a window may add to the slot's row this step: room for them and
        the bonus token in the context."""
        req = slot.req
        assert req is not None
        if not req.spec_k or req.isolate:
            return 0
        return max(0, min(req.spec_k, self.llama.n_ctx - len(slot.cached) - 2))

    def _verify(self, slot: Slot, prop: Proposal, rows: WindowRows) -> None:
        """Sample each row of the window as an ordinary step would (same position, same
        draw), keep the drafts that match, and trim the cache to what was kept."""
        req, draft = slot.req, prop.tokens
        assert req is not None
        drafts = len(draft) - prop.filler  # filler rows only pad the window: no drafts
        st = state(req)
        st.drafted += drafts  # counted before any row is sampled: a row may end the request
        kept = 0
        for j in range(len(draft) + 1):
            tok = rows.take(j)
            if tok is None or j == len(draft) or tok != draft[j]:
                break
            rows.keep(tok)  # its KV is already in the cache
            kept += 1
            if kept <= drafts:  # (a filler token that matched is emitted, not counted)
                st.accepted += 1
        if draft:
            self.calibration.add(min(kept, drafts), prop.promised)
            self._after_window(slot, st, drafts, min(kept, drafts))

    def _verify_gated(self, slot: Slot, prop: Proposal, rows: WindowRows) -> None:
        """Verify a draft-model window (the gated rule, verify.py) and emit what it keeps: its accepted
        drafts, then the residual or bonus sample."""
        req, drafter = slot.req, self.drafter
        assert req is not None and drafter is not None and prop.q_rows is not None
        offered, params = prop.offered, req.params
        base, last_n = list(slot.cached), params.penalty_last_n

        def p_row(j: int) -> np.ndarray:  # the target's row j, after the drafts before it
            history = (base + offered[:j])[-last_n:] if last_n else ()
            return probabilities(rows.logits(j), params, history)

        result = verify_proposal(p_row, prop, drafter.tau, params.seed, len(base))
        st = state(req)
        st.drafted += len(offered)  # counted before any row is emitted: one may end the request
        kept = 0
        for tok in [*offered[: result.accepted], result.token]:
            if rows.take(kept, chosen=tok) is None or kept == result.accepted:
                break
            rows.keep(tok)  # its KV is already in the cache
            kept += 1
            st.accepted += 1
        self._after_window(slot, st, len(offered), kept)

    def _after_window(self, slot: Slot, st: SpecState, drafted: int, kept: int) -> None:
        """Learn from a window, trim the cache to what was kept, and back off after misses."""
        st.acceptance.observe(drafted, kept)
        self.llama.seq_trim(slot.seq, len(slot.cached))
        self._misses[slot.seq] = 0 if kept else self._misses[slot.seq] + 1
        self._wait[slot.seq] = min(2**self._misses[slot.seq] - 1, SPEC_MAX_WAIT) if not kept else 0

