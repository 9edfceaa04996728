"""The model runner: builds a step's llama.cpp batches, decodes them and hands back the
logits rows as one matrix. It decides nothing: the scheduler says what runs, speculation
what windows hold."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from strata_core.engine.llama import Batch, Llama
from strata_core.engine.plan import Chunk
from strata_core.engine.request import Slot
from strata_core.engine.ubatch import micro_batches


class Rows(NamedTuple):
    """Tokens of one sequence decoded with logits at every row (a last token and its window)."""

    seq: int
    tokens: list[int]
    pos0: int


class Decoded(NamedTuple):
    first: dict[int, int]  # sequence -> its first row in ``logits``
    rows: int  # the batch's rows, padding included
    parts: int  # micro-batches llama.cpp splits it into (1 when not counted)
    steady: bool  # the decodes before it had its shape (a GPU replays a captured graph)


class Runner:
    def __init__(self, llama: Llama, shape_costs: bool, count_parts: bool) -> None:
        self.llama = llama
        self.batch = Batch(max(llama.n_batch, llama.n_seq))
        self.shape_costs = shape_costs  # a GPU: pad a step to one micro-batch (``gaps``)
        self.count_parts = count_parts or shape_costs
        self.shapes: deque[int] = deque([0, 0], maxlen=2)  # sizes of the last two decodes
        self._outputs = 0  # logits rows of the last decode

    @property
    def capacity(self) -> int:
        return self.batch.capacity

    def prefill(self, chunks: list[Chunk]) -> tuple[np.ndarray, int, float]:
        """Decode prompt chunks in one batch; the rows of the chunks' ``last`` tokens, in
        chunk order, the batch's rows and the seconds it took."""
        batch = self.batch
        batch.clear()
        outputs = 0
        for c in chunks:
            batch.add(c.tokens, c.pos0, c.seq, "none")
            if c.last is not None:
                batch.add_one(c.last, c.pos0 + len(c.tokens), c.seq)
                outputs += 1
        if not batch.n:
            return np.empty((0, self.llama.n_vocab), np.float32), 0, 0.0
        t0 = time.perf_counter()
        self.llama.decode(batch)
        self.llama.synchronize()
        self.shapes.append(batch.n)
        return self.llama.outputs(outputs), batch.n, time.perf_counter() - t0

    def decode(self, rows: list[Rows], fill: dict[int, tuple[int, int, int]]) -> Decoded:
        """Launch one decode of ``rows`` and of ``fill`` (sequence -> token, position,
        rows: padding that keeps the batch one micro-batch, computed then dropped). On a
        GPU it returns while the device computes; ``logits`` waits for it."""
        batch = self.batch
        first: dict[int, int] = {}
        layout: list[tuple[int, int]] = []  # (sequence, rows) in batch order
        token: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        logits: list[int] = []
        outputs = 0
        entries = [(r.seq, r.tokens, r.pos0, 1) for r in rows]
        entries += [(seq, [t] * n, p, 0) for seq, (t, p, n) in fill.items()]
        for seq, tokens, pos0, out in sorted(entries, key=lambda e: e[0]):  # consecutive sequences go together
            n = len(tokens)
            if out:
                first[seq], outputs = outputs, outputs + n
            token += tokens
            pos += range(pos0, pos0 + n)
            seqs += [seq] * n
            logits += [out] * n
            layout.append((seq, n))
        batch.fill(token, pos, seqs, logits)
        parts = micro_batches(layout) if self.count_parts else 1
        steady = not self.shape_costs or all(n == batch.n for n in self.shapes)
        self.llama.decode(batch)
        for seq, (_, held, _) in fill.items():
            self.llama.seq_trim(seq, held)
        self.shapes.append(batch.n)
        self._outputs = outputs
        return Decoded(first, batch.n, parts, steady)

    def logits(self) -> np.ndarray:
        """The last decode's logits rows (waiting for the device)."""
        return self.llama.outputs(self._outputs)

    def gaps(self, slots: list[Slot], group: list[Slot], rows_of: Callable[[Slot], int]) -> dict[int, tuple[int, int, int]]:
        """On a GPU, padding for the sequences between the group's first and last that are
        not in it (idle, prefilling, decoding alone): llama.cpp computes a run of consecutive
        sequences holding equal rows together, and a gap splits the step in two, neither of
        which replays a captured graph, so the step costs several plain ones
        (bench/results/2026-12-03-cuda-h200-micro-batches.md). Their rows are written past what the slot holds and trimmed
        after the decode. ``rows_of``: a group slot's rows."""
        if not self.shape_costs or not group:
            return {}
        rows = {s.seq: rows_of(s) for s in group}
        if len(set(rows.values())) != 1:
            return {}  # (unequal rows split the step anyway)
        (n,) = set(rows.values())
        seqs = {s.seq for s in group}
        gaps = [s for s in slots[min(seqs) : max(seqs) + 1] if s.seq not in seqs]
        if any(len(s.cached) + n > self.llama.n_ctx for s in gaps):
            return {}
        return {s.seq: (s.last if s.last is not None else max(0, (s.cached or [0])[-1]), len(s.cached), n) for s in gaps}
