"""Fixtures that start the real engine and a real server on loopback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from strata_core.backends.cpu import CpuBackend
from strata_core.ops.build import EngineBuild, ensure_engine
from strata_core.ops.config import load_config
from strata_core.ops.models import default_model_path
from strata_core.testing.harness import Server
from strata_core.text.grammars import _byte_tokenizer

# Property tests check results, never speed: on a loaded two-core machine (a test server
# decoding beside them) an example's time says nothing, so no example has a deadline.
# Speed is measured in bench/, against peers in the same run.
settings.register_profile("strata", deadline=None)
settings.load_profile("strata")


@pytest.fixture(scope="session")
def cpu_engine() -> EngineBuild:
    """The CPU engine, built once and cached under $STRATA_HOME (or the operator's
    ``engine.llama_cpp``, e.g. STRATA_ENGINE_LLAMA_CPP, when set)."""
    llama_cpp = load_config().engine.llama_cpp
    return ensure_engine(CpuBackend(), llama_cpp, log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def llama_cpp_site(cpu_engine: EngineBuild) -> Path:
    return cpu_engine.path


@pytest.fixture(scope="session")
def default_model() -> Path:
    return default_model_path()


#: Blocks a draft model keeps of the default model's 30: self-speculation sharing the
#: vocabulary, with enough agreement that windows accept drafts and reject others.
DRAFT_LAYERS = 28


@pytest.fixture(scope="session")
def draft_model(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from strata_core.testing.models import write_truncated

    path = tmp_path_factory.mktemp("draft") / f"draft-{DRAFT_LAYERS}.gguf"
    write_truncated(default_model, path, DRAFT_LAYERS)
    return path


@pytest.fixture(scope="session")
def server(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with Server(["--backend", "cpu", "--parallel", "4", "--n-ctx", "1024"], log) as srv:
        yield srv


@pytest.fixture(scope="session")
def tools_server(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model carrying a Hermes/Qwen style template that shows it tools and, with
    ``enable_thinking``, opens ``<think>`` (test_tools_e2e.TOOLS_TEMPLATE)."""
    from test_tools_e2e import TOOLS_TEMPLATE

    from strata_core.testing.models import write_with_template

    d = tmp_path_factory.mktemp("tools")
    model = d / "smollm2-tools.gguf"
    write_with_template(default_model, model, TOOLS_TEMPLATE)
    with Server(["--backend", "cpu", "--model", str(model), "--parallel", "4", "--n-ctx", "2048"], d / "server.log") as srv:
        yield srv


@pytest.fixture()
def client(server: Server):  # type: ignore[no-untyped-def]
    import openai

    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The 256 bytes and an end token: a matcher fed a text's bytes checks the text itself."""
    return _byte_tokenizer()
