"""A tool format derived from a chat template's own rendering of probe calls, for templates
that write calls in no registered format (tool_formats.py).

The template renders three assistant turns (one call; two calls; a call with an object
argument). In the first, the call is located in one of these shapes (the first that fits):

* a JSON object holding the name under any key and the arguments under any other, in
  either order, with constant members (``"type": "function"``) and the call id kept where
  they stand, or ``{NAME: arguments}``;
* a Python call, ``NAME(city="Paris", days=2)``, strings quoted and values written as the
  template writes them;
* the name, then a JSON object of the arguments, with what the template writes between;
* the name, then XML-style parameters (``<key>Paris</key>``-like, the same for each).

What precedes the call is its opening marker (none: a reply may open with the call), what
follows it up to the end of the turn its closing marker (or none). The two-call turn says
whether each call has its markers or one block holds them all (a JSON list, a Python list,
a section), and what separates them. A format is kept only if it reads every probe back as
its calls; where it also writes each probe as the template does, byte for byte, it is
``exact`` (a forced call is written with no whitespace the template lacks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from strata_core.text.tool_formats import ToolFormat
from strata_core.text.tool_notations import (
    PythonStyle,
    python_call_end,
    python_decode,
    python_partial,
)
from strata_core.text.tool_syntax import Json, Lit, Name, Params, Part, Raw, Written

CALL_ID = "a1B2c3D4e"  # an id every template accepts (9 alphanumerics, Mistral's form)

PROBE_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "the city"},
            "days": {"type": "integer", "description": "how many days"},
            "opts": {"type": "object", "description": "options", "properties": {"unit": {"type": "string"}}}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {
            "zone": {"type": "string", "description": "the zone"},
            "style": {"type": "string", "description": "short or long"}},
            "required": ["zone"]}}},
]  # fmt: skip

#: the probe's tools without the object parameter, for templates that refuse it
FLAT_TOOLS: list[dict[str, Any]] = [
    {**t, "function": {**t["function"], "parameters": {**t["function"]["parameters"], "properties": {
        k: v for k, v in t["function"]["parameters"]["properties"].items() if v["type"] != "object"}}}}
    for t in PROBE_TOOLS
]  # fmt: skip

Calls = list[tuple[str, dict[str, Any]]]
ONE: Calls = [("get_weather", {"location": "Paris", "days": 2})]  # keys unsorted: a sorting template shows it
TWO: Calls = [*ONE, ("get_time", {"zone": "UTC", "style": "short"})]
NESTED: Calls = [("get_weather", {"location": "Paris", "opts": {"unit": "C"}})]
PROBES = (ONE, TWO, NESTED)

#: the template's rendering of an assistant turn making these calls (what follows the
#: generation prompt), or None where it refuses the turn
Render = Callable[[Calls], "str | None"]


def written(calls: Calls) -> list[Written]:
    return [Written(n, a, CALL_ID, i) for i, (n, a) in enumerate(calls)]


@dataclass(frozen=True)
class Spot:
    """Where one call stands in a rendering, and the parts that write it."""

    start: int
    end: int
    core: tuple[Part, ...]
    lead: str = ""  # the text a call opens with, where no marker precedes it


_SEPARATORS = ((", ", ": "), (",", ":"), (",", ": "), (", ", ":"))
_STYLES = tuple((seps, sort) for sort in (False, True) for seps in _SEPARATORS)


def _decode(text: str, at: int) -> tuple[Any, int] | None:
    try:
        return json.JSONDecoder().raw_decode(text, at)
    except ValueError:
        return None


def _json_style(value: Any, text: str) -> dict[str, Any]:
    """How ``json.dumps`` writes ``text`` (``value``'s JSON): its separators and whether it
    sorts keys, as :class:`Json`'s fields (none where no way gives the text)."""
    for seps, sort in _STYLES:
        if json.dumps(value, ensure_ascii=False, separators=seps, sort_keys=sort) == text:
            return {"separators": seps, "sort_keys": sort}
    return {}


# ---- locating one call ------------------------------------------------------------------------


def _json_call(text: str, name: str, args: dict[str, Any], frm: int) -> list[Spot]:
    """A JSON object holding the name and the arguments, the innermost around the name."""
    quoted = json.dumps(name)
    at = text.find(quoted, frm)
    while at >= 0:
        j = text.rfind("{", frm, at)
        while j >= 0:
            got = _decode(text, j)
            if got is not None and got[1] > at and isinstance(got[0], dict):
                spot = _json_spot(text, j, got[1], got[0], name, args)
                if spot is not None:
                    return [spot]
            j = text.rfind("{", frm, j)
        at = text.find(quoted, at + 1)
    return []


def _json_spot(text: str, at: int, end: int, obj: dict[str, Any], name: str, args: dict[str, Any]) -> Spot | None:
    # the object with the arguments in the order given (the rendering's may be sorted)
    style = _json_style({k: args if v == args else v for k, v in obj.items()}, text[at:end])
    first = re.match(r'\{\s*"(?:[^"\\]|\\.)*"', text[at:end])
    lead = first.group(0) if first else "{"
    if list(obj.items()) == [(name, args)]:
        return Spot(at, end, (Json("call", keyed=True, **style),), lead)
    layout: list[tuple[str, str, Any]] = []
    for key, value in obj.items():
        roles = {r for _, r, _ in layout}
        if value == name and "name" not in roles:
            layout.append((key, "name", None))
        elif value == args and "args" not in roles:
            layout.append((key, "args", None))
        elif value == CALL_ID:
            layout.append((key, "id", None))
        elif isinstance(value, str | int | float | bool) or value is None:
            layout.append((key, "const", value))
        else:
            return None
    if {r for _, r, _ in layout} < {"name", "args"}:
        return None
    return Spot(at, end, (Json("call", layout=tuple(layout), **style),), lead)


_PY_STYLES = tuple(
    PythonStyle(q, s, j) for j in (True, False) for q in ('"', "'") for s in (", ", ",")
)


def _python_call(text: str, name: str, args: dict[str, Any], frm: int) -> list[Spot]:
    """``NAME(k=v, ...)``: one spot per way of writing its values that gives the text."""
    at = text.find(name + "(", frm)
    while at >= 0:
        end = python_call_end(text, at)
        if end is not None and end > 0 and python_decode(text[at:end], None) == [(name, args)]:
            c = Written(name, args)
            styles = [s for s in _PY_STYLES if s.encode(c) == text[at:end]] or [_guess_style(text[at:end])]
            return [Spot(at, end, (_python_raw(s),)) for s in styles]
        at = text.find(name + "(", at + 1)
    return []


def _guess_style(call: str) -> PythonStyle:
    quote = '"' if '="' in call else "'"
    return PythonStyle(quote, ", " if ", " in call else ",", '{"' in call)


def _python_raw(style: PythonStyle) -> Raw:
    return Raw("", python_decode, style.encode, style.grammar, python_call_end, python_partial)


def _name_then_json(text: str, name: str, args: dict[str, Any], frm: int) -> list[Spot]:
    """The name, then (within a short marker) a JSON object of the arguments."""
    at = text.find(name, frm)
    while at >= 0:
        after = at + len(name)
        for j in (m.start() for m in re.finditer(r"\{", text[after : after + 80])):
            got = _decode(text, after + j)
            if got is not None and got[0] == args:
                mid = text[after : after + j]
                style = _json_style(args, text[after + j : got[1]])
                stop = mid.strip() or "{"
                if stop != "{" and stop in name:
                    break
                core = (Name((stop,)), *((Lit(mid),) if mid.strip() else ()), Json(**style))
                return [Spot(at, got[1], core)]
        at = text.find(name, at + 1)
    return []


def _xml_call(text: str, name: str, args: dict[str, Any], frm: int) -> list[Spot]:
    """The name, then each parameter as ``KEY_OPEN key KEY_CLOSE value VALUE_CLOSE`` (the
    same markup for each; a probe's two parameters show it)."""
    at = text.find(name, frm)
    if at < 0 or len(args) < 2:
        return []
    (k1, v1), (k2, v2) = list(args.items())[:2]
    s1, s2 = _plain(v1), _plain(v2)
    i = at + len(name)
    a = text.find(k1, i)
    b = text.find(s1, a + len(k1)) if a >= 0 else -1
    c = text.find(k2, b + len(s1)) if b >= 0 else -1
    d = text.find(s2, c + len(k2)) if c >= 0 else -1
    if d < 0:
        return []
    key_close, words = _flagged(text[a + len(k1) : b], text[c + len(k2) : d], isinstance(v1, str) != isinstance(v2, str))
    if key_close is None:
        return []
    between = text[b + len(s1) : c]  # VALUE_CLOSE + KEY_OPEN
    key_open = between[max(between.rfind("<"), 0) :] if "<" in between else between.lstrip()
    value_close = between[: len(between) - len(key_open)]
    if not text[:a].endswith(key_open) or not value_close.strip() or not text[d + len(s2) :].startswith(value_close):
        return []
    after_name = text[at + len(name) : a - len(key_open)]
    rest = text[d + len(s2) + len(value_close) :]
    tail = re.match(r"\s*(<[^<>]*>)?", rest)
    call_close = tail.group(0) if tail else ""
    end = call_close.strip() or after_name.strip()
    if not end or not key_open.strip():
        return []
    fmt = key_open + "{key}" + key_close + "{value}" + value_close
    flag = f"(?P<string>{re.escape(words[0])}|{re.escape(words[1])})"
    key_pattern = _loose(key_close).replace(re.escape("{string}"), flag)
    pattern = _loose(key_open) + "(?P<key>[^<>]*?)" + key_pattern + r"(?P<value>.*?)\s*" + _loose(value_close)
    name_part = Name((after_name.strip() or key_open.strip(), end))
    core: tuple[Part, ...] = (name_part, *((Lit(after_name),) if after_name else ()), Params(end, fmt, pattern, words=words))
    if call_close.strip():
        core += (Lit(call_close),)
    return [Spot(at, d + len(s2) + len(value_close) + len(call_close), core)]


def _flagged(first: str, second: str, differ: bool) -> tuple[str | None, tuple[str, str]]:
    """The markup between a parameter's key and its value: the same for each, or (DSML's
    ``string="true"``) the same but for a word saying whether the value is a string (the
    probe's first value is, its second is not), which becomes ``{string}``."""
    if first == second:
        return first, ("true", "false")
    if not differ:
        return None, ("", "")
    head = _common(first, second)
    tail = _common(first[::-1], second[::-1])[::-1]
    w1, w2 = first[len(head) : len(first) - len(tail)], second[len(head) : len(second) - len(tail)]
    if not w1.isalnum() or not w2.isalnum():
        return None, ("", "")
    return head + "{string}" + tail, (w1, w2)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _loose(markup: str) -> str:
    """A regex of ``markup`` where its whitespace may be any (a model's newlines vary)."""
    return r"\s*".join(re.escape(p) for p in re.split(r"\s+", markup.strip())) + r"\s*"


LOCATORS = (_json_call, _python_call, _name_then_json, _xml_call)

# ---- assembling the format --------------------------------------------------------------------


def _head(text: str) -> str:
    """What the rendering writes before its calls, less an empty reasoning block."""
    return re.sub(r"<think>\s*</think>|</think>", "", text).lstrip()


def _close(rest: str, end: str) -> str:
    """The closing marker: what follows the calls up to the end of the turn (``end``:
    what follows a plain reply)."""
    mark = end.strip()
    if mark and mark in rest:
        return rest[: rest.find(mark)].rstrip()
    first = re.match(r"\s*(<[^<>]*>|\[[^\[\]]*\]|```|[^\w\s<\[]+)?", rest)
    return first.group(0).rstrip() if first else ""


def _common(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _formats(locate: Callable[..., list[Spot]], texts: Sequence[str | None], end: str) -> list[ToolFormat]:
    one, two = texts[0], texts[1]
    assert one is not None
    spots = locate(one, *ONE[0], 0)
    if not spots:
        return []
    first = spots[0]
    head, close = _head(one[: first.start]), _close(one[first.end :], end)
    single = two is None or any(n not in two for n, _ in TWO)
    per_call, sep = False, ""
    if not single:
        assert two is not None
        a = locate(two, *TWO[0], 0)
        b = locate(two, *TWO[1], a[0].end) if a else []
        if not b:
            return []
        between = two[a[0].end : b[0].start]
        per_call = bool(head.strip()) and between.endswith(head) and head.strip() not in close
        if per_call:
            own = _common(between[: len(between) - len(head)], one[first.end :]).rstrip()
            close, sep = own, between[len(own) : len(between) - len(head)]
        else:
            sep = between
    out = []
    for spot in spots:
        if per_call:
            call = tuple(p for p in (Lit(head), *spot.core, Lit(close)) if not (isinstance(p, Lit) and not p.text))
            out.append(ToolFormat("derived", call, sep=sep, single=single))
        else:
            bare = not head.strip()
            out.append(ToolFormat("derived", spot.core, open=head, close=close, sep=sep, single=single, bare=bare,
                                  starts=(spot.lead,) if bare and spot.lead else ()))
    return out


def reads(fmt: ToolFormat, text: str, calls: Calls) -> bool:
    """Whether ``fmt`` reads ``text`` as exactly ``calls``, with nothing but reasoning
    markup before them."""
    from strata_core.text.tool_reader import FormatParser

    p = FormatParser(fmt, PROBE_TOOLS)
    p.push(text)
    p.flush()
    if not p.spans or [(c.name, json.loads(c.arguments)) for c in p.calls] != calls:
        return False
    before = text[: p.spans[0][0]]
    for tag in (*fmt.think, "<think>", "</think>"):
        before = before.replace(tag, "")
    return not before.strip()


def _probed(texts: Sequence[str | None], single: bool) -> list[tuple[str, Calls]]:
    """The probes the template rendered whole (a one-call template: not the two-call turn)."""
    out = []
    for text, calls in zip(texts, PROBES, strict=True):
        if text is not None and all(n in text for n, _ in calls) and not (single and len(calls) > 1):
            out.append((text, calls))
    return out


def derive(render: Render, end: str = "") -> ToolFormat | str:
    """The format the template's rendering of probe calls shows, or why there is none (a
    sentence naming what the rendering lacks)."""
    texts = [render(calls) for calls in PROBES]
    one = texts[0]
    if one is None or ONE[0][0] not in one:
        return "it renders no call"
    found = []
    for locate in LOCATORS:
        for fmt in _formats(locate, texts, end):
            probed = _probed(texts, fmt.single)
            if all(reads(fmt, t, calls) for t, calls in probed):
                if all(fmt.write(written(calls), {}) in t for t, calls in probed):
                    return replace(fmt, exact=True)
                found.append(fmt)
        if found:
            return found[0]
    return f"no shape it can be read in fits its rendering of a call, {one.strip()[:160]!r}"
