"""The Anthropic Messages API end to end: the official ``anthropic`` client's
``messages.create``, ``messages.stream`` and ``messages.count_tokens`` against a real server
on the real engine (tools and thinking on the default model carrying test_tools_e2e's
template)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from test_tools_e2e import TIMEOUT

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def client_of(server: Server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base, api_key=key, max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def api(server: Server) -> anthropic.Anthropic:
    return client_of(server)


@pytest.fixture(scope="module")
def tools_api(tools_server: Server) -> anthropic.Anthropic:
    return client_of(tools_server)


def test_create_with_system_and_usage(api: anthropic.Anthropic, server: Server) -> None:
    # room to finish: the reply (a paragraph on 2+2, greedy unless the request samples) ends by itself
    kw: Any = {"model": "default", "max_tokens": 300, "messages": QUESTION, "system": "Be brief."}
    m = api.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "end_turn"
    (block,) = m.content
    assert block.type == "text" and block.text
    counted = api.messages.count_tokens(model="default", messages=QUESTION, system="Be brief.").input_tokens
    without_system = api.messages.count_tokens(model="default", messages=QUESTION).input_tokens
    assert counted != without_system  # the fixture: the system prompt is in the prompt
    chat = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert counted == len(httpx.post(f"{server.base}/tokenize", json={"messages": chat}).json()["tokens"])
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == counted
    assert 0 < m.usage.output_tokens < 300


def test_max_tokens_and_stop_sequences(api: anthropic.Anthropic) -> None:
    msgs: Any = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    m = api.messages.create(model="default", max_tokens=3, messages=msgs)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    free = api.messages.create(model="default", max_tokens=40, messages=msgs)
    assert ", 5" in free.content[0].text  # type: ignore[union-attr]
    m = api.messages.create(model="default", max_tokens=40, messages=msgs, stop_sequences=["X", ", 5"])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", ", 5")
    assert m.content[0].text == free.content[0].text.split(", 5")[0]  # type: ignore[union-attr]


def test_stream_events_and_helper(api: anthropic.Anthropic) -> None:
    whole = api.messages.create(model="default", max_tokens=40, messages=QUESTION)  # type: ignore[arg-type]
    events = list(api.messages.create(model="default", max_tokens=40, messages=QUESTION, stream=True))  # type: ignore[arg-type]
    kinds = [e.type for e in events]
    n = kinds.count("content_block_delta")
    assert n > 1 and kinds == ["message_start", "content_block_start", *["content_block_delta"] * n,
                               "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    with api.messages.stream(model="default", max_tokens=40, messages=QUESTION) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text  # type: ignore[union-attr]
    assert (final.stop_reason, final.usage.output_tokens) == ("end_turn", whole.usage.output_tokens)


def test_sampling_parameters_act(api: anthropic.Anthropic) -> None:
    kw: Any = {"model": "default", "max_tokens": 12, "messages": [{"role": "user", "content": "Tell me a story."}]}
    greedy = api.messages.create(**kw).content[0].text  # type: ignore[union-attr]
    one = api.messages.create(**kw, extra_body={"temperature": 1.0, "top_k": 1}).content[0].text  # type: ignore[union-attr]
    assert one == greedy  # top_k 1 is greedy whatever the temperature
    hot = {api.messages.create(**kw, extra_body={"temperature": 1.0, "top_p": 0.99}).content[0].text  # type: ignore[union-attr]
           for _ in range(3)}  # fmt: skip
    assert len(hot | {greedy}) > 1


def test_errors_are_anthropic_shaped(api: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        api.messages.create(model="default", max_tokens=5, messages=QUESTION, extra_body={"temperature": 3})  # type: ignore[arg-type]
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "temperature" in err.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        api.messages.create(model="claude-nope", max_tokens=5, messages=QUESTION)  # type: ignore[arg-type]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


# ---- tools and thinking (the tools template) ------------------------------------------------

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
AGAIN = [
    {"role": "user", "content": "Repeat exactly: " + CALL_TEXT},
    {"role": "assistant", "content": CALL_TEXT},
    {"role": "user", "content": "Again, exactly."},
]


def test_tool_use_streamed_and_not(tools_api: anthropic.Anthropic) -> None:
    kw: Any = {"model": "smollm2-tools", "max_tokens": 60, "messages": AGAIN, "tools": [WEATHER]}
    m = tools_api.messages.create(**kw)
    (use,) = m.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert m.stop_reason == "tool_use"
    events = list(tools_api.messages.create(**kw, stream=True))
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")  # type: ignore[union-attr]
    assert partial == '{"city": "Paris"}'
    with tools_api.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [("tool_use", {"city": "Paris"})]
    assert final.stop_reason == "tool_use"


def test_tool_result_round_trip_and_forced_tool(tools_api: anthropic.Anthropic) -> None:
    history: Any = [
        {"role": "user", "content": "What is the weather in London?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "London"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Cloudy, 14 C"}]},
        {"role": "assistant", "content": "The weather in London: Cloudy, 14 C."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "Sunny, 25 C"}]},
    ]  # fmt: skip
    m = tools_api.messages.create(model="smollm2-tools", max_tokens=60, messages=history, tools=[WEATHER])
    assert m.content[0].type == "text" and "Sunny, 25 C" in m.content[0].text
    kw: Any = {"model": "smollm2-tools", "max_tokens": 100, "messages": QUESTION, "tools": [WEATHER]}
    assert tools_api.messages.create(**kw).content[0].type == "text"  # the fixture: no call unless forced
    forced = tools_api.messages.create(**kw, tool_choice={"type": "any"})
    assert forced.content[0].type == "tool_use" and forced.stop_reason == "tool_use"


def test_tool_use_on_a_template_without_tools(api: anthropic.Anthropic) -> None:
    """The default model's template never reads tools: the generic format serves them."""
    kw: Any = {"model": "default", "max_tokens": 100, "tools": [WEATHER],
               "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}  # fmt: skip
    m = api.messages.create(**kw, tool_choice={"type": "any"})
    use = m.content[0]
    assert use.type == "tool_use" and use.name == "get_weather" and m.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER["input_schema"])


