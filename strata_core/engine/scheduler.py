"""The scheduler decides what runs: which request takes which slot (from which cached
prefix), which prompt chunks a step prefills, and which slots decode together.

Each step decodes chunks of pending prompts and then one token (or a speculative window)
for every decoding slot, within ``n_batch`` together. New requests join between steps and take
the free slot whose cached tokens share the longest prefix with their prompt, starting
from a copy of another slot's cache or of one saved in host memory where that holds more
of it (prompt_cache.py); finished or cancelled slots free at once and keep their cache
for the next request. It runs nothing itself (runner.py does) and samples nothing.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from collections.abc import Callable

from strata_core.contract import protocol as proto
from strata_core.engine.averages import moving_average
from strata_core.engine.emitter import Emitter
from strata_core.engine.llama import Llama
from strata_core.engine.media_runs import decode_media_ahead, media_boundary, text_ahead
from strata_core.engine.plan import Chunk, Plan
from strata_core.engine.prefill import CPU_PREFILL_ROWS, prefill_budget, prefill_order
from strata_core.engine.prompt_cache import SavedPrompts, common_prefix
from strata_core.engine.request import Request, Slot
from strata_core.engine.speculation.policy import Windows

#: A cached prefix is copied from another slot (or host memory) only when it holds at least
#: this many more tokens (fewer cost no less than computing them again); a slot's cache is
#: saved before it loses as many.
COPY_MIN_GAIN = 16


#: speculation's proposer: this step's windows for the decoding slots (``Speculator.propose``)
Propose = Callable[[list[Slot], bool], Windows]


class Scheduler:
    def __init__(self, llama: Llama, emitter: Emitter, saved_bytes: int = 0) -> None:
        self.llama = llama
        self.emitter = emitter
        self.slots = [Slot(i) for i in range(llama.n_seq)]
        self.waiting: deque[Request] = deque()
        self.saved = SavedPrompts(saved_bytes)  # slot caches kept in host memory
        # Measured: seconds to prefill one prompt token, and to copy a sequence's cache
        # (through host memory); None until seen. A copy must cost less than its prefill.
        self.prefill_secs: float | None = None
        self.copy_secs: float | None = None

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
                self.emitter.done(req, "cancelled")
                return True
        for slot in self.slots:
            if slot.req is not None and slot.req.rid == rid:
                self.emitter.finish(slot, "cancelled")
                return True
        return False

    # ---- what a step runs -----------------------------------------------------------

    def schedule(self, propose: Propose, capacity: int) -> Plan:
        """The plan of one step: waiting requests placed in free slots (and their media
        encoded into them), the windows ``propose`` opens for the decoding slots, the
        prompt chunks within ``capacity`` rows a batch and the step's budget, and the
        decodes. Nothing of it is decoded yet, and no slot holds the chunks until the
        emitter moves them in (``Emitter.prefilled``)."""
        self.admit()
        self.media()
        decoding = [s for s in self.slots if s.decoding]
        plan = Plan(decoding=decoding, windows=propose(decoding, self._waiting_first()))
        plan.cached_whole = [s for s in self.slots if s.req is not None and s.last is None and not s.pending]
        plan.budget = prefill_budget(capacity, sum(plan.windows.rows(s) for s in decoding), self.llama.on_gpu)
        plan.prefill, plan.firsts = self._prefill(plan.budget, plan.joined)
        plan.isolated = [self._chunk(s, capacity, plan.joined, with_last=False)
                         for s in self.slots if s.req is not None and s.req.isolate and s.pending]  # fmt: skip
        # the decoding slots together, and each that must replay exactly alone
        decoding = decoding + plan.joined
        shared = [s for s in decoding if s.req is not None and not s.req.isolate]
        plan.groups = ([shared] if shared else []) + [[s] for s in decoding if s.req is not None and s.req.isolate]
        return plan

    def _waiting_first(self) -> bool:
        """Whether a request in a slot still waits for its first token."""
        return any(s.req is not None and not s.req.generated for s in self.slots)

    def media(self) -> None:
        """The media items next in each slot's prompt, encoded and their embeddings decoded
        into its sequence, each in a ``llama_decode`` of its own (media_runs.py), before the
        step's prefill is planned: a prompt's text runs stop at them."""
        for slot in self.slots:
            if slot.req is None or not slot.req.media or not slot.pending:
                continue  # (most slots: asked every step)
            try:
                while slot.req is not None and decode_media_ahead(self.llama, slot.seq, slot.cached, slot.pending, slot.req.media):
                    pass
            except Exception as exc:  # this request's media, not the step's other requests
                traceback.print_exc()
                self.emitter.fail(slot, f"the media item could not be encoded: {exc}")

    def _prefill(self, budget: int, joined: list[Slot]) -> tuple[list[Chunk], list[Slot]]:
        """The prompt chunks this step prefills within ``budget`` rows, and the slots whose
        first token their last chunk computes too (in chunk order). A prompt that is all in
        without room for its last token joins the step's decodes (``joined``).
        Requests that must replay exactly are prefilled apart (``Plan.isolated``)."""
        prompts = [s for s in self.slots if s.req is not None and s.pending and not s.req.isolate]
        chunks: list[Chunk] = []
        firsts: list[Slot] = []
        order = prefill_order([(len(s.pending), s.req.t_arrive if s.req else 0.0) for s in prompts], self.llama.on_gpu)
        rows, whole, cpu = 0, False, not self.llama.on_gpu
        for slot in (prompts[i] for i in order):
            if budget <= 0 or (cpu and whole and rows >= CPU_PREFILL_ROWS):
                break
            chunk = self._chunk(slot, budget, joined, with_last=True)
            chunks.append(chunk)
            if chunk.last is not None:
                firsts.append(slot)
            taken = len(chunk.tokens) + (chunk.last is not None)
            budget, rows, whole = budget - taken, rows + taken, whole or len(chunk.tokens) == len(slot.pending)
        return chunks, firsts

    @staticmethod
    def _chunk(slot: Slot, most: int, joined: list[Slot], with_last: bool) -> Chunk:
        """Up to ``most`` of the slot's pending prompt tokens, from where its cache ends. A
        slot whose prompt is then all in takes its last token too (``with_last``, where
        there is room): its first token is sampled from this decode. Otherwise it joins the
        step's decodes (``joined``). The slot is left as it is: the emitter moves the chunk in once decoded.

        A request that must replay exactly is prefilled alone, in chunks its prompt alone
        decides: llama.cpp computes a token's KV by the rows of its sequence in the
        micro-batch (on the CPU, flash attention tiles 64 rows or more), so a chunk cut by
        the budget beside other prompts would change its logits; its chunks take the whole
        batch (``most``: the capacity) and no last token."""
        chunk = slot.pending[: text_ahead(slot.pending, most)]
        pos0 = len(slot.cached)
        if len(chunk) < len(slot.pending):
            return Chunk(slot.seq, chunk, pos0)
        if with_last and len(chunk) < most:
            assert slot.last is not None
            return Chunk(slot.seq, chunk, pos0, slot.last)
        joined.append(slot)
        return Chunk(slot.seq, chunk, pos0)

    def learn_prefill(self, rows: int, secs: float) -> None:
        if rows:
            self.prefill_secs = moving_average(self.prefill_secs, secs / rows)

    def release_all(self) -> None:
        """After a failed decode: every slot forgets its cache (the caller ended the requests)."""
        for slot in self.slots:
            slot.cached = []
            self.llama.seq_trim(slot.seq, 0)

    # ---- admission ------------------------------------------------------------------

    def admit(self) -> None:
        """Waiting requests take free slots."""
        free = [s for s in self.slots if s.req is None]
        while self.waiting and free:
            req = self.waiting.popleft()
            req.t_admit = time.perf_counter()
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
                self.emitter.emit(proto.Error(req.rid, f"could not start the request: {exc}"))
                self.emitter.done(req, "error")
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
        whole = not req.isolate and have >= len(prompt) and slot.first_for(req, len(prompt))
        keep = media_boundary(prompt, len(prompt) if whole else min(have, len(prompt) - 1), req.media)
        self.llama.seq_trim(slot.seq, keep)
        slot.cached = slot.cached[:keep]
        slot.first = {n: row for n, row in slot.first.items() if n <= keep}
        slot.pending = prompt[keep:-1]
        slot.req, slot.last = req, None if whole else prompt[-1]
        on_device = req.device_key if self.llama.device_greedy else None
        slot.device = self.llama.greedy_on_device(slot.seq, on_device) and on_device is not None
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

