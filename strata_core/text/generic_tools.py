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
decoded, as it arrives; calls stream as the other dialects' do (the first delta of each
carries index, id and name, then the arguments in fragments).

Earlier turns are rewritten the same way, since the template reads no tool messages
either: an assistant turn's calls become the JSON object the model is told to write, and
a tool result a user turn holding ``{"tool_result": {"name": ..., "content": ...}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from strata_core.text.grammars import JSON_STYLE
from strata_core.text.tools import (
    CallDelta,
    Dialect,
    Event,
    JsonScan,
    ToolCallParser,
    merged_events,
    new_call_id,
)

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


def _calls_text(calls: Sequence[Mapping[str, Any]]) -> str:
    objs = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    value: dict[str, Any] = {"tool_call": objs[0]} if len(objs) == 1 else {"tool_calls": objs}
    return json.dumps(value, ensure_ascii=False)


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
            msg["content"] = "\n".join(t for t in (m.get("content") or "", _calls_text(m["tool_calls"])) if t)
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
            args = c.get("arguments", c.get("parameters"))
            calls.append((c["name"], args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)))
        return None, calls
    if isinstance(obj.get("response"), str):
        return obj["response"], []
    return None


class GenericParser(ToolCallParser):
    """:class:`ToolCallParser` for the generic format.

    The reply is held until its first key decides it: ``response`` streams the string's
    text as content, decoded; ``tool_call`` / ``tool_calls`` stream their calls. Any
    other object is held until it closes and then read whole (keys in another order);
    text that is not such an object is content, unchanged.
    """

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        super().__init__(Dialect.GENERIC, new_id)
        self._in_list = False
        self._held = ""  # text consumed but not decided (the object's head before a list)
        self._scan = JsonScan()  # "whole": where the held object stands
        self._scanned = 0

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
            self._content(len(self._buf), out)

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
            opener = buf[: m.start(2)]
            self._cut(m.start(2))
            self._open_body(opener)
        elif key == "tool_calls" and value == "[":
            self._held = buf[: m.end()]
            self._cut(m.end())
            self._in_list = True
            self._state = "items"
        else:
            self._state = "whole"

    def _whole(self, out: list[Event]) -> None:
        buf = self._buf
        for i in range(self._scanned, len(buf)):
            was_open = self._scan.depth > 0
            self._scan.step(buf[i])
            if was_open and self._scan.depth == 0:
                reading = None
                try:
                    reading = _reading(json.loads(buf[: i + 1]))
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
                    self._args[-1].append(args)
                    out.append(CallDelta(len(self._ids) - 1, args))
                self._cut(i + 1)
                self._state = "done"
                return
        self._scanned = len(buf)

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

    def flush(self) -> list[Event]:
        out: list[Event] = []
        state = self._state
        if state == "body" and self._body is not None:
            self._flush_body(out)
            if self._buf:
                out.append(self._buf)
        elif state in ("start", "key", "whole", "content") or self._held:
            out.append(self._held + self._buf)
        elif state != "response" and self._buf.strip() and set(self._buf.strip()) - set("]}"):
            out.append(self._buf)  # a response's incomplete escape is dropped
        self._buf = self._held = ""
        self._state = "done"
        return merged_events(out)


def tool_parser(dialect: Dialect, new_id: Callable[[], str] = new_call_id) -> GenericParser:
    """The reply parser of ``dialect`` (the generic format is the only one left)."""
    assert dialect is Dialect.GENERIC, dialect
    return GenericParser(new_id)
