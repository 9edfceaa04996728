"""The client libraries people use, with their default request shapes, against a real
server (the default model carrying test_tools_e2e's template, which shows it tools):
the OpenAI Agents SDK, LangChain's ChatOpenAI / ChatAnthropic / ChatOllama, LiteLLM and
pydantic-ai; and request bodies as coding agents and UIs send them (the Codex CLI's
Responses requests, Claude Code's Messages requests, Continue's autocomplete, Open WebUI's
Ollama calls), written from their published source.

The model is a 135M one: each check is about the protocol (a forced tool call comes back
parsed, structured output validates, a stream assembles into the whole reply), never
about the answer's quality. Forced calls name a tool whose one parameter is an enum, so
the grammar keeps the call short whatever the model would write.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field
from test_tools_e2e import TIMEOUT

from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

# LiteLLM reads its model prices from the network unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

City = Literal["Paris", "London"]
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                  "required": ["city"], "additionalProperties": False}  # fmt: skip
ASK = "What is the weather in Paris?"
HELLO = "Say hello."
#: Tokens of a reply whose stream is compared with the whole: a few are enough.
SHORT = 8


class Person(BaseModel):
    """Bounded, so the grammar closes the object in a few tokens whatever the model writes."""

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)


def weather(city: str) -> str:
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def base(tools_server: Server) -> Iterator[str]:
    yield tools_server.base


# ---- OpenAI Agents SDK ------------------------------------------------------------------


def agents_run(base: str, api: Literal["responses", "chat"], stream: bool) -> tuple[Any, list[str]]:
    """An agent whose one tool is forced, run to its first tool call (the tool's result is
    the final output); the cities the tool was called with."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        called.append(city)
        return weather(city)

    async def run() -> Any:
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
        kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(name="weather", instructions="Answer with the tool.", model=kind("default", client),
                      tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                      model_settings=ModelSettings(tool_choice="get_weather", max_tokens=48))  # fmt: skip
        if not stream:
            return (await Runner.run(agent, ASK)).final_output
        result = Runner.run_streamed(agent, ASK)
        kinds = {event.type async for event in result.stream_events()}
        assert "raw_response_event" in kinds  # it did stream
        return result.final_output

    return asyncio.run(run()), called


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_agents_sdk_forced_function_tool(base: str, api: Literal["responses", "chat"], stream: bool) -> None:
    output, called = agents_run(base, api, stream)
    assert len(called) == 1 and called[0] in ("Paris", "London")
    assert output == weather(called[0])


# ---- LangChain ---------------------------------------------------------------------------


def lc_tool() -> Any:
    from langchain_core.tools import tool

    @tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        return weather(city)

    return get_weather


def test_langchain_chat_openai(base: str) -> None:
    from langchain_openai import ChatOpenAI

    def llm(max_tokens: int) -> ChatOpenAI:
        return ChatOpenAI(model="default", base_url=f"{base}/v1", api_key="unused", max_tokens=max_tokens,
                          max_retries=0, timeout=TIMEOUT)  # fmt: skip

    (call,) = llm(48).bind_tools([lc_tool()], tool_choice="get_weather").invoke(ASK).tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "London")
    assert isinstance(llm(48).with_structured_output(Person).invoke("Invent a person."), Person)
    whole = llm(SHORT).invoke(HELLO).content
    assert whole and "".join(str(c.content) for c in llm(SHORT).stream(HELLO)) == whole


def test_langchain_chat_anthropic(base: str) -> None:
    from langchain_anthropic import ChatAnthropic

    def llm(max_tokens: int) -> ChatAnthropic:
        return ChatAnthropic(model="default", base_url=base, api_key="unused", max_tokens=max_tokens, max_retries=0,
                             timeout=TIMEOUT)  # fmt: skip

    (call,) = llm(48).bind_tools([lc_tool()], tool_choice="get_weather").invoke(ASK).tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "London")
    whole = llm(SHORT).invoke(HELLO).text
    assert whole and "".join(c.text for c in llm(SHORT).stream(HELLO)) == whole


