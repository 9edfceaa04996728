"""The pieces a model family writes one tool call with, each able to read itself from text
(whole or cut short), write itself, and say itself as an llguidance Lark rule.

A call is a tuple of parts, read left to right: :class:`Lit` (a marker), :class:`Name`
(the function's name, up to a marker), :class:`Id` (a call id), :class:`Skip` (text the
family writes there that carries nothing, e.g. ``<|constrain|>json``), :class:`Opt`
(parts that may be absent), :class:`Json` (a JSON value: the arguments, one call object,
or a list of them), :class:`Params` (XML-style ``key``/``value`` pairs) and :class:`Raw`
(a family's own notation, read and written by two functions).

Reading returns :data:`PARTIAL` while the text so far could still become the call,
:data:`FAIL` when it cannot, else the fields read and where the call ended. Whitespace
before a marker or a JSON value is skipped, since templates put newlines there freely.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_core.text.grammars import JSON_STYLE

PARTIAL = "partial"
FAIL = "fail"

#: A name or id longer than this is not one: the text is not a call.
MAX_FIELD = 256


@dataclass
class Read:
    """What reading a call found: ``calls`` holds (name, arguments object) pairs; ``id``
    the id the model wrote, if the family writes one."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    props: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # tool -> its parameters
    name: str | None = None
    id: str | None = None
    end: int = 0
    upto: int = 0  # how far the text was read so far
    partial: tuple[str, dict[str, Any]] | None = None  # the call being read: its arguments complete so far
    early: list[tuple[str, Any]] = field(default_factory=list)  # calls of a list still being read, whole


@dataclass
class Written:
    """One call as the family writes it: name, arguments object, id, place in the turn."""

    name: str
    arguments: Any
    id: str = ""
    index: int = 0