def test_thinking_blocks(tools_api: anthropic.Anthropic) -> None:
    thought: Any = [*QUESTION, {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\nThe answer is 4."},
                    *QUESTION]  # fmt: skip
    kw: Any = {"model": "smollm2-tools", "max_tokens": 1100, "messages": thought}
    assert [b.type for b in tools_api.messages.create(**kw).content] == ["text"]  # the fixture
    m = tools_api.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == [
        ("thinking", "Two plus two.\n"), ("text", "The answer is 4.")]
    with tools_api.messages.stream(**kw, thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds == sorted(kinds, key=lambda k: k != "thinking_delta") and "thinking_delta" in kinds
    assert final.content[0].type == "thinking" and final.content[0].thinking == "Two plus two.\n"


def test_api_key_as_x_api_key(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    with Server(["--backend", "cpu", "--parallel", "1", "--n-ctx", "512"], tmp_path / "server.log",
                env={"STRATA_SERVER_API_KEY": "sekret"}) as srv:  # fmt: skip
        assert client_of(srv, "sekret").messages.count_tokens(model="default", messages=QUESTION).input_tokens > 0  # type: ignore[arg-type]
        with pytest.raises(anthropic.AuthenticationError) as err:
            client_of(srv, "wrong").messages.count_tokens(model="default", messages=QUESTION)  # type: ignore[arg-type]
        assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        assert httpx.post(f"{srv.base}/tokenize", json={"content": "x"}).status_code == 401
        # every route takes the key either way (bearer or x-api-key), and refuses a wrong one
        one = {"model": "default", "input": "x", "max_output_tokens": 1}
        r = httpx.post(f"{srv.base}/v1/responses", json=one, headers={"x-api-key": "sekret"}, timeout=60)
        assert r.status_code == 200
        r = httpx.post(f"{srv.base}/v1/responses", json=one, headers={"x-api-key": "wrong"}, timeout=60)
        assert r.status_code == 401
        oa = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="sekret", max_retries=0, timeout=60)
        assert oa.responses.create(model="default", input="Hi", max_output_tokens=1).status == "incomplete"
