"""api/limits.py's strict JSON, as pure functions: what it accepts is what json.loads reads,
and what it refuses is named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_core.api.limits import parse_json
from strata_core.schema.errors import ApiError

DEPTH = 64

# JSON values as a client sends them: finite numbers, text without lone surrogates
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


def refused(raw: bytes, depth: int = DEPTH) -> ApiError:
    with pytest.raises(ApiError) as exc:
        parse_json(raw, depth)
    assert exc.value.status == 400
    return exc.value


@given(values)
def test_strict_json_reads_what_json_reads(value: Any) -> None:
    raw = json.dumps(value).encode()
    assert parse_json(raw, DEPTH) == json.loads(raw)
    assert parse_json(json.dumps(value, ensure_ascii=False).encode(), DEPTH) == json.loads(raw)


@given(st.integers(1, 12), st.sampled_from(["NaN", "Infinity", "-Infinity"]))
def test_a_non_finite_number_is_named_where_it_is(depth: int, constant: str) -> None:
    raw = ('{"a": ' + "[" * depth + "1, " + constant + "]" * depth + "}").encode()
    e = refused(raw)
    assert (e.code, e.param) == ("invalid_value", "a" + ".0" * (depth - 1) + ".1")
    assert constant in e.message


def test_lone_surrogates_in_strings_and_keys() -> None:
    assert refused(b'{"s": ["ok", "x\\udfff"]}').param == "s.1"
    assert refused(b'{"k": {"\\ud800": 1}}').param == "k.\\ud800"
    assert parse_json(b'{"s": "\\ud83d\\ude00"}', DEPTH) == {"s": "\U0001f600"}  # a pair is text


@given(st.integers(2, 40))
def test_nesting_past_the_limit(limit: int) -> None:
    assert parse_json(b"[" * limit + b"]" * limit, limit) == json.loads(b"[" * limit + b"]" * limit)
    e = refused(b"[" * (limit + 1) + b"]" * (limit + 1), limit)
    assert (e.code, e.param) == ("too_deep", ".".join(["0"] * limit))


def test_what_is_not_json() -> None:
    assert refused(b"").code == "invalid_json"
    assert refused(b"\xef\xbb\xbf{}").code == "invalid_json"  # a UTF-8 byte-order mark
    assert "byte 2" in refused(b'["\xff"]').message
    assert refused(b"[" * 200_000).code == "too_deep"  # past the parser's own recursion
