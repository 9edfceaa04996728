"""Prompt caches kept in host memory after their slot moved on to another request.

A slot keeps its cache when its request ends, and the next request that shares a prefix
with it reuses it. With more distinct prompts (users, conversations) than slots, a slot
taken by a new prompt would lose a cache that a later request could have used: before
that happens the scheduler saves the slot's sequence state here, and a request whose
prompt shares more with a saved state than with any slot loads it instead of prefilling.
Entries are opaque state blobs (llama_state_seq_get_data) with the tokens they hold; the
least recently used go first once the entries exceed their byte budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from strata_core.engine.request import FirstKept


@dataclass
class Saved:
    tokens: list[int]
    state: np.ndarray  # uint8
    first: dict[int, FirstKept] = field(default_factory=dict)  # its slot's first-token rows or picks (Slot.first)


class SavedPrompts:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.entries: list[Saved] = []  # least recently used first
        self.size = 0

    def longest(self, prompt: Sequence[int]) -> tuple[Saved | None, int]:
        """The entry sharing the longest prefix with ``prompt``, and that length."""
        best, n = None, 0
        for e in self.entries:
            m = common_prefix(e.tokens, prompt)
            if m > n:
                best, n = e, m
        return best, n

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether an entry already holds all of ``tokens`` (as its own or as a prefix)."""
        return any(_starts_with(e.tokens, tokens) for e in self.entries)

    def use(self, entry: Saved) -> None:
        """Mark ``entry`` most recently used."""
        self.entries.remove(entry)
        self.entries.append(entry)

    def add(self, tokens: Sequence[int], state: np.ndarray, first: dict[int, FirstKept] | None = None) -> None:
        """Keep ``state`` for ``tokens`` (and the first-token rows of prompts it holds);
        entries it holds all of (a prefix of it) go, their rows joining its."""
        if state.nbytes > self.capacity:
            return
        rows: dict[int, FirstKept] = {}
        for e in [e for e in self.entries if _starts_with(tokens, e.tokens)]:
            rows.update(e.first)
            self._drop(e)
        rows.update(first or {})
        entry = Saved(list(tokens), state, rows)
        self.entries.append(entry)
        self.size += _nbytes(entry)
        while self.size > self.capacity:
            self._drop(self.entries[0])

    def clear(self) -> None:
        self.entries, self.size = [], 0

    def _drop(self, entry: Saved) -> None:
        self.entries.remove(entry)
        self.size -= _nbytes(entry)


def _nbytes(entry: Saved) -> int:
    return entry.state.nbytes + sum(row.nbytes for row in entry.first.values() if isinstance(row, np.ndarray))


def _starts_with(tokens: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(prefix) <= len(tokens) and common_prefix(tokens, prefix) == len(prefix)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n
