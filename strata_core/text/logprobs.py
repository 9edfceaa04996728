"""Token stream to logprob entries, aligned exactly with the reply's text (their OpenAI
JSON shapes are written in ``api/bodies.py``).

Rules (the server relies on them; tests/test_logprobs.py checks each):

* An entry's ``token`` is the text its token completes under incremental UTF-8
  decoding (``text.Detokenizer``'s rule). A character split across tokens belongs to the
  token that finishes it; the earlier tokens' ``token`` is ``""``. So the entries'
  tokens joined spell the text exactly.
* An entry's ``bytes`` are the token's own raw bytes, so the entries' bytes joined are
  the text's bytes and decode to it exactly.
* The caller says which part of the generated text an answer shows, as a character span
  ``[start, end)`` of ``Aligner.text`` (``content`` after ``</think>\\n\\n``, content cut
  by a stop string, ...). An entry is kept when its token gives the span a byte or a
  character; a token cut by a span edge keeps only its part inside the span, in
  ``token`` and in ``bytes`` alike. OpenAI and vLLM drop a token a stop string cuts; we
  keep its part before the cut, because that is the rule under which the entries still
  spell the content exactly. Tokens that give the span nothing (``</think>``, the
  newlines after it, an empty piece, bytes of a character the span leaves out) are left
  out. The stop token never reaches us: the engine does not emit it.
* ``top`` alternatives are the engine's, sorted by logprob (ties to the lower id), at
  most ``alternatives`` (``()`` for 0). An alternative's ``token`` is its own piece decoded
  alone with ``errors="replace"`` (as OpenAI and vLLM do), so a piece that is part of a
  character reads as U+FFFD; its ``bytes`` are the exact truth. The chosen token in its
  own ``top`` therefore may read differently from the entry's ``token``: match by
  ``bytes``. A span cut changes the entry's ``token``/``bytes``, never its ``top``.
* A token without an ``LP`` line has the logprob ``UNLIKELY`` (-9999.0, OpenAI's "very
  unlikely" value), which the bodies also write for logprobs JSON cannot carry (``-inf``
  after ``allowed`` renormalisation).
* Streaming (``Span``): an entry is handed out once, with the chunk whose text completes
  its token; a token cut by where the text released so far ends waits for the next
  chunk. Over the whole stream the entries spell the text; one chunk's entries need not
  spell that chunk.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from strata_core.contract.options import MAX_ALTERNATIVES
from strata_core.contract.protocol import Logprob

UNLIKELY = -9999.0  # OpenAI's logprob for "very unlikely"; JSON has no -inf


class Alt(NamedTuple):
    """One ``top_logprobs`` alternative."""

    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Entry:
    """One ``choices[i].logprobs.content`` entry."""

    id: int
    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[Alt, ...]


@dataclass(slots=True)
class _Tok:
    id: int
    lp: Logprob | None
    b0: int  # its bytes: raw[b0:b1]
    b1: int
    c0: int  # the characters it completes: text[c0:c1] == text
    c1: int
    text: str


def _utf8_len(ch: str) -> int:
    o = ord(ch)
    return 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4


def _char_ends(data: bytes, n: int, base: int) -> list[int]:
    """Byte offsets (plus ``base``) where each of the first ``n`` characters that
    ``data.decode("utf-8", "replace")`` makes ends; a U+FFFD covers the bytes of its
    error, as the ``replace`` handler resumes at the error's end."""
    ends: list[int] = []
    pos = 0
    while len(ends) < n:
        try:
            data[pos:].decode("utf-8")
            good, bad_end = len(data), -1
        except UnicodeDecodeError as exc:
            good, bad_end = pos + exc.start, pos + exc.end
        for ch in data[pos:good].decode("utf-8"):
            pos += _utf8_len(ch)
            ends.append(base + pos)
            if len(ends) == n:
                return ends
        if bad_end < 0:
            raise AssertionError(f"asked for {n} characters, the bytes hold {len(ends)}")
        pos = bad_end
        ends.append(base + pos)
    return ends