def _ws(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def lark_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


#: Whitespace a grammar lets the model write before a marker: bounded, so that a small
#: model cannot pad forever.
WS = "/[ \\t\\r\\n]{0,8}/"


def lit_rule(text: str, exact: bool = False) -> str:
    """A marker as a grammar says it: where the family may put whitespace (at its ends,
    inside it, between two tags) any little is allowed; ``exact``: the family's templates
    write it as here, and so must the model (a small one pads every place it may)."""
    if exact:  # each run of whitespace a lexeme of its own; what precedes decides the leading run
        runs = [lark_str(p) for p in re.split(r"(\s+)", text.lstrip()) if p]
        return " ".join([WS] * (text[:1].isspace()) + runs) or '""'
    pieces = [p for p in re.split(r"\s+|(?<=>)(?=<)", text) if p]
    return " ".join(f"{WS} {lark_str(p)}" for p in pieces) if pieces else '""'


_SUBSCHEMAS = ("items", "additionalItems", "not", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")


#: The bound a forced number of no other bound gets: 16 digits before any point.
_NUMBER_BOUND = 10**16 - 1
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "const", "enum")


def closed(schema: Any) -> Any:
    """``schema`` as a forced call writes it: every object that lists its properties closed
    to others, where it does not say (a forced call writes the parameters its tool
    declares, not keys of the model's invention; JSON Schema leaves such objects open,
    llama.cpp's grammars close them too), and a number of no bound given 16 digits (a
    small model otherwise writes keys or digits until max_tokens)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    if out.get("type") in ("integer", "number") and not any(k in out for k in _BOUNDS):
        out["minimum"], out["maximum"] = -_NUMBER_BOUND, _NUMBER_BOUND
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = closed(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(s) for k, s in out[key].items()}
    return out


def sorted_schema(schema: Any) -> Any:
    """``schema`` with every object's properties listed in key order: a grammar writes them
    in the order listed, and some families' JSON sorts keys."""
    if isinstance(schema, list):
        return [sorted_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: sorted_schema(v) if k != "properties" and k != "const" else v for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: sorted_schema(schema["properties"][k]) for k in sorted(schema["properties"])}
    return out


def json_rule(schema: Any, style: dict[str, Any]) -> str:
    """A JSON value of ``schema`` (objects closed, numbers bounded: :func:`closed`) as a
    grammar says it."""
    return "%json " + json.dumps({**closed(schema), "x-guidance": style}, ensure_ascii=False)


@dataclass(frozen=True)
class Lit:
    text: str  # as written; read with the whitespace around it free

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        want = self.text.strip()
        at = _ws(text, at) if want else at
        rest = text[at : at + len(want)]
        if rest == want:
            return at + len(want)
        return PARTIAL if want.startswith(rest) and at + len(rest) == len(text) and not final else FAIL

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        return self.text

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        return lit_rule(self.text, exact)


def _until(text: str, at: int, stops: Sequence[str], final: bool) -> tuple[int, int] | str:
    """(start of the first stop, its length) at or after ``at``; PARTIAL / FAIL."""
    hits = [(text.find(s, at), len(s)) for s in stops]
    found = [h for h in hits if h[0] >= 0]
    if found:
        first = min(found)
        return FAIL if first[0] - at > MAX_FIELD else first
    if len(text) - at > MAX_FIELD or final:
        return FAIL
    return PARTIAL


@dataclass(frozen=True)
class Name:
    """The name, up to the first of ``stops`` (not consumed); ``fmt`` writes it (``{name}``,
    ``{index}``: the call's place), ``pattern`` reads it back (group 1; a group ``index``:
    the index written with it, which makes the call's id as ``fmt`` writes it, e.g. Kimi
    K2's ``functions.get_weather:0``, the id its template renders results with)."""

    stops: tuple[str, ...]
    fmt: str = "{name}"
    pattern: str = r"(.+)"
    no_space: bool = False  # holds no whitespace: text with some before a stop is no name

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        start = _ws(text, at)
        hit = _until(text, start, self.stops, final)  # a stop may be whitespace
        if isinstance(hit, str):
            return FAIL if self.no_space and hit == PARTIAL and re.search(r"\s", text[start:]) else hit
        m = re.fullmatch(self.pattern, text[at : hit[0]].strip(), re.S)
        if m is None or not m.group(1).strip():
            return FAIL
        r.name = m.group(1).strip()
        index = m.groupdict().get("index")
        if index is not None:
            r.id = self.fmt.format(name=r.name, index=int(index))
        return hit[0]

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        return self.fmt.format(name=c.name, index=c.index)

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        head, _, tail = self.fmt.partition("{name}")
        parts = [lark_str(head)] if head else [] if exact else [WS]
        parts.append(lark_str(name))
        if "{index}" in tail:
            before, _, after = tail.partition("{index}")
            parts += [lark_str(before)] if before else []
            parts.append("/[0-9]{1,2}/")
            parts += [lark_str(after)] if after else []
        elif tail:
            parts.append(lark_str(tail))
        return " ".join(parts)


@dataclass(frozen=True)
class Id:
    """A call id up to the first of ``stops`` (not consumed); written as the call's id."""

    stops: tuple[str, ...]
    regex: str = "[A-Za-z0-9_-]{1,40}"

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        hit = _until(text, at, self.stops, final)
        if isinstance(hit, str):
            return hit
        r.id = text[at : hit[0]].strip()
        return hit[0]

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        return c.id

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        return f"/{self.regex}/"


@dataclass(frozen=True)
class Skip:
    """Text that carries nothing, up to the first of ``stops`` (not consumed); written as
    ``written``."""

    stops: tuple[str, ...]
    written: str = ""
    regex: str = ""  # what a grammar lets the model write there (else ``written``)

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        hit = _until(text, at, self.stops, final)
        return hit if isinstance(hit, str) else hit[0]

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        return self.written

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        return f"/{self.regex}/" if self.regex else lit_rule(self.written, exact)


@dataclass(frozen=True)
class Opt:
    """Parts that may be absent: absent when the first one does not match."""

    parts: tuple[Part, ...]
    forced: bool = True  # a forced call may write them (False: the template never does)

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        first = self.parts[0].read(text, at, r, final)
        if first == FAIL:
            return at
        if first == PARTIAL:
            return PARTIAL
        return read_parts(self.parts, text, at, r, final)

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        return write_parts(self.parts, c, tools) if self.forced else ""

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        if not self.forced:
            return '""'
        return f"({' '.join(p.rule(name, schema, style, exact) for p in self.parts)})?"


def scan(text: str, at: int, quotes: tuple[str, ...]) -> Iterator[tuple[int, str, int]]:
    """The one scanner of bracketed notations (JSON, Python calls, Gemma 4's objects): each
    character of ``text`` from ``at`` outside strings (each opened and closed by one of
    ``quotes``; a backslash escapes in a one-character quote), with its index and the
    bracket depth after it."""
    depth, quote, i = 0, "", at
    while i < len(text):
        if quote:
            if len(quote) == 1 and text[i] == "\\":
                i += 2
            elif text.startswith(quote, i):
                i, quote = i + len(quote), ""
            else:
                i += 1
            continue
        quote = next((q for q in quotes if text.startswith(q, i)), "")
        if quote:
            i += len(quote)
            continue
        ch = text[i]
        depth += (ch in "([{") - (ch in ")]}")
        yield i, ch, depth
        i += 1


def bracket_end(text: str, at: int, quotes: tuple[str, ...] = ('"',)) -> int | None:
    """Where the bracketed value whose first bracket is at or after ``text[at]`` ends (after
    its closing bracket); None if it does not yet, -1 if a bracket closes none."""
    for i, ch, depth in scan(text, at, quotes):
        if ch in ")]}" and depth <= 0:
            return i + 1 if depth == 0 else -1
    return None


def json_end(text: str, at: int) -> int | None:
    """Where the JSON object or array starting at ``text[at]`` ends; None if it does not yet."""
    return bracket_end(text, at)


def item_ends(body: str, quotes: tuple[str, ...]) -> list[int]:
    """Where the complete items of the bracketed list that ``body`` opens end: its commas
    at depth 1, outside strings (each opened and closed by one of ``quotes``), and its
    closing bracket."""
    ends: list[int] = []
    for i, ch, depth in scan(body, 0, quotes):
        if (ch == "," and depth == 1) or (ch in ")]}" and depth == 0):  # an item's comma, the list's end
            ends.append(i)
            if depth == 0:
                break
    return ends


def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members, a key written twice keeping its first value (so arguments
    that streamed a key at a time stand)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        out.setdefault(k, v)
    return out


def json_members(text: str) -> tuple[dict[str, Any], int] | None:
    """The members complete so far of the JSON object ``text`` opens, cut short or not
    (``{"a": 1, "b": 2``: a), and where they end; None when none is."""
    ends = item_ends(text, ('"',)) if text.startswith("{") else []
    if not ends:
        return None
    try:
        value = json.loads(text[: ends[-1]] + "}", object_pairs_hook=first_wins)
    except ValueError:
        return None
    return (value, ends[-1]) if isinstance(value, dict) and value else None


#: Keys of a call object: the name's, then the arguments' (first found wins).
NAME_KEYS = ("name", "tool_name")
ARGS_KEYS = ("arguments", "parameters")


def call_of(obj: Any, keys: tuple[str, str] | None = None) -> tuple[str, Any] | None:
    """(name, arguments) of one call object, or None; ``keys``: the name's and the
    arguments' keys of the family, tried first; ``{"name": {...}}`` (a single key whose
    value is the arguments) reads as a call of ``name``."""
    if not isinstance(obj, dict):
        return None
    names, args_keys = (keys[0], *NAME_KEYS) if keys else NAME_KEYS, (keys[1], *ARGS_KEYS) if keys else ARGS_KEYS
    for key in names:
        if isinstance(obj.get(key), str):
            args: Any = next((obj[k] for k in args_keys if k in obj), {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            return (obj[key], {} if args is None else args)
    if len(obj) == 1:
        (name, args), = obj.items()
        if isinstance(args, dict):
            return name, args
    return None


_KEY = re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*:\s*')


def _call_so_far(obj: str, keyed: bool, keys: tuple[str, str]) -> tuple[str, dict[str, Any], int] | None:
    """A call object cut short (``{"name": "f", "arguments": {"a": 1, "b``): its name,
    the members of its arguments complete so far (not none) and where they end."""
    if not obj.startswith("{"):
        return None
    ends = item_ends(obj, ('"',))
    try:
        head = json.loads(obj[: ends[-1]] + "}", object_pairs_hook=first_wins) if ends else {}
    except ValueError:
        return None
    name_keys, args_keys = (keys[0], *NAME_KEYS), (keys[1], *ARGS_KEYS)
    name = next((head[k] for k in name_keys if isinstance(head.get(k), str)), None)
    args = next((head[k] for k in args_keys if k in head), None)
    if name is not None and isinstance(args, dict):  # whole arguments, members after them to come
        return (name, args, ends[-1]) if args else None
    last = ends[-1] + 1 if ends else 1
    m = _KEY.match(obj, last)
    if m is None or not obj.startswith("{", m.end()):
        return None
    key = json.loads(f'"{m.group(1)}"')
    if keyed:
        name = key if not head else None
    elif key not in args_keys:
        name = None
    value = obj[m.end() :]
    end = json_end(value, 0)
    if end is not None:  # the arguments whole
        try:
            got: tuple[dict[str, Any], int] | None = (json.loads(value[:end], object_pairs_hook=first_wins), end)
        except ValueError:
            return None
    else:
        got = json_members(value)
    if name is None or got is None or not got[0]:
        return None
    return name, got[0], m.end() + got[1]


def _id_schema(fmt: str) -> dict[str, Any]:
    """What a grammar lets the model write for a call object's id, written as ``fmt``: the
    call's place (``{index}``) in digits, an id (``{id}``) as ids look; bounded, else a
    small model writes digits until max_tokens."""
    pattern = "[0-9]{1,2}" if fmt == "{index}" else "[A-Za-z0-9_-]{1,40}"
    return {"type": "string", "pattern": f"^{pattern}$"}


@dataclass(frozen=True)
class Json:
    """A JSON value: ``args`` the arguments of the call named before it; ``call`` one call
    object (``keys``: its name and arguments keys as written); ``calls`` a list of them
    (one bare object also reads)."""

    what: str = "args"
    keys: tuple[str, str] = ("name", "arguments")
    lead: dict[str, str] = field(default_factory=dict)  # keys written before the name
    trail: dict[str, str] = field(default_factory=dict)  # and after the arguments
    keyed: bool = False  # a call is {name: arguments}
    indent: int | None = None
    #: a call object's members in the order written, each (key, role, value): role "name",
    #: "args", "id" or "const" (``value`` as written); empty: ``lead``, ``keys``, ``trail``
    layout: tuple[tuple[str, str, Any], ...] = ()
    separators: tuple[str, str] | None = None  # as the family's JSON separates items, keys
    sort_keys: bool = False  # the family's JSON writes every object's keys sorted

    def _keys(self) -> tuple[str, str]:
        if not self.layout:
            return self.keys
        role = {r: k for k, r, _ in self.layout}
        return role["name"], role["args"]

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        at = _ws(text, at)
        if at == len(text):
            return FAIL if final else PARTIAL
        if text[at] not in "{[":
            return FAIL
        end = json_end(text, at)
        so_far = json_members(text[at:end]) if self.what == "args" else None
        if so_far is not None and r.name is not None:  # the arguments complete so far stream
            r.partial, r.upto = (r.name, so_far[0]), at + so_far[1]
        if end is None and self.what != "args":
            self._so_far(text, at, r)
        if end is None:
            return FAIL if final else PARTIAL
        try:
            value = json.loads(text[at:end], object_pairs_hook=first_wins)
        except ValueError:
            return FAIL
        if self.what == "args":
            if not isinstance(value, dict) or r.name is None:
                return FAIL
            r.calls.append((r.name, value))
            return end
        items = value if isinstance(value, list) and self.what == "calls" else [value]
        calls = [call_of(v, self._keys()) for v in items]
        if not calls or any(c is None for c in calls):
            return FAIL
        r.calls += [c for c in calls if c is not None]
        return end

    def _so_far(self, text: str, at: int, r: Read) -> None:
        """Of call objects cut short (one, or a list): the calls complete so far
        (``r.early``) and the arguments complete so far of the one being written
        (``r.partial``), so that they stream a parameter at a time."""
        body = text[at:]
        items = [(0, body)]
        if body.startswith("["):
            if self.what != "calls":
                return
            cuts = [0, *item_ends(body, ('"',))]
            items = [(c + 1, body[c + 1 : d]) for c, d in zip(cuts, [*cuts[1:], len(body)], strict=True)]
        for i, (start, item) in enumerate(items):
            start, item = start + len(item) - len(item.lstrip()), item.strip()
            if json_end(item, 0) is None and i == len(items) - 1:
                got = _call_so_far(item, self.keyed, self._keys())
                if got is not None:
                    r.partial, r.upto = (got[0], got[1]), at + start + got[2]
                return
            try:
                call = call_of(json.loads(item, object_pairs_hook=first_wins), self._keys())
            except ValueError:
                return
            if call is None:
                return
            r.early.append(call)

    def _obj(self, c: Written) -> dict[str, Any]:
        if self.keyed:
            return {c.name: c.arguments}
        if self.layout:
            said = {"name": c.name, "args": c.arguments, "id": c.id}
            return {k: said.get(role, value) for k, role, value in self.layout}
        lead = {k: v.format(id=c.id, index=c.index) for k, v in self.lead.items()}
        trail = {k: v.format(id=c.id, index=c.index) for k, v in self.trail.items()}
        return {**lead, self.keys[0]: c.name, self.keys[1]: c.arguments, **trail}

    def write_list(self, calls: Sequence[Written]) -> str:
        """Calls as one JSON list of call objects."""
        objs = [self._obj(c) for c in calls]
        return json.dumps(objs, ensure_ascii=False, indent=self.indent, separators=self.separators, sort_keys=self.sort_keys)

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        value = c.arguments if self.what == "args" else self._obj(c)
        return json.dumps(value, ensure_ascii=False, indent=self.indent, separators=self.separators, sort_keys=self.sort_keys)

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        params = schema or {"type": "object"}  # (json_rule closes it to the tool's parameters)
        if self.separators:
            style = {**style, "item_separator": self.separators[0], "key_separator": self.separators[1]}
        if self.layout:
            said = {"name": {"const": name}, "args": params, "id": _id_schema("{id}")}
            props = {k: said.get(role, {"const": value}) for k, role, value in self.layout}
            params = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        elif self.keyed:
            params = {"type": "object", "properties": {name: params}, "required": [name], "additionalProperties": False}
        elif self.what != "args":
            props = {k: _id_schema(v) for k, v in self.lead.items()}
            props |= {self.keys[0]: {"const": name}, self.keys[1]: params}
            props |= {k: _id_schema(v) for k, v in self.trail.items()}
            params = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        if self.sort_keys:
            params = sorted_schema(params)
        value = json_rule(params, style)
        return value if exact else f"{WS} {value}"  # a list of calls: the format's grammar says the list


def _value(raw: str, prop: Mapping[str, Any] | None, as_string: bool | None) -> Any:
    """A parameter's value as its schema wants it: text for a string, else JSON if it reads."""
    if as_string is None:
        kind = (prop or {}).get("type")
        as_string = kind == "string" or (isinstance(kind, list) and "string" in kind and len(kind) == 1)
    if as_string:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:  # a template that writes values with Python's str() (``{'unit': 'C'}``)
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw
    return value if isinstance(value, dict | list) else raw


#: A number of a type with no other constraint, as a grammar says it: at most 16 digits.
_NUMBERS = {"integer": "/-?(0|[1-9][0-9]{0,15})/", "number": "/-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,16})?/"}


@dataclass(frozen=True)
class Params:
    """XML-style parameters up to ``end`` (not consumed): each as ``fmt`` writes it
    (``{key}``, ``{value}``, ``{string}``: "true" for a string value), read by ``pattern``
    (groups ``key``, ``value``, optionally ``string``); ``trim``: the newline the family
    writes around a value is not part of it."""

    end: str
    fmt: str
    pattern: str
    trim: bool = False
    words: tuple[str, str] = ("true", "false")  # what {string} says of a string, of anything else

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        """The parameters up to ``end``. Short of it, those complete so far are kept in
        ``r.partial`` (the call streams them; tool_reader.py)."""
        hit = text.find(self.end, at)
        if r.name is None:
            return FAIL if hit >= 0 or final else PARTIAL
        args, upto = self._args(text, at, len(text) if hit < 0 else hit, r.props.get(r.name, {}))
        r.partial = (r.name, args) if args else None
        r.upto = upto
        if hit < 0:
            return FAIL if final else PARTIAL
        r.calls.append((r.name, args))
        return hit

    def _args(self, text: str, at: int, stop: int, props: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """The parameters complete in ``text[at:stop]`` and where the last one ended; a key
        written twice keeps its first value (so what streamed stands)."""
        args: dict[str, Any] = {}
        upto = at
        for m in re.finditer(self.pattern, text[at:stop], re.S):
            raw = m.group("value")
            if self.trim:
                raw = raw.removeprefix("\n").removesuffix("\n")
            flag = m.groupdict().get("string")
            key = m.group("key").strip()
            if key not in args:
                args[key] = _value(raw, props.get(key), None if flag is None else flag == self.words[0])
            upto = at + m.end()
        return args, upto

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        out = []
        for key, value in (c.arguments or {}).items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            string = self.words[0] if isinstance(value, str) else self.words[1]
            out.append(self.fmt.replace("{key}", key).replace("{string}", string).replace("{value}", text))
        return "".join(out)

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        props = (schema or {}).get("properties") or {}
        required = set((schema or {}).get("required") or ())
        head, _, tail = self.fmt.partition("{value}")
        items = []
        for key, prop in props.items():
            string = prop.get("type") == "string"
            h = head.replace("{key}", key).replace("{string}", self.words[0] if string else self.words[1])
            t = tail.replace("{key}", key)
            if string:
                stop = re.escape(t.strip()[:1] or "<").replace("/", "\\/")
                value = f"/[^{stop}\\n]{{1,200}}/"
            elif exact and set(prop) <= {"type", "description", "title"} and prop.get("type") in _NUMBERS:
                value = _NUMBERS[prop["type"]]  # a bare number, of bounded length (else digits run on)
            else:
                value = json_rule(prop, style)
            item = f"({lit_rule(h, exact)} {lark_str(chr(10)) + '? ' if self.trim else ''}{value} {lit_rule(t, exact)})"
            items.append(item if key in required else item + "?")
        return " ".join(items) or '""'


@dataclass(frozen=True)
class Raw:
    """A family's own notation of the arguments (or of several calls), up to ``end`` (not
    consumed): ``decode`` reads it into (name, arguments) pairs given the name read before
    it, ``encode`` writes one call, ``grammar`` says it for one tool (name, schema)."""

    end: str
    decode: Callable[[str, str | None], list[tuple[str, Any]] | None]
    encode: Callable[[Written], str]
    grammar: Callable[[str, Any], str]
    scan: Callable[[str, int], int | None] | None = None  # where it ends (None: not yet), else at ``end``
    #: the arguments complete so far of a call cut short, and where they end (they stream)
    partial: Callable[[str, str | None], tuple[list[tuple[str, Any]], int] | None] | None = None

    def read(self, text: str, at: int, r: Read, final: bool) -> int | str:
        at = _ws(text, at)
        if self.scan is not None:
            found = self.scan(text, at)
            hit = found if found is not None else -1
        else:
            hit = text.find(self.end, at)
        so_far = self.partial(text[at : len(text) if hit < 0 else hit], r.name) if self.partial else None
        if so_far is not None and so_far[0][0][1]:
            r.partial, r.upto = so_far[0][0], at + so_far[1]
        if hit < 0:
            if not final:
                return PARTIAL
            hit = len(text)
        calls = self.decode(text[at:hit].strip(), r.name)
        if not calls:
            return FAIL
        r.calls += calls
        return hit

    def write(self, c: Written, tools: Mapping[str, Any]) -> str:
        return self.encode(c)

    def rule(self, name: str, schema: Any, style: dict[str, Any], exact: bool = False) -> str:
        return self.grammar(name, schema)


Part = Lit | Name | Id | Skip | Opt | Json | Params | Raw


def read_parts(parts: Sequence[Part], text: str, at: int, r: Read, final: bool) -> int | str:
    for p in parts:
        got = p.read(text, at, r, final)
        if isinstance(got, str):
            return got
        at = r.upto = got
    return at


def write_parts(parts: Sequence[Part], c: Written, tools: Mapping[str, Any]) -> str:
    return "".join(p.write(c, tools) for p in parts)


def rule_of(parts: Sequence[Part], name: str, schema: Any, flexible: bool = False, exact: bool = False) -> str:
    style = {"whitespace_flexible": True} if flexible else JSON_STYLE
    return " ".join(r for r in (p.rule(name, schema, style, exact) for p in parts) if r != '""') or '""'
