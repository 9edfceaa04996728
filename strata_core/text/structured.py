"""Structured outputs: ``response_format`` -> an engine grammar, and the answer reconciled.

Enforcement is the engine's (constrained decoding with llguidance, engine/grammar.py; the grammar sources in grammars.py);
this module turns a request's ``response_format`` into the grammar it sends and checks
what came back against the schema (jsonschema).

``json_object`` constrains to any JSON object. ``json_schema`` constrains to its schema;
``strict: true`` refuses a schema that uses a keyword llguidance cannot enforce, while
non-strict ignores such keywords (the answer is still validated afterwards). A schema that
is not a valid JSON schema, that llguidance refuses, or that admits no value at all (its
grammar compiled and its first mask computed here: grammars.grammar_error), is a 400
naming ``response_format``, decided before anything reaches the engine.

Reconciliation (``reconcile``), after generation, with the answer as the model wrote it:

1. the text, less surrounding whitespace, is a valid value: returned as written;
2. else the inside of a ```json (or bare ```) fence is a valid value: that inside is
   returned, as written;
3. else a valid value sits elsewhere in the text (after some prose): it is returned as
   canonical JSON (``canonical_json``), which the tokens do not spell, so without logprobs;
4. else nothing valid (typically cut off by max_tokens, finish_reason "length"): the text
   as written, as OpenAI does, with its logprobs.

In 1, 2 and 4 the logprob entries are cut to the returned span (logprobs.slice_entries),
so they spell the content exactly; a case where they would not is answered without
logprobs (``logprobs: null``). No logprobs ever fail to spell the content.

Streaming sends the text as it is generated, so there is nothing to reconcile: under the
grammar the streamed text is the value as written (case 1), complete unless cut off.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from strata_core.contract import protocol as proto
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import ResponseFormat
from strata_core.text.grammars import grammar_error, json_schema_grammar
from strata_core.text.logprobs import Entry, slice_entries

_FENCE = re.compile(r"```(?:json)?[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
#: Most places an embedded value is looked for (each a JSON parse from there).
_MAX_SCAN = 64
_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """What a response_format asks for: the schema answers are checked against, and the
    llguidance grammar the engine enforces."""

    schema: dict[str, Any]
    grammar: str

    def gen_value(self) -> str:
        """The ``grammar`` GEN value."""
        return proto.encode_grammar("llguidance", self.grammar)


def _bad_schema(message: str) -> ApiError:
    return ApiError(400, f"invalid JSON schema in 'response_format': {message}",
                    param="response_format", code="invalid_value")  # fmt: skip


def constraint_for(fmt: ResponseFormat | None) -> Constraint | None:
    """The constraint for a request's response_format (None for text); ApiError (400) when
    the schema is not valid or cannot be enforced."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint(_OBJECT, json_schema_grammar(_OBJECT))
    assert fmt.json_schema is not None
    schema = fmt.json_schema.schema_ or {}
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path)
        raise _bad_schema(f"{exc.message}" + (f" (at {path})" if path else "")) from None
    try:
        grammar = json_schema_grammar(schema, lenient=not fmt.json_schema.strict)
    except ValueError as exc:
        raise _bad_schema(str(exc)) from None
    error = grammar_error(grammar)
    if error:
        hint = " (with strict false, unsupported keywords are ignored)" if fmt.json_schema.strict else ""
        raise _bad_schema(" ".join(error.split()) + hint)
    return Constraint(schema, grammar)


# ---- reconciliation ----------------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


def _parse(text: str) -> tuple[bool, Any]:
    try:
        value, end = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return False, None
    return end == len(text), value


def _stripped(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def canonical_json(value: Any) -> str:
    """The form a recovered value is returned in: json.dumps' separators (the style the
    grammar makes the model write, grammars.JSON_STYLE), characters unescaped."""
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Reconciled:
    text: str
    span: tuple[int, int] | None  # where ``text`` lies in what was written; None: canonical
    valid: bool  # the text is a value the schema accepts


def reconcile(written: str, schema: dict[str, Any]) -> Reconciled:
    """The answer to return for ``written`` under ``schema`` (rules in the module doc)."""
    candidates = [_stripped(written, 0, len(written))]
    candidates += [_stripped(written, *m.span(1)) for m in _FENCE.finditer(written)]
    for start, end in candidates:
        whole, value = _parse(written[start:end])
        if whole and _valid(value, schema):
            return Reconciled(written[start:end], (start, end), True)
    for m in list(re.finditer(r"[\[{]", written))[:_MAX_SCAN]:
        try:
            value, _ = _DECODER.raw_decode(written, m.start())
        except (ValueError, RecursionError):
            continue
        if _valid(value, schema):
            return Reconciled(canonical_json(value), None, True)
    return Reconciled(written, (0, len(written)), False)


def reconcile_choice(
    written: str, entries: Sequence[Entry] | None, schema: dict[str, Any]
) -> tuple[str, list[Entry] | None]:
    """(content, logprob entries) for one finished choice; entries None when there are
    none to give, or when they could not spell the content."""
    r = reconcile(written, schema)
    if entries is None or r.span is None:
        return r.text, None
    cut = slice_entries(entries, *r.span)
    spelled = "".join(e.token for e in cut) == r.text and bytes(b for e in cut for b in e.bytes) == r.text.encode()
    return r.text, cut if spelled else None
