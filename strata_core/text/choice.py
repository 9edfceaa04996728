"""One choice's tokens -> what the reply shows: content, reasoning, tool-call deltas, and
the logprob entries that spell each, as pieces (:class:`Delta`) for the HTTP layer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_core.contract.events import TokenEvent, Usage
from strata_core.text.detokenize import Detokenizer, StopMatcher
from strata_core.text.infill import EditorLimits
from strata_core.text.logprobs import Aligner, Entry, Span
from strata_core.text.reasoning import Piece, ThinkSplitter
from strata_core.text.tool_formats import THINK, ToolFormat
from strata_core.text.tool_reader import reply_parser
from strata_core.text.tools import CallDelta, Reader, ToolCall, new_call_id, split_events


@dataclass
class Delta:
    """A piece of one choice's reply; the last one carries the finish reason and usage.

    ``text`` is content, ``reasoning`` the reasoning shown before it, ``calls`` tool-call
    deltas. ``entries`` / ``reasoning_entries``: when logprobs were asked for, the entries
    handed out with this piece (logprobs.Span's rule: over the whole choice they spell
    its content / its reasoning); else None. ``tool_calls``: on the last piece, the
    choice's calls whole when tool calls were parsed, else None; ``stop_sequence``: on the
    last piece, the stop string that ended the reply, if one did.
    """

    text: str
    finish: str | None = None
    usage: Usage | None = None
    entries: list[Entry] | None = None
    reasoning: str = ""
    reasoning_entries: list[Entry] | None = None
    calls: list[CallDelta] = field(default_factory=list)
    tool_calls: list[ToolCall] | None = None
    stop_sequence: str | None = None

    def shows(self) -> bool:
        return bool(self.text or self.reasoning or self.calls)


@dataclass(frozen=True)
class ChatShape:
    """How a chat reply is cut up: ``thinking`` the prompt left a reasoning block open;
    ``format`` the format its tool calls are read in, a family's or the generic one (none:
    the reply is only content); ``think`` the reasoning tags; ``tools`` the
    request's tools (how XML-style values are typed); ``new_id`` makes call ids;
    ``most_calls`` the calls the reply may make (``max_tool_calls``: a further call is
    ignored and ends the reply)."""

    thinking: bool = False
    format: ToolFormat | None = None
    think: tuple[str, str] = THINK
    tools: tuple[Mapping[str, Any], ...] = ()
    new_id: Callable[[], str] = new_call_id
    most_calls: int | None = None

    def sections(self) -> tuple[str, ...]:
        """Where a reasoning the model never closed ends: its family's calls section opening."""
        return (self.format.open.strip(),) if self.format is not None else ()

    def tool_parser(self) -> Reader | None:
        return None if self.format is None else reply_parser(self.format, self.tools, self.new_id)


def joined(a: list[Entry] | None, b: list[Entry] | None) -> list[Entry] | None:
    return b if a is None else a + (b or [])


