"""structured_outputs (vLLM) and grammar (llama-server) end to end: the official client,
the HTTP server and the real engine, on chat and completions, streamed and not."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "default"
PHONE = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"
CHOICES = ["Paris", "London", "Rome"]
# GBNF (llama.cpp's notation) and the Lark dialect llguidance reads: a sum of small numbers.
GBNF = 'root ::= num " + " num " = " num\nnum ::= [1-9] [0-9]?'
LARK = 'start: NUM " + " NUM " = " NUM\nNUM: /[1-9][0-9]?/'
SUM = re.compile(r"[1-9][0-9]? \+ [1-9][0-9]? = [1-9][0-9]?")
ASK = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"


def text(server: Any, path: str, body: dict[str, Any], stream: bool) -> str:
    """The reply's text, read from SSE chunks when ``stream``."""
    r = httpx.post(f"{server.base}{path}", json={**body, "stream": stream}, timeout=120)
    assert r.status_code == 200, r.text
    chat = path.endswith("chat/completions")
    if not stream:
        c = r.json()["choices"][0]
        return str(c["message"]["content"] if chat else c["text"])
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            assert "error" not in event, event
            for c in event["choices"]:
                out.append((c["delta"].get("content") if chat else c["text"]) or "")
    return "".join(out)


def both(server: Any, fields: dict[str, Any], stream: bool) -> list[str]:
    chat = text(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 40, **fields}, stream)
    compl = text(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 40, **fields}, stream)
    return [chat, compl]


def test_the_fixture_unconstrained_replies_match_none_of_the_constraints(server: Any) -> None:
    for reply in both(server, {}, False):
        assert not re.fullmatch(PHONE, reply) and reply not in CHOICES and not SUM.fullmatch(reply), reply


@pytest.mark.parametrize("stream", [False, True])
def test_regex(server: Any, stream: bool) -> None:
    for reply in both(server, {"structured_outputs": {"regex": PHONE}}, stream):
        assert re.fullmatch(PHONE, reply), reply


@pytest.mark.parametrize("stream", [False, True])
def test_choice(server: Any, stream: bool) -> None:
    for reply in both(server, {"structured_outputs": {"choice": CHOICES}}, stream):
        assert reply in CHOICES, reply


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fields", [{"structured_outputs": {"grammar": LARK}}, {"structured_outputs": {"grammar": GBNF}},
                                    {"grammar": GBNF}, {"grammar": LARK}], ids=["so-lark", "so-gbnf", "gbnf", "lark"])  # fmt: skip
def test_grammar(server: Any, fields: dict[str, Any], stream: bool) -> None:
    for reply in both(server, fields, stream):
        assert SUM.fullmatch(reply), reply


def test_json_through_the_official_client(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60,  # type: ignore[arg-type]
                                       extra_body={"structured_outputs": {"json": schema}})  # fmt: skip
    value = json.loads(r.choices[0].message.content or "")
    assert isinstance(value, dict) and isinstance(value["city"], str)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=60,
                                  extra_body={"structured_outputs": {"choice": CHOICES}})  # fmt: skip
    assert r.choices[0].text in CHOICES


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"structured_outputs": {"regex": "(abc"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "start: foo("}}, "structured_outputs.grammar"),
        ({"grammar": "root ::= missing"}, "grammar"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ],
)  # fmt: skip
def test_an_invalid_constraint_is_a_400_naming_it(client: openai.OpenAI, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, extra_body=fields)  # type: ignore[arg-type]
    assert info.value.body["param"] == param, info.value.body  # type: ignore[index]
