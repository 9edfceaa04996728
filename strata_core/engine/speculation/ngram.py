"""N-gram (prompt lookup) drafts: the tokens that followed the latest earlier occurrence
of the stream's suffix. Drafts are point masses, verified by exact match (verify.py)."""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """N-gram (prompt lookup) drafts over a stream that grows a token at a time, in
    constant time per token: for each n, where the latest occurrence of each n-gram that
    some token followed ends. The scheduler keeps one per request (prompt, then emitted
    tokens).

    ``append`` only extends the stream; the n-grams it completes are indexed by ``index``,
    which ``draft`` calls first. The scheduler calls it right after launching each decode:
    a GPU's decode returns once the work is queued, so there indexing costs the step no
    time."""

    def __init__(self, tokens: Sequence[int] = (), n_max: int = 3, n_min: int = 1) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n_min={n_min}, n_max={n_max} are out of range: expected 1 <= n_min <= n_max")
        self.tokens: list[int] = [int(t) for t in tokens]
        self.n_max, self.n_min = n_max, n_min
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
        self._indexed = 0  # the n-grams ending before this position are indexed

    def append(self, token: int) -> None:
        self.tokens.append(int(token))

    def index(self) -> None:
        """Index the n-grams that gained a follower since the last call."""
        t, ends = self.tokens, self._ends
        for p in range(self._indexed, len(t) - 1):  # the n-grams ending at p have a follower
            key: tuple[int, ...] = ()
            for n in range(1, min(self.n_max, p + 1) + 1):  # each n-gram extends the one before
                key = (t[p - n + 1], *key)
                ends[n][key] = p
        self._indexed = max(self._indexed, len(t) - 1)

    def draft(self, k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest
        suffix n-gram of the stream (n from n_max down to n_min); [] when none occurs."""
        t = self.tokens
        if k <= 0 or len(t) <= self.n_min:
            return []
        self.index()
        for n in range(min(self.n_max, len(t)), self.n_min - 1, -1):
            end = self._ends[n].get(tuple(t[len(t) - n :]))
            if end is not None:
                return t[end + 1 : end + 1 + k]
        return []
