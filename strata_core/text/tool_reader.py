"""A reply's tool calls read in its family's format (tool_formats.py), incrementally.

Rules (tests/test_tool_formats.py checks them on every template of the corpus, at every
chunk boundary):

* Content streams as it comes until a marker where calls may begin; a tail that could be
  the start of a marker is held until it is decided.
* At a marker the calls block is read as it comes: each call becomes a first delta carrying
  index, id, type and name, then its arguments (JSON text) in fragments. A call becomes
  known once its first parameter is complete (XML-style parameters, a notation of the
  family's own, a JSON object after the name or inside a call object with the name, or a
  list of those), else once it is whole; its arguments then stream a parameter at a time
  (``{"city": "Paris"``, ``, "days": 2``, ``}``), and the fragments join to exactly the
  arguments read whole.
* A marker whose text turns out not to be calls is content, unchanged, except a calls block
  cut short by the reply's end (max_tokens), which is markup, as is a marker the reply ended
  partway into right after a call, or elsewhere once two characters or more of it,
  punctuation among them, were written (``<|start|>ass``, not `` to`` or ``<``); markup the
  family writes that is neither (``strip``) makes no text, also where it is a marker (GigaChat's
  ``<|function_call|>`` before a copy of a tool's result), and so do a block's opening marker
  with no call after it (Kimi K3's ``<|open|>tools<|sep|>``), its closing marker with no
  block open, and a message header (``header``: muse's ``to=RECIPIENT<|message|>``) where
  no call follows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from strata_core.text.detokenize import held_prefix
from strata_core.text.generic_tools import GenericParser
from strata_core.text.tool_formats import GenericFormat, ToolFormat, as_json, props_of
from strata_core.text.tool_notations import QUOTE
from strata_core.text.tool_syntax import PARTIAL, Params, Read
from strata_core.text.tools import CallDelta, Event, Reader, ToolCall, merged_events, new_call_id


def _earliest(text: str, marks: Sequence[str]) -> tuple[int, str] | None:
    """The first marker in ``text`` (the longest where two begin at one place)."""
    best: tuple[int, str] | None = None
    for m in marks:
        at = text.find(m)
        if at >= 0 and (best is None or at < best[0] or (at == best[0] and len(m) > len(best[1]))):
            best = (at, m)
    return best


def _begun_markup(tail: str) -> bool:
    """Whether a reply's last characters, the start of one of its family's markers, are that
    marker begun (``<|start|>ass``, `` to=functions``) rather than words that happen to
    start one (`` to``, ``<``): two characters or more, punctuation among them."""
    s = tail.strip()
    return len(s) >= 2 and any(not (c.isalnum() or c.isspace()) for c in s)


class FormatParser:
    """``push(text)`` returns the events now decided; ``flush()`` the rest at the end;
    ``calls`` the calls read so far."""

    def __init__(
        self,
        fmt: ToolFormat,
        tools: Sequence[Mapping[str, Any]] | None = None,
        new_id: Callable[[], str] = new_call_id,
    ) -> None:
        self.format = fmt
        self._props = props_of(tools)
        self._new_id = new_id
        self._marks = fmt.markers()
        # markup that makes no text: the family's own, and a calls block's closing marker
        # written with no block open (one that is markup, not a bracket or part of a marker)
        close = fmt.close.strip()
        stray = len(close) > 1 and not any(close in m for m in self._marks)
        self._strip = fmt.strip + ((close,) if stray else ())
        # markup also where no call follows it: the family's own, and a calls block's opener
        # (a block opened with no call inside is markup, as its closer with no block open is)
        self._markup = fmt.strip + ((fmt.open.strip(),) if fmt.open.strip() else ())
        self._buf = ""
        self.calls: list[ToolCall] = []
        self.spans: list[tuple[int, int]] = []  # where each calls block was, in the text pushed
        self._at = 0  # offset of _buf[0] in the text pushed
        self._fresh = fmt.bare  # at the reply's start, where a bare call may begin
        self._lead = fmt.lead  # at the reply's start: the markup plain content opens with
        self._open: list[tuple[str, int]] = []  # calls of the block being read: id, arguments sent
        self._said = False  # content other than whitespace was shown (until then it waits)
        self._said_after = False  # ... since the last calls block

    def push(self, text: str) -> list[Event]:
        self._buf += text
        return merged_events(self._scan(final=False))

    def flush(self) -> list[Event]:
        out = self._scan(final=True)
        if self._buf:
            self._say(self._cut(len(self._buf)), out)
        return merged_events(out)

    def _say(self, text: str, out: list[Event]) -> None:
        """Content, except whitespace before a reply's first call or at the end of its calls."""
        if self._said or (text.strip() or not (self.calls or self._buf)):
            out.append(text)
            self._said = self._said or bool(text.strip())
            self._said_after = self._said_after or bool(text.strip())

    def _cut(self, n: int) -> str:
        part, self._buf = self._buf[:n], self._buf[n:]
        self._at += n
        return part

    def _scan(self, final: bool) -> list[Event]:
        out: list[Event] = []
        if self._lead:
            if self._lead.startswith(self._buf) and not final:
                return out
            if self._buf.startswith(self._lead):
                self._cut(len(self._lead))
                self._fresh = False
            self._lead = ""
        if self._fresh:
            seen: list[Read] = []
            got = self.format.read_turn(self._buf, 0, final, self._props, seen)
            if got == PARTIAL:
                self._stream(seen, out)
                return out
            self._fresh = False
            if not isinstance(got, str):
                self._take(got, out)
            elif final and self._cut_short():  # a bare call the reply's end broke off
                self._take_cut_short(out)  # (none named: the text is read on as content)
        while self._buf:
            hit = _earliest(self._buf, self._marks + self._strip)
            if hit is None:
                hold = max((held_prefix(self._buf, m) for m in self._marks + self._strip), default=0)
                before, tail = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold :]
                if final:  # the reply ended: a tail that had begun a marker is markup right after
                    # calls (nothing but whitespace between), or where it had begun the marker's punctuation
                    bare = self.calls and not self._said_after and not before.strip()
                    hold = hold if bare or _begun_markup(tail) else 0
                elif not self._said and not before.strip():
                    break  # leading whitespace waits: a call may follow it
                self._say(self._cut(len(self._buf) - hold), out)
                if final:
                    self._cut(hold)
                break
            at, mark = hit
            self._say(self._cut(at), out)
            if mark in self._strip and mark not in self._marks:
                self._cut(len(mark))
                continue
            seen = []
            got = self.format.read_turn(self._buf, 0, final, self._props, seen)
            if got == PARTIAL:
                self._stream(seen, out)
                break
            if isinstance(got, str) and final and self._cut_short():  # markup the reply's end broke off
                if not self._take_cut_short(out):
                    self._cut(len(self._buf))
                break
            if isinstance(got, str):  # not calls after all: the marker is content, unless it is markup
                header = re.match(self.format.header, self._buf) if self.format.header else None
                text = self._cut(header.end() if header else len(mark))
                if header is None and mark not in self._markup:
                    out.append(text)
                continue
            self._take(got, out)
        return out

    def _cut_short(self) -> bool:
        """Whether the calls block at the buffer's start, unreadable at the reply's end,
        would have gone on being read had the reply not ended there."""
        return self.format.read_turn(self._buf, 0, False, self._props) == PARTIAL

    def _take_cut_short(self, out: list[Event]) -> bool:
        """A calls block the reply's end (max_tokens) cut short before any parameter was
        complete: each call whose name was written comes back with its arguments so far
        (the value being written closed where the family's markup allows it), as OpenAI
        returns a call cut short; False where no name was written (nothing taken)."""
        best: list[Read] = []
        names: list[str | None] | None = None
        for closer in _closers(self.format, self._props):  # the first (none) says which names were written
            seen: list[Read] = []
            self.format.read_turn(self._buf + closer, 0, False, self._props, seen)
            names = [r.name for r in seen] if names is None else names
            if [r.name for r in seen] == names and _known(seen) > _known(best):
                best = seen
        reads = [r for r in best if r.end or r.partial or r.early or r.name]
        if not reads:
            return False
        for r in reads:
            if not r.end:
                r.calls = [*r.early, *([r.partial] if r.partial else [(r.name, {})] if r.name else [])]
        start = self._at
        self._cut(len(self._buf))
        self.spans.append((start, self._at))
        self._emit(reads, out)
        return True

    def _take(self, reads: list[Read], out: list[Event]) -> None:
        self._said_after = False
        start = self._at
        self._cut(reads[-1].end)
        self.spans.append((start, self._at))
        self._emit(reads, out)

    def _emit(self, reads: list[Read], out: list[Event]) -> None:
        started, self._open = self._open, []
        j = 0
        for r in reads:
            for name, args in r.calls:
                whole = as_json(args)
                if j < len(started):
                    call_id, sent = started[j]
                    if whole[sent:]:
                        out.append(CallDelta(len(self.calls), whole[sent:]))
                else:
                    call_id = r.id or self._new_id()
                    out.append(CallDelta(len(self.calls), "", call_id, name))
                    out.append(CallDelta(len(self.calls), whole))
                self.calls.append(ToolCall(call_id, name, whole))
                j += 1

    def _stream(self, seen: list[Read], out: list[Event]) -> None:
        """What a calls block still being read says so far: calls read whole, and the
        parameters complete so far of the one being read (its JSON object left open)."""
        known = []
        for r in seen:
            if r.end:  # read whole
                known += [(r, n, a, True) for n, a in r.calls]
                continue
            known += [(r, n, a, True) for n, a in r.early]  # a list's calls written so far
            if r.partial is not None:
                known.append((r, *r.partial, False))
        for j, (r, name, args, whole) in enumerate(known):
            text = as_json(args) if whole else as_json(args)[:-1]
            index = len(self.calls) + j
            if j == len(self._open):
                self._open.append((r.id or self._new_id(), 0))
                out.append(CallDelta(index, "", self._open[j][0], name))
            call_id, sent = self._open[j]
            if len(text) > sent:
                out.append(CallDelta(index, text[sent:]))
                self._open[j] = (call_id, len(text))


