"""The generic tool format: tool calling for models whose chat template never reads
``tools`` (the template cannot show them, and the model has no call syntax of its own).

The server does what such a template would have done: it writes the tools and a fixed
instruction into the system message (:func:`generic_messages`), and constrains the reply
with a grammar (:func:`generic_grammar`) to exactly one JSON object of one of these forms:

* ``{"response": "<text>"}``: an answer in text (``tool_choice`` auto only);
* ``{"tool_call": {"name": ..., "arguments": {...}}}``: one call;
* ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}``: one or more calls
  (unless ``parallel_tool_calls`` is false).

The reply is read back by :class:`GenericParser`: a response's string streams as content,
decoded, as it arrives; calls stream as every family's do (the first delta of each
carries index, id and name, then the arguments in fragments). The registry holds this
format as ``generic`` (tool_formats.GENERIC), served through a ToolSetup like a
template's own.

Earlier turns are rewritten the same way, since the template reads no tool messages
either: an assistant turn's calls become the JSON object the model is told to write, and
a tool result a user turn holding ``{"tool_result": {"name": ..., "content": ...}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata_core.text.grammars import JSON_STYLE
from strata_core.text.tool_syntax import bracket_end, scan
from strata_core.text.tools import CallDelta, Event, ToolCall, merged_events, new_call_id

# ---- the prompt ---------------------------------------------------------------------------

_CALL_FORM = '{"name": "<tool name>", "arguments": <arguments object>}'


def generic_instruction(
    tools: Sequence[Mapping[str, Any]], mode: str, parallel: bool, named: str | None = None
) -> str:
    """The system text that shows ``tools`` and the reply's forms; it names only the forms
    the grammar admits for ``mode`` (auto, required, named)."""
    lines = ["You can use the tools listed below. Reply with one JSON object and nothing else:"]
    lines.append(f'- to call a tool: {{"tool_call": {_CALL_FORM}}}')
    if parallel:
        lines.append(f'- to call several tools at once: {{"tool_calls": [{_CALL_FORM}, ...]}}')
    if mode == "auto":
        lines.append('- to answer without a tool: {"response": "<your answer>"}')
    elif named is not None:
        lines.append(f"You must call the tool {named}.")
    else:
        lines.append("You must call a tool.")
    lines.append('A tool\'s result comes back as {"tool_result": {"name": "<tool name>", "content": "..."}}.')
    lines.append("")
    lines.append("Tools, each with the JSON schema of its arguments:")
    for tool in tools:
        fn = tool["function"]
        shown = {"name": fn["name"]}
        if fn.get("description"):
            shown["description"] = fn["description"]
        shown["parameters"] = fn.get("parameters") or {"type": "object"}
        lines.append(json.dumps(shown, ensure_ascii=False))
    return "\n".join(lines)


def calls_text(calls: Sequence[tuple[str, Any]]) -> str:
    """(name, arguments) calls as the model is told to write them."""
    objs = [{"name": name, "arguments": args} for name, args in calls]
    return json.dumps({"tool_call": objs[0]} if len(objs) == 1 else {"tool_calls": objs}, ensure_ascii=False)


def generic_messages(messages: Sequence[Mapping[str, Any]], instruction: str | None) -> list[dict[str, Any]]:
    """``messages`` (template views) as a template that reads no tools can render them:
    assistant calls as the JSON object the model is told to write (after the turn's text,
    if any), each run of tool results as one user turn of ``{"tool_result": ...}`` lines,
    and ``instruction`` (None: none) at the end of the system message, or in a new one."""
    names: dict[str, str] = {}  # call id -> function name, to label its result
    out: list[dict[str, Any]] = []
    results: list[str] = []

    def end_results() -> None:
        if results:
            out.append({"role": "user", "content": "\n".join(results)})
            results.clear()

    for m in messages:
        if m["role"] == "tool":
            call_id = m.get("tool_call_id", "")
            label = {"name": names[call_id]} if call_id in names else {"tool_call_id": call_id}
            results.append(json.dumps({"tool_result": {**label, "content": m["content"]}}, ensure_ascii=False))
            continue
        end_results()
        msg = {k: v for k, v in m.items() if k != "tool_calls"}
        if m.get("tool_calls"):
            for c in m["tool_calls"]:
                names[c["id"]] = c["function"]["name"]
            calls = calls_text([(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]])
            msg["content"] = "\n".join(t for t in (m.get("content") or "", calls) if t)
        out.append(msg)
    end_results()
    if instruction is not None:
        if out and out[0]["role"] in ("system", "developer"):
            first = out[0]["content"]
            out[0] = {**out[0], "content": f"{first}\n\n{instruction}" if first else instruction}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


# ---- the grammar ----------------------------------------------------------------------------


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """JSON schema of one call object of ``tool`` (``{"type": "function", "function": ...}``)."""
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}  # fmt: skip


def _only(key: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {key: value}, "required": [key], "additionalProperties": False}


def generic_schema(tools: Sequence[Mapping[str, Any]], parallel: bool, text: bool) -> dict[str, Any]:
    """The JSON schema of a reply: a call to one of ``tools`` (with ``parallel``, also a
    list of calls) or, with ``text``, a response."""
    calls = [_call_schema(t) for t in tools]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    forms = [_only("tool_call", call)]
    if parallel:
        forms.append(_only("tool_calls", {"type": "array", "items": call, "minItems": 1}))
    if text:
        forms.append(_only("response", {"type": "string"}))
    return forms[0] if len(forms) == 1 else {"anyOf": forms}


def generic_grammar(tools: Sequence[Mapping[str, Any]], parallel: bool, text: bool) -> str:
    """A Lark grammar (llguidance's, with ``%json``) of one reply in the generic format."""
    # JSON written as structured outputs write it: no free whitespace (a small model pads with it)
    schema = {**generic_schema(tools, parallel, text), "x-guidance": JSON_STYLE}
    return "start: %json " + json.dumps(schema, ensure_ascii=False) + "\n"


# ---- the reply ----------------------------------------------------------------------------

# The object's first key and the first character of its value; while only a prefix of
# that has come, the reply is undecided.
_KEY = re.compile(r'\s*\{\s*"((?:[^"\\]|\\.)*)"\s*:\s*(\S)')
_KEY_SO_FAR = re.compile(r'\s*\{\s*(?:"(?:[^"\\]|\\.)*(?:\\|"\s*(?::\s*)?)?)?')
# a call object's head: its name, then the arguments' key
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:')
_PLAIN = re.compile(r'[^"\\]+')
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_HEX = re.compile(r"[0-9a-fA-F]*")
_ESCAPE_SO_FAR = re.compile(r"(\\(u[0-9a-fA-F]{0,3})?)?")


def _escape(buf: str, i: int) -> tuple[str, int] | None:
    """The character(s) of the JSON escape at ``buf[i]`` (a backslash) and its length;
    None while it is incomplete. A lone surrogate reads as U+FFFD, an unknown escape as
    its own two characters."""
    if i + 1 >= len(buf):
        return None
    if buf[i + 1] != "u":
        try:
            return json.loads(f'"{buf[i:i + 2]}"'), 2
        except ValueError:
            return buf[i : i + 2], 2
    hex4 = buf[i + 2 : i + 6]
    if not _HEX4.fullmatch(hex4):
        return None if len(hex4) < 4 and _HEX.fullmatch(hex4) else (buf[i : i + 2], 2)
    code = int(hex4, 16)
    if 0xD800 <= code < 0xDC00:  # a high surrogate: its low half should follow
        low = buf[i + 6 : i + 12]
        if len(low) < 6 and _ESCAPE_SO_FAR.fullmatch(low):
            return None
        if low.startswith("\\u") and _HEX4.fullmatch(low[2:]) and 0xDC00 <= int(low[2:], 16) < 0xE000:
            return chr(0x10000 + ((code - 0xD800) << 10) + (int(low[2:], 16) - 0xDC00)), 12
        return "\ufffd", 6
    if 0xDC00 <= code < 0xE000:
        return "\ufffd", 6
    return chr(code), 6


def _arguments_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps({} if value is None else value, ensure_ascii=False)


def _reading(obj: Any) -> tuple[str | None, list[tuple[str, str]]] | None:
    """(content, calls) of a whole reply object in the generic format, or None."""
    if not isinstance(obj, dict):
        return None
    items = obj.get("tool_calls")
    if items is None and isinstance(obj.get("tool_call"), dict):
        items = [obj["tool_call"]]
    if isinstance(items, list) and items:
        calls = []
        for c in items:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                return None
            calls.append((c["name"], _arguments_text(c.get("arguments", c.get("parameters")))))
        return None, calls
    if isinstance(obj.get("response"), str):
        return obj["response"], []
    return None


@dataclass
class _Body:
    """One JSON call object fed as it comes: ``feed`` returns how many characters it used;
    ``closed`` once the object ended; ``failed`` when its name cannot be read (the caller
    shows it as content)."""

    text: str = ""
    name: str | None = None
    args_at: int | None = None  # where the arguments value starts in text
    args_end: int | None = None  # where it ended
    sent: int = 0  # how far the arguments were handed out
    started: bool = False  # the first non-space character of the arguments was sent
    colons: int = 0  # key/value colons of the object itself seen so far
    closed: bool = False
    failed: bool = False

    def feed(self, chunk: str) -> int:
        base, text = len(self.text), self.text + chunk  # (it opens at the object's "{")
        for i, ch, depth in scan(text, 0, ('"',)):
            if i < base:
                continue
            if self.args_at is not None and self.args_end is None and ch in ",}" and depth == (ch == ","):
                self.args_end = i  # a member's comma or the object's end, at its top
            if ch == ":" and depth == 1:
                self.colons += 1
                if self.colons == 2:  # after the second key: is it name, then arguments?
                    self._head(text[: i + 1])
            if (ch == "}" and depth == 0) or self.failed:
                self.closed = not self.failed
                self.text = text[: i + 1]
                return i + 1 - base
        self.text = text
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
        return obj["name"], _arguments_text(obj.get("arguments", obj.get("parameters")))


class GenericParser:
    """The reader of the generic format (a :class:`strata_core.text.tools.Reader`).

    The reply is held until its first key decides it: ``response`` streams the string's
    text as content, decoded; ``tool_call`` / ``tool_calls`` stream their calls (the first
    delta of each carries index, id and name, then the arguments in fragments, the model's
    own JSON text). Any other object is held until it closes and then read whole (keys in
    another order); text that is not such an object is content, unchanged.
    """

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self._new_id = new_id
        self._state = "start"
        self._buf = ""
        self._body: _Body | None = None
        self._opener = ""  # the text that opened the body, shown if it is not a call
        self._made: list[tuple[str, str, list[str]]] = []  # each call's id, name, arguments' fragments
        self._in_list = False
        self._held = ""  # text consumed but not decided (the object's head before a list)

    @property
    def calls(self) -> list[ToolCall]:
        return [ToolCall(i, n, "".join(a)) for i, n, a in self._made]

    def push(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._buf:
            before = (self._state, len(self._buf))
            self._step(out)
            if (self._state, len(self._buf)) == before:
                break
        return merged_events(out)

    def _step(self, out: list[Event]) -> None:
        state = self._state
        if state == "body":
            self._feed_body(out)
        elif state == "start":
            rest = self._buf.lstrip()
            if rest:
                self._state = "key" if rest[0] == "{" else "content"
        elif state == "key":
            self._key(out)
        elif state == "whole":
            self._whole(out)
        elif state == "response":
            self._response(out)
        elif state == "items":
            self._items(out)
        elif state == "after":
            self._after(out)
        elif state == "tail":
            rest = self._buf.lstrip()
            if rest:
                self._cut(len(self._buf) - len(rest) + (rest[0] == "}"))
                self._state = "done" if rest[0] == "}" else "content"
        elif state == "done":
            if self._buf.strip():
                self._state = "content"
        else:  # content
            out.append(self._buf)
            self._cut(len(self._buf))

    def _key(self, out: list[Event]) -> None:
        buf = self._buf
        m = _KEY.match(buf)
        if m is None:
            if not _KEY_SO_FAR.fullmatch(buf):
                self._state = "whole"
            return
        try:
            key = json.loads(f'"{m.group(1)}"')
        except ValueError:
            key = None
        value = m.group(2)
        if key == "response" and value == '"':
            self._cut(m.end())
            self._state = "response"
        elif key == "tool_call" and value == "{":
            self._open_body(buf[: m.start(2)])
            self._cut(m.start(2))
        elif key == "tool_calls" and value == "[":
            self._held = buf[: m.end()]
            self._cut(m.end())
            self._in_list = True
            self._state = "items"
        else:
            self._state = "whole"

    def _whole(self, out: list[Event]) -> None:
        """An object whose first key decided nothing: read whole once it closes."""
        end = bracket_end(self._buf, 0)
        if end is None:
            return
        reading = None
        try:
            reading = _reading(json.loads(self._buf[:end]))
        except ValueError:
            pass
        if reading is None:
            self._state = "content"
            return
        content, calls = reading
        if content:
            out.append(content)
        for name, args in calls:
            self._start_call(name, out)
            self._made[-1][2].append(args)
            out.append(CallDelta(len(self._made) - 1, args))
        self._cut(end)
        self._state = "done"

    def _response(self, out: list[Event]) -> None:
        buf, i, text = self._buf, 0, []
        while i < len(buf):
            ch = buf[i]
            if ch == '"':
                self._state = "tail"
                i += 1
                break
            if ch == "\\":
                esc = _escape(buf, i)
                if esc is None:
                    break
                text.append(esc[0])
                i += esc[1]
                continue
            m = _PLAIN.match(buf, i)
            assert m is not None
            text.append(m.group())
            i = m.end()
        out.append("".join(text))
        self._cut(i)

    def _items(self, out: list[Event]) -> None:
        rest = self._buf.lstrip()
        if not rest:
            return
        if rest[0] == "{":
            self._cut(len(self._buf) - len(rest))
            self._open_body(self._held)
            self._held = ""
        elif rest[0] == "]" and not self._held:
            self._cut(len(self._buf) - len(rest) + 1)
            self._end_list()
        else:  # not a call (an empty list too: no call was made)
            self._as_content(out)

    def _after(self, out: list[Event]) -> None:
        """A call object closed: the reply's end, or (in a list) the next call."""
        if not self._in_list:
            self._state = "tail"
            return
        rest = self._buf.lstrip()
        if not rest:
            return
        if rest[0] == ",":
            self._cut(len(self._buf) - len(rest) + 1)
            self._state = "items"
        elif rest[0] == "]":
            self._cut(len(self._buf) - len(rest) + 1)
            self._end_list()
        else:
            self._as_content(out)

    def _end_list(self) -> None:
        self._in_list = False
        self._state = "tail"

    def _as_content(self, out: list[Event]) -> None:
        out.append(self._held)
        self._held = ""
        self._state = "content"

    # -- one call object --

    def _open_body(self, opener: str) -> None:
        self._state = "body"
        self._body = _Body()
        self._opener = opener

    def _feed_body(self, out: list[Event]) -> None:
        body = self._body
        assert body is not None
        had_name = body.name is not None
        self._cut(body.feed(self._buf))
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
                self._made[-1][2].append(whole[1])
                out.append(CallDelta(len(self._made) - 1, whole[1]))
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
        self._made.append((call_id, name, []))
        out.append(CallDelta(len(self._made) - 1, "", call_id, name))

    def _arguments(self, out: list[Event]) -> None:
        assert self._body is not None
        part = self._body.fragment()
        if part:
            self._made[-1][2].append(part)
            out.append(CallDelta(len(self._made) - 1, part))

    def _cut(self, n: int) -> None:
        self._buf = self._buf[n:]

    def flush(self) -> list[Event]:
        out: list[Event] = []
        state = self._state
        if state == "body" and self._body is not None:
            # a call cut short by the reply's end: its arguments so far stand, or, before
            # its name was read, its text as content
            if self._body.name is not None:
                self._arguments(out)
            else:
                out.append(self._opener + self._body.text)
            self._body = None
            if self._buf:
                out.append(self._buf)
        elif state in ("start", "key", "whole", "content") or self._held:
            out.append(self._held + self._buf)
        elif state != "response" and self._buf.strip() and set(self._buf.strip()) - set("]}"):
            out.append(self._buf)  # a response's incomplete escape is dropped
        self._buf = self._held = ""
        self._state = "done"
        return merged_events(out)