class ChoiceText:
    """One choice's tokens -> released text (stop strings applied) and logprob entries.

    Without logprobs it is a Detokenizer and a StopMatcher; with them an Aligner decodes,
    and Spans hand out the entries of the text released so far, cut where a stop string
    cuts the text, so the entries always spell the (trimmed) text exactly. For chat
    (``shape``), the released text is split into reasoning and content (reasoning.py),
    each with its own Span, and the content into text and tool calls (tools.py); the
    content's entries spell the content as the model wrote it, calls included.
    """

    def __init__(
        self,
        pieces: list[bytes],
        stops: list[str],
        alternatives: int | None,
        shape: ChatShape | None = None,
        limits: EditorLimits | None = None,
    ) -> None:
        self._matcher = StopMatcher(stops)
        self._limits = limits
        self._detok = Detokenizer(pieces)
        self._aligner = None if alternatives is None else Aligner(pieces, alternatives)
        self._think = None if shape is None else ThinkSplitter(shape.thinking, shape.think, shape.sections())
        self._tools = None if shape is None else shape.tool_parser()
        self._most_calls = None if shape is None else shape.most_calls
        self._spans: dict[str, Span] = {}  # "reasoning" / "content", opened at their start
        self._released = 0  # characters of the text shown so far
        self.stopped = False
        #: tokens pushed while the reasoning was open (the think tags' own included)
        self.reasoning_tokens = 0

    @property
    def tool_calls(self) -> list[ToolCall] | None:
        if self._tools is None:
            return None
        return self._tools.calls[: self._most_calls] if self._most_calls is not None else self._tools.calls

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the reply, if one did."""
        return self._matcher.matched if self._matcher.stopped else None

    def push(self, *events: TokenEvent) -> Delta:
        """Take the next tokens: the reply now safe to show and the entries that go with it."""
        if self._limits is not None and len(events) > 1:  # an editor stop ends the reply at its token
            return self._one_by_one(events)
        if self._aligner is None:
            text = "".join(self._detok.feed(ev.id) for ev in events)
        else:
            text = "".join(self._aligner.add(ev.id, ev.logprob) for ev in events)
        safe, self.stopped = self._matcher.push(text)
        if self._limits is not None:
            safe = self._limits.push([ev.id for ev in events], safe)
            self.stopped = self.stopped or self._limits.why is not None
        open_before = self._think is not None and self._think.reasoning_end is None
        out = self._release(safe, last=self.stopped)
        if open_before and self._think is not None and self._think.thinking:
            self.reasoning_tokens += len(events)
        return out

    def _one_by_one(self, events: tuple[TokenEvent, ...]) -> Delta:
        out = Delta("")
        for ev in events:
            if self.stopped:
                break
            d = self.push(ev)
            out.text, out.reasoning, out.calls = out.text + d.text, out.reasoning + d.reasoning, out.calls + d.calls
            out.entries = joined(out.entries, d.entries)
            out.reasoning_entries = joined(out.reasoning_entries, d.reasoning_entries)
        return out

    def end(self) -> Delta:
        """The engine is done: the rest of the reply and of the entries."""
        if self.stopped:  # the stop already released (and closed) everything
            empty: list[Entry] | None = None if self._aligner is None else []
            return Delta("", entries=empty, reasoning_entries=empty)
        text = self._detok.flush() if self._aligner is None else self._aligner.flush()
        safe, self.stopped = self._matcher.push(text)
        tail = safe if self.stopped else safe + self._matcher.flush()
        if self._limits is not None:
            tail = self._limits.push([], tail)
        # a stop the end of the text decided
        self.stopped = self._matcher.stopped or (self._limits is not None and self._limits.why is not None)
        return self._release(tail, last=True)

    def _release(self, text: str, last: bool) -> Delta:
        start = self._released
        self._released += len(text)
        if self._think is None:
            pieces = [Piece("content", text, start, self._released)] if text else []
        else:
            pieces = self._think.push(text) + (self._think.flush() if last else [])
        out = Delta("".join(p.text for p in pieces if p.kind == "content"))
        out.reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
        if self._tools is not None:
            events = self._tools.push(out.text) + (self._tools.flush() if last else [])
            out.text, out.calls = split_events(events)
            out.calls = self._within_limit(out.calls)
            if self.stopped and not last:  # a call past max_tool_calls ended the reply: so does the parser
                _, done = split_events(self._tools.flush())
                out.calls += self._within_limit(done)
        if self._aligner is not None:
            reasoning_end = None if self._think is None else self._think.reasoning_end
            out.reasoning_entries = self._entries("reasoning", pieces, reasoning_end, last)
            out.entries = self._entries("content", pieces, self._released if last else None, last)
        return out

    def _within_limit(self, calls: list[CallDelta]) -> list[CallDelta]:
        """``calls`` without those past ``most_calls``; the first of them ends the reply."""
        most = self._most_calls
        if most is None:
            return calls
        if any(c.index >= most for c in calls):
            self.stopped = True
        return [c for c in calls if c.index < most]

    def _entries(self, kind: str, pieces: list[Piece], end: int | None, last: bool) -> list[Entry]:
        """The entries of ``kind``'s text released now; ``end``: where that text ended."""
        assert self._aligner is not None
        mine = [p for p in pieces if p.kind == kind]
        span = self._spans.get(kind)
        if span is None:
            if not mine:
                return []
            span = self._spans[kind] = Span(self._aligner, mine[0].start)
        if span.closed:
            return []
        if end is not None or last:
            return span.close(end)
        return span.take(mine[-1].end) if mine else []


def carry(carried: Delta, d: Delta) -> Delta:
    """``d`` with the entries of earlier pieces that showed nothing put before its own."""
    d.entries = joined(carried.entries, d.entries)
    d.reasoning_entries = joined(carried.reasoning_entries, d.reasoning_entries)
    return d
