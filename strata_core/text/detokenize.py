"""Token ids to text, incrementally, and stop strings.

``Detokenizer.feed`` returns the text a token completes under incremental UTF-8
decoding: a character split across tokens belongs to the token that finishes it, so
the pieces joined spell the reply exactly.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class Detokenizer:
    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.pieces = pieces
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token: int) -> str:
        return self._dec.decode(self.pieces[token])

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def decode(pieces: Sequence[bytes], ids: Sequence[int]) -> str:
    return b"".join(pieces[i] for i in ids).decode("utf-8", "replace")


def held_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``: what a
    stream must hold back until it knows whether ``tag`` follows."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class StopMatcher:
    """Cuts streamed text at the earliest place a stop string begins, holding back a tail
    that may still grow into one.

    ``push(text)`` returns ``(safe, stopped)``: the text that can be shown now, and
    whether a stop string ended the reply (its text and what follows are dropped).
    ``flush()`` returns the held tail at the end, cut at a stop it holds; ``stopped``
    says whether either of them found one, and ``matched`` which stop string it was.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False
        self.matched: str | None = None

    def _first(self, buf: str) -> int | None:
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if not found:
            return None
        at, self.matched = min(found, key=lambda f: (f[0], -len(f[1])))
        return at

    def push(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buf = self.held + text
        cut = self._first(buf)
        # where a longer stop may yet begin: until it is decided, a stop found after it
        # (say "a" in "<a", with "<a<" a stop) may not be the first one
        hold = len(buf) - max(held_prefix(buf, s) for s in self.stops)
        if cut is not None and cut <= hold:
            self.held, self.stopped = "", True
            return buf[:cut], True
        self.held = buf[hold:]
        return buf[:hold], False

    def flush(self) -> str:
        """The held tail at the end of the text: no stop can grow any more, so the first
        one it holds (if any) cuts it."""
        cut = self._first(self.held)
        out, self.held = self.held[:cut], ""
        self.stopped = self.stopped or cut is not None
        return out
