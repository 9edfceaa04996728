"""structured_outputs and grammar into the engine's grammar value (text/constraints.py):
each kind compiled and checked in the server, an invalid one a 400 naming it."""

from __future__ import annotations

from typing import Any

import llguidance
import pytest

from strata_core.contract import protocol as proto
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import CompletionRequest, parse_request
from strata_core.text.constraints import choice_grammar, lark_source, request_constraint
from strata_core.text.grammars import _byte_tokenizer, llguidance_grammar


def req(**fields: Any) -> CompletionRequest:
    return parse_request(CompletionRequest, {"prompt": "x", **fields})


def accepts(gen_value: str, text: str) -> bool:
    """Whether the grammar of a GEN value takes ``text`` whole and may then end."""
    kind, source = proto.parse_grammar(gen_value)
    m = llguidance.LLMatcher(_byte_tokenizer(), llguidance_grammar(kind, source), log_level=0)
    return m.consume_tokens(list(text.encode())) and m.is_accepting()


def refusal(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        request_constraint(req(**fields))
    assert info.value.status == 400
    return info.value


def test_regex() -> None:
    c = request_constraint(req(structured_outputs={"regex": r"[0-9]{3}-[0-9]{4}"}))
    assert c is not None and c.param == "structured_outputs.regex" and c.json is None
    assert accepts(c.gen_value, "555-1234")
    assert not accepts(c.gen_value, "555-123")
    assert not accepts(c.gen_value, "x555-1234")


def test_choice_is_exactly_one_of_the_strings() -> None:
    choices = ["Paris", 'say "hi"\n', "a\\b", "été"]
    c = request_constraint(req(structured_outputs={"choice": choices}))
    assert c is not None and c.param == "structured_outputs.choice"
    for choice in choices:
        assert accepts(c.gen_value, choice), choice
    for other in ["Pari", "Paris ", "ab", "say hi"]:
        assert not accepts(c.gen_value, other), other
    assert choice_grammar(["a"]) == 'start: "a"\n'


@pytest.mark.parametrize("field", ["structured_outputs", "grammar"])
def test_gbnf_and_lark_grammars(field: str) -> None:
    gbnf = 'root ::= answer "."\nanswer ::= "yes" | "no"'
    lark = 'start: ANSWER "."\nANSWER: "yes" | "no"'
    for source in (gbnf, lark):
        body = {"structured_outputs": {"grammar": source}} if field == "structured_outputs" else {"grammar": source}
        c = request_constraint(req(**body))
        assert c is not None and c.param == ("structured_outputs.grammar" if field != "grammar" else "grammar")
        assert accepts(c.gen_value, "yes.") and accepts(c.gen_value, "no.")
        assert not accepts(c.gen_value, "maybe.") and not accepts(c.gen_value, "yes")
    assert lark_source(lark) == lark and "start" in lark_source(gbnf)


def test_json_and_json_object() -> None:
    c = request_constraint(req(structured_outputs={"json": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                            "required": ["a"]}}))  # fmt: skip
    assert c is not None and c.json is not None and c.param == "structured_outputs.json"
    assert accepts(c.gen_value, '{"a": 5}') and not accepts(c.gen_value, '{"a": "x"}')
    c = request_constraint(req(structured_outputs={"json": '{"type": "array"}'}))
    assert c is not None and accepts(c.gen_value, "[1, 2]")
    c = request_constraint(req(structured_outputs={"json_object": True}))
    assert c is not None and c.json is not None and accepts(c.gen_value, "{}") and not accepts(c.gen_value, "[]")


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"structured_outputs": {"regex": "(abc"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "start: foo("}}, "structured_outputs.grammar"),
        ({"grammar": 'root ::= "a" ('}, "grammar"),
        ({"grammar": "root ::= undefined_rule"}, "grammar"),
        ({"structured_outputs": {"json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}},
         "structured_outputs.json"),
        ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json"),
    ],
)  # fmt: skip
def test_invalid_constraints_are_a_400_naming_them(fields: dict[str, Any], param: str) -> None:
    e = refusal(**fields)
    assert e.param == param and e.code == "invalid_value", e
    assert "\n" not in e.message and "<state>" not in e.message


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"json_object": False}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"choice": ["a", ""]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json": "not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"structured_outputs": {"regex": "a"}, "grammar": "start: \"a\""}, "grammar"),
        ({"response_format": {"type": "json_object"}, "grammar": "start: \"a\""}, "grammar"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ],
)  # fmt: skip
def test_malformed_requests_are_refused_by_the_model(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        req(**fields)
    assert info.value.status == 400 and info.value.param == param, info.value


def test_text_response_format_with_a_grammar_is_fine() -> None:
    c = request_constraint(req(response_format={"type": "text"}, grammar='start: "a"'))
    assert c is not None and c.param == "grammar"
