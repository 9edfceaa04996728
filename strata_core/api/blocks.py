"""A chat reply's pieces (choice.Delta) as a sequence of blocks, the unit the Responses and
Messages APIs speak in: the reasoning, the text, each tool call. Each block is opened,
grows and is closed before the next one opens, so a family's module only maps these
events onto its own (``output_item`` / ``content_part`` events, or ``content_block_*``).

``Blocks`` is pure (no I/O, no API shapes); ``stream_blocks`` runs it over a choice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from strata_core.api.stream import Collected
from strata_core.client.reader import EngineUnavailable
from strata_core.text.choice import Delta
from strata_core.text.logprobs import Entry
from strata_core.text.tools import CallDelta

Kind = Literal["reasoning", "text", "call"]


@dataclass
class Block:
    """One block of a reply; ``text`` is the reasoning, the text or a call's arguments
    (JSON text) so far; a call's block carries its ``call_id`` and function ``name``; a
    text block, when logprobs were asked for, the ``entries`` that spell its text."""

    kind: Kind
    index: int
    text: str = ""
    call_id: str = ""
    name: str = ""
    entries: list[Entry] = field(default_factory=list)


@dataclass(frozen=True)
class Opened:
    block: Block


@dataclass(frozen=True)
class Grew:
    block: Block
    text: str
    entries: tuple[Entry, ...] = ()  # a text block's, with this text


@dataclass(frozen=True)
class Closed:
    block: Block


Event = Opened | Grew | Closed


class Blocks:
    """``push(delta)`` returns the block events a piece makes; ``close()`` the last ones.

    Within a piece the reasoning comes first, then the text, then the calls (the order
    choice.ChoiceText releases them in). A reply that made no block at all gets one
    empty text block, so every reply says something.
    """

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._open: Block | None = None

    def push(self, d: Delta) -> list[Event]:
        out: list[Event] = []
        if d.reasoning:
            self._grow("reasoning", d.reasoning, out)
        if d.text:
            self._grow("text", d.text, out, d.entries or [])
        elif d.entries and self._open is not None and self._open.kind == "text":
            self._open.entries += d.entries  # tokens that show no text (a stop) end the text
        for c in d.calls:
            self._call(c, out)
        return out

    def close(self) -> list[Event]:
        out: list[Event] = []
        if not self.blocks:
            self._start(Block("text", 0), out)
        self._close(out)
        return out

    def _grow(self, kind: Kind, text: str, out: list[Event], entries: list[Entry] | None = None) -> None:
        if self._open is None or self._open.kind != kind:
            self._close(out)
            self._start(Block(kind, len(self.blocks)), out)
        assert self._open is not None
        self._open.text += text
        self._open.entries += entries or []
        out.append(Grew(self._open, text, tuple(entries or ())))

    def _call(self, c: CallDelta, out: list[Event]) -> None:
        if c.id is not None:  # a call's first delta
            self._close(out)
            self._start(Block("call", len(self.blocks), call_id=c.id, name=c.name or ""), out)
        if c.arguments and self._open is not None and self._open.kind == "call":
            self._open.text += c.arguments
            out.append(Grew(self._open, c.arguments))

    def _start(self, block: Block, out: list[Event]) -> None:
        self.blocks.append(block)
        self._open = block
        out.append(Opened(block))

    def _close(self, out: list[Event]) -> None:
        if self._open is not None:
            out.append(Closed(self._open))
            self._open = None


def blocks_of(r: Collected) -> list[Block]:
    """A whole (non-streamed) reply's blocks: its reasoning, its text, then its calls."""
    calls = [CallDelta(i, c.arguments, c.id, c.name) for i, c in enumerate(r.tool_calls or ())]
    b = Blocks()
    b.push(Delta(r.text, reasoning=r.reasoning, calls=calls, entries=r.entries))
    b.close()
    return b.blocks


async def stream_blocks(pieces: AsyncIterator[Delta]) -> AsyncIterator[Event | Delta]:
    """A streamed choice's block events as its pieces come; its last piece (finish reason,
    usage, stop string) itself just before the events that close the last block."""
    blocks = Blocks()
    async for d in pieces:
        for ev in blocks.push(d):
            yield ev
        if d.finish is not None:
            yield d
            for ev in blocks.close():
                yield ev
            return
    raise EngineUnavailable("the engine ended the request without DONE")
