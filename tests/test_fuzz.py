"""Issue 14, item 3: property-based fuzzing of the HTTP API from its own OpenAPI document
(schemathesis): requests that follow the request models' schemas and requests that break
them, against a real server. No answer may be a 5xx, and every answer must match the
document (status, content type, body schema, headers).

A bounded run here (STRATA_FUZZ_EXAMPLES per operation, 40 by default), the same examples
on every run of one commit (hypothesis derandomized), so the suite is reproducible;
``nox -s fuzz`` runs it longer on fresh random examples (STRATA_FUZZ_RANDOM=1)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from strata_core.ops.build import EngineBuild  # noqa: E402

pytestmark = pytest.mark.slow

N_CTX = 256
#: Longest reply a fuzzed request may ask for, so hundreds of them take seconds each at most.
MAX_TOKENS = 4
EXAMPLES = int(os.environ.get("STRATA_FUZZ_EXAMPLES", "40"))
RANDOM = os.environ.get("STRATA_FUZZ_RANDOM") == "1"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def fuzzed_server(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from strata_core.testing.harness import Server

    # a request that names no max_tokens gets the operator's default, not the whole context
    # /api/pull and /api/delete act on an empty hub cache of its own, offline
    hf = tmp_path_factory.mktemp("hf")
    env = {"STRATA_SAMPLING_MAX_TOKENS": str(MAX_TOKENS), "HF_HOME": str(hf), "HF_HUB_OFFLINE": "1"}
    args = ["--backend", "cpu", "--parallel", "2", "--n-ctx", str(N_CTX)]
    with Server(args, tmp_path_factory.mktemp("fuzz") / "server.log", env=env) as srv:
        yield srv.base


@pytest.fixture(scope="module")
def api(fuzzed_server: str) -> Any:
    return schemathesis.openapi.from_url(f"{fuzzed_server}/openapi.json")


def short(body: Any) -> None:
    """Cap the reply's length where a fuzzed body asks for a long one that fits the context
    (a longer ask is still sent: it must be refused)."""
    if isinstance(body, dict):
        options = body.get("options")  # Ollama's routes
        for where, key in [(body, "max_tokens"), (body, "max_completion_tokens"), (options, "num_predict")]:
            value = where.get(key) if isinstance(where, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and MAX_TOKENS < value <= N_CTX:
                where[key] = MAX_TOKENS  # type: ignore[index]
        if isinstance(options, dict) and options.get("num_predict", -1) in (-1, -2):
            options["num_predict"] = MAX_TOKENS  # Ollama's "no limit": the whole context


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api(api: Any, mode: GenerationMode) -> None:
    """EXAMPLES cases for every operation (negative ones only where there is a body to break)."""
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/v1/models", "/api/chat"}
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not RANDOM,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case: Any) -> None:
            short(case.body)
            case.call_and_validate(checks=CHECKS, timeout=120)

        fuzz()
