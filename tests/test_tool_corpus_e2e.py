"""(c) and (d) of the corpus tests (tests/test_tool_formats.py has (a) and (b)): every
tool-reading template of the pinned corpus, served by one ``strata serve`` as a model per
template (the default model's GGUF with the template as its ``chat_template``) loaded one
at a time, driven with the official client. Parametrised by template file name, so a
failure names the family."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server
from strata_core.testing.templates import TOOLS, template_source, tool_templates
from strata_core.testing.tool_corpus import (
    QUESTION,
    check,
    model_name,
    server_config,
    write_templates,
)
from strata_core.text.chat import ChatTemplate

pytestmark = pytest.mark.slow

#: Four families of different kinds by default (XML parameters, Mistral's [TOOL_CALLS],
#: gpt-oss Harmony, and a prompt that leaves reasoning open, Qwen3.5): each template costs
#: seconds to a minute over HTTP on two CPU cores, the whole corpus about 16 minutes.
#: STRATA_TOOL_CORPUS=all runs every tool-reading template of the pinned source.
DEFAULT = ("Qwen3-Coder.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja", "openai-gpt-oss-120b.jinja",
           "Qwen3.5-4B.jinja")
ALL = tool_templates()
TEMPLATES = ALL if os.environ.get("STRATA_TOOL_CORPUS") == "all" else [t for t in ALL if t in DEFAULT]


@pytest.fixture(scope="module")
def corpus_server(
    cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("corpus")
    config = d / "strata.toml"
    config.write_text(server_config(default_model, write_templates(d / "templates", TEMPLATES)))
    with Server(["--backend", "cpu", "--config", str(config)], d / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def api(corpus_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=corpus_server.base + "/v1", api_key="none", timeout=600, max_retries=0)


@pytest.mark.parametrize("name", TEMPLATES)
def test_required_streamed_and_history(api: openai.OpenAI, name: str) -> None:
    out = check(api, name)
    assert out.required, out.notes
    assert out.streamed, out.notes
    assert out.history, out.notes


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_model_prompts_with_its_template(corpus_server: Server, api: openai.OpenAI, name: str) -> None:
    """The model named for a template renders its prompt with that template, not the
    GGUF's own: its prompt is as many tokens as the template's rendering (every model
    here shares the one GGUF, so any of them tokenizes that rendering)."""
    r = api.chat.completions.create(model=model_name(name), messages=QUESTION, tools=TOOLS, max_tokens=1)  # type: ignore[arg-type]
    assert r.usage is not None
    engine = httpx.get(corpus_server.base + "/v1/strata/backend", params={"model": model_name(name)}).json()["engine"]
    template = ChatTemplate(template_source(name), bos_token=engine["bos_text"], eos_token=engine["eos_text"])
    setup = template.tool_setup
    assert setup is not None
    mine = template.render(QUESTION, add_generation_prompt=True, tools=setup.tools(TOOLS))
    tokens = httpx.post(corpus_server.base + "/tokenize", json={"content": mine}, timeout=600).json()["tokens"]
    assert r.usage.prompt_tokens == len(tokens), mine
