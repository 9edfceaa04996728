"""A non-Hermes family's tool calls through every API: the default model served with
Qwen3-Coder's template (XML parameters, ``chat_template = "FILE.jinja"``), driven with the
official clients. The Responses API's ``function_call`` items, the Messages API's
``tool_use`` blocks and the Ollama API's ``message.tool_calls`` carry the calls Chat
Completions does, streamed and not; streamed, the arguments come a parameter at a time."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from test_logprobs_e2e import again
from test_tools_e2e import TIMEOUT

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server
from strata_core.testing.templates import template_source

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow

MODEL = "qwen3-coder"
FUNCTIONARY = "functionary-v3-2"
FN: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the city"},
                       "days": {"type": "integer", "description": "how many days"}},
        "required": ["city", "days"],
    },
}  # fmt: skip
CHAT_TOOL = {"type": "function", "function": FN}
QUESTION = [{"role": "user", "content": "What is the weather in Paris for the next 2 days?"}]
MAX = 120
#: A call in the family's own markup, which the model repeats when asked (Ollama's API has
#: no tool_choice to force one).
CALL_TEXT = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
AGAIN = again(CALL_TEXT)


@pytest.fixture(scope="module")
def served(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("tool-apis")
    lines = []
    for model, template in ((MODEL, "Qwen3-Coder.jinja"), (FUNCTIONARY, "meetkai-functionary-medium-v3.2.jinja")):
        (d / template).write_text(template_source(template))
        lines.append(f'[models.{model}]\npath = "{default_model}"\nchat_template = "{d / template}"\nparallel = 1\nn_ctx = 2048\n')
    config = d / "strata.toml"
    config.write_text("\n".join(lines))
    with Server(["--backend", "cpu", "--config", str(config)], d / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def chat(served: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base + "/v1", api_key="none", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def forced(chat: openai.OpenAI) -> list[tuple[str, Any]]:
    """The calls Chat Completions gives for tool_choice required, checked streamed too."""
    kw: Any = {"model": MODEL, "messages": QUESTION, "tools": [CHAT_TOOL], "tool_choice": "required",
               "max_tokens": MAX, "temperature": 0, "parallel_tool_calls": False}  # fmt: skip
    r = chat.chat.completions.create(**kw)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls or ()]
    assert calls and r.choices[0].message.content in (None, ""), r
    assert calls[0][0] == "get_weather" and set(calls[0][1]) == {"city", "days"}, calls
    fragments = [d.function.arguments for ch in chat.chat.completions.create(**kw, stream=True) if ch.choices
                 for d in ch.choices[0].delta.tool_calls or () if d.function and d.function.arguments]  # fmt: skip
    assert len(fragments) > 1, fragments  # a parameter at a time
    assert "".join(fragments) == r.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index]
    return calls


def test_responses_function_calls(served: Server, forced: list[tuple[str, Any]]) -> None:
    api = openai.OpenAI(base_url=served.base + "/v1", api_key="none", timeout=TIMEOUT, max_retries=0)
    kw: Any = {"model": MODEL, "input": QUESTION, "tools": [{"type": "function", "strict": False, **FN}],
               "tool_choice": "required", "max_output_tokens": MAX, "temperature": 0, "parallel_tool_calls": False}  # fmt: skip
    r = api.responses.create(**kw)
    items = [o for o in r.output if o.type == "function_call"]
    assert [(o.name, json.loads(o.arguments)) for o in items] == forced, r.output
    events = list(api.responses.create(**kw, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == items[0].arguments, deltas
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(o.name, json.loads(o.arguments)) for o in done] == forced  # type: ignore[union-attr]


def test_messages_tool_use_blocks(served: Server, forced: list[tuple[str, Any]]) -> None:
    api = anthropic.Anthropic(base_url=served.base, api_key="none", timeout=TIMEOUT, max_retries=0)
    tool = {"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}
    kw: Any = {"model": MODEL, "messages": QUESTION, "tools": [tool], "max_tokens": MAX, "extra_body": {"temperature": 0},
               "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}  # fmt: skip
    m = api.messages.create(**kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == forced and m.stop_reason == "tool_use", m.content
    events = list(api.messages.create(**kw, stream=True))
    partial = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]  # type: ignore[union-attr]
    assert len(partial) > 1 and json.loads("".join(partial)) == uses[0].input, partial
    with api.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == forced


def test_ollama_tool_calls(served: Server, chat: openai.OpenAI) -> None:
    """Nothing forces a call in Ollama's API: the model repeats one in its family's markup,
    and Ollama's tool_calls carry what Chat Completions parses from the same reply."""
    r = chat.chat.completions.create(model=MODEL, messages=AGAIN, tools=[CHAT_TOOL], max_tokens=MAX, temperature=0)  # type: ignore[arg-type]
    want = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls or ()]
    assert want == [("get_weather", {"city": "Paris", "days": 2})], r.choices[0].message
    client = ollama.Client(host=served.base, timeout=TIMEOUT)
    opts = {"temperature": 0, "num_predict": MAX}
    tools = [copy.deepcopy(CHAT_TOOL)]
    plain = client.chat(model=MODEL, messages=AGAIN, tools=tools, options=opts)
    assert [(c.function.name, dict(c.function.arguments)) for c in plain.message.tool_calls or ()] == want
    assert not plain.message.content.strip(), plain.message.content
    streamed = [c for p in client.chat(model=MODEL, messages=AGAIN, tools=tools, options=opts, stream=True)
                for c in p.message.tool_calls or ()]  # fmt: skip
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == want


def test_functionary_content_channel_is_no_content(chat: openai.OpenAI) -> None:
    """Functionary v3.2's generation prompt ends with ``>>>``: the model names its recipient,
    ``all`` for plain content, which is markup, with tools offered or not."""
    text = "The sky is blue."
    # the template ends a turn with Llama 3's <|eot_id|>, which is text to these weights
    kw: Any = {"model": FUNCTIONARY, "messages": again(text), "max_tokens": 30, "temperature": 0, "stop": ["<|eot_id|>"]}
    for extra in ({}, {"tools": [CHAT_TOOL]}, {"tools": [CHAT_TOOL], "tool_choice": "none"}):
        r = chat.chat.completions.create(**kw, **extra)
        assert r.choices[0].message.content == text, (extra, r.choices[0].message)
        streamed = "".join(c.choices[0].delta.content or "" for c in chat.chat.completions.create(**kw, **extra, stream=True)
                           if c.choices)  # fmt: skip
        assert streamed == text, extra
