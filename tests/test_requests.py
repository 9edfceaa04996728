"""Request validation: every bad input is a 400 naming the offending field."""

from __future__ import annotations

from typing import Any

import pytest

from strata_core.schema.errors import ApiError
from strata_core.schema.requests import (
    MAX_N,
    PENALTY_LAST_N_ALL,
    ChatRequest,
    CompletionRequest,
    parse_request,
)

USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, **fields}


def refused(model_cls: type[Any], body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_request(model_cls, body)
    err = info.value
    assert err.status == 400
    return err


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(foo=1), "foo"),
        (chat(temperature="0.5"), "temperature"),
        (chat(max_tokens=1.5), "max_tokens"),
        (chat(stream=1), "stream"),
        ({"messages": []}, "messages"),
        ({}, "messages"),
        (chat(stop=list("abcdefghijklmnopq")), "stop"),
        (chat(stop=""), "stop"),
        (chat(stop=["a", ""]), "stop"),
        (chat(stop=5), "stop"),
        (chat(n=0), "n"),
        (chat(n=17), "n"),
        (chat(temperature=3), "temperature"),
        (chat(temperature=-0.1), "temperature"),
        (chat(temperature=float("nan")), "temperature"),
        (chat(top_p=0), "top_p"),
        (chat(top_p=1.01), "top_p"),
        (chat(top_k=-2), "top_k"),
        (chat(min_p=1.5), "min_p"),
        (chat(presence_penalty=2.5), "presence_penalty"),
        (chat(frequency_penalty=float("inf")), "frequency_penalty"),
        (chat(repetition_penalty=0), "repetition_penalty"),
        (chat(repetition_penalty=10.5), "repetition_penalty"),
        (chat(penalty_last_n=-2), "penalty_last_n"),
        (chat(seed=2**64), "seed"),
        (chat(seed=-(2**63) - 1), "seed"),
        (chat(logit_bias={"abc": 1}), "logit_bias"),
        (chat(logit_bias={"-3": 1}), "logit_bias"),
        (chat(logit_bias={"5": 101}), "logit_bias"),
        (chat(logit_bias={"5": "1"}), "logit_bias"),
        (chat(logit_bias=[1]), "logit_bias"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_completion_tokens=0), "max_completion_tokens"),
        (chat(max_tokens=5, max_completion_tokens=6), "max_completion_tokens"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        (chat(stream=True, stream_options={"include_usage": True, "x": 1}), "stream_options.x"),
        ({"messages": ["hi"]}, "messages.0"),
        ({"messages": [{"role": "critic", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),  # no tool_call_id
        ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages.0"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
        ({"messages": [*USER, {"role": "user", "content": 7}]}, "messages.1.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages.0.content",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "a"}]}]},
            "messages.0.tool_calls.0.function",
        ),
        (chat(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools.0.function.name"),
        (chat(tools=[{"type": "retrieval"}]), "tools.0.type"),
        (chat(tools=[]), "tools"),
        (chat(tools=[WEATHER, WEATHER]), "tools"),
        (chat(tools=[WEATHER], tool_choice="maybe"), "tool_choice"),
        (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice"),
        (chat(tools=[WEATHER], tool_choice={"type": "function"}), "tool_choice"),
        (chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
        (chat(chat_template_kwargs={"add_generation_prompt": False}), "chat_template_kwargs"),
        (chat(chat_template_kwargs=[1]), "chat_template_kwargs"),
        (chat(response_format={"type": "xml"}), "response_format.type"),
        (chat(response_format={"type": "json_schema"}), "response_format"),
        (chat(response_format={"type": "text", "json_schema": {"name": "a"}}), "response_format"),
        (chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
         "response_format.json_schema.name"),
        (chat(response_format={"type": "json_schema", "json_schema": {"name": "a b"}}),
         "response_format.json_schema.name"),
        (chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": []}}),
         "response_format.json_schema.schema"),
        (chat(top_logprobs=2), "top_logprobs"),
        (chat(logprobs=False, top_logprobs=2), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=2.0), "top_logprobs"),
        (chat(logprobs=2, top_logprobs=3), "top_logprobs"),
        (chat(logprobs=21), "logprobs"),
        (chat(logprobs=-1), "logprobs"),
        (chat(logprobs="yes"), "logprobs"),
        (chat(allowed_token_ids=[]), "allowed_token_ids"),
        (chat(allowed_token_ids=[-1]), "allowed_token_ids"),
        (chat(allowed_token_ids=["5"]), "allowed_token_ids"),
        (chat(allowed_token_ids=[True]), "allowed_token_ids"),
        (chat(allowed_token_ids=5), "allowed_token_ids"),
        (chat(logprobs_mode="sampled"), "logprobs_mode"),
        (chat(tool_choice="auto"), "tool_choice"),
        (chat(tool_choice="none"), "tool_choice"),
        (chat(tools=[WEATHER], parallel_tool_calls="yes"), "parallel_tool_calls"),
    ],
)
def test_chat_refused(body: dict[str, Any], param: str) -> None:
    err = refused(ChatRequest, body)
    assert err.param == param, err.message
    assert param.split(".")[-1] in err.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", ""]}, "prompt"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": [True]}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "x", "echo": True, "logprobs": 0}, "echo"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "suffix": 3}, "suffix"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "logprobs": True}, "logprobs"),
        ({"prompt": "x", "logprobs": 1.0}, "logprobs"),
        ({"prompt": "x", "allowed_token_ids": []}, "allowed_token_ids"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
    ],
)
def test_completion_refused(body: dict[str, Any], param: str) -> None:
    assert refused(CompletionRequest, body).param == param


