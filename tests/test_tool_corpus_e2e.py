"""(c) and (d) of the corpus tests (tests/test_tool_formats.py has (a) and (b)): every
tool-reading template of the pinned corpus, carried by a copy of the default model, served
by one ``strata serve`` with a model per template loaded one at a time, driven with the
official client. Parametrised by template file name, so a failure names the family."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server
from strata_core.testing.templates import tool_templates
from strata_core.testing.tool_corpus import check, server_config, write_models

pytestmark = pytest.mark.slow

#: Three families of different kinds (XML parameters, Mistral's [TOOL_CALLS], gpt-oss
#: Harmony) by default: each template costs minutes over HTTP on two CPU cores, the whole
#: corpus hours. STRATA_TOOL_CORPUS=all runs every tool-reading template of the pinned source.
DEFAULT = ("Qwen3-Coder.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja", "openai-gpt-oss-120b.jinja")
ALL = tool_templates()
TEMPLATES = ALL if os.environ.get("STRATA_TOOL_CORPUS") == "all" else [t for t in ALL if t in DEFAULT]


@pytest.fixture(scope="module")
def corpus_server(
    cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("corpus")
    models = write_models(default_model, d / "models", TEMPLATES)
    config = d / "strata.toml"
    config.write_text(server_config(models))
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
