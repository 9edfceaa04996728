"""Emission: what a step's decodes and sampled tokens do to slots and requests (events
out, stops, grammar, limits). After the scheduler placed a request, the emitter is the only
writer of its slot's tokens and its state.

The runner decodes; ``prefilled`` and ``decoded`` move what a decode computed into the
slot's cache, and ``kept`` a window's confirmed tokens. The loop samples; ``accept`` then
checks the token against the request's stops, feeds the grammar, writes TOKEN (and LP)
events, and ends the request at its limits. Ending a request (``finish``, ``fail``) frees
its slot at once; its cache stays.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from strata_core.contract import protocol as proto
from strata_core.engine.llama import Llama
from strata_core.engine.plan import Chunk
from strata_core.engine.request import FIRST_ROWS, Request, Slot
from strata_core.engine.sampler import processed_logprobs, top_logprobs

Emit = Callable[[proto.Event], None]


class Emitter:
    def __init__(self, llama: Llama, emit: Emit) -> None:
        self.llama = llama
        self.emit = emit
        self.observe: Callable[[Request, int], None] = lambda req, token: None  # every emitted token
        self.emitted = 0  # tokens emitted so far (the step trace counts them)
        self._eog: dict[int, bool] = {}  # llama.is_eog by token, asked once each

    def done(self, req: Request, reason: str) -> None:
        now = time.perf_counter()
        stats = {"prompt": str(len(req.prompt)), "cached": str(req.cached), "gen": str(req.generated)}
        if req.spec_k:
            stats.update(drafted=str(req.drafted), accepted=str(req.accepted))
        if req.t_admit:
            stats["queue_ms"] = f"{(req.t_admit - req.t_arrive) * 1e3:.2f}"
        if req.t_first:
            stats["ttft_ms"] = f"{(req.t_first - req.t_arrive) * 1e3:.2f}"
            stats["gen_ms"] = f"{(now - req.t_first) * 1e3:.2f}"
        self.emit(proto.Done(req.rid, reason, stats))

    def finish(self, slot: Slot, reason: str) -> None:
        assert slot.req is not None
        self.done(slot.req, reason)
        if slot.req.lora is not None:  # KV of other adapters: no later prompt may reuse it
            self.llama.seq_trim(slot.seq, 0)
            slot.cached, slot.first = [], {}
        slot.clear()

    def fail(self, slot: Slot, message: str) -> None:
        assert slot.req is not None
        self.emit(proto.Error(slot.req.rid, message))
        self.finish(slot, "error")

    def mask(self, slot: Slot) -> tuple[bool, np.ndarray | None]:
        """The grammar's mask before the slot's next sample (None without a grammar); False
        when the grammar failed, which ends the request."""
        req = slot.req
        assert req is not None
        if req.grammar is None:
            return True, None
        mask = req.grammar.mask()
        if mask is None:
            self.fail(slot, req.grammar.refusal())
            return False, None
        return True, mask

    # ---- what a step's decodes did to the slots ----------------------------------------

    def prefilled(self, slot: Slot, chunk: Chunk) -> None:
        """The chunk is decoded into the slot's sequence: its tokens leave the pending
        prompt for the cache (and its last token too, whose row gives the first token)."""
        slot.cached.extend(chunk.tokens)
        del slot.pending[: len(chunk.tokens)]
        if chunk.last is not None:
            slot.cached.append(chunk.last)

    def decoded(self, slot: Slot) -> None:
        """The slot's last token is decoded: its KV is in the cache."""
        assert slot.last is not None
        slot.cached.append(slot.last)

    def kept(self, slot: Slot, token: int) -> None:
        """A window's token is kept: its KV, computed by the window's decode, stays."""
        slot.cached.append(token)

    def accept(self, slot: Slot, row: np.ndarray | None, tok: int, mask: np.ndarray | None) -> int | None:
        """Emit ``tok``, sampled from the logits ``row`` (under ``mask``; None: picked in the
        decode) at the slot's next position; the token, or None when it ended the request.
        A request's first row (or token) is kept (``Slot.first``)."""
        req = slot.req
        assert req is not None
        if req.budget is not None:
            tok = req.budget.next(tok)
        position = len(slot.cached)
        if not req.generated and (row is None or slot.first.get(position) is not row):
            slot.first.pop(position, None)
            if row is not None:
                slot.first[position] = row.copy()  # last in order: the latest prompt's
            elif req.device_key is not None:  # (always, for a row picked in the decode)
                slot.first[position] = (req.device_key, tok)
            while len(slot.first) > FIRST_ROWS:
                del slot.first[next(iter(slot.first))]
        if not req.t_first:
            req.t_first = time.perf_counter()
        eog = self._eog.get(tok)
        if eog is None:
            eog = self._eog[tok] = self.llama.is_eog(tok)
        if eog or tok in req.stop_ids:
            self.finish(slot, "stop")
            return None
        if req.grammar is not None and not req.grammar.consume(tok):
            self.fail(slot, f"grammar refused token {tok}: {req.grammar.error}")
            return None
        self.emit(proto.Token(req.rid, tok))
        self.emitted += 1
        self.observe(req, tok)
        if req.logprobs is not None:
            assert row is not None  # (a request with logprobs is never picked in the decode)
            self._logprobs(slot, row, tok, mask)
        req.generated += 1
        slot.last = tok
        if req.grammar is not None and req.grammar.stopped:  # only end-of-generation may follow
            self.finish(slot, "stop")
            return None
        if req.generated >= req.max_tokens or position + 1 >= self.llama.n_ctx:
            self.finish(slot, "length")
            return None
        return tok

    def _logprobs(self, slot: Slot, row: np.ndarray, tok: int, mask: np.ndarray | None) -> None:
        req = slot.req
        assert req is not None and req.logprobs is not None
        params = req.params
        if req.logprobs_processed:
            history = slot.history(params.history_n)
            lps, top = processed_logprobs(row, req.logprobs, params, history, mask, req.sampling)
        else:
            lps, top = top_logprobs(row, req.logprobs, params.allowed)
        self.emit(proto.Logprob(req.rid, float(lps[tok]), tuple(top)))
