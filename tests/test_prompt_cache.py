"""The host-memory prompt cache's bookkeeping (the engine test is in test_engine_slots.py)."""

from __future__ import annotations

import numpy as np

from strata_core.engine.prompt_cache import SavedPrompts


def blob(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.uint8)


def test_longest_finds_the_entry_sharing_most() -> None:
    saved = SavedPrompts(1000)
    saved.add([1, 2, 3, 4], blob(10))
    saved.add([1, 2, 9], blob(10))
    entry, n = saved.longest([1, 2, 3, 7])
    assert entry is not None and entry.tokens == [1, 2, 3, 4] and n == 3
    assert saved.longest([5, 6]) == (None, 0)


def test_an_entry_holding_another_replaces_it() -> None:
    saved = SavedPrompts(1000)
    saved.add([1, 2], blob(10))
    saved.add([1, 2, 3], blob(10))
    assert [e.tokens for e in saved.entries] == [[1, 2, 3]] and saved.size == 10
    assert saved.holds([1, 2]) and saved.holds([1, 2, 3]) and not saved.holds([1, 2, 3, 4])


def test_least_recently_used_go_first_past_the_budget() -> None:
    saved = SavedPrompts(25)
    saved.add([1], blob(10))
    saved.add([2], blob(10))
    first, _ = saved.longest([1])
    assert first is not None
    saved.use(first)  # [1] is now the most recently used
    saved.add([3], blob(10))
    assert [e.tokens for e in saved.entries] == [[1], [3]] and saved.size == 20


def test_a_state_larger_than_the_budget_is_not_kept() -> None:
    saved = SavedPrompts(5)
    saved.add([1, 2], blob(10))
    assert saved.entries == [] and saved.size == 0