def test_langchain_chat_ollama(base: str) -> None:
    from langchain_ollama import ChatOllama

    person = ChatOllama(model="default", base_url=base, num_predict=48).with_structured_output(
        Person, method="json_schema").invoke("Invent a person.")  # fmt: skip
    assert isinstance(person, Person)
    llm = ChatOllama(model="default", base_url=base, num_predict=SHORT)
    whole = llm.invoke(HELLO).text
    assert whole and "".join(c.text for c in llm.stream(HELLO)) == whole


# ---- LiteLLM and pydantic-ai ---------------------------------------------------------------


def test_litellm(base: str) -> None:
    import litellm

    kw: dict[str, Any] = {"model": "openai/default", "api_base": f"{base}/v1", "api_key": "unused", "timeout": TIMEOUT}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    r = litellm.completion(**kw, messages=[{"role": "user", "content": ASK}], tools=tools, max_tokens=48,
                           tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "London")
    hello = [{"role": "user", "content": HELLO}]
    whole = litellm.completion(**kw, messages=hello, max_tokens=SHORT).choices[0].message.content
    chunks = litellm.completion(**kw, messages=hello, max_tokens=SHORT, stream=True)
    assert whole and "".join(c.choices[0].delta.content or "" for c in chunks) == whole


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_pydantic_ai_structured_output(base: str, api: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{base}/v1", api_key="unused")
    model = (OpenAIChatModel if api == "chat" else OpenAIResponsesModel)("default", provider=provider)
    # the output is a forced call of pydantic-ai's own output tool, validated as a Person
    result = Agent(model, output_type=Person).run_sync("Invent a person.", model_settings={"max_tokens": 64})
    assert isinstance(result.output, Person)


# ---- coding agents and UIs, replayed ------------------------------------------------------


def sse_events(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


SHELL_TOOL = {
    "type": "function", "name": "shell", "description": "Runs a shell command and returns its output.", "strict": False,
    "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                                    "workdir": {"type": "string"}, "timeout_ms": {"type": "number"}},
                   "required": ["command"], "additionalProperties": False},
}  # fmt: skip


def codex_body(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A turn as the Codex CLI sends it to a provider speaking the Responses API (its
    ResponsesApiRequest: instructions, every item so far, its tools, nothing stored,
    streamed, the conversation's id as prompt_cache_key)."""
    return {"model": "default", "instructions": "You are a coding agent running in a terminal.",
            "input": items, "tools": [SHELL_TOOL], "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning": None, "store": False, "stream": True, "include": [],
            "prompt_cache_key": "0199a0e4-5c1f-7a40-9d0e-3f5b8a1c2d3e", "max_output_tokens": 16}  # fmt: skip


def test_codex_cli_responses_turns(base: str) -> None:
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files here."}]}
    context = {"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/src</cwd>\n</environment_context>"}]}  # fmt: skip
    events = sse_events(httpx.post(f"{base}/v1/responses", json=codex_body([context, user]), timeout=TIMEOUT))
    assert events[0]["type"] == "response.created" and events[-1]["type"] in ("response.completed", "response.incomplete")
    assert events[-1]["response"]["prompt_cache_key"] == codex_body([])["prompt_cache_key"]
    # the next turn: the call the model made and its output, sent back as items
    call = {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_1"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": '{"output":"a.py\\n","metadata":{"exit_code":0,"duration_seconds":0.1}}'}  # fmt: skip
    events = sse_events(httpx.post(f"{base}/v1/responses", json=codex_body([context, user, call, output]), timeout=TIMEOUT))
    assert events[-1]["type"] in ("response.completed", "response.incomplete")


def test_claude_code_messages_with_cache_control_and_thinking(base: str) -> None:
    """Claude Code's request: system blocks and the last message marked for caching, tools
    with JSON-schema input, a thinking budget, its user id in metadata, streamed. The
    stream is read until the thinking has begun, then dropped (as a user's Esc does)."""
    ephemeral = {"type": "ephemeral"}
    body = {
        "model": "default", "max_tokens": 1200, "stream": True, "temperature": 1,
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": ephemeral},
                   {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
                    "cache_control": ephemeral}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>The date is today.</system-reminder>"},
                                                  {"type": "text", "text": "What does main.py do?", "cache_control": ephemeral}]}],
        "tools": [{"name": "Read", "description": "Reads a file.", "input_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
            "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "user_4f2a_account__session_9c1d"},
    }  # fmt: skip
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14", "x-api-key": "unused"}
    events = []
    with httpx.stream("POST", f"{base}/v1/messages", json=body, headers=headers, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if events and events[-1]["type"] == "content_block_delta":
                break
    assert [e["type"] for e in events] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert events[2]["content_block"]["type"] == "thinking" and events[3]["delta"]["type"] == "thinking_delta"


#: Continue's autocomplete stop strings for a model its templates do not name (its
#: stable-code FIM template's): seven, more than OpenAI's four.
CONTINUE_STOPS = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<|endoftext|>", "</fim_middle>", "</code>"]
FIM_PROMPT = "<fim_prefix>def add(a, b):\n    <fim_suffix>\n<fim_middle>"


def test_continue_autocomplete(base: str) -> None:
    """Continue's autocomplete renders the FIM prompt itself and sends it raw: to an OpenAI
    provider as a legacy completion, to an Ollama one as a raw generate (after /api/show,
    which tells it whether the model takes a suffix)."""
    body = {"model": "default", "prompt": FIM_PROMPT, "max_tokens": 12, "temperature": 0.01, "stop": CONTINUE_STOPS, "stream": True}
    chunks = sse_events(httpx.post(f"{base}/v1/completions", json=body, timeout=TIMEOUT))
    assert chunks and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    show = httpx.post(f"{base}/api/show", json={"name": "default"}, timeout=TIMEOUT).json()
    assert ".Suffix" not in show["template"]  # so Continue sends no suffix
    # it reads num_ctx from the parameters and sends it back with every request
    num_ctx = int(dict(line.split(None, 1) for line in show["parameters"].splitlines())["num_ctx"])
    gen = {"model": "default", "prompt": FIM_PROMPT, "raw": True, "keep_alive": 1800, "stream": True,
           "options": {"temperature": 0.01, "num_predict": 12, "stop": CONTINUE_STOPS, "num_ctx": num_ctx}}  # fmt: skip
    r = httpx.post(f"{base}/api/generate", json=gen, timeout=TIMEOUT)
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert r.status_code == 200 and lines[-1]["done"] is True, r.text


def test_open_webui_ollama_calls(base: str) -> None:
    """Open WebUI lists the models and the version, then chats (its OpenAI-style payload
    turned into Ollama's: options, keep_alive), streamed, and titles the chat unstreamed."""
    tags = httpx.get(f"{base}/api/tags", timeout=TIMEOUT).json()
    name = tags["models"][0]["model"]
    assert httpx.get(f"{base}/api/version", timeout=TIMEOUT).json()["version"]
    chat = {"model": name, "messages": [{"role": "user", "content": "Hello!"}], "stream": True,
            "options": {"temperature": 0.8, "num_predict": SHORT}, "keep_alive": "5m"}  # fmt: skip
    lines = [json.loads(x) for x in httpx.post(f"{base}/api/chat", json=chat, timeout=TIMEOUT).text.splitlines()]
    assert lines[-1]["done"] is True and "".join(x["message"]["content"] for x in lines)
    title = {"model": name, "stream": False, "options": {"num_predict": SHORT},
             "messages": [{"role": "user", "content": "Generate a concise title for this chat: Hello!"}]}  # fmt: skip
    r = httpx.post(f"{base}/api/chat", json=title, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["done"] is True
