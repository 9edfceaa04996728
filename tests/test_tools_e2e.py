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

from strata_core.ops.build import EngineBuild
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


# ---- the generic format: the default model, whose template never reads tools ----------------
#
# The server shows the tools in the system message and constrains the reply to one JSON
# object, a response or calls (strata_core/text/generic_tools.py).

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def plain(server: Server) -> openai.OpenAI:
    """The default model as it is: its chat template never mentions tools."""
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def prompt_text(server: Server, **body: Any) -> str:
    r = httpx.post(f"{server.base}/tokenize", json={**body, "with_pieces": True}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return "".join(t["piece"] for t in r.json()["tokens"])


def streamed_calls(chunks: Any) -> tuple[list[Any], str, list[str]]:
    deltas, content, finishes = [], "", []
    for chunk in chunks:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        deltas += ch.delta.tool_calls or []
        content += ch.delta.content or ""
        if ch.finish_reason:
            finishes.append(ch.finish_reason)
    return deltas, content, finishes


def joined_calls(deltas: list[Any]) -> list[tuple[str, str]]:
    """(name, arguments) of each streamed call; each call's first delta carries index, id,
    type and name, the later ones none of these but the index."""
    out = []
    for i in sorted({d.index for d in deltas}):
        first, *rest = [d for d in deltas if d.index == i]
        assert first.id and first.id.startswith("call_") and first.type == "function" and first.function.name
        assert all(d.id is None and d.function.name is None for d in rest)
        out.append((first.function.name, "".join(d.function.arguments or "" for d in (first, *rest))))
    return out


def test_generic_required_gives_a_valid_call_streamed_with_index_and_id(plain: openai.OpenAI, server: Server) -> None:
    # the fixture: the template never reads tools, so the server shows them itself
    assert "get_weather" not in prompt_text(server, messages=PARIS)
    assert '{"tool_call": ' in prompt_text(server, messages=PARIS, tools=[WEATHER, CLOCK])
    kw: dict[str, Any] = {"model": "default", "messages": PARIS, "tools": [WEATHER, CLOCK],
                          "tool_choice": "required", "max_tokens": 100}  # fmt: skip
    c = plain.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls and c.message.content is None
    for call in c.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in SCHEMAS
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    deltas, content, finishes = streamed_calls(plain.chat.completions.create(**kw, stream=True))
    assert deltas and deltas[0].index == 0 and deltas[0].id and deltas[0].function.name
    assert joined_calls(deltas) == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
    assert content == "" and finishes == ["tool_calls"]


def test_generic_named_tool_choice(plain: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    r = plain.chat.completions.create(model="default", messages=PARIS, tools=[WEATHER, CLOCK],
                                      tool_choice=named, max_tokens=100)  # type: ignore[arg-type]  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls
    for call in c.message.tool_calls:
        assert call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_time"])


def test_generic_tool_choice_none_is_text_without_the_tools(plain: openai.OpenAI, server: Server) -> None:
    kw: dict[str, Any] = {"model": "default", "messages": PARIS, "tools": [WEATHER], "max_tokens": 20}
    r = plain.chat.completions.create(**kw, tool_choice="none")
    c = r.choices[0]
    assert c.message.tool_calls is None and c.finish_reason != "tool_calls" and c.message.content
    assert not c.message.content.lstrip().startswith("{")  # free text, not the format
    # the tools are not shown: the prompt is the one without tools
    assert r.usage is not None and r.usage.prompt_tokens == len(
        httpx.post(f"{server.base}/tokenize", json={"messages": PARIS}, timeout=TIMEOUT).json()["tokens"])  # fmt: skip


def test_generic_auto_answers_in_text_or_a_valid_call(plain: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "default", "tools": [WEATHER, CLOCK], "max_tokens": 60}
    for messages in (PARIS, [{"role": "user", "content": "Say hello."}]):
        c = plain.chat.completions.create(**kw, messages=messages).choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls" and c.message.content is None
            for call in c.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        else:
            # the response's text, unwrapped: never the JSON the model wrote around it
            assert c.message.content and '"response"' not in c.message.content
        deltas, content, _ = streamed_calls(plain.chat.completions.create(**kw, messages=messages, stream=True))
        if c.message.tool_calls:
            assert joined_calls(deltas) == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
        else:
            assert not deltas and content == c.message.content


# It answered with two calls at once before: greedy, it does again when parallel calls are
# allowed; with parallel_tool_calls false the grammar admits one call only.
TWO_CALLS = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, ' \
            '{"name": "get_time", "arguments": {"city": "Paris"}}]}'  # fmt: skip
TWICE = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": TWO_CALLS},
    {"role": "user", "content": "Weather and time in Paris?"},
]


def test_generic_parallel_calls(plain: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "default", "messages": TWICE, "tools": [WEATHER, CLOCK],
                          "tool_choice": "required", "max_tokens": 100}  # fmt: skip
    c = plain.chat.completions.create(**kw).choices[0]
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []]
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Paris"})]
    assert len({t.id for t in c.message.tool_calls or []}) == 2
    deltas, _, finishes = streamed_calls(plain.chat.completions.create(**kw, stream=True))
    assert [(n, json.loads(a)) for n, a in joined_calls(deltas)] == calls and finishes == ["tool_calls"]
    one = plain.chat.completions.create(**kw, parallel_tool_calls=False).choices[0]
    assert len(one.message.tool_calls or []) == 1


def test_generic_tool_result_round_trip(plain: openai.OpenAI, server: Server) -> None:
    history = [
        *PARIS,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_paris", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_paris", "content": "Sunny, 25 C"},
    ]  # fmt: skip
    # the call and its result reach the prompt as text the model can read
    text = prompt_text(server, messages=history, tools=[WEATHER])
    assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}' in text
    assert '{"tool_result": {"name": "get_weather", "content": "Sunny, 25 C"}}' in text
    assert "<|im_start|>tool" not in text
    c = plain.chat.completions.create(model="default", messages=history, tools=[WEATHER],  # type: ignore[arg-type]
                                      max_tokens=60).choices[0]  # fmt: skip
    assert c.message.content or c.message.tool_calls


def test_generic_opt_out_refuses_tools(cpu_engine: EngineBuild, tmp_path: Path) -> None:
    env = {"STRATA_TOOLS_GENERIC": "false"}
    with Server(["--backend", "cpu", "--parallel", "1", "--n-ctx", "512"], tmp_path / "server.log", env=env) as srv:
        r = httpx.post(f"{srv.base}/v1/chat/completions", timeout=TIMEOUT,
                       json={"messages": PARIS, "tools": [WEATHER], "max_tokens": 2})  # fmt: skip
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tools" and err["code"] == "unsupported_value" and "generic" in err["message"]
        ok = httpx.post(f"{srv.base}/v1/chat/completions", timeout=TIMEOUT, json={"messages": PARIS, "max_tokens": 2})
        assert ok.status_code == 200
