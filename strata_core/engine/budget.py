"""Reasoning budgets: a request's reasoning is ended after a number of tokens by emitting
the family's closing marker, after which the model writes its answer.

The engine sees tokens, the marker is text (``</think>``), so the budget follows the
reply's bytes: the reply reasons when the prompt left a think block open or when it opens
one itself (``<think>`` after optional whitespace); it stops reasoning once ``</think>``
appears. While it reasons, every emitted token counts; when ``budget`` tokens have been
emitted and the reasoning is still open, the next tokens are the closing marker's ids
instead of samples, one a step (each is decoded like a sample, so the answer that follows
sees it). A budget of 0 closes the reasoning at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from strata_core.text.reasoning import CLOSE, OPEN

_OPEN, _CLOSE = OPEN.encode(), CLOSE.encode()


class ThinkBudget:
    """One request's budget: ``next(sampled)`` gives the token to emit in its place."""

    def __init__(self, budget: int, close: Sequence[int], piece: Callable[[int], bytes], opened: bool) -> None:
        self.budget = budget
        self.close = list(close)
        self.piece = piece
        self.state: Literal["start", "think", "forcing", "done"] = "think" if opened else "start"
        self.spent = 0  # tokens emitted while reasoning
        self._bytes = b""  # the reply's opening (start) or the reasoning's tail (think)
        self._forced = 0

    def next(self, sampled: int) -> int:
        """The token to emit: ``sampled``, or the closing marker's next id once the budget is spent."""
        if self.state == "think" and self.spent >= self.budget:
            self.state = "forcing"
        if self.state == "forcing":
            tok = self.close[self._forced]
            self._forced += 1
            if self._forced == len(self.close):
                self.state = "done"
            return tok
        self._see(sampled)
        return sampled

    def _see(self, tok: int) -> None:
        if self.state == "start":
            self._bytes += self.piece(tok)
            head = self._bytes.lstrip()
            if head.startswith(_OPEN):
                self.state, self._bytes = "think", head[len(_OPEN) :]
            elif head and not _OPEN.startswith(head):
                self.state = "done"  # the reply does not reason
        elif self.state == "think":
            self.spent += 1
            self._bytes = (self._bytes + self.piece(tok))[-(len(_CLOSE) + 16) :]
            if _CLOSE in self._bytes:
                self.state = "done"