class Aligner:
    """Decodes one choice's tokens and keeps what it needs to align logprob entries.

    ``add`` returns the text a token completes (as ``Detokenizer.feed``), so the aligner
    can be the choice's decoder; ``flush`` at the end (as ``Detokenizer.flush``).
    ``entries(start, end)`` gives the entries spelling ``text[start:end]``.
    """

    def __init__(self, pieces: Sequence[bytes], alternatives: int = 0) -> None:
        if not 0 <= alternatives <= MAX_ALTERNATIVES:
            raise ValueError(f"alternatives = {alternatives} is out of range (expected 0..{MAX_ALTERNATIVES})")
        self.pieces = pieces
        self.alternatives = alternatives
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._raw = bytearray()
        self._ends: list[int] = []  # byte offset where each character of the text ends
        self._parts: list[str] = []
        self._text = ""
        self._toks: list[_Tok] = []
        self._flushed = False

    @property
    def text(self) -> str:
        """Everything decoded so far."""
        if len(self._text) != len(self._ends):
            self._text = "".join(self._parts)
        return self._text

    def __len__(self) -> int:
        return len(self._ends)

    def _piece(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self.pieces):
            raise ValueError(
                f"token id {token_id} is out of range "
                f"(the vocabulary has {len(self.pieces)} pieces)"
            )
        return self.pieces[token_id]

    def _decoded(self, text: str) -> None:
        if text:
            start = self._ends[-1] if self._ends else 0
            self._ends += _char_ends(bytes(self._raw[start:]), len(text), start)
            self._parts.append(text)

    def add(self, token_id: int, lp: Logprob | None = None) -> str:
        """Take the next emitted token; return the text it completes."""
        if self._flushed:
            raise RuntimeError("add() after flush(): the choice's text is already complete")
        piece = self._piece(token_id)
        b0, c0 = len(self._raw), len(self._ends)
        self._raw += piece
        text = self._dec.decode(piece)
        self._decoded(text)
        self._toks.append(_Tok(token_id, lp, b0, len(self._raw), c0, len(self._ends), text))
        return text

    def flush(self) -> str:
        """End of the choice: the text of bytes still waiting for the rest of a character
        (U+FFFD); it belongs to the last token that has bytes."""
        if self._flushed:
            return ""
        self._flushed = True
        text = self._dec.decode(b"", final=True)
        if not text:
            return text
        self._decoded(text)
        owner = max(i for i, t in enumerate(self._toks) if t.b1 > t.b0)
        self._toks[owner].c1 = len(self._ends)
        self._toks[owner].text += text
        for t in self._toks[owner + 1 :]:  # empty pieces after it
            t.c0 = t.c1 = len(self._ends)
        return text

    def _byte_at(self, c: int) -> int:
        return self._ends[c - 1] if c else 0

    def _check(self, start: int, end: int | None) -> int:
        n = len(self._ends)
        end = n if end is None else end
        if not 0 <= start <= end <= n:
            raise ValueError(
                f"span [{start}, {end}) is not inside the text "
                f"(expected 0 <= start <= end <= {n})"
            )
        return end

    def _entry(self, t: _Tok, start: int, end: int) -> Entry | None:
        lo, hi = max(t.b0, self._byte_at(start)), min(t.b1, self._byte_at(end))
        c0, c1 = max(t.c0, start), min(t.c1, end)
        if lo >= hi and c0 >= c1:
            return None
        raw = bytes(self._raw[lo:hi]) if lo < hi else b""
        lp = t.lp
        top: tuple[Alt, ...] = ()
        if lp is not None and self.alternatives:
            best = sorted(lp.top, key=lambda a: (-a[1], a[0]))[: self.alternatives]
            top = tuple(self._alt(i, v) for i, v in best)
        return Entry(
            id=t.id,
            token=t.text[c0 - t.c0 : c1 - t.c0] if c0 < c1 else "",
            logprob=UNLIKELY if lp is None else lp.logprob,
            bytes=tuple(raw),
            top=top,
        )

    def _alt(self, token_id: int, logprob: float) -> Alt:
        piece = self._piece(token_id)
        return Alt(piece.decode("utf-8", "replace"), logprob, tuple(piece))

    def _span_entries(self, toks: Iterable[_Tok], start: int, end: int) -> list[Entry]:
        out = []
        for t in toks:
            e = self._entry(t, start, end)
            if e is not None:
                out.append(e)
        return out

    def entries(self, start: int = 0, end: int | None = None) -> list[Entry]:
        """The entries spelling ``text[start:end]`` exactly (``end`` None: to the end)."""
        end = self._check(start, end)
        return self._span_entries(self._toks, start, end)


class Span:
    """Hands out the entries of one growing span of an aligner's text while streaming.

    ``take(end)`` when ``text[start:end]`` has been released: the entries of tokens
    whose text is now complete, each once; ``close(end)`` when the span ends at ``end``
    (a stop string, end of the choice): the rest, the last one cut at ``end``.
    """

    def __init__(self, aligner: Aligner, start: int = 0) -> None:
        aligner._check(start, None)
        self.aligner = aligner
        self.start = start
        self._next = 0  # the first token not handed out yet
        self._closed = False

    def take(self, end: int) -> list[Entry]:
        a = self.aligner
        end = self._valid_end(end)
        stop = self._next
        be = a._byte_at(end)
        # a token's characters end within its bytes, so its bytes ending by `be` suffice
        while stop < len(a._toks) and a._toks[stop].b1 <= be:
            stop += 1
        out = a._span_entries(a._toks[self._next : stop], self.start, end)
        self._next = stop
        return out

    def close(self, end: int | None = None) -> list[Entry]:
        a = self.aligner
        end = self._valid_end(len(a) if end is None else end)
        out = a._span_entries(a._toks[self._next :], self.start, end)
        self._next = len(a._toks)
        self._closed = True
        return out

    @property
    def closed(self) -> bool:
        return self._closed

    def _valid_end(self, end: int) -> int:
        if self._closed:
            raise RuntimeError("the span is closed: close() hands out its last entries")
        return self.aligner._check(self.start, end)


def slice_entries(entries: Sequence[Entry], start: int, end: int) -> list[Entry]:
    """The entries spelling ``text[start:end]``, where ``text`` is what ``entries`` spell.

    The span rule of :meth:`Aligner.entries`, applied to finished entries: a token cut by
    an edge keeps its part inside, in ``token`` and ``bytes``; one that gives the span
    nothing is left out. Edges are character offsets, so bytes of a character split
    across tokens stay with that character.
    """
    text = "".join(e.token for e in entries)
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"span [{start}, {end}) is not inside the text (0..{len(text)})")
    b_start, b_end = len(text[:start].encode()), len(text[:end].encode())
    out: list[Entry] = []
    c = b = 0  # where the entry starts, in characters and in bytes
    for e in entries:
        c1, b1 = c + len(e.token), b + len(e.bytes)
        lo, hi = max(b, b_start), min(b1, b_end)
        t0, t1 = max(c, start), min(c1, end)
        if lo < hi or t0 < t1:
            token = e.token[t0 - c : t1 - c] if t0 < t1 else ""
            raw = e.bytes[lo - b : hi - b] if lo < hi else ()
            out.append(Entry(e.id, token, e.logprob, raw, e.top))
        c, b = c1, b1
    return out
