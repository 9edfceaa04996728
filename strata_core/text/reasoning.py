"""Split a reply into its reasoning (``<think>...</think>``, or the family's own tags) and its
content, incrementally.

Rules (tests/test_reasoning.py checks each, at every chunk boundary):

* A reply thinks when the prompt already opened ``<think>`` (the template's generation
  prompt ends inside a think block: :func:`prompt_opens_think`), or when the reply itself
  starts with ``<think>`` after optional whitespace (a model that repeats the prompt's
  ``<think>`` is allowed to). Otherwise all of it is content.
* The reasoning runs to the first ``</think>``; the tag and the whitespace after it make no
  text. A reasoning the model never closed also ends where a family's calls section opens
  (``ends``: its calls come after its reasoning, never inside it); the marker begins the
  content. ``<think>`` itself (and whitespace before it) makes no text either, nor does a
  ``<think>`` inside the reasoning (it does not nest: a small model that writes on past its
  turn copies the prompt's tags). A reply that opens with ``</think>`` closes an empty
  reasoning (MiniMax M3 writes that prefix when it chooses not to think): the tag makes no
  text.
* A tag split across chunks is held back until it is decided, so a tag never reaches the
  content, and a held prefix that turns out not to be a tag is released unchanged.
* Every piece is a slice of the text pushed so far, ``text[start:end]``, so the caller can
  align logprob entries with exactly the characters each part shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from strata_core.text.detokenize import held_prefix

OPEN = "<think>"
CLOSE = "</think>"

Kind = Literal["reasoning", "content"]


@dataclass(frozen=True, slots=True)
class Piece:
    """``text`` is ``whole[start:end]`` of everything pushed so far."""

    kind: Kind
    text: str
    start: int
    end: int


def prompt_opens_think(prompt: str, tags: tuple[str, str] = (OPEN, CLOSE)) -> bool:
    """Whether a rendered prompt leaves the reply inside an open reasoning block
    (``tags``: the family's, tool_formats.ToolFormat.think)."""
    return prompt.rfind(tags[0]) > prompt.rfind(tags[1])


class ThinkSplitter:
    """``push(text)`` returns the pieces now decided; ``flush()`` the rest at the end.

    ``reasoning_end`` is the offset where the reasoning ended (``</think>`` began), once
    known; ``content_start`` the offset where the content begins, once known.
    """

    def __init__(self, thinking: bool = False, tags: tuple[str, str] = (OPEN, CLOSE), ends: tuple[str, ...] = ()) -> None:
        self._open, self._close = tags
        self._ends = tuple(e for e in ends if e)
        self._state: Literal["start", "think", "after", "content"] = "start"
        self._buf = ""
        self._at = 0  # offset of _buf[0] in the whole text
        self.thinking = thinking
        self.reasoning_end: int | None = None
        self.content_start: int | None = None

    def _take(self, kind: Kind, n: int, out: list[Piece]) -> None:
        """Emit the first ``n`` characters of the buffer as ``kind``."""
        if n > 0:
            out.append(Piece(kind, self._buf[:n], self._at, self._at + n))
        self._drop(n)

    def _drop(self, n: int) -> None:
        self._buf = self._buf[n:]
        self._at += n

    def push(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._buf:
            before = (self._state, len(self._buf))
            self._step(out)
            if (self._state, len(self._buf)) == before:
                break  # waiting for more text
        return out

    def _step(self, out: list[Piece]) -> None:
        buf = self._buf
        if self._state == "start":
            lead = len(buf) - len(buf.lstrip())
            rest = buf[lead:]
            if rest.startswith(self._open):
                self._drop(lead + len(self._open))
                self._state, self.thinking = "think", True
            elif rest.startswith(self._close):  # an empty reasoning, closed at once (MiniMax M3)
                self.reasoning_end = self._at + lead
                self._drop(lead + len(self._close))
                self._state = "after"
            elif not (self._open.startswith(rest) or self._close.startswith(rest)):  # not a tag (an empty rest waits)
                self._begin()
        elif self._state == "think":
            cut, again = buf.find(self._close), buf.find(self._open)
            end = min((at for at in (buf.find(e) for e in self._ends) if at >= 0), default=-1)
            if end >= 0 and all(at < 0 or end < at for at in (cut, again)):  # a calls section: the content's
                self._take("reasoning", end, out)
                self.reasoning_end = self._at
                self._state = "content"
                self.content_start = self._at
            elif again >= 0 and (cut < 0 or again < cut):  # an open tag inside: markup
                self._take("reasoning", again, out)
                self._drop(len(self._open))
            elif cut >= 0:
                self._take("reasoning", cut, out)
                self.reasoning_end = self._at
                self._drop(len(self._close))
                self._state = "after"
            else:
                held = max(held_prefix(buf, t) for t in (self._close, self._open, *self._ends))
                self._take("reasoning", len(buf) - held, out)
        elif self._state == "after":
            lead = len(buf) - len(buf.lstrip())
            if lead < len(buf):
                self._drop(lead)
                self._state = "content"
                self.content_start = self._at
        else:
            self._take("content", len(buf), out)

    def _begin(self) -> None:
        """The reply does not open with ``<think>``: it goes on as the prompt left it."""
        if self.thinking:
            self._state = "think"
        else:
            self._state = "content"
            self.content_start = self._at

    def flush(self) -> list[Piece]:
        """The end of the reply: what was held is released (a partial tag as text)."""
        out: list[Piece] = []
        if self._state == "start":
            self._begin()
        if self._state == "think":
            self._take("reasoning", len(self._buf), out)
            self.reasoning_end = self._at
        elif self._state == "after":
            self._drop(len(self._buf))  # whitespace after </think>: no text
        else:
            self._take("content", len(self._buf), out)
        return out
