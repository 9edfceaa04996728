"""Tool calls: what a call and a streamed piece of one are, and what reads a reply's calls.
Which family a template speaks, how its replies are read and the grammar forcing its calls
are the format registry's (tool_formats.py, tool_reader.py, tool_setup.py); the server's
own generic format, for templates that never read tools, is one format among them
(generic_tools.py).
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

_ID_CHARS = string.ascii_letters + string.digits


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text

    def body(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class CallDelta:
    """One streamed piece of a call; the first of each call carries id and name."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"], out["type"] = self.id, "function"
        if self.name is not None:
            function = {"name": self.name, **function}
        out["function"] = function
        return out


# ---- the reply ----------------------------------------------------------------------------

Event = str | CallDelta  # a str is content text


class Reader(Protocol):
    """A reply's parser: ``push(text)`` returns the events now decided, ``flush()`` the rest
    at the end, ``calls`` the calls read so far, whole."""

    @property
    def calls(self) -> list[ToolCall]: ...

    def push(self, text: str) -> list[Event]: ...

    def flush(self) -> list[Event]: ...


def merged_events(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for e in events:
        if isinstance(e, str) and out and isinstance(out[-1], str):
            out[-1] += e
        elif e != "":
            out.append(e)
    return out


def split_events(events: Sequence[Event]) -> tuple[str, list[CallDelta]]:
    """Content text and call deltas of a batch of events."""
    text = "".join(e for e in events if isinstance(e, str))
    return text, [e for e in events if isinstance(e, CallDelta)]
