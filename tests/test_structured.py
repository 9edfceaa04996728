"""structured.py: response_format -> grammar, schema errors, and reconciliation rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_core.contract import protocol as proto
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import ResponseFormat
from strata_core.text.logprobs import Aligner, Entry, slice_entries
from strata_core.text.structured import canonical_json, constraint_for, reconcile, reconcile_choice

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}


def fmt(kind: str, schema: Any = None, strict: bool | None = None) -> ResponseFormat:
    body: dict[str, Any] = {"type": kind}
    if kind == "json_schema":
        body["json_schema"] = {"name": "x", "schema": schema, "strict": strict}
    return ResponseFormat.model_validate(body)


# ---- response_format -> constraint --------------------------------------------------------


def test_text_needs_no_constraint() -> None:
    assert constraint_for(None) is None
    assert constraint_for(fmt("text")) is None


def test_json_object_and_json_schema_constraints() -> None:
    obj = constraint_for(fmt("json_object"))
    assert obj is not None and obj.schema == {"type": "object"}
    c = constraint_for(fmt("json_schema", PERSON, strict=True))
    assert c is not None and c.schema == PERSON
    kind, text = proto.parse_grammar(c.gen_value())
    assert kind == "llguidance" and json.loads(text)["grammars"][0]["json_schema"]["required"] == ["name", "age"]


@pytest.mark.parametrize(
    "schema, strict, words",
    [
        ({"type": "strin"}, None, "strin"),  # not a JSON schema
        ({"type": "object", "required": "name"}, None, "required"),
        ({"type": "string", "format": "no-such-format"}, True, "no-such-format"),  # llguidance refuses
    ],
)
def test_invalid_schemas_are_a_400_naming_response_format(schema: Any, strict: Any, words: str) -> None:
    with pytest.raises(ApiError) as exc:
        constraint_for(fmt("json_schema", schema, strict))
    assert exc.value.status == 400 and exc.value.param == "response_format"
    assert words in exc.value.message


def test_non_strict_ignores_what_llguidance_cannot_enforce() -> None:
    schema = {"type": "string", "format": "no-such-format"}
    assert constraint_for(fmt("json_schema", schema, strict=False)) is not None


# ---- reconciliation ------------------------------------------------------------------------


def test_a_valid_value_is_returned_as_written() -> None:
    written = '{"name":  "Ann",\n "age": 3}'
    r = reconcile(written, PERSON)
    assert (r.text, r.span, r.valid) == (written, (0, len(written)), True)
    r = reconcile('  {"name": "Ann", "age": 3}\n', PERSON)
    assert r.text == '{"name": "Ann", "age": 3}' and r.span == (2, 27)


def test_json_inside_a_fence_is_returned_as_written() -> None:
    written = 'Here:\n```json\n{"name": "Bo", "age": 7}\n```\nDone.'
    r = reconcile(written, PERSON)
    assert r.text == '{"name": "Bo", "age": 7}' and r.span is not None
    assert written[r.span[0] : r.span[1]] == r.text and r.valid


def test_a_value_in_prose_is_returned_canonical() -> None:
    written = 'Sure! The person is {"name":"Cy","age":40} as asked, or {"bad": 1}.'
    r = reconcile(written, PERSON)
    assert r == type(r)('{"name": "Cy", "age": 40}', None, True)
    assert r.text == canonical_json({"name": "Cy", "age": 40})


def test_nothing_valid_is_returned_as_written() -> None:
    cut = '{"name": "Dee", "ag'
    assert reconcile(cut, PERSON) == type(reconcile(cut, PERSON))(cut, (0, len(cut)), False)
    wrong = '{"name": "Dee", "age": -1}'  # parses, but the schema refuses it
    assert not reconcile(wrong, PERSON).valid and reconcile(wrong, PERSON).text == wrong
    assert not reconcile("[NaN]", {"type": "array"}).valid  # NaN is not JSON


def test_json_object_accepts_objects_only() -> None:
    assert reconcile('{"a": [1]}', {"type": "object"}).valid
    assert not reconcile("[1, 2]", {"type": "object"}).valid


def entries_of(pieces: list[bytes]) -> tuple[str, list[Entry]]:
    a = Aligner(pieces, 0)
    for i in range(len(pieces)):
        a.add(i, proto.Logprob("r", -0.5 - i, ()))
    a.flush()
    return a.text, a.entries()


def spell(entries: list[Entry]) -> tuple[str, bytes]:
    return "".join(e.token for e in entries), bytes(b for e in entries for b in e.bytes)


def test_reconciled_entries_spell_the_content() -> None:
    pieces = [b"```", b"json\n{", b'"name": "', b"\xc3", b"\xa9", b'", "age', b'": 1}\n`', b"``"]
    written, entries = entries_of(pieces)
    text, cut = reconcile_choice(written, entries, PERSON)
    assert text == '{"name": "é", "age": 1}'
    assert cut is not None and spell(cut) == (text, text.encode())
    assert cut[0].token == "{" and cut[0].logprob == -1.5  # the token cut by the fence keeps its part
    canonical, none = reconcile_choice('I say {"name":"x","age":1}', entries_of([b"I say ", b'{"name":"x","age":1}'])[1], PERSON)
    assert canonical == '{"name": "x", "age": 1}' and none is None


@given(st.lists(st.binary(max_size=4), min_size=1, max_size=8), st.data())
def test_sliced_entries_spell_the_slice(pieces: list[bytes], data: st.DataObject) -> None:
    text, entries = entries_of(pieces)
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    cut = slice_entries(entries, start, end)
    assert "".join(e.token for e in cut) == text[start:end]
    if "\ufffd" not in text:
        assert spell(cut)[1] == text[start:end].encode()
