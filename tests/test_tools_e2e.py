"""Reasoning and tool calls end to end: the official client, the HTTP server, the real engine.

The model is the default one (SmolLM2, its weights and tokenizer) carrying a Hermes/Qwen
style chat template that shows it tools and, with ``enable_thinking``, opens ``<think>``
in the generation prompt. SmolLM2 was never trained to call tools, so each check first
makes sure the model really wrote what the check is about: a conversation in which it
already answered with a call (or thought and closed ``</think>``) once makes it, greedy,
write the same again, and the logprob entries show the markup it wrote. tool_choice
required / named run on the engine's grammar, which forces a call the model would not make.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from strata_core.build import EngineBuild
from strata_core.testing.harness import Server
from strata_core.testing.models import write_with_template

pytestmark = pytest.mark.slow

TIMEOUT = 600

TOOLS_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to help with the user query.\\n\\n' }}
{{- 'The function signatures are within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a JSON object with the function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' }}
{{- (call.function.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role != 'system' or not loop.first %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking %}{{- '<think>\\n' }}{%- endif %}
{%- endif %}
"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# The model answered with this call once; greedy, it writes it again.
AGAIN = [
    {"role": "user", "content": "Repeat exactly: " + CALL_TEXT},
    {"role": "assistant", "content": CALL_TEXT},
    {"role": "user", "content": "Again, exactly."},
]


@pytest.fixture(scope="module")
def api(tools_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tools_server.base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def ask(api: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("model", "smollm2-tools")
    kw.setdefault("max_tokens", 60)
    return api.chat.completions.create(**kw)


def spelled(entries: list[Any]) -> str:
    return b"".join(bytes(e.bytes) for e in entries).decode("utf-8")


def has_grammar(server: Server) -> bool:
    info = httpx.get(f"{server.base}/v1/strata/backend").json()
    return "grammar" in info["engine"].get("capabilities", [])


# ---- auto: the model's own call ---------------------------------------------------------


def test_auto_call_is_parsed_into_tool_calls(api: openai.OpenAI) -> None:
    r = ask(api, messages=AGAIN, tools=[WEATHER, CLOCK], logprobs=True)
    c = r.choices[0]
    # the fixture: the model really wrote the call's markup (its tokens spell it)
    assert c.logprobs is not None and c.logprobs.content
    assert spelled(c.logprobs.content).strip() == CALL_TEXT
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) > 10
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_without_tools_the_same_text_stays_content(api: openai.OpenAI) -> None:
    r = ask(api, messages=AGAIN, tools=[WEATHER], tool_choice="none")
    c = r.choices[0]
    assert c.message.tool_calls is None and c.finish_reason != "tool_calls"
    assert c.message.content  # no tools shown: some text, never parsed


def test_streamed_call_deltas(api: openai.OpenAI) -> None:
    whole = ask(api, messages=AGAIN, tools=[WEATHER])
    deltas, content, finishes = [], "", []
    for chunk in ask(api, messages=AGAIN, tools=[WEATHER], stream=True):
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        deltas += ch.delta.tool_calls or []
        if ch.finish_reason:
            finishes.append(ch.finish_reason)
    assert deltas, "no tool-call deltas were streamed"
    first = deltas[0]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name == "get_weather"
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    args = "".join(d.function.arguments or "" for d in deltas)
    assert args == whole.choices[0].message.tool_calls[0].function.arguments
    assert content == "" and finishes == ["tool_calls"]


def test_sdk_stream_helper_accumulates_the_call(api: openai.OpenAI) -> None:
    events = []
    with api.chat.completions.stream(
        model="smollm2-tools", messages=AGAIN, tools=[WEATHER], max_tokens=60  # type: ignore[arg-type, list-item]
    ) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    c = final.choices[0]
    assert c.finish_reason == "tool_calls"
    (call,) = c.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


# An earlier round in which the model answered from a tool result, quoting it: greedy, it
# answers the next result the same way. Its result is not the one the check looks for.
EARLIER_ROUND = [
    {"role": "user", "content": "What is the weather in London?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_london", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "London"}'}}]},
    {"role": "tool", "tool_call_id": "call_london", "content": "Cloudy, 14 C"},
    {"role": "assistant", "content": "The weather in London: Cloudy, 14 C."},
]  # fmt: skip


def test_tool_round_trip_with_a_tool_result(api: openai.OpenAI) -> None:
    first = ask(api, messages=AGAIN, tools=[WEATHER])
    (call,) = first.choices[0].message.tool_calls
    history = [
        *EARLIER_ROUND,
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 25 C"},
    ]
    # the fixture: only the tool message holds the result, so quoting it needs that message
    assert "Sunny" not in json.dumps(history[:-1])
    r = ask(api, messages=history, tools=[WEATHER], logprobs=True)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length") and c.message.tool_calls is None
    assert c.message.content
    assert spelled(c.logprobs.content) == c.message.content
    # the result reached the prompt: the model quotes it back
    assert "Sunny, 25 C" in c.message.content


def test_logprobs_are_present_with_tools(api: openai.OpenAI) -> None:
    kw = {"messages": [{"role": "user", "content": "What is 2+2?"}], "tools": [WEATHER],
          "logprobs": True, "top_logprobs": 2, "max_tokens": 12}  # fmt: skip
    c = ask(api, **kw).choices[0]
    assert c.message.content and c.message.tool_calls is None
    assert c.logprobs.content and spelled(c.logprobs.content) == c.message.content
    assert all(len(e.top_logprobs) == 2 for e in c.logprobs.content)
    streamed = []
    for chunk in ask(api, stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content or []
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in c.logprobs.content]


def test_calls_under_continuous_batching(api: openai.OpenAI) -> None:
    results: list[Any] = [None] * 4

    def one(i: int) -> None:
        results[i] = ask(api, messages=AGAIN, tools=[WEATHER], stream=i % 2 == 1)
        if i % 2:
            calls: list[Any] = []
            for chunk in results[i]:
                calls += chunk.choices[0].delta.tool_calls or []
            results[i] = (calls[0].function.name, "".join(d.function.arguments or "" for d in calls))
        else:
            call = results[i].choices[0].message.tool_calls[0]
            results[i] = (call.function.name, call.function.arguments)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [("get_weather", '{"city": "Paris"}')] * 4


# ---- required / named: a grammar forces the call ------------------------------------------


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_call(api: openai.OpenAI, tools_server: Server, choice: Any) -> None:
    """The engine's grammar forces a call the model would not make on its own."""
    assert has_grammar(tools_server)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    free = ask(api, messages=messages, tools=[WEATHER, CLOCK]).choices[0]
    assert free.message.tool_calls is None  # the fixture: left alone, it answers in text
    r = ask(api, messages=messages, tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=200, logprobs=True)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls
    names = {"get_weather", "get_time"} if choice == "required" else {"get_time"}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
    for call in c.message.tool_calls:
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    assert c.logprobs.content
    # streamed, the same calls
    deltas = []
    for chunk in ask(api, messages=messages, tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=200, stream=True):
        deltas += chunk.choices[0].delta.tool_calls or []
    streamed = [(d.function.name, "".join(x.function.arguments or "" for x in deltas if x.index == d.index))
                for d in deltas if d.id]  # fmt: skip
    assert streamed == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]


