"""Media items in the scheduler's prompts: each item's positions hold one negative id, its
placeholder (``placeholder``), so a prompt stays a list of ints that prefix reuse compares as
it compares tokens. Text runs are prefilled in the step's shared batch; a media run is
encoded by mtmd and its embeddings decoded into the slot's sequence on their own, between
the text before and after it.
"""

from __future__ import annotations

from typing import Any, Protocol


class MediaItem(Protocol):
    n: int  # positions it takes

    def decode(self, llama: Any, seq: int, pos: int) -> int: ...


def placeholder(key: str) -> int:
    """The id a media item's positions hold inside the scheduler: negative, so never a token,
    and equal for equal keys (``key``: hex digits of the item's hash)."""
    return -1 - int(key[:15], 16)


def text_ahead(pending: list[int], most: int) -> int:
    """How many of the first ``most`` pending ids are text, up to the first media run."""
    for i, tok in enumerate(pending[:most]):
        if tok < 0:
            return i
    return min(most, len(pending))


def media_boundary(prompt: list[int], keep: int, items: dict[int, MediaItem]) -> int:
    """``keep`` (a cached prefix's length) moved back to the start of the media item it would
    cut: an item's embeddings are decoded whole or not at all."""
    if not items or keep <= 0 or keep >= len(prompt) or prompt[keep] >= 0 or prompt[keep - 1] != prompt[keep]:
        return keep
    tok, start = prompt[keep], keep
    while start > 0 and prompt[start - 1] == tok:
        start -= 1
    n = items[tok].n  # equal items side by side: whole items from the run's start
    return start + (keep - start) // n * n


def decode_media_ahead(llama: Any, seq: int, cached: list[int], pending: list[int], items: dict[int, MediaItem]) -> bool:
    """Decode the media item at the head of ``pending`` into ``seq`` (moving its positions
    from ``pending`` to ``cached``); whether there was one."""
    if not pending or pending[0] >= 0:
        return False
    item = items[pending[0]]
    llama_pos = item.decode(llama, seq, len(cached))
    if llama_pos != len(cached) + item.n:
        raise RuntimeError(f"a media item took {llama_pos - len(cached)} positions, not the {item.n} announced")
    cached.extend(pending[: item.n])
    del pending[: item.n]
    return True
