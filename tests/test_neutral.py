"""The one rule for parameters Strata does not implement (schema/neutral.py), in every API
family: a value that asks for nothing (null, [], {}, false, the documented default) is
accepted, a hint is kept, and any other value is a 400 naming the parameter."""

from __future__ import annotations

from typing import Any

import pytest

from strata_core.api.messages_input import MessagesRequest
from strata_core.api.ollama_input import OllamaChat, OllamaGenerate
from strata_core.api.responses_input import ResponsesRequest
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import ChatRequest, CompletionRequest, parse_request

USER = [{"role": "user", "content": "x"}]
FAMILIES: dict[str, tuple[type[Any], dict[str, Any]]] = {
    "chat": (ChatRequest, {"messages": USER}),
    "completions": (CompletionRequest, {"prompt": "x"}),
    "responses": (ResponsesRequest, {"input": "x"}),
    "messages": (MessagesRequest, {"model": "m", "max_tokens": 8, "messages": USER}),
    "ollama_chat": (OllamaChat, {"model": "m", "messages": USER}),
    "ollama_generate": (OllamaGenerate, {"model": "m", "prompt": "x"}),
}

#: (family, parameter, a value that asks for nothing)
NEUTRAL = [
    ("chat", "audio", None), ("chat", "prediction", None), ("chat", "web_search_options", None),
    ("chat", "functions", []), ("chat", "function_call", "none"),
    ("chat", "store", False), ("chat", "modalities", ["text"]), ("chat", "service_tier", "auto"),
    ("chat", "service_tier", "default"), ("chat", "verbosity", "medium"),
    ("chat", "parallel_tool_calls", None), ("chat", "n", 1), ("chat", "top_logprobs", None),
    ("completions", "suffix", None), ("completions", "best_of", 1),
    ("responses", "include", []), ("responses", "background", False), ("responses", "conversation", None),
    ("responses", "prompt", None), ("responses", "service_tier", "auto"), ("responses", "top_logprobs", 0),
    ("responses", "truncation", "disabled"), ("responses", "stream_options", {"include_obfuscation": True}),
    ("responses", "context_management", None), ("responses", "store", False),
    ("responses", "text", {"verbosity": "medium"}), ("responses", "reasoning", {"summary": None}),
    ("messages", "mcp_servers", []), ("messages", "service_tier", "auto"), ("messages", "container", None),
    ("messages", "context_management", None), ("messages", "metadata", {}),
    ("ollama_chat", "logprobs", False), ("ollama_chat", "top_logprobs", 0),
    ("ollama_chat", "options", {"tfs_z": 1.0}),
    ("ollama_generate", "suffix", ""), ("ollama_generate", "template", ""), ("ollama_generate", "context", []),
    ("ollama_generate", "images", []),
]  # fmt: skip

#: (family, parameter, a hint: accepted whatever its value, never changing the reply)
HINTS = [
    (family, name, value)
    for family in ("chat", "completions", "responses")
    for name, value in (("user", "u-1"), ("metadata", {"k": "v"}), ("safety_identifier", "s-1"),
                        ("prompt_cache_key", "conv-1"), ("prompt_cache_retention", "24h"))  # fmt: skip
] + [("messages", "metadata", {"user_id": "u-1"})]

