"""The Responses API end to end: the official client's ``responses.create``, ``.stream``
and ``.parse`` against a real server on the real engine (the default model; tools and
reasoning on the default model carrying test_tools_e2e's template)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel
from test_tools_e2e import AGAIN, EARLIER_ROUND, TIMEOUT

from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

QUESTION = "What is 2+2?"


@pytest.fixture(scope="module")
def api(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def tools_api(tools_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tools_server.base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def prompt_tokens(server: Server, messages: list[dict[str, Any]]) -> int:
    return len(httpx.post(f"{server.base}/tokenize", json={"messages": messages}).json()["tokens"])


def test_text_input_and_usage(api: openai.OpenAI, server: Server) -> None:
    r = api.responses.create(model="default", input=QUESTION, max_output_tokens=40)
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert r.output_text and msg.content[0].type == "output_text" and msg.content[0].text == r.output_text
    assert r.usage is not None and 0 < r.usage.output_tokens < 40
    assert r.usage.input_tokens == prompt_tokens(server, [{"role": "user", "content": QUESTION}])
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_and_message_input_reach_the_prompt(api: openai.OpenAI, server: Server) -> None:
    items: Any = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    r = api.responses.create(model="default", input=items, instructions="Answer in French.", max_output_tokens=1)
    expected = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": QUESTION}]
    # the fixture: the instructions change the prompt (they replace the template's default system)
    assert prompt_tokens(server, expected) != prompt_tokens(server, expected[1:])
    assert r.usage is not None and r.usage.input_tokens == prompt_tokens(server, expected)
    assert r.instructions == "Answer in French."


def test_max_output_tokens_makes_it_incomplete(api: openai.OpenAI) -> None:
    r = api.responses.create(model="default", input="Count from 1 to 50.", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 5 and r.output[-1].status == "incomplete"


def test_stream_events_in_the_documented_order(api: openai.OpenAI) -> None:
    whole = api.responses.create(model="default", input=QUESTION, max_output_tokens=40)
    events = list(api.responses.create(model="default", input=QUESTION, max_output_tokens=40, stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * deltas,
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    done = events[-1]
    assert done.type == "response.completed" and done.response.output_text == text
    assert done.response.usage is not None and done.response.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]
    # the SDK's stream helper assembles the same response
    with api.responses.stream(model="default", input=QUESTION, max_output_tokens=40) as stream:
        helped = [e.type for e in stream]
        final = stream.get_final_response()
    assert helped == kinds and final.output_text == whole.output_text


class Person(BaseModel):
    name: str
    age: int


def test_parse_with_a_strict_json_schema(api: openai.OpenAI) -> None:
    free = api.responses.create(model="default", input="Invent a person.", max_output_tokens=40)
    with pytest.raises(ValueError):  # the fixture: left alone it writes prose
        Person.model_validate_json(free.output_text)
    r = api.responses.parse(model="default", input="Invent a person.", text_format=Person, max_output_tokens=60)
    assert isinstance(r.output_parsed, Person)
    assert r.text is not None and r.text.format is not None and r.text.format.type == "json_schema"


def test_sampling_parameters_act(api: openai.OpenAI) -> None:
    greedy = {api.responses.create(model="default", input="Tell me a story.", max_output_tokens=12).output_text
              for _ in range(2)}  # fmt: skip
    assert len(greedy) == 1
    hot = {api.responses.create(model="default", input="Tell me a story.", max_output_tokens=12,
                                temperature=1.5, top_p=0.99).output_text for _ in range(3)}  # fmt: skip
    assert len(hot) > 1


@pytest.mark.parametrize(("kw", "param"), [({"include": ["reasoning.encrypted_content"]}, "include"),
                                          ({"extra_body": {"frequency_penalty": 1}}, "frequency_penalty"),
                                          ({"tools": [{"type": "web_search"}]}, "tools"),
                                          # not a list: once a TypeError and a 500 (found by the fuzzer)
                                          ({"extra_body": {"tools": 562}}, "tools")])  # fmt: skip
def test_unsupported_parameters_are_refused(api: openai.OpenAI, kw: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        api.responses.create(model="default", input=QUESTION, **kw)
    assert err.value.status_code == 400 and isinstance(err.value.body, dict) and err.value.body["param"] == param


def test_output_text_logprobs_when_included(api: openai.OpenAI) -> None:
    kw: Any = {"model": "default", "input": QUESTION, "max_output_tokens": 8}
    plain = api.responses.create(**kw, top_logprobs=2)
    assert plain.output[0].content[0].logprobs == []  # the fixture: none unless included
    include: Any = ["message.output_text.logprobs"]
    r = api.responses.create(**kw, include=include, top_logprobs=2)
    part = r.output[0].content[0]
    assert part.type == "output_text" and part.logprobs and "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)
    events = list(api.responses.create(**kw, include=include, top_logprobs=2, stream=True))
    streamed = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs or []]
    assert streamed == [lp.token for lp in part.logprobs]


def test_store_and_previous_response_id(api: openai.OpenAI, server: Server) -> None:
    first = api.responses.create(model="default", input="My name is Zorblax.", max_output_tokens=10, store=True)
    second = api.responses.create(model="default", input="What is my name?", previous_response_id=first.id,
                                  max_output_tokens=1)  # fmt: skip
    history = [{"role": "user", "content": "My name is Zorblax."},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "What is my name?"}]  # fmt: skip
    assert second.usage is not None and second.usage.input_tokens == prompt_tokens(server, history)
    assert second.previous_response_id == first.id
    assert api.responses.retrieve(first.id).output_text == first.output_text
    api.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:
        api.responses.create(model="default", input="x", previous_response_id=first.id)
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "previous_response_id"
    unstored = api.responses.create(model="default", input="x", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):  # stateless by default
        api.responses.retrieve(unstored.id)


# ---- tools and reasoning (the tools template) ----------------------------------------------

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


def test_function_call_streamed_and_not(tools_api: openai.OpenAI) -> None:
    kw: Any = {"model": "smollm2-tools", "input": AGAIN, "tools": [WEATHER], "max_output_tokens": 60}
    r = tools_api.responses.create(**kw)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"} and r.status == "completed"
    events = list(tools_api.responses.create(**kw, stream=True))
    kinds = [e.type for e in events if e.type != "response.function_call_arguments.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]  # fmt: skip
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == call.arguments
    with tools_api.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert [(o.type, getattr(o, "arguments", None)) for o in final.output] == [("function_call", call.arguments)]


def test_function_call_output_round_trip(tools_api: openai.OpenAI) -> None:
    earlier: list[Any] = [
        EARLIER_ROUND[0],
        {"type": "function_call", "call_id": "call_london", "name": "get_weather", "arguments": '{"city": "London"}'},
        {"type": "function_call_output", "call_id": "call_london", "output": "Cloudy, 14 C"},
        EARLIER_ROUND[3],
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": "call_paris", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_paris", "output": "Sunny, 25 C"},
    ]  # fmt: skip
    r = tools_api.responses.create(model="smollm2-tools", input=earlier, tools=[WEATHER], max_output_tokens=60)
    assert [o.type for o in r.output] == ["message"]
    assert "Sunny, 25 C" in r.output_text  # the output item reached the prompt


def test_tool_choice_required_forces_a_call(tools_api: openai.OpenAI) -> None:
    kw: Any = {"model": "smollm2-tools", "input": QUESTION, "tools": [WEATHER], "max_output_tokens": 100}
    assert [o.type for o in tools_api.responses.create(**kw).output] == ["message"]  # the fixture
    r = tools_api.responses.create(**kw, tool_choice="required")
    assert r.output[0].type == "function_call" and r.output[0].name == "get_weather"
    named = tools_api.responses.create(**kw, tool_choice={"type": "function", "name": "get_weather"})
    assert named.output[0].type == "function_call"


def test_function_call_on_a_template_without_tools(api: openai.OpenAI) -> None:
    """The default model's template never reads tools: the generic format serves them."""
    kw: Any = {"model": "default", "input": "What is the weather in Paris?", "tools": [WEATHER],
               "max_output_tokens": 100, "tool_choice": "required"}  # fmt: skip
    r = api.responses.create(**kw)
    call = r.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    events = list(api.responses.create(**kw, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == call.arguments
    # the generic format's grammar and a text format would both constrain the reply
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.create(**{**kw, "tool_choice": "auto"}, text={"format": {"type": "json_object"}})
    assert refused.value.param == "text.format"


THOUGHT = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\nThe answer is 4."},
    {"role": "user", "content": QUESTION},
]


def test_reasoning_item(tools_api: openai.OpenAI) -> None:
    kw: Any = {"model": "smollm2-tools", "input": THOUGHT, "max_output_tokens": 40}
    plain = tools_api.responses.create(**kw)
    assert [o.type for o in plain.output] == ["message"]  # the fixture: no thinking unless asked
    r = tools_api.responses.create(**kw, reasoning={"effort": "medium"})
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content is not None and r.output[0].content[0].text == "Two plus two.\n"  # type: ignore[union-attr]
    assert r.output_text == "The answer is 4."
    assert r.usage is not None and 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(tools_api.responses.create(**kw, reasoning={"effort": "medium"}, stream=True))
    kinds = [e.type for e in events if not e.type.endswith(".delta")]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Two plus two.\n"
