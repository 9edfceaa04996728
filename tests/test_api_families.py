"""The Responses and Messages APIs' pure parts: requests translated into the chat request
the shared path runs, the blocks a reply's pieces make, and the stop string reported."""

from __future__ import annotations

from typing import Any

import pytest

from strata_core.api.blocks import Block, Blocks, Closed, Grew, Opened
from strata_core.api.messages import error_body, stop_reason
from strata_core.api.messages_input import MessagesRequest
from strata_core.api.responses import ResponseStore
from strata_core.api.responses_input import ResponsesRequest
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import parse_request
from strata_core.text.choice import Delta
from strata_core.text.detokenize import StopMatcher
from strata_core.text.tools import CallDelta


def shape(events: list[Any]) -> list[tuple[str, str, str]]:
    return [(type(e).__name__, e.block.kind, e.text if isinstance(e, Grew) else "") for e in events]


def test_blocks_open_grow_and_close_in_turn() -> None:
    b = Blocks()
    events = b.push(Delta("", reasoning="hm"))
    events += b.push(Delta("Hi", reasoning=" ok"))
    events += b.push(Delta("!", calls=[CallDelta(0, "", "call_1", "f"), CallDelta(0, '{"a"')]))
    events += b.push(Delta("", calls=[CallDelta(0, ": 1}"), CallDelta(1, "{}", "call_2", "g")]))
    events += b.close()
    assert shape(events) == [
        ("Opened", "reasoning", ""), ("Grew", "reasoning", "hm"), ("Grew", "reasoning", " ok"),
        ("Closed", "reasoning", ""), ("Opened", "text", ""), ("Grew", "text", "Hi"), ("Grew", "text", "!"),
        ("Closed", "text", ""), ("Opened", "call", ""), ("Grew", "call", '{"a"'), ("Grew", "call", ": 1}"),
        ("Closed", "call", ""), ("Opened", "call", ""), ("Grew", "call", "{}"), ("Closed", "call", ""),
    ]  # fmt: skip
    assert [(x.kind, x.index, x.text, x.call_id, x.name) for x in b.blocks] == [
        ("reasoning", 0, "hm ok", "", ""), ("text", 1, "Hi!", "", ""),
        ("call", 2, '{"a": 1}', "call_1", "f"), ("call", 3, "{}", "call_2", "g"),
    ]  # fmt: skip


def test_an_empty_reply_is_one_empty_text_block() -> None:
    b = Blocks()
    assert b.push(Delta("")) == []
    events = b.close()
    assert [type(e) for e in events] == [Opened, Closed] and b.blocks == [Block("text", 0)]


@pytest.mark.parametrize(
    ("stops", "text", "matched"),
    [(["5", "3"], "1, 2, 3, 4, 5", "3"), (["ab", "abc"], "xxabcx", "ab"), (["z"], "abc", None)],
)
def test_stop_matcher_names_the_stop_that_ended_the_text(stops: list[str], text: str, matched: str | None) -> None:
    m = StopMatcher(stops)
    for ch in text:
        if m.push(ch)[1]:
            break
    else:
        m.flush()
    assert (m.matched if m.stopped else None) == matched


def responses(body: dict[str, Any]) -> ResponsesRequest:
    return parse_request(ResponsesRequest, {"model": "default", **body})


def test_responses_input_items_become_chat_messages() -> None:
    req = responses({
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Sunny.", "annotations": [], "logprobs": []}]},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 7, "temperature": 0.5, "reasoning": {"effort": "low"},
    })  # fmt: skip
    history = [{"role": "user", "content": "Earlier"}, {"role": "assistant", "content": "Yes"}]
    chat = req.chat_request(req.conversation(history))
    assert [m.template_view() for m in chat.messages] == [
        {"role": "system", "content": "Be brief."},
        *history,
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]  # fmt: skip
    assert chat.max_new_tokens() == 7 and chat.temperature == 0.5
    assert chat.tool_mode() == "named" and chat.chat_template_kwargs == {"enable_thinking": True}
    fmt = {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}
    req = responses({"input": "x", "text": {"format": fmt}})
    chat = req.chat_request(req.conversation([]))
    assert chat.response_format is not None and chat.response_format.json_schema is not None
    assert chat.response_format.json_schema.strict is True and chat.response_format.json_schema.schema_ == fmt["schema"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": "x", "service_tier": "flex"}, "service_tier"),
        ({"input": "x", "frequency_penalty": 1}, "frequency_penalty"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
    ],
)
def test_responses_refuses_what_it_does_not_implement(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        responses(body)
    assert err.value.status == 400 and err.value.param == param, err.value


def test_store_refused_when_none_is_kept_and_bounded_otherwise() -> None:
    with pytest.raises(ApiError) as err:
        ResponseStore(0).history(responses({"input": "x", "store": True}))
    assert err.value.param == "store" and "store_size" in err.value.message
    store = ResponseStore(2)
    with pytest.raises(ApiError) as err:
        store.history(responses({"input": "x", "previous_response_id": "resp_gone"}))
    assert err.value.param == "previous_response_id"
    from strata_core.api.responses import Stored

    for rid in ("a", "b", "c"):
        store.put(rid, Stored({"id": rid}, [{"role": "user", "content": rid}]))
    assert store.history(responses({"input": "x", "previous_response_id": "c"})) == [{"role": "user", "content": "c"}]
    with pytest.raises(ApiError):  # the oldest went first
        store.get("a")


def messages(body: dict[str, Any]) -> MessagesRequest:
    return parse_request(MessagesRequest, {"model": "default", "max_tokens": 2000, **body})


def test_anthropic_blocks_become_chat_messages() -> None:
    req = messages({
        "system": [{"type": "text", "text": "Be ", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "brief."}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "Sunny"}]},
                {"type": "text", "text": "And?"}]},
        ],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["\n\n"], "top_k": 5, "temperature": 0.3,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    })  # fmt: skip
    chat = req.chat_request()
    assert [m.template_view() for m in chat.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
        {"role": "user", "content": "And?"},
    ]  # fmt: skip
    assert chat.tool_mode() == "required" and chat.parallel_tool_calls is False
    assert (chat.stop, chat.top_k, chat.temperature, chat.max_tokens) == (["\n\n"], 5, 0.3, 2000)
    assert chat.chat_template_kwargs == {"enable_thinking": True}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, "temperature"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0.image.source"),
        ({"messages": [{"role": "user", "content": "x"}], "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
        ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 4096}}, None),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "messages.0"),
    ],
)
def test_messages_refuses_what_it_does_not_implement(body: dict[str, Any], param: str | None) -> None:
    with pytest.raises(ApiError) as err:
        messages(body)
    assert err.value.status == 400 and err.value.param == param, err.value


def test_anthropic_errors_and_stop_reasons() -> None:
    assert error_body(ApiError(400, "bad")) == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert error_body(ApiError(401, "key"))["error"]["type"] == "authentication_error"
    assert error_body(ApiError(500, "x"))["error"]["type"] == "api_error"
    assert [stop_reason("length", None), stop_reason("tool_calls", None), stop_reason("stop", "\n"),
            stop_reason("stop", None)] == ["max_tokens", "tool_use", "stop_sequence", "end_turn"]  # fmt: skip
