"""Two families write arguments in a notation of their own rather than JSON: LFM2 as Python
calls (``[get_weather(city='Paris', days=2)]``) and Gemma 4 as bare-keyed objects with
``<|"|>`` quoting strings (``{city:<|"|>Paris<|"|>,days:2}``). Each is read into JSON
values, written back, and said as a grammar for one tool."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from strata_core.text.grammars import JSON_STYLE
from strata_core.text.tool_syntax import (
    Written,
    bracket_end,
    first_wins,
    item_ends,
    json_rule,
    lark_str,
)

_JSON_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _literal(node: ast.expr) -> Any:
    """A Python literal, where JSON's true / false / null also read (a grammar writes JSON)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    return ast.literal_eval(node)


def python_decode(body: str, name: str | None) -> list[tuple[str, Any]] | None:
    """``[f(a=1), g(b='x')]`` (or one call without the brackets) as (name, arguments)."""
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except SyntaxError:
        return None
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    out = []
    for call in items:
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
            return None
        args: dict[str, Any] = {}
        try:
            for k in call.keywords:
                if k.arg and k.arg not in args:  # a keyword written twice keeps its first value
                    args[k.arg] = _literal(k.value)
        except (ValueError, TypeError, SyntaxError):
            return None
        out.append((call.func.id, args))
    return out or None


def python_partial(body: str, name: str | None) -> tuple[list[tuple[str, Any]], int] | None:
    """The keyword arguments complete so far of a call cut short (``f(a=1, b=``: a), and
    where they end."""
    paren = body.find("(")
    ends = item_ends(body[paren:], ("'", '"')) if paren > 0 else []
    if not ends:
        return None
    end = paren + ends[-1]
    calls = python_decode(body[:end] + ")", name)
    return (calls, end) if calls else None


@dataclass(frozen=True)
class PythonStyle:
    """How a family writes a Python call's keyword arguments: strings in ``quote``,
    ``sep`` between arguments, other values as JSON (a template's ``tojson``) or as
    Python writes them."""

    quote: str = "'"
    sep: str = ", "
    json_values: bool = False

    def value(self, v: Any) -> str:
        if isinstance(v, str):
            return json.dumps(v, ensure_ascii=False) if self.quote == '"' else repr(v)
        return json.dumps(v, ensure_ascii=False) if self.json_values else repr(v)

    def encode(self, c: Written) -> str:
        args = self.sep.join(f"{k}={self.value(v)}" for k, v in (c.arguments or {}).items())
        return f"{c.name}({args})"

    def grammar(self, name: str, schema: Any) -> str:
        args = _items(schema, lambda k, p: f"{lark_str(k + '=')} {self._value_rule(p)}", self.sep)
        return f'{lark_str(name)} "(" {args} ")"'

    def _value_rule(self, prop: Any) -> str:
        if prop.get("type") == "string":  # as the template writes it
            q = lark_str(self.quote)
            return f"{q} /[^{re.escape(self.quote)}\\\\\\n]{{1,200}}/ {q}"
        return _json_value(prop)


LFM2_PYTHON = PythonStyle()


def python_encode(c: Written) -> str:
    return LFM2_PYTHON.encode(c)


def python_call_end(text: str, at: int) -> int | None:
    """Where the call ``name(...)`` at ``text[at]`` ends (after its ``)``); None if not yet.
    Brackets inside quoted strings do not count."""
    return bracket_end(text, at, ("'", '"'))


def _items(schema: Any, item: Any, sep: str) -> str:
    """The arguments of one tool as a grammar says them, in the schema's order, each
    ``item(key, prop)``, joined by ``sep``: the required ones always, the others optional."""
    props = (schema or {}).get("properties") or {}
    required = set((schema or {}).get("required") or ())
    out = ""
    for key, prop in props.items():
        one = item(key, prop)
        if not out:
            out = one if key in required else f"({one})?"
        elif key in required:
            out += f" {lark_str(sep)} {one}"
        else:
            out += f" ({lark_str(sep)} {one})?"
    return out or '""'


def _json_value(prop: Any) -> str:
    return json_rule(prop, JSON_STYLE)


def python_grammar(name: str, schema: Any) -> str:
    return LFM2_PYTHON.grammar(name, schema)


# ---- Gemma 4 ---------------------------------------------------------------------------------

QUOTE = '<|"|>'
_STRING = re.compile(re.escape(QUOTE) + "(.*?)" + re.escape(QUOTE), re.S)
_KEY = re.compile(r'([{,]\s*)([A-Za-z_][\w.-]*)\s*:')


def gemma_decode(body: str, name: str | None) -> list[tuple[str, Any]] | None:
    if name is None:
        return None
    text = _KEY.sub(r'\1"\2":', _STRING.sub(lambda m: json.dumps(m.group(1)), body))
    try:
        args = json.loads(text, object_pairs_hook=first_wins)  # a key written twice keeps its first value
    except ValueError:
        return None
    return [(name, args)] if isinstance(args, dict) else None


def gemma_value(value: Any) -> str:
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_value(v) for v in value) + "]"
    return json.dumps(value)


def gemma_partial(body: str, name: str | None) -> tuple[list[tuple[str, Any]], int] | None:
    """The keys complete so far of arguments cut short (``{a:1,b:``: a), and where they end."""
    ends = item_ends(body, (QUOTE,)) if body.startswith("{") else []
    if not ends:
        return None
    calls = gemma_decode(body[: ends[-1]] + "}", name)
    return (calls, ends[-1]) if calls else None


def gemma_encode(c: Written) -> str:
    return gemma_value(c.arguments or {})


def gemma_grammar(name: str, schema: Any) -> str:
    def item(key: str, prop: Any) -> str:
        if prop.get("type") == "string":
            return f"{lark_str(key + ':')} {lark_str(QUOTE)} /[^<\\n]{{1,200}}/ {lark_str(QUOTE)}"
        return f"{lark_str(key + ':')} {_json_value(prop)}"

    return '"{" ' + _items(schema, item, ",") + ' "}"'
