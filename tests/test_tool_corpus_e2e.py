"""(c) and (d) of the corpus tests (tests/test_tool_formats.py has (a) and (b)): every
tool-reading template of the pinned corpus, carried by a copy of the default model, served
by one ``strata serve`` with a model per template loaded one at a time, driven with the
official client. Parametrised by template file name, so a failure names the family."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from strata_core.build import EngineBuild
from strata_core.testing.harness import Server
from strata_core.testing.templates import tool_templates
from strata_core.testing.tool_corpus import check, server_config, write_models

pytestmark = pytest.mark.slow

TEMPLATES = tool_templates()


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
