"""Templates no registry lists, over HTTP with the official client (the default model's
GGUF, each template a model of one server): a derived format forces and reads calls in the
template's own markup, streamed or not; a forced call cut short by max_tokens comes back
as written (the corpus's Gemma 4 template); a template nothing can be derived from is
served with the generic format and says why once, as its model loads."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing import shaped_templates as shaped
from strata_core.testing.harness import Server
from strata_core.testing.templates import TOOLS, template_source
from strata_core.testing.tool_corpus import QUESTION, server_config

pytestmark = pytest.mark.slow

#: one derived family by default (a model load and a few requests each, on two CPU cores);
#: STRATA_TOOL_CORPUS=all runs every hand-written shape
DERIVED = tuple(shaped.BY_HAND) if os.environ.get("STRATA_TOOL_CORPUS") == "all" else ("pythonic",)
GEMMA = "google-gemma-4-31B-it.jinja"
#: the tool the Gemma 4 run-on was seen with: one string parameter, no description
CITY: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}]  # fmt: skip


@pytest.fixture(scope="module")
def server(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("derive")
    sources = {f"{n}.jinja": shaped.BY_HAND[n] for n in DERIVED} | {"prose.jinja": shaped.PROSE, GEMMA: template_source(GEMMA)}
    paths = {}
    for name, source in sources.items():
        paths[name] = d / name
        paths[name].write_text(source, encoding="utf-8")
    (d / "strata.toml").write_text(server_config(default_model, paths))
    with Server(["--backend", "cpu", "--config", str(d / "strata.toml")], d / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=600, max_retries=0)


def streamed(api: openai.OpenAI, **kw: Any) -> tuple[str, list[tuple[str, str]], str | None]:
    content, calls, finish = "", {}, None
    for chunk in api.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        content += c.delta.content or ""
        for d in c.delta.tool_calls or ():
            name, args = calls.get(d.index, ("", ""))
            calls[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
        finish = c.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("name", DERIVED)
def test_required_calls_in_a_derived_format(api: openai.OpenAI, name: str) -> None:
    kw: dict[str, Any] = {"model": name, "messages": QUESTION, "tools": TOOLS, "tool_choice": "required",
                          "max_tokens": 120, "temperature": 0}  # fmt: skip
    r = api.chat.completions.create(**kw)
    msg = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or ()]
    assert calls and r.choices[0].finish_reason == "tool_calls", (calls, msg.content, r.choices[0].finish_reason)
    for n, a in calls:
        assert n in ("get_weather", "get_time") and isinstance(json.loads(a), dict)
    assert not (msg.content or "").strip(), msg.content
    assert streamed(api, **kw) == (msg.content or "", calls, "tool_calls")


def test_a_forced_call_cut_short_comes_back_as_written(api: openai.OpenAI) -> None:
    """Gemma 4's forced string ran on until max_tokens and the reply had no call at all."""
    kw: dict[str, Any] = {"model": "google-gemma-4-31B-it", "messages": QUESTION, "tools": CITY, "tool_choice": "required",
                          "max_tokens": 40, "temperature": 0}  # fmt: skip
    r = api.chat.completions.create(**kw)
    calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or ()]
    assert r.choices[0].finish_reason == "length"
    assert [n for n, _ in calls] == ["get_weather"], (calls, r.choices[0].message.content)
    assert set(json.loads(calls[0][1])) <= {"city"}, calls  # the value as far as it was written
    assert streamed(api, **kw) == (r.choices[0].message.content or "", calls, "length")


def test_an_underivable_template_is_served_generic_and_says_why_once(api: openai.OpenAI, server: Server) -> None:
    kw: dict[str, Any] = {"model": "prose", "messages": QUESTION, "tools": TOOLS, "tool_choice": "required",
                          "max_tokens": 24, "temperature": 0}  # fmt: skip
    r = api.chat.completions.create(**kw)  # the generic format's JSON object, forced
    assert r.choices[0].message.tool_calls or r.choices[0].finish_reason == "length", r.choices[0].message.content
    log = server.log.read_text(encoding="utf-8")
    said = [line for line in log.splitlines() if "renders tool calls in no shape" in line]
    assert len(said) == 1 and "prose" in said[0] and "I would use get_weather" in said[0], said