def _closers(fmt: ToolFormat, props: Mapping[str, Any]) -> tuple[str, ...]:
    """Texts that may close a value a reply's end cut short, so that it reads: nothing, the
    end of a number, of a JSON / Python / Gemma 4 string, of an XML-style parameter (one
    whose markup names it: each of the tools' parameters)."""
    ends = [p.fmt.partition("{value}")[2] for p in fmt.call if isinstance(p, Params)]
    keys = {k for params in props.values() for k in params}
    params = [e.replace("{key}", k) for e in ends for k in (sorted(keys) if "{key}" in e else [""])]
    return ("", ",", '",', "',", QUOTE + ",", *params)


def _known(reads: list[Read]) -> tuple[int, int]:
    """How much of a cut-short block ``reads`` know: its calls and parameters, then names."""
    calls = sum(len(r.calls) + len(r.early) for r in reads)
    params = sum(len(r.partial[1]) for r in reads if r.partial and not r.end)
    return calls + params, sum(1 for r in reads if r.name)


def reply_parser(
    fmt: ToolFormat, tools: Sequence[Mapping[str, Any]] | None = None, new_id: Callable[[], str] = new_call_id
) -> Reader:
    """The parser of a reply in ``fmt`` (the generic format's JSON reply has its own)."""
    if isinstance(fmt, GenericFormat):
        return GenericParser(new_id)
    return FormatParser(fmt, tools, new_id)
