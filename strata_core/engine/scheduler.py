"""Slots and continuous batching.

Each step decodes chunks of pending prompts and then one token (or a speculative window)
for every decoding slot, within ``n_batch`` together. New requests join between steps and take
the free slot whose cached tokens share the longest prefix with their prompt, starting
from a copy of another slot's cache or of one saved in host memory where that holds more
of it (prompt_cache.py); finished or cancelled slots free at once and keep their cache
for the next request.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strata_core import protocol as proto
from strata_core.engine.adaptive import (
    CPU_MARGIN,
    MARGIN,
    Acceptance,
    Calibration,
    Shadow,
    StepCost,
    WindowGuard,
    expected_kept,
    micro_batches,
    moving_average,
    uniform_window,
    window_size,
)
from strata_core.engine.drafter import DraftJob, DraftModel
from strata_core.engine.grammar import GrammarMatcher
from strata_core.engine.llama import Batch, Llama
from strata_core.engine.media_runs import MediaItem, decode_media_ahead, media_boundary, text_ahead
from strata_core.engine.prompt_cache import SavedPrompts
from strata_core.engine.sampler import (
    SamplingParams,
    probabilities,
    processed_logprobs,
    sample,
    top_logprobs,
)
from strata_core.engine.speculative import NgramIndex, Proposal, common_prefix, verify_proposal

Emit = Callable[[proto.Event], None]
Trace = Callable[[dict[str, Any]], None]


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
    media: dict[int, MediaItem] = field(default_factory=dict)  # the prompt's media items, by placeholder
    drafted: int = 0
    accepted: int = 0
    acceptance: Acceptance = field(default_factory=Acceptance)  # of n-gram drafts, real or shadow
    shadow: Shadow | None = None  # an n-gram draft recorded instead of decoded
    ngrams: NgramIndex | None = None  # n-gram speculation: the prompt and emitted tokens
    t_arrive: float = field(default_factory=time.perf_counter)
    t_first: float = 0.0


@dataclass
class Slot:
    seq: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV is in this sequence
    req: Request | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to decode
    last: int | None = None  # sampled, not yet decoded
    reused: bool = False  # its request started from a cached prefix worth keeping, and no copy was made since
    spec_wait: int = 0  # draft model: decode steps left before this slot drafts again
    spec_misses: int = 0  # draft model: windows in a row that accepted nothing
    #: by prompt length, the logits row that gave a request on this cache its first token,
    #: while the cache holds that prompt: the same prompt again samples its first token
    #: from it, computing nothing and exactly as the first time
    first: dict[int, np.ndarray] = field(default_factory=dict)


#: The draft model drafts only while at most this many slots decode: beyond it the batch
#: already keeps the device busy and its drafting would cost more than it saves. (N-gram
#: windows cost no drafting; the measured step cost decides for them, adaptive.py.)
SPEC_MAX_SLOTS = 2
SPEC_MAX_WAIT = 32
#: After a step where no window could have paid even had every slot drafted all the
#: tokens it has room for (adaptive), n-gram drafting pauses for 1, 2, 4, ... then at
#: most this many steps: where windows do not pay, drafting and sizing them every step was
#: the whole cost of speculation (an H200 step of 4 slots: 1.75 ms against 1.67 off), and
#: at 16 slots drafting one step in nine still cost some 50 us a step on an H100's host
#: (docs/backends/cuda.md). Tokens are the same either way; a shadow draft is scored as
#: the tokens it guessed are emitted, and one whose kept drafts make a window pay ends the
#: pause.
NGRAM_MAX_PAUSE = 32
#: After a step where the index drafted nothing at all, the pause is at most this long:
#: whether a draft exists changes with every token, what a window costs and keeps slowly.
NGRAM_MAX_DRY_PAUSE = 8
#: A new request starts from a copy of another slot's cache, or of one saved in host
#: memory, when that saves prefilling at least this many prompt tokens (a copy costs far
#: less than computing them again); a slot's cache is saved before it loses as many.
COPY_MIN_GAIN = 16


#: On a CPU a prompt row costs nearly the same however many rows share the step (two cores:
#: 3.5-3.9 ms a row from 20 rows up, 6 ms at 4), so prompts prefilled together all wait for
#: their sum. There a step takes the shortest pending prompts first and stops once it holds
#: a whole prompt and at least this many rows: each prompt's first token comes after its
#: own prefill and those before it, and only the last one's later than beside the others,
#: by the decode steps between (four prompts of 20 tokens: at about 90, 180, 270 and 370
#: ms instead of all at 330).
CPU_PREFILL_ROWS = 16
#: First-token rows a cache keeps (Slot.first), the latest prompts'.
FIRST_ROWS = 4


class Scheduler:
    def __init__(
        self, llama: Llama, emit: Emit, drafter: DraftModel | None = None, adaptive: bool = True,
        saved_bytes: int = 0, shape_costs: bool = False, trace: Trace | None = None,
    ) -> None:  # fmt: skip
        self.llama = llama
        self.emit = emit
        self.drafter = drafter
        self.slots = [Slot(i) for i in range(llama.n_seq)]
        self.waiting: deque[Request] = deque()
        self.batch = Batch(max(llama.n_batch, llama.n_seq))
        self.cost = StepCost()  # seconds per decode-and-sample step by rows
        self.calibration = Calibration()  # n-gram windows: drafts kept against promised
        self.shapes: deque[int] = deque([0, 0], maxlen=2)  # sizes of the last two decodes
        self.saved = SavedPrompts(saved_bytes)  # slot caches kept in host memory
        # Measured: seconds to prefill one prompt token, and to copy a sequence's cache
        # (through host memory); None until seen. A copy must cost less than its prefill.
        self.prefill_secs: float | None = None
        self.copy_secs: float | None = None
        self.adaptive = adaptive  # False: an n-gram window at every match (rows taken as free)
        # Price a change of the batch's shape (adaptive.StepCost.switch): on a GPU, whose
        # backends replay a captured graph only for a shape run twice in a row. A CPU
        # rebuilds its graph for about a millisecond, lost in its noise; there every step
        # counts as steady and a window follows its drafts.
        self.shape_costs = shape_costs
        # There (GPU) every slot of a step's shared batch takes the same window, so that the
        # step stays one micro-batch (adaptive.uniform_window): the size the last one used.
        self.window = 0
        self.guard = WindowGuard()  # windows only where they realised more than plain steps
        self.ngram_pause = 0  # steps left without n-gram drafting
        self._next_pause = 1  # the next pause: doubles up to NGRAM_MAX_PAUSE; 1 again where a window opens or could pay
        self._windowed = False  # whether the last step opened windows
        self.trace = trace  # one record a step (timings, rows, micro-batches), when given
        self._step: dict[str, Any] | None = None  # the step that ran last, until timed
        self._t_step = 0.0  # when it started

    # ---- requests -------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or any(s.req for s in self.slots)

    def submit(self, req: Request) -> None:
        self.waiting.append(req)

    def cancel(self, rid: str) -> bool:
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._done(req, "cancelled")
                return True
        for slot in self.slots:
            if slot.req is not None and slot.req.rid == rid:
                self._finish(slot, "cancelled")
                return True
        return False

    def _done(self, req: Request, reason: str) -> None:
        now = time.perf_counter()
        stats = {"prompt": str(len(req.prompt)), "cached": str(req.cached), "gen": str(req.generated)}
        if req.spec_k:
            stats.update(drafted=str(req.drafted), accepted=str(req.accepted))
        if req.t_first:
            stats["ttft_ms"] = f"{(req.t_first - req.t_arrive) * 1e3:.2f}"
            stats["gen_ms"] = f"{(now - req.t_first) * 1e3:.2f}"
        self.emit(proto.Done(req.rid, reason, stats))

    def _finish(self, slot: Slot, reason: str) -> None:
        assert slot.req is not None
        self._done(slot.req, reason)
        slot.req, slot.pending, slot.last = None, [], None

    def _fail(self, slot: Slot, message: str) -> None:
        assert slot.req is not None
        self.emit(proto.Error(slot.req.rid, message))
        self._finish(slot, "error")

    def _admit(self) -> None:
        free = [s for s in self.slots if s.req is None]
        while self.waiting and free:
            req = self.waiting.popleft()
            if req.isolate:  # it computes its whole prompt itself: take the least cache
                shared = {s.seq: 0 for s in self.slots}
                slot = min(free, key=lambda s: len(s.cached))
            else:
                shared = {s.seq: common_prefix(s.cached, req.prompt) for s in self.slots}
                slot = max(free, key=lambda s: shared[s.seq])
            free.remove(slot)
            try:
                self._place(slot, req, shared)
            except Exception as exc:  # a request taken off the queue must end, never vanish
                traceback.print_exc()  # to the engine's log
                self.emit(proto.Error(req.rid, f"could not start the request: {exc}"))
                self._done(req, "error")
                slot.req, slot.pending, slot.last, slot.cached, slot.first = None, [], None, [], {}
                try:
                    self.llama.seq_trim(slot.seq, 0)
                except Exception:  # the slot is empty as far as the scheduler knows
                    pass

    def _place(self, slot: Slot, req: Request, shared: dict[int, int]) -> None:
        """Start ``req`` in ``slot``, from the longest cached prefix of its prompt: the
        slot's own, another slot's (``shared``: each slot's common prefix) or host memory's.
        A request that must replay exactly (``isolate``) starts from nothing: a cached
        prefix holds the KV of whatever chunks another request computed it in."""
        prompt = req.prompt
        have = shared[slot.seq]
        # Another slot (busy or not) may hold more of the prompt, say a chat preamble
        # a burst of new requests shares, or host memory may: start from a copy.
        donor = max(self.slots, key=lambda s: shared[s.seq])
        saved, n_saved = (None, 0) if req.isolate else self.saved.longest(prompt)
        copying = self._worth_copying(max(shared[donor.seq], n_saved) - have)
        # what the slot held goes to host memory first, if worth keeping: the copy delays
        # this request and every one still waiting behind it
        self._save(slot, 0 if copying else min(have, len(prompt) - 1), delayed=1 + len(self.waiting))
        if saved is not None and not any(e is saved for e in self.saved.entries):
            # the save evicted it for room: look again (the slot still holds its cache)
            saved, n_saved = self.saved.longest(prompt)
            copying = self._worth_copying(max(shared[donor.seq], n_saved) - have)
        if copying:
            t0 = time.perf_counter()
            if shared[donor.seq] >= n_saved:
                ok, n = self.llama.seq_copy(donor.seq, slot.seq), shared[donor.seq]
                tokens, first = donor.cached, donor.first
            else:
                assert saved is not None
                self.saved.use(saved)
                ok, tokens, n, first = self.llama.seq_load(slot.seq, saved.state), saved.tokens, n_saved, saved.first
            self.copy_secs = moving_average(self.copy_secs, time.perf_counter() - t0)
            slot.cached, have, slot.first = (list(tokens), n, dict(first)) if ok else ([], 0, {})
        # The first token comes from the row of the last prompt token: from the row kept
        # when this prompt gave a request its first token on this cache before (nothing
        # to compute), else from the prompt's last chunk, which computes that token too.
        whole = not req.isolate and have >= len(prompt) and len(prompt) in slot.first
        keep = media_boundary(prompt, len(prompt) if whole else min(have, len(prompt) - 1), req.media)
        self.llama.seq_trim(slot.seq, keep)
        slot.cached = slot.cached[:keep]
        slot.first = {n: row for n, row in slot.first.items() if n <= keep}
        slot.pending = prompt[keep:-1]
        slot.req, slot.last = req, None if whole else prompt[-1]
        slot.reused = keep >= COPY_MIN_GAIN
        req.cached = keep

    def _worth_copying(self, tokens: int, delayed: int = 1) -> bool:
        """Whether copying a cache beats prefilling ``tokens`` of it (measured costs), when
        the copy makes ``delayed`` requests wait for it."""
        if tokens < COPY_MIN_GAIN:
            return False
        if self.prefill_secs is None or self.copy_secs is None:
            return True
        return tokens * self.prefill_secs > delayed * self.copy_secs

    def save_idle(self) -> bool:
        """With nothing to decode: save one free slot's cache to host memory, if worth
        keeping, so that the request that takes the slot later need not wait for the copy
        (docs/architecture.md, "Prompt caches"); whether one was copied (or tried). What another slot
        holds too is not lost when the slot moves on, so only the rest must be worth it."""
        for slot in self.slots if self.saved.capacity else ():
            if slot.req is None and slot.reused:
                others = (common_prefix(slot.cached, s.cached) for s in self.slots if s is not slot)
                if self._save(slot, max(others, default=0)):
                    return True
        return False

    def _save(self, slot: Slot, keep: int, delayed: int = 1) -> bool:
        """Save the slot's cache to host memory before it shrinks to ``keep`` tokens; whether
        a copy was made now (or tried: llama.cpp may refuse it). Only a cache its request reused (a conversation, a shared system
        prompt) is likely to be asked for again, and only one whose prefill costs more than
        the ``delayed`` requests' wait for the copy is saved: on a GPU, where prefill is
        cheap, a burst of new requests does not wait for a copy of every slot they take."""
        if not (slot.reused and self.saved.capacity and self._worth_copying(len(slot.cached) - keep, delayed)):
            return False
        held = self.saved.holds(slot.cached)
        slot.reused = False  # saved (or refused by llama.cpp): not asked again for this cache
        if held:
            return False
        t0 = time.perf_counter()
        state = self.llama.seq_save(slot.seq)
        self.copy_secs = moving_average(self.copy_secs, time.perf_counter() - t0)
        if state is not None:
            self.saved.add(slot.cached, state, slot.first)
        return True

    # ---- one step ---------------------------------------------------------------------

    def step(self) -> None:
        """One step: prompt chunks in one ``llama_decode``, then one token (or one
        speculative window) per decoding slot in a second.

        Decode rows never share a batch with prompt chunks, so a generated token's row is
        computed the same way whatever else is prefilling. A prompt's first token is
        sampled from its last chunk's last row, so it comes in the step that prefills that
        chunk; a prompt cached whole with the row that gave its first token before takes
        it from that row, at the start of a step (``Slot.first``).
        """
        t_step = time.perf_counter()
        self._timed(t_step)
        self._admit()
        for slot in self.slots:  # media items next in a prompt: encoded and decoded on their own
            if slot.req is not None and slot.req.media:
                try:
                    decode_media_ahead(self.llama, slot.seq, slot.cached, slot.pending, slot.req.media)
                except Exception as exc:  # this request's media, not the step's other requests
                    traceback.print_exc()
                    self._fail(slot, f"the media item could not be encoded: {exc}")
        batch = self.batch
        decoding = [s for s in self.slots if s.req is not None and s.last is not None and not s.pending]
        # No windows while a request waits for its first token: its first row shares the
        # decode with the windows, and time to first token matters more than a draft.
        waiting_first = any(s.req is not None and not s.req.generated for s in self.slots)
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
        record: dict[str, Any] = {"t": t_step, "n": len(decoding), "allowed": arm, "emitted": 0}
        if guarded and (proposed or self._windowed):
            # a step back to plain rows after windows pays their change of shape: theirs
            record["guarded"] = True
        self._windowed = bool(drafts)
        self._step = record
        for slot in self.slots:  # prompts cached whole: their first token from the row kept
            if slot.req is not None and slot.last is None and not slot.pending:
                self._sample(slot, slot.first[len(slot.cached)])
        budget = batch.capacity - sum(1 + len(drafts[s.seq].offered) if s.seq in drafts else 1 for s in decoding)
        batch.clear()
        prompts = [s for s in self.slots if s.req is not None and s.pending and not s.req.isolate]
        cpu = not self.llama.on_gpu
        if cpu:  # one prompt's rows cost what they would beside others: shortest first
            prompts.sort(key=lambda s: len(s.pending))
        rows, whole = 0, False
        from_prefill: list[tuple[Slot, int]] = []  # prompts whose last token is in their last chunk
        for slot in prompts:
            if budget <= 0 or (cpu and whole and rows >= CPU_PREFILL_ROWS):
                break
            taken = self._chunk(slot, budget, decoding, from_prefill)
            budget, rows, whole = budget - taken, rows + taken, whole or not slot.pending
        self._prefill()
        for slot, idx in from_prefill:
            assert slot.last is not None
            slot.cached.append(slot.last)
            self._sample(slot, self.llama.logits(idx))
        # A request that must replay exactly is prefilled alone, in chunks its prompt alone
        # decides: llama.cpp computes a token's KV by the rows of its sequence in the
        # micro-batch (on the CPU, flash attention tiles 64 rows or more), so a chunk cut by
        # the budget beside other prompts would change its logits.
        for slot in self.slots:
            if slot.req is not None and slot.req.isolate and slot.pending:
                batch.clear()
                self._chunk(slot, batch.capacity, decoding)
                self._prefill()
        shared = [s for s in decoding if s.req is not None and not s.req.isolate]
        groups = [shared] if shared else []
        groups += [[s] for s in decoding if s.req is not None and s.req.isolate]
        self._t_step = t_step
        for group in groups:
            self._decode_rows(group, drafts)
        if not self.busy:  # nothing runs next: the step ends here, not at the next one
            self._timed(time.perf_counter())

    def _chunk(
        self, slot: Slot, most: int, decoding: list[Slot], from_prefill: list[tuple[Slot, int]] | None = None
    ) -> int:
        """Add up to ``most`` of the slot's pending prompt tokens to the batch; how many rows.
        A slot whose prompt is then all in adds its last token too, with logits, where
        ``from_prefill`` collects it (with its row) and there is room: its first token is
        sampled from this decode. Otherwise it joins ``decoding``: its last token decodes next."""
        chunk = slot.pending[: text_ahead(slot.pending, most)]
        self.batch.add(chunk, len(slot.cached), slot.seq, "none")
        slot.cached.extend(chunk)
        del slot.pending[: len(chunk)]
        if slot.pending:
            return len(chunk)
        if from_prefill is not None and len(chunk) < most:
            assert slot.last is not None
            from_prefill.append((slot, self.batch.add_one(slot.last, len(slot.cached), slot.seq)))
            return len(chunk) + 1
        decoding.append(slot)
        return len(chunk)

    def _prefill(self) -> None:
        """Decode the batch of prompt chunks, if any, and learn what a prompt token costs."""
        batch = self.batch
        if not batch.n:
            return
        t0 = time.perf_counter()
        self.llama.decode(batch)
        self.llama.synchronize()
        self.shapes.append(batch.n)
        secs = time.perf_counter() - t0
        self.prefill_secs = moving_average(self.prefill_secs, secs / batch.n)
        if (record := self._step) is not None:
            record["prefill_rows"] = record.get("prefill_rows", 0) + batch.n
            record["prefill_ms"] = record.get("prefill_ms", 0.0) + secs * 1e3

    def _timed(self, now: float) -> None:
        """Close the last step's record: its wall time runs to ``now`` (the next step's start,
        so what the engine does between steps counts); the guard learns from it."""
        record, self._step = self._step, None
        if record is None:
            return
        secs = now - self._t_step
        if record.get("guarded"):
            self.guard.add(int(record["n"]), int(record["emitted"]), secs)
        if self.trace is not None:
            record["step_ms"] = secs * 1e3
            self.trace(record)

    def _decode_rows(self, group: list[Slot], drafts: dict[int, Proposal]) -> None:
        """One ``llama_decode`` of the group's last tokens (with their windows), then
        sample them: logits only live until the next decode."""
        t0 = time.perf_counter()
        batch = self.batch
        batch.clear()
        windows: list[tuple[Slot, int, Proposal]] = []
        layout: list[tuple[int, int]] = []  # (sequence, rows) in batch order
        fill = self._gaps(group, drafts)
        members = [*group, *(self.slots[seq] for seq in fill)]
        for slot in sorted(members, key=lambda s: s.seq):  # consecutive sequences go together
            if slot.seq in fill:  # rows that only keep the batch one micro-batch: computed, then dropped
                token = slot.last if slot.last is not None else max(0, (slot.cached or [0])[-1])
                batch.add([token] * fill[slot.seq], len(slot.cached), slot.seq, "none")
                layout.append((slot.seq, fill[slot.seq]))
                continue
            assert slot.last is not None
            prop = drafts.get(slot.seq, Proposal())
            idx = batch.add([slot.last, *prop.offered], len(slot.cached), slot.seq, "all")
            windows.append((slot, idx, prop))
            layout.append((slot.seq, 1 + len(prop.offered)))
        # only a GPU prices a split step apart, and only a trace reports it
        parts = micro_batches(layout) if self.shape_costs or self.trace is not None else 1
        self.llama.decode(batch)
        for seq in fill:
            self.llama.seq_trim(seq, len(self.slots[seq].cached))
        # On a GPU the step is still computing: index the last tokens meanwhile, for the
        # drafts of the next step. While drafting pauses nobody drafts next step, and where
        # the host sets a step's pace (a small model, many slots) indexing would lengthen it:
        # the first draft after the pause indexes what came meanwhile (NgramIndex.draft).
        for slot in group if not self.ngram_pause else ():
            if slot.req is not None and slot.req.ngrams is not None:
                slot.req.ngrams.index()
        t1 = time.perf_counter()
        if self.trace is not None:  # the device's time apart from the host's
            self.llama.synchronize()
        t2 = time.perf_counter()
        for slot, idx, prop in windows:
            assert slot.last is not None
            slot.cached.append(slot.last)
            if prop.q_rows is None:
                self._verify(slot, idx, prop)
            else:
                self._verify_gated(slot, idx, prop)
        t3 = time.perf_counter()
        steady = not self.shape_costs or all(n == batch.n for n in self.shapes)
        # On a GPU a step split into micro-batches costs more than its rows say (no graph
        # replays for any part): it is not a price for that many rows in one batch.
        if parts == 1 or not self.shape_costs:
            self.cost.add(batch.n, t3 - t0, steady)
        self.shapes.append(batch.n)
        if self.trace is not None and (record := self._step) is not None:
            windowed = [prop for _, _, prop in windows if prop.tokens]
            record["rows"] = record.get("rows", 0) + batch.n
            record["seqs"] = sorted(record.get("seqs", []) + [slot.seq for slot in group])  # the decoding slots
            record["micro_batches"] = record.get("micro_batches", 0) + parts
            record["windows"] = record.get("windows", 0) + len(windowed)
            record["filler"] = record.get("filler", 0) + sum(p.filler for p in windowed)
            record["steady"] = steady
            for key, secs in (("decode_ms", t1 - t0), ("wait_ms", t2 - t1), ("verify_ms", t3 - t2)):
                record[key] = record.get(key, 0.0) + secs * 1e3

    def _gaps(self, group: list[Slot], drafts: dict[int, Proposal]) -> dict[int, int]:
        """On a GPU, the sequences of the slots between the group's first and last sequence that are not in
        it (idle, prefilling, decoding alone), with the rows each must add so that the step
        stays one micro-batch: llama.cpp computes a run of consecutive sequences holding
        equal rows together, and a gap splits the step in two, neither of which replays a
        captured graph (an H200 measured 5.7 ms for rows 1,1,0,1 against 1.3 ms for 1,1,1,1).
        Their rows are written past what the slot holds and trimmed after the decode."""
        if not self.shape_costs or not group:
            return {}
        rows = {1 + len(drafts[s.seq].offered) if s.seq in drafts else 1 for s in group}
        seqs = {s.seq for s in group}
        if len(rows) != 1:  # unequal rows split the step anyway
            return {}
        (n,) = rows
        gaps = [s for s in self.slots[min(seqs) : max(seqs) + 1] if s.seq not in seqs]
        if any(len(s.cached) + n > self.llama.n_ctx for s in gaps):
            return {}
        return {s.seq: n for s in gaps}

    # ---- speculation -------------------------------------------------------------------

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
                if slot.spec_wait:  # backing off after windows that kept nothing
                    slot.spec_wait -= 1
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
        if req.ngrams is None:  # the stream so far: the prompt, then emitted tokens
            req.ngrams = NgramIndex([*slot.cached, slot.last])
        tokens = req.ngrams.draft(k)
        if req.grammar is not None:  # a token the grammar forbids can never be kept
            tokens = tokens[: req.grammar.valid_prefix(tokens)]
        return tokens

    def _score_shadow(self, req: Request) -> None:
        """Score the request's shadow draft once its stream shows what it would have kept
        (as each token is emitted, paused or not). Where what it kept makes a window pay
        now, a pause of n-gram drafting ends: a copy resumed after a miss is drafted for
        at once, not after the rest of a pause of up to NGRAM_MAX_PAUSE steps."""
        shadow, ngrams = req.shadow, req.ngrams
        assert shadow is not None and ngrams is not None
        stream = ngrams.tokens
        i = len(stream) - 1 - shadow.start  # the token just emitted is the shadow's i-th guess
        if 0 <= i < len(shadow.tokens) - 1 and stream[-1] == shadow.tokens[i]:
            return  # guessed right, more to come: the common case, in constant time
        if (kept := shadow.check(stream)) is None:
            return
        req.acceptance.observe(len(shadow.tokens), kept)
        req.shadow = None
        if kept and self.ngram_pause and self._window_pays(req):
            self.ngram_pause, self._next_pause = 0, 1

    def _window_pays(self, req: Request) -> bool:
        """Whether a window as long as the request may open would pay in a step like the
        one running, at the request's acceptance (its drafts aside)."""
        n = int(self._step["n"]) if self._step is not None else 1
        k, margin = req.spec_k, MARGIN if self.shape_costs else CPU_MARGIN
        return window_size(req.acceptance.alpha, k, self.cost.seconds, n, float(n), k, 0, self.cost.switch,
                           self.calibration.ratio, margin) > 0  # fmt: skip

    def _open(self, slot: Slot, tokens: list[int], n: int, out: dict[int, Proposal]) -> float:
        """A window of ``n`` rows for the slot: its drafts, then filler (the last draft
        again) to the size; the drafts it promises to keep. With ``n`` 0 the drafts are
        recorded as a shadow instead, to learn what they would have kept."""
        req = slot.req
        assert req is not None and req.ngrams is not None and slot.last is not None
        if not n:
            if tokens and req.shadow is None:
                req.shadow = Shadow(len(req.ngrams.tokens), tokens)
            return 0.0
        filler = max(0, n - len(tokens))
        promised = expected_kept(req.acceptance.alpha, min(n, len(tokens)))
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
                n = window_size(req.acceptance.alpha, k, self.cost.seconds, rows, expect, len(tokens), 0,
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
        alphas = [(slot.req.acceptance.alpha if slot.req else 0.0, room if full else len(tokens))
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
            window_size(slot.req.acceptance.alpha if slot.req else 0.0, room, cost.seconds, rows, float(rows), room,
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

    def _verify(self, slot: Slot, idx: int, prop: Proposal) -> None:
        """Sample each row of the window as an ordinary step would (same position, same
        draw), keep the drafts that match, and trim the cache to what was kept."""
        req, draft = slot.req, prop.tokens
        assert req is not None
        drafts = len(draft) - prop.filler  # filler rows only pad the window: no drafts
        req.drafted += drafts  # counted before any row is sampled: a row may end the request
        kept = 0
        for j in range(len(draft) + 1):
            tok = self._sample(slot, self.llama.logits(idx + j))
            if tok is None or j == len(draft) or tok != draft[j]:
                break
            slot.cached.append(tok)  # its KV is already in the cache
            kept += 1
            if kept <= drafts:  # (a filler token that matched is emitted, not counted)
                req.accepted += 1
        if draft:
            self.calibration.add(min(kept, drafts), prop.promised)
            self._after_window(slot, req, drafts, min(kept, drafts))

    def _verify_gated(self, slot: Slot, idx: int, prop: Proposal) -> None:
        """Verify a draft-model window (the gated rule, speculative.py) and emit what it keeps: its accepted
        drafts, then the residual or bonus sample."""
        req, drafter = slot.req, self.drafter
        assert req is not None and drafter is not None and prop.q_rows is not None
        offered, params = prop.offered, req.params
        base, last_n = list(slot.cached), params.penalty_last_n

        def p_row(j: int) -> np.ndarray:  # the target's row j, after the drafts before it
            history = (base + offered[:j])[-last_n:] if last_n else ()
            return probabilities(self.llama.logits(idx + j), params, history)

        result = verify_proposal(p_row, prop, drafter.tau, params.seed, len(base))
        req.drafted += len(offered)  # counted before any row is emitted: one may end the request
        kept = 0
        for tok in [*offered[: result.accepted], result.token]:
            if self._sample(slot, self.llama.logits(idx + kept), chosen=tok) is None or kept == result.accepted:
                break
            slot.cached.append(tok)  # its KV is already in the cache
            kept += 1
            req.accepted += 1
        self._after_window(slot, req, len(offered), kept)

    def _after_window(self, slot: Slot, req: Request, drafted: int, kept: int) -> None:
        """Learn from a window, trim the cache to what was kept, and back off after misses."""
        req.acceptance.observe(drafted, kept)
        self.llama.seq_trim(slot.seq, len(slot.cached))
        slot.spec_misses = 0 if kept else slot.spec_misses + 1
        slot.spec_wait = min(2**slot.spec_misses - 1, SPEC_MAX_WAIT) if not kept else 0

    def _sample(self, slot: Slot, row: np.ndarray, chosen: int | None = None) -> int | None:
        """Sample the logits ``row`` for ``slot`` (or take ``chosen``, which a verifier drew
        from it); the token, or None when it ended the request. A request's first row is
        kept (``Slot.first``)."""
        req = slot.req
        assert req is not None
        params = req.params
        position = len(slot.cached)
        if not req.generated and slot.first.get(position) is not row:
            slot.first.pop(position, None)
            slot.first[position] = row.copy()  # last in order: the latest prompt's
            while len(slot.first) > FIRST_ROWS:
                del slot.first[next(iter(slot.first))]
        last_n = params.penalty_last_n
        history = slot.cached[-last_n:] if last_n else ()
        mask = None
        if req.grammar is not None:
            mask = req.grammar.mask()
            if mask is None:
                self._fail(slot, f"grammar failed: {req.grammar.error}")
                return None
        try:
            if chosen is not None:  # drawn by the gated verifier (never under a grammar)
                tok = chosen
            else:  # sample() takes the argmax itself for a plain, unmasked row
                tok = sample(row, params, history, position, mask=mask)
        except ValueError as exc:  # nothing permitted: this request's problem, not the batch's
            self._fail(slot, str(exc))
            return None
        if not req.t_first:
            req.t_first = time.perf_counter()
        if tok in req.stop_ids or self.llama.is_eog(tok):
            self._finish(slot, "stop")
            return None
        if req.grammar is not None and not req.grammar.consume(tok):
            self._fail(slot, f"grammar refused token {tok}: {req.grammar.error}")
            return None
        self.emit(proto.Token(req.rid, tok))
        if self._step is not None:
            self._step["emitted"] += 1
        if req.ngrams is not None:
            req.ngrams.append(tok)
            if req.shadow is not None:
                self._score_shadow(req)
        if req.logprobs is not None:
            if req.logprobs_processed:
                lps, top = processed_logprobs(row, req.logprobs, params, history, mask)
            else:
                lps, top = top_logprobs(row, req.logprobs, params.allowed)
            self.emit(proto.Logprob(req.rid, float(lps[tok]), tuple(top)))
        req.generated += 1
        slot.last = tok
        if req.grammar is not None and req.grammar.stopped:  # only end-of-generation may follow
            self._finish(slot, "stop")
            return None
        if req.generated >= req.max_tokens or position + 1 >= self.llama.n_ctx:
            self._finish(slot, "length")
            return None
        return tok