#: (family, body fields, the parameter the 400 names): values that ask for what Strata lacks
REFUSED = [
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat", {"web_search_options": {"search_context_size": "low"}}, "web_search_options"),
    ("chat", {"store": True}, "store"), ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"service_tier": "flex"}, "service_tier"), ("chat", {"verbosity": "low"}, "verbosity"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"), ("chat", {"reasoning_effort": "extreme"}, "reasoning_effort"),
    ("chat", {"no_such_field": None}, "no_such_field"),
    ("completions", {"best_of": 2}, "best_of"),
    ("responses", {"include": ["reasoning.encrypted_content"]}, "include"), ("responses", {"background": True}, "background"),
    ("responses", {"service_tier": "priority"}, "service_tier"), ("responses", {"truncation": "auto"}, "truncation"),
    ("responses", {"text": {"verbosity": "high"}}, "text.verbosity"),
    ("responses", {"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ("responses", {"conversation": "conv_1"}, "conversation"), ("responses", {"top_logprobs": 21}, "top_logprobs"),
    ("messages", {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    ("messages", {"service_tier": "standard_only"}, "service_tier"), ("messages", {"container": "c"}, "container"),
    ("ollama_chat", {"options": {"tfs_z": 0.5}}, "options.tfs_z"), ("ollama_chat", {"logprobs": True}, "logprobs"),
    ("ollama_generate", {"context": [1, 2]}, "context"),
]  # fmt: skip


def parse(family: str, fields: dict[str, Any]) -> Any:
    """The family's request, and the chat (or completion) request it runs as."""
    model, base = FAMILIES[family]
    req = parse_request(model, {**base, **fields})
    if family == "responses":
        return req.chat_request(req.conversation([]))
    if family in ("messages", "ollama_chat", "ollama_generate"):
        return req.chat_request()
    return req


@pytest.mark.parametrize(("family", "name", "value"), NEUTRAL)
def test_a_value_that_asks_for_nothing_is_accepted(family: str, name: str, value: Any) -> None:
    plain = parse(family, {})
    assert parse(family, {name: value}) == plain  # and changes nothing


@pytest.mark.parametrize(("family", "name", "value"), HINTS)
def test_hints_are_accepted(family: str, name: str, value: Any) -> None:
    model, base = FAMILIES[family]
    req = parse_request(model, {**base, name: value})
    assert getattr(req, name) == value or getattr(req, name).model_dump() == value  # kept


@pytest.mark.parametrize(("family", "fields", "param"), REFUSED)
def test_a_value_that_asks_for_more_is_refused_by_name(family: str, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse(family, fields)
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert param.split(".")[-1] in err.value.message


def test_the_refusal_says_what_is_accepted() -> None:
    with pytest.raises(ApiError) as err:
        parse("chat", {"service_tier": "flex"})
    assert '"auto"' in err.value.message and "null" in err.value.message and err.value.code == "unsupported_parameter"


def test_false_is_not_zero() -> None:
    """``top_logprobs: false`` is neutral (false always is); ``0`` where the default is 0; but
    a default of ``1`` is not ``true``."""
    parse("ollama_chat", {"top_logprobs": False})
    with pytest.raises(ApiError):
        parse("completions", {"best_of": True})


@pytest.mark.parametrize(("effort", "thinking", "budget"), [("none", False, None), ("low", True, 1024),
                                                            ("high", True, 16384), ("xhigh", True, None)])  # fmt: skip
def test_chat_reasoning_effort_maps_as_responses_does(effort: str, thinking: bool, budget: int | None) -> None:
    chat = parse("chat", {"reasoning_effort": effort})
    assert chat.chat_template_kwargs == {"enable_thinking": thinking} and chat.reasoning_budget == budget
    assert parse("responses", {"reasoning": {"effort": effort}}) == parse("chat", {"reasoning_effort": effort,
                                                                               "messages": USER})  # fmt: skip


def test_explicit_thinking_settings_win_over_the_effort() -> None:
    chat = parse("chat", {"reasoning_effort": "low", "reasoning_budget": 7,
                          "chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    assert chat.reasoning_budget == 7 and chat.chat_template_kwargs == {"enable_thinking": False}
    assert parse("chat", {"reasoning_effort": "low", "reasoning_budget": -1}).reasoning_budget is None


def test_responses_logprobs_and_max_tool_calls_reach_the_chat_request() -> None:
    chat = parse("responses", {"include": ["message.output_text.logprobs"], "top_logprobs": 3})
    assert chat.logprob_alternatives() == 3
    assert parse("responses", {"top_logprobs": 3}).logprob_alternatives() is None  # not included: not shown
    assert parse("responses", {"max_tool_calls": 2}).max_tool_calls == 2
    assert parse("responses", {"prompt_cache_key": "k"}).prompt_cache_key == "k"


def max_tool_calls_reply(most: int | None) -> tuple[int, bool]:
    """A Hermes-style reply of two calls read with ``most_calls``: the calls kept, and
    whether the reply was ended (so the engine stops)."""
    from test_tools_e2e import TOOLS_TEMPLATE

    from strata_core.contract.events import TokenEvent
    from strata_core.text.chat import ChatTemplate
    from strata_core.text.choice import ChatShape, ChoiceText

    setup = ChatTemplate(TOOLS_TEMPLATE).tool_setup
    assert setup is not None
    view = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    shape = ChatShape(format=setup.format, think=setup.format.think, tools=(view,), new_id=setup.new_id,
                      most_calls=most)  # fmt: skip
    choice = ChoiceText([bytes([b]) for b in range(256)], [], None, shape)
    call = '<tool_call>\n{{"name": "f", "arguments": {{"a": {}}}}}\n</tool_call>'
    for b in (call.format(1) + "\n" + call.format(2)).encode():
        if choice.stopped:
            break
        choice.push(TokenEvent(b))
    stopped = choice.stopped
    choice.end()
    return len(choice.tool_calls or []), stopped


def test_max_tool_calls_ignores_further_calls_and_ends_the_reply() -> None:
    assert max_tool_calls_reply(None) == (2, False)  # the fixture: both calls are read
    assert max_tool_calls_reply(2) == (2, False)
    assert max_tool_calls_reply(1) == (1, True)