# ---- reasoning ----------------------------------------------------------------------------

THINK = {"chat_template_kwargs": {"enable_thinking": True}}


def test_reasoning_when_the_prompt_opens_think(api: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    plain = ask(api, messages=msgs, max_tokens=16).choices[0]
    assert not getattr(plain.message, "reasoning_content", None)  # the fixture: off by default
    r = ask(api, messages=msgs, max_tokens=16, logprobs=True, extra_body=THINK)
    c = r.choices[0]
    reasoning = c.message.reasoning_content  # type: ignore[attr-defined]
    assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    assert "think>" not in (c.message.content or "")
    lp = c.logprobs.model_dump()
    assert spelled_dicts(lp["reasoning_content"]) == reasoning
    assert spelled_dicts(lp["content"]) == (c.message.content or "")
    # streamed: the same split, reasoning deltas first
    kinds, text, reasoning_streamed = [], "", ""
    for chunk in ask(api, messages=msgs, max_tokens=16, stream=True, extra_body=THINK):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta.model_dump()
        if d.get("reasoning_content"):
            kinds.append("reasoning")
            reasoning_streamed += d["reasoning_content"]
        if d.get("content"):
            kinds.append("content")
            text += d["content"]
    assert reasoning_streamed == reasoning and text == (c.message.content or "")
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning")


def spelled_dicts(entries: list[dict[str, Any]] | None) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries or []).decode("utf-8")


