"""Structured outputs end to end: the official client, the HTTP server, the real engine."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "default"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


class Capital(BaseModel):
    # Bounded: the 135M test model, greedy, can repeat a digit or letter until max_tokens.
    country: str = Field(max_length=30)
    capital: str = Field(max_length=30)
    population_millions: int = Field(ge=0, le=10_000)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def schema_format(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def test_json_object_gives_an_object(client: openai.OpenAI) -> None:
    msgs = ask("Describe your favourite city.")
    free = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30)
    with pytest.raises(ValueError):  # the fixture: unconstrained, the model writes prose
        json.loads(free.choices[0].message.content or "")
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200,
                                       response_format={"type": "json_object"})  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("strict", [True, False])
def test_json_schema_validates(client: openai.OpenAI, strict: bool) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("Name a city and its country."), max_tokens=80,
                                       response_format=schema_format(CITY, strict))  # type: ignore[arg-type]
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), CITY)


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model=MODEL, messages=ask("What is the capital of France?"),
                                      response_format=Capital, max_tokens=120)  # fmt: skip
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Capital), r
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), Capital.model_json_schema())


@pytest.mark.parametrize("top", [0, 3])
def test_json_schema_logprobs_spell_the_content_or_are_absent(client: openai.OpenAI, top: int) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask("Name a city and its country."), max_tokens=80,
                                       response_format=schema_format(CITY), logprobs=True,  # type: ignore[arg-type]
                                       top_logprobs=top)  # fmt: skip
    c = r.choices[0]
    content = c.message.content or ""
    jsonschema.validate(json.loads(content), CITY)
    if c.logprobs is not None:
        entries = c.logprobs.content or []
        assert b"".join(bytes(e.bytes or []) for e in entries).decode() == content
        assert "".join(e.token for e in entries) == content
        assert all(len(e.top_logprobs) == top for e in entries)
    # Under the grammar the answer is the value as written, so the logprobs are kept.
    assert c.logprobs is not None


def test_streamed_json_schema_parses(client: openai.OpenAI) -> None:
    text = ""
    for ch in client.chat.completions.create(model=MODEL, messages=ask("Name a city and its country."),
                                             max_tokens=80, stream=True,
                                             response_format=schema_format(CITY)):  # type: ignore[arg-type]
        if ch.choices:
            text += ch.choices[0].delta.content or ""
    jsonschema.validate(json.loads(text), CITY)


def test_completions_take_response_format(client: openai.OpenAI) -> None:
    numbers = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "maxItems": 3}
    r = client.completions.create(model=MODEL, prompt="A JSON list of three small numbers:", max_tokens=40,
                                  extra_body={"response_format": schema_format(numbers)})  # fmt: skip
    jsonschema.validate(json.loads(r.choices[0].text), numbers)


@pytest.mark.parametrize(
    "fmt",
    [schema_format({"type": "strin"}), schema_format({"type": "string", "format": "no-such-format"}, strict=True)],
    ids=["not-a-schema", "unenforceable"],
)
def test_invalid_schema_is_a_400(client: openai.OpenAI, fmt: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=ask("hi"), max_tokens=4,
                                       response_format=fmt)  # type: ignore[arg-type]
    err = exc.value.body
    assert isinstance(err, dict) and err["param"] == "response_format", err
    assert exc.value.status_code == 400
