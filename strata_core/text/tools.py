"""Tool calls: what a call and a streamed piece of one are, and the base of the generic
format's incremental parser (generic_tools.py) for models whose template never reads
tools. Which family a template speaks, how its replies are read and the grammar forcing
its calls are the format registry's (tool_formats.py, tool_reader.py, tool_setup.py).

Parser rules (tests/test_tools.py checks each, at every chunk boundary):

* Content streams as it comes until a call may begin; text that could be the start of a
  call is held until it is decided.
* A call's first delta carries ``index``, ``id``, ``type`` and the function ``name``; its
  ``arguments`` follow in fragments, the model's own JSON text, which joined are the
  call's final ``arguments``. A call whose keys come in another order is sent whole when
  its object closes.
* Text that turns out not to be a call (JSON that does not parse, an object without a
  string ``name``) is content, unchanged.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Dialect(str, Enum):
    """The server's own format for templates that never read tools (generic_tools.py); a
    template's family format is the registry's (tool_formats.py)."""

    GENERIC = "generic"


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


# ---- one call object ----------------------------------------------------------------------

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:')


@dataclass
class JsonScan:
    """Where JSON text stands: nesting depth, inside a string, after a backslash."""

    depth: int = 0
    in_str: bool = False
    esc: bool = False

    def step(self, ch: str) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
        elif ch == '"':
            self.in_str = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1


def _arguments_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps({} if value is None else value, ensure_ascii=False)


@dataclass
class _Body:
    """One JSON call object fed character by character.

    ``feed`` returns how many characters it used; ``closed`` once the object ended;
    ``failed`` when the text cannot be a call (the caller shows it as content).
    """

    text: str = ""
    scan: JsonScan = field(default_factory=JsonScan)
    name: str | None = None
    args_at: int | None = None  # where the arguments value starts in text
    args_end: int | None = None  # where it ended
    sent: int = 0  # how far the arguments were handed out
    started: bool = False  # the first non-space character of the arguments was sent
    colons: int = 0  # key/value colons of the object itself seen so far
    closed: bool = False
    failed: bool = False

    def feed(self, chunk: str) -> int:
        base = len(self.text)
        for i, ch in enumerate(chunk):
            if self.scan.depth == 0 and not ch.isspace() and ch != "{":
                self.failed = True
            at_top = self.scan.depth == 1 and not self.scan.in_str
            self.scan.step(ch)
            if self.args_at is not None and self.args_end is None and at_top and ch in ",}":
                self.args_end = base + i
            if self.scan.depth == 0 and ch == "}":
                self.closed = True
            if at_top and ch == ":":
                self.colons += 1
                if self.colons == 2:  # after the second key: is it name, then arguments?
                    self._head(self.text + chunk[: i + 1])
            if self.failed or self.closed:
                self.text += chunk[: i + 1]
                return i + 1
        self.text += chunk
        return len(chunk)

    def _head(self, text: str) -> None:
        m = _HEAD.fullmatch(text)
        if m is None:
            return
        try:
            self.name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            self.failed = True
            return
        self.args_at = self.sent = m.end()

    def fragment(self) -> str:
        """Arguments text not handed out yet that is surely part of the arguments:
        leading whitespace is skipped, trailing whitespace waits (it may end the value)."""
        if self.args_at is None:
            return ""
        end = self.args_end if self.args_end is not None else len(self.text)
        part = self.text[self.sent : end]
        if not self.started:
            lead = len(part) - len(part.lstrip())
            self.sent += lead
            part = part[lead:]
            self.started = bool(part)
        keep = part.rstrip()
        self.sent += len(keep)
        return keep

    def whole(self) -> tuple[str, str] | None:
        """(name, arguments) of a closed object, or None when it is not a call."""
        try:
            obj = json.loads(self.text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters"))
        return obj["name"], _arguments_text(args)


# ---- the reply ----------------------------------------------------------------------------

Event = str | CallDelta  # a str is content text


class ToolCallParser:
    """``push(text)`` returns the events now decided; ``flush()`` the rest at the end;
    ``calls`` the calls made so far, whole. A call object's reading (``_Body``) and the
    calls' events; the states of a reply are its subclass's."""

    def __init__(self, dialect: Dialect, new_id: Callable[[], str] = new_call_id) -> None:
        self.dialect = dialect
        self._new_id = new_id
        self._state = "start"
        self._buf = ""
        self._body: _Body | None = None
        self._opener = ""  # the text that opened the body, shown if it is not a call
        self._names: list[str] = []
        self._args: list[list[str]] = []
        self._ids: list[str] = []

    @property
    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(i, n, "".join(a)) for i, n, a in zip(self._ids, self._names, self._args, strict=True)
        ]

    def push(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._buf:
            before = (self._state, len(self._buf))
            self._step(out)
            if (self._state, len(self._buf)) == before:
                break
        return merged_events(out)

    def _flush_body(self, out: list[Event]) -> None:
        """A call cut short by the reply's end: its arguments so far stand, or, before its
        name was read, its text as content."""
        body = self._body
        assert body is not None
        if body.name is not None:
            self._arguments(out)
        else:
            out.append(self._opener + body.text)
        self._body = None

    # -- states (the format's parser says them: generic_tools.GenericParser) --

    def _step(self, out: list[Event]) -> None:
        raise NotImplementedError

    def _open_body(self, opener: str) -> None:
        self._state = "body"
        self._body = _Body()
        self._opener = opener

    def _feed_body(self, out: list[Event]) -> None:
        body = self._body
        assert body is not None
        had_name = body.name is not None
        used = body.feed(self._buf)
        self._cut(used)
        if body.failed:
            return self._not_a_call(out)
        if body.name is not None and not had_name:
            self._start_call(body.name, out)
        if body.closed:
            if body.name is None:
                whole = body.whole()
                if whole is None:
                    return self._not_a_call(out)
                self._start_call(whole[0], out)
                self._args[-1].append(whole[1])
                out.append(CallDelta(len(self._ids) - 1, whole[1]))
            else:
                self._arguments(out)
            self._body = None
            self._state = "after"
        elif body.name is not None:
            self._arguments(out)

    def _not_a_call(self, out: list[Event]) -> None:
        """The body was not a call after all: it is content, as written."""
        assert self._body is not None
        out.append(self._opener + self._body.text)
        self._body = None
        self._state = "content"

    def _start_call(self, name: str, out: list[Event]) -> None:
        call_id = self._new_id()
        self._ids.append(call_id)
        self._names.append(name)
        self._args.append([])
        out.append(CallDelta(len(self._ids) - 1, "", call_id, name))

    def _arguments(self, out: list[Event]) -> None:
        assert self._body is not None
        part = self._body.fragment()
        if part:
            self._args[-1].append(part)
            out.append(CallDelta(len(self._ids) - 1, part))

    def _content(self, n: int, out: list[Event]) -> None:
        if n > 0:
            out.append(self._buf[:n])
        self._cut(n)

    def _cut(self, n: int) -> None:
        self._buf = self._buf[n:]


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
