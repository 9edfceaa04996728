"""The engine loop: each step is schedule -> run -> sample -> emit.

The scheduler (scheduler.py) decides everything a step runs and hands it over as one
``Plan`` (plan.py): placements, prefill chunks, isolated chunks, the decodes, the first
tokens kept from earlier rows, and the windows speculation proposed into it. The runner
(runner.py) decodes the plan's batches and hands back their logits rows (or the tokens
the device picked). One sampler call (batch_sampler.py) picks a token for every row a
decode gives; the emitter (emitter.py) then moves what was decoded into the slots and
applies the tokens in order, speculation judging each window's rows through the sampled
tokens, so it reads the same with speculation off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from strata_core.contract import protocol as proto
from strata_core.engine.batch_sampler import PLAIN, Row, Sampled, sample_rows
from strata_core.engine.emitter import Emit, Emitter
from strata_core.engine.llama import Llama
from strata_core.engine.plan import Chunk, Plan
from strata_core.engine.request import Request, Slot
from strata_core.engine.runner import Rows, Runner
from strata_core.engine.scheduler import Scheduler
from strata_core.engine.speculation.drafter import DraftModel
from strata_core.engine.speculation.policy import Speculator, Windows
from strata_core.engine.speculation.verify import Proposal

Trace = Callable[[dict[str, Any]], None]


class Engine:
    def __init__(
        self, llama: Llama, emit: Emit, drafter: DraftModel | None = None, adaptive: bool = True,
        saved_bytes: int = 0, shape_costs: bool = False, trace: Trace | None = None,
    ) -> None:  # fmt: skip
        self.llama = llama
        self.runner = Runner(llama, shape_costs, count_parts=trace is not None)
        self.emitter = Emitter(llama, emit)
        self.scheduler = Scheduler(llama, self.emitter, saved_bytes)
        self.spec = Speculator(llama, self.scheduler.slots, drafter, adaptive, shape_costs)
        self.emitter.observe = self.spec.observe  # every emitted token, for the n-gram index
        self.trace = trace  # one record a step (timings, rows, micro-batches), when given
        self._step: dict[str, Any] | None = None  # the step that ran last, until timed
        self._t_step = 0.0  # when it started
        self._emitted0 = 0  # tokens emitted before it

    # ---- what the process calls ------------------------------------------------------

    @property
    def slots(self) -> list[Slot]:
        return self.scheduler.slots

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    def submit(self, req: Request) -> None:
        self.spec.attach(req)
        self.scheduler.submit(req)

    def cancel(self, rid: str) -> bool:
        return self.scheduler.cancel(rid)

    def save_idle(self) -> bool:
        return self.scheduler.save_idle()

    def fail_all(self, message: str) -> None:
        """After a failed decode: every request in a slot ends with ``message``, and every
        slot forgets its cache."""
        for slot in self.slots:
            if slot.req is not None:
                self.emitter.emit(proto.Error(slot.req.rid, message))
                self.emitter.finish(slot, "error")
        self.scheduler.release_all()

    # ---- one step -------------------------------------------------------------------

    def step(self) -> None:
        """One step: the plan, then its prompt chunks in one ``llama_decode`` (isolated
        ones each in their own), then one token (or one speculative window) per decoding
        slot in a second.

        Decode rows never share a batch with prompt chunks, so a generated token's row is
        computed the same way whatever else is prefilling. A prompt's first token is
        sampled from its last chunk's last row, so it comes in the step that prefills that
        chunk; a prompt cached whole with the row that gave its first token before takes
        it from that row, at the start of a step (``Slot.first``).
        """
        t_step = time.perf_counter()
        self._timed(t_step)
        plan = self.scheduler.schedule(self.spec.propose, self.runner.capacity)
        self._record(t_step, plan)
        self._kept_firsts(plan.cached_whole)
        self._prefill(plan.prefill, plan.firsts)
        for chunk in plan.isolated:
            self._prefill([chunk], [], self._lora(self.slots[chunk.seq]))
        self._t_step = t_step
        for group in plan.groups:
            self._decode(group, plan.windows)
        if not self.busy:  # nothing runs next: the step ends here, not at the next one
            self._timed(time.perf_counter())

    def _record(self, t_step: float, plan: Plan) -> None:
        """Open the step's trace record."""
        windows = plan.windows
        record: dict[str, Any] = {"t": t_step, "n": len(plan.decoding), "allowed": windows.allowed, "emitted": 0}
        if windows.guarded:
            record["guarded"] = True
        self._step = record
        self._emitted0 = self.emitter.emitted

    def _kept_firsts(self, slots: list[Slot]) -> None:
        """First tokens from the rows kept when the same prompt gave one before."""
        for slot in slots:
            kept = slot.first[len(slot.cached)]
            if isinstance(kept, np.ndarray):
                self.sample_one(slot, kept)
            else:  # the token a decode picked, under the request's own bias
                self.emitter.accept(slot, None, kept[1], None)

    def _prefill(self, chunks: list[Chunk], firsts: list[Slot], lora: tuple[float, ...] | None = None) -> None:
        """Decode prompt chunks (under the LoRA scales ``lora``, None: the configured ones),
        move them into their slots and sample the first tokens their last rows give."""
        if not chunks:
            return
        self.llama.use_lora(lora)
        logits, rows, secs = self.runner.prefill(chunks)
        for chunk in chunks:
            self.emitter.prefilled(self.slots[chunk.seq], chunk)
        self.scheduler.learn_prefill(rows, secs)
        if (record := self._step) is not None and rows:
            record["prefill_rows"] = record.get("prefill_rows", 0) + rows
            record["prefill_ms"] = record.get("prefill_ms", 0.0) + secs * 1e3
        if firsts:
            self._sample_emit(firsts, logits)

    def _sample_emit(self, slots: list[Slot], logits: np.ndarray) -> None:
        """One row each (in order): sample them in one call, then emit."""
        masks = [self.emitter.mask(s) for s in slots]
        rows = [self._row(s, mask) if ok and not s.device else None for s, (ok, mask) in zip(slots, masks, strict=True)]
        out = sample_rows(logits, rows)
        self._picked(out, [i for i, s in enumerate(slots) if s.device], len(logits))
        for i, (slot, (ok, mask)) in enumerate(zip(slots, masks, strict=True)):
            if ok:
                self.emit_row(slot, None if slot.device else logits[i], out, i, mask)

    def _picked(self, out: Sampled, rows: list[int], n: int) -> None:
        """The tokens the decode picked at ``rows`` (of its ``n`` outputs), into ``out``."""
        if rows:
            out.tokens[rows] = self.llama.sampled(rows, n)

    def sample_one(self, slot: Slot, row: np.ndarray, chosen: int | None = None) -> int | None:
        """Sample one row for the slot (or take ``chosen``, drawn from it) and emit it."""
        ok, mask = self.emitter.mask(slot)
        if not ok:
            return None
        if chosen is not None:
            return self.emitter.accept(slot, row, chosen, mask)
        return self.emit_row(slot, row, sample_rows(row[None, :], [self._row(slot, mask)]), 0, mask)

    def _row(self, slot: Slot, mask: np.ndarray | None, ahead: list[int] | None = None) -> Row:
        """How the slot's next row is sampled; ``ahead``: window drafts before the row,
        taken as kept (the row is only reached if they are)."""
        req = slot.req
        assert req is not None
        if req.plain:
            return PLAIN
        params, n = req.params, len(slot.cached)
        return Row(params, slot.history(params.history_n, ahead), n + len(ahead or ()), 0, mask, req.sampling)

    def emit_row(self, slot: Slot, row: np.ndarray | None, out: Sampled, i: int, mask: np.ndarray | None) -> int | None:
        if i in out.errors:  # nothing permitted: this request's problem, not the batch's
            grammar = mask is not None  # the grammar's mask left nothing: the caller's constraint
            self.emitter.fail(slot, f"{proto.GRAMMAR_REFUSED} {out.errors[i]}" if grammar else out.errors[i])
            return None
        return self.emitter.accept(slot, row, int(out.tokens[i]), mask)

    @staticmethod
    def _lora(slot: Slot) -> tuple[float, ...] | None:
        return slot.req.lora if slot.req is not None else None

    def _timed(self, now: float) -> None:
        """Close the last step's record: its wall time runs to ``now`` (the next step's start,
        so what the engine does between steps counts); the guard learns from it."""
        record, self._step = self._step, None
        if record is None:
            return
        record["emitted"] = self.emitter.emitted - self._emitted0
        secs = now - self._t_step
        if record.get("guarded"):
            self.spec.learn_guarded(int(record["n"]), int(record["emitted"]), secs)
        if self.trace is not None:
            record["step_ms"] = secs * 1e3
            self.trace(record)

    def _decode(self, group: list[Slot], windows: Windows) -> None:
        """One ``llama_decode`` of the group's last tokens (with their windows), then
        sample them: logits only live until the next decode."""
        t0 = time.perf_counter()
        drafts = windows.drafts
        rows = [Rows(s.seq, [s.last, *drafts[s.seq].offered] if s.seq in drafts else [s.last], len(s.cached))  # type: ignore[list-item]
                for s in group]  # fmt: skip
        fill = self.runner.gaps(self.slots, group, windows.rows)
        self.llama.use_lora(self._lora(group[0]))  # a group shares its adapters: the scheduler's groups
        decoded = self.runner.decode(rows, fill)
        # On a GPU the step is still computing: index the last tokens meanwhile.
        self.spec.index(group)
        t1 = time.perf_counter()
        logits = self.runner.logits()  # waits for the device
        t2 = time.perf_counter()
        self._judge(sorted(group, key=lambda s: s.seq), drafts, logits, decoded.first)
        t3 = time.perf_counter()
        # On a GPU a step split into micro-batches costs more than its rows say (no graph
        # replays for any part): it is not a price for that many rows in one batch.
        if decoded.parts == 1 or not self.spec.shape_costs:
            self.spec.learn_step(decoded.rows, t3 - t0, decoded.steady)
        if self.trace is not None and (record := self._step) is not None:
            windowed = [drafts[s.seq] for s in group if s.seq in drafts and drafts[s.seq].tokens]
            record["rows"] = record.get("rows", 0) + decoded.rows
            record["seqs"] = sorted(record.get("seqs", []) + [slot.seq for slot in group])  # the decoding slots
            record["micro_batches"] = record.get("micro_batches", 0) + decoded.parts
            record["windows"] = record.get("windows", 0) + len(windowed)
            record["filler"] = record.get("filler", 0) + sum(p.filler for p in windowed)
            record["steady"] = decoded.steady
            for key, secs in (("decode_ms", t1 - t0), ("wait_ms", t2 - t1), ("verify_ms", t3 - t2)):
                record[key] = record.get(key, 0.0) + secs * 1e3

    def _judge(self, group: list[Slot], drafts: dict[int, Proposal], logits: np.ndarray, first: dict[int, int]) -> None:
        """Sample every row of the decode in one call, then emit slot by slot in batch
        order, speculation judging each window. A window under a grammar (whose mask at a
        row follows the tokens kept before it) or from the draft model samples row by row."""
        rows: list[Row | None] = [None] * len(logits)
        todo: list[tuple[Slot, Proposal | None, np.ndarray | None, bool]] = []  # slot, window, mask, sampled now
        picked: list[int] = []  # rows whose token the decode picked
        for slot in group:
            req = slot.req
            assert req is not None and slot.last is not None
            self.emitter.decoded(slot)
            prop = drafts.get(slot.seq)
            if slot.device:
                todo.append((slot, prop, None, True))
                at = first[slot.seq]
                picked += range(at, at + 1 + (len(prop.offered) if prop is not None else 0))
                continue
            if prop is not None and (prop.q_rows is not None or req.grammar is not None):
                todo.append((slot, prop, None, False))
                continue
            mask = None
            if req.grammar is not None:
                ok, mask = self.emitter.mask(slot)
                if not ok:
                    continue
            todo.append((slot, prop, mask, True))
            at = first[slot.seq]
            rows[at] = self._row(slot, mask)
            for j in range(1, len(prop.tokens) + 1 if prop is not None else 1):
                rows[at + j] = self._row(slot, None, prop.tokens[:j])  # type: ignore[union-attr]
        # (every row picked in the decode: nothing to sample)
        out = sample_rows(logits, rows) if len(picked) < len(rows) else Sampled(np.full(len(rows), -1), {})
        self._picked(out, picked, len(logits))
        tokens, accept = out.tokens.tolist(), self.emitter.accept
        for slot, prop, mask, sampled in todo:
            at = first[slot.seq]
            if prop is None and slot.device:  # the decode's pick (it is never refused)
                accept(slot, None, tokens[at], None)
            elif prop is None:  # no window: the row's token, as judging it would emit
                self.emit_row(slot, logits[at], out, at, mask)
            else:
                self.spec.judge(slot, prop, SlotRows(self, slot, logits, at, out if sampled else None, mask))


class SlotRows:
    """A slot's rows of a decode as speculation judges them (``policy.WindowRows``): their
    tokens taken from the step's one sampler call (``out``), or, where a row's mask
    follows the tokens kept before it (a grammar) or the draft model's verifier chooses
    (``out`` None), each sampled as it is taken."""

    def __init__(self, engine: Engine, slot: Slot, logits: np.ndarray, at: int, out: Sampled | None,
                 mask: np.ndarray | None) -> None:  # fmt: skip
        self.engine, self.slot, self._logits, self.at, self.out, self.mask = engine, slot, logits, at, out, mask

    def logits(self, j: int) -> np.ndarray:
        return self._logits[self.at + j]

    def take(self, j: int, chosen: int | None = None) -> int | None:
        if self.out is None:
            return self.engine.sample_one(self.slot, self._logits[self.at + j], chosen)
        assert chosen is None
        row = None if self.slot.device else self._logits[self.at + j]
        return self.engine.emit_row(self.slot, row, self.out, self.at + j, self.mask if j == 0 else None)

    def keep(self, token: int) -> None:
        self.engine.emitter.kept(self.slot, token)