def test_unknown_field_message_and_body() -> None:
    err = refused(ChatRequest, chat(foo=1))
    assert err.body() == {
        "error": {
            "message": "unsupported parameter: 'foo' (Strata does not implement it)",
            "type": "invalid_request_error",
            "param": "foo",
            "code": "unsupported_parameter",
        }
    }


def test_range_error_names_field_value_and_bound() -> None:
    err = refused(ChatRequest, chat(temperature=3))
    assert err.code == "invalid_value"
    assert "'temperature'" in err.message and "3" in err.message and "2" in err.message
    assert refused(ChatRequest, chat(temperature="hot")).code == "invalid_type"


def test_nan_and_inf_are_refused_as_not_finite() -> None:
    assert "finite" in refused(ChatRequest, chat(temperature=float("nan"))).message
    assert "finite" in refused(ChatRequest, chat(top_p=float("inf"))).message


def test_long_values_are_truncated_in_messages() -> None:
    err = refused(ChatRequest, chat(stop=["x" * 500] * 17))
    assert len(err.message) < 200


def test_unsupported_content_part() -> None:
    video = {"type": "video_url", "video_url": {"url": "http://x/y.mp4"}}
    err = refused(ChatRequest, {"messages": [*USER, {"role": "user", "content": [video]}]})
    assert err.param == "messages.1.content"
    assert "video_url" in err.message and err.code == "unsupported_content"
    assert "image_url" in err.message and "input_audio" in err.message  # what is taken instead


def test_media_parts_of_the_wrong_form() -> None:
    for part in ({"type": "image_url", "image_url": "http://x/y.png"},
                 {"type": "input_audio", "input_audio": {"data": "", "format": "ogg"}}):  # fmt: skip
        err = refused(ChatRequest, {"messages": [{"role": "user", "content": [part]}]})
        assert err.param == "messages.0.content" and part["type"] in err.message


def test_echo_with_logprobs_message() -> None:
    err = refused(CompletionRequest, {"prompt": "x", "echo": True, "logprobs": 2})
    assert "echo" in err.message and "not supported yet" in err.message
    assert "prompt" in err.message


def test_top_logprobs_without_logprobs_message() -> None:
    err = refused(ChatRequest, chat(top_logprobs=5))
    assert "logprobs: true" in err.message