def test_reasoning_then_content_with_logprobs_split(api: openai.OpenAI) -> None:
    # It thought this way before: greedy, it closes </think> and answers again.
    thought = "Two plus two.\n</think>\n\nThe answer is 4."
    msgs = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\n" + thought},
        {"role": "user", "content": "What is 2+2?"},
    ]
    kw: dict[str, Any] = {"messages": msgs, "max_tokens": 40, "logprobs": True, "extra_body": THINK}
    r = ask(api, **kw)
    c = r.choices[0]
    reasoning = c.message.reasoning_content  # type: ignore[attr-defined]
    assert (reasoning, c.message.content) == ("Two plus two.\n", "The answer is 4.")
    lp = c.logprobs.model_dump()
    assert spelled_dicts(lp["reasoning_content"]) == reasoning
    assert spelled_dicts(lp["content"]) == c.message.content
    # </think> and the newlines after it make no text, so they have no entries
    assert len(lp["reasoning_content"]) + len(lp["content"]) < r.usage.completion_tokens
    streamed: dict[str, Any] = {"reasoning": "", "content": "", "r": [], "c": [], "order": []}
    for chunk in ask(api, stream=True, **kw):
        if not chunk.choices:
            continue
        d, lps = chunk.choices[0].delta.model_dump(), chunk.choices[0].logprobs
        if d.get("reasoning_content"):
            streamed["reasoning"] += d["reasoning_content"]
            streamed["order"].append("reasoning")
        if d.get("content"):
            streamed["content"] += d["content"]
            streamed["order"].append("content")
        if lps is not None:
            streamed["r"] += lps.model_dump().get("reasoning_content") or []
            streamed["c"] += lps.model_dump()["content"] or []
    assert (streamed["reasoning"], streamed["content"]) == (reasoning, c.message.content)
    assert streamed["order"] == sorted(streamed["order"], key=lambda k: k != "reasoning")
    assert (streamed["r"], streamed["c"]) == (lp["reasoning_content"], lp["content"])


# ---- Llama 3's form: a bare JSON object with "name" and "parameters" -----------------------


def test_llama3_form_over_http(cpu_engine: EngineBuild, default_model: Path, tmp_path: Path) -> None:
    """A model whose template shows tools the Llama 3 way answers a forced call as
    {"name": ..., "parameters": ...}; the reply's tool_calls carry it, streamed or not."""
    from test_chat import LLAMA3_STYLE

    model = tmp_path / "smollm2-llama3.gguf"
    write_with_template(default_model, model, LLAMA3_STYLE)
    with Server(["--backend", "cpu", "--model", str(model), "--parallel", "1", "--n-ctx", "2048"],
                tmp_path / "server.log") as srv:  # fmt: skip
        assert has_grammar(srv)
        client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
        # bounded arguments: the grammar then cannot let the small model run on to max_tokens
        params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                  "required": ["city"], "additionalProperties": False}  # fmt: skip
        tool = {"type": "function", "function": {**WEATHER["function"], "parameters": params}}
        kw: dict[str, Any] = {"model": "smollm2-llama3", "max_tokens": 80, "tools": [tool], "tool_choice": "required",
                              "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}  # fmt: skip
        c = client.chat.completions.create(**kw).choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
        call = c.message.tool_calls[0]
        assert call.function.name == "get_weather" and "<|" not in (c.message.content or "")
        jsonschema.validate(json.loads(call.function.arguments), params)
        deltas = []
        for chunk in client.chat.completions.create(**kw, stream=True):
            deltas += chunk.choices[0].delta.tool_calls or []
        streamed = [(d.function.name, "".join(x.function.arguments or "" for x in deltas if x.index == d.index))
                    for d in deltas if d.id]  # fmt: skip
        assert streamed == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