@pytest.mark.parametrize(
    ("fields", "k"),
    [
        ({}, None),
        ({"logprobs": None}, None),
        ({"logprobs": False}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": None}, 0),
        ({"logprobs": True, "top_logprobs": 0}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
        ({"logprobs": 5}, 5),
        ({"logprobs": 0}, 0),
        ({"logprobs": 3, "top_logprobs": 3}, 3),
    ],
)
def test_chat_logprobs_forms(fields: dict[str, Any], k: int | None) -> None:
    assert parse_request(ChatRequest, chat(**fields)).logprob_alternatives() == k


@pytest.mark.parametrize(
    ("fields", "k"),
    [({}, None), ({"logprobs": None}, None), ({"logprobs": False}, None),
     ({"logprobs": 0}, 0), ({"logprobs": 5}, 5), ({"logprobs": 20}, 20)],
)  # fmt: skip
def test_completion_logprobs_forms(fields: dict[str, Any], k: int | None) -> None:
    req = parse_request(CompletionRequest, {"prompt": "x", **fields})
    assert req.logprob_alternatives() == k


def test_echo_and_extensions_are_accepted() -> None:
    req = parse_request(CompletionRequest, {"prompt": "x", "echo": True, "logprobs": None})
    assert req.echo is True
    assert parse_request(CompletionRequest, {"prompt": "x", "echo": None}).echo is None
    req2 = parse_request(
        ChatRequest, chat(allowed_token_ids=[7, 3, 7], logprobs_mode="processed", logprobs=True)
    )
    assert req2.allowed_token_ids == [7, 3] and req2.logprobs_mode == "processed"
    for name in ("logprobs", "top_logprobs", "echo"):
        assert name not in ChatRequest.unimplemented + CompletionRequest.unimplemented


@pytest.mark.parametrize("body", [None, [1], "text", 3, True])
def test_body_must_be_an_object(body: Any) -> None:
    assert refused(ChatRequest, body).param is None


def test_limits() -> None:
    assert parse_request(ChatRequest, chat(n=MAX_N)).n == MAX_N
    assert refused(ChatRequest, chat(n=MAX_N + 1)).param == "n"
    assert parse_request(ChatRequest, chat(stop=list("abcdefghijklmnop"))).stop_list() == list("abcdefghijklmnop")
    assert refused(ChatRequest, chat(stop=list("abcdefghijklmnopq"))).param == "stop"


@pytest.mark.parametrize("name", ["functions", "function_call"])
def test_later_work_is_refused_as_not_yet(name: str) -> None:
    assert name in ChatRequest.unimplemented
    err = refused(ChatRequest, chat(**{name: {"type": "json_object"}}))
    assert err.param == name and "not supported yet" in err.message


@pytest.mark.parametrize("name", ChatRequest.unimplemented)
def test_later_work_accepts_null_and_false(name: str) -> None:
    parse_request(ChatRequest, chat(**{name: None}))
    parse_request(ChatRequest, chat(**{name: False}))
    assert refused(ChatRequest, chat(**{name: "x"})).param == name


def test_response_format_is_accepted_on_both_endpoints() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}
    req = parse_request(ChatRequest, chat(response_format=fmt))
    assert req.response_format is not None and req.response_format.json_schema is not None
    assert req.response_format.json_schema.schema_ == schema and req.response_format.json_schema.strict
    assert parse_request(CompletionRequest, {"prompt": "x", "response_format": {"type": "json_object"}})
    assert parse_request(ChatRequest, chat(response_format={"type": "text"})).response_format is not None
    assert "response_format" not in ChatRequest.unimplemented


def test_chat_accepts_and_normalises() -> None:
    req = parse_request(
        ChatRequest,
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "a"}]},
                {"role": "user", "content": "hi", "name": "ann"},
                {"role": "assistant", "content": None, "tool_calls": None, "refusal": None},
            ],
            "model": "m",
            "temperature": 1,
            "top_k": -1,
            "penalty_last_n": -1,
            "seed": -1,
            "logit_bias": {"50256": -100, "7": 2.5},
            "logprobs": False,
            "tools": None,
            "n": None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 7,
            "max_tokens": 7,
            "stop": "END",
            "user": "u1",
        },
    )
    assert req.temperature == 1.0 and isinstance(req.temperature, float)
    assert req.top_k == 0
    assert req.penalty_last_n == PENALTY_LAST_N_ALL
    assert req.seed == 2**64 - 1
    assert req.logit_bias == {50256: -100.0, 7: 2.5}
    assert req.n == 1
    assert req.max_new_tokens() == 7
    assert req.stop_list() == ["END"]
    part = req.messages[1].content
    assert isinstance(part, list) and part[0].text == "a"
    assert req.messages[3].content is None


def test_max_tokens_helpers() -> None:
    assert parse_request(ChatRequest, chat()).max_new_tokens() is None
    assert parse_request(ChatRequest, chat(max_tokens=9)).max_new_tokens() == 9
    assert parse_request(ChatRequest, chat(max_completion_tokens=4)).max_new_tokens() == 4
    assert parse_request(ChatRequest, chat()).stop_list() == []
    assert parse_request(ChatRequest, chat(stop=["a", "b"])).stop_list() == ["a", "b"]


@pytest.mark.parametrize("prompt", ["hello", ["a", "b"], [1, 2, 3], [[1], [2, 3]], [0]])
def test_completion_prompt_shapes(prompt: Any) -> None:
    req = parse_request(CompletionRequest, {"prompt": prompt, "echo": False, "suffix": None})
    assert req.prompt == prompt
    assert req.n == 1 and req.stream is False and req.seed is None


def test_seed_bounds_are_inclusive() -> None:
    assert parse_request(ChatRequest, chat(seed=2**64 - 1)).seed == 2**64 - 1
    assert parse_request(ChatRequest, chat(seed=-(2**63))).seed == 2**63
    assert parse_request(ChatRequest, chat(seed=0)).seed == 0


def test_tools_round_trip_messages_are_accepted_and_shown_to_templates_as_hf_does() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    req = parse_request(
        ChatRequest,
        {
            "messages": [
                *USER,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [WEATHER],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert req.tool_mode() == "auto" and req.chat_template_kwargs == {"enable_thinking": False}
    assistant = req.messages[1].template_view()
    assert assistant["content"] == ""
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # an object
    assert req.messages[2].template_view() == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert req.tools is not None and req.tools[0].template_view() == WEATHER


@pytest.mark.parametrize(
    "choice,mode,forced",
    [
        (None, "auto", ["get_weather", "f"]),
        ("auto", "auto", ["get_weather", "f"]),
        ("none", "none", ["get_weather", "f"]),
        ("required", "required", ["get_weather", "f"]),
        ({"type": "function", "function": {"name": "f"}}, "named", ["f"]),
    ],
)
def test_tool_modes(choice: Any, mode: str, forced: list[str]) -> None:
    other = {"type": "function", "function": {"name": "f"}}
    req = parse_request(ChatRequest, chat(tools=[WEATHER, other], tool_choice=choice))
    assert req.tool_mode() == mode
    assert [t.function.name for t in req.forced_tools()] == forced
    assert parse_request(ChatRequest, chat()).tool_mode() == "none"
