"""The conformance kit's pytest plugin (registered through the ``pytest11`` entry point).

    pytest --pyargs strata_core.testing --strata-backend cuda [--strata-model M.gguf]
           [--strata-reference ref.json]

runs a fixed suite against that backend's real engine. Numeric parity compares with a
recorded CPU reference (``python -m strata_core.testing.reference``) or, without one,
with a live run of the CPU engine on the same model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata_core.ops.backend_spec import Backend
from strata_core.ops.build import EngineBuild, ensure_engine
from strata_core.ops.models import resolve_model
from strata_core.ops.plugins import load_registry
from strata_core.testing.harness import EngineProcess, Server

#: Lines for the terminal summary: what parity measured.
REPORT: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("strata", "Strata backend conformance kit")
    g.addoption("--strata-backend", help="backend to check (cpu, cuda, hip, sycl, metal, ...)")
    g.addoption("--strata-model", default="default", help="GGUF model (default: the embedded one)")
    g.addoption("--strata-reference", help="recorded CPU reference (JSON); default: run the CPU live")
    g.addoption("--strata-max-dlogprob", type=float, default=0.02, help="parity bound on |Δ logprob|")
    g.addoption("--strata-tie-margin", type=float, default=0.05,
                help="a greedy divergence is accepted only where the reference's top-2 margin is below this")  # fmt: skip


def _backend(config: pytest.Config) -> Backend:
    name = config.getoption("--strata-backend")
    if not name:
        raise pytest.UsageError("the conformance kit needs --strata-backend NAME")
    return load_registry().get(name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kit = [item for item in items if Path(str(item.path)).parent == Path(__file__).parent]
    if not kit:
        return
    backend = _backend(config)
    for item in kit:
        reason = backend.expected_failures.get(getattr(item, "originalname", item.name))
        if reason:
            item.add_marker(pytest.mark.xfail(reason=f"declared by {backend.name}: {reason}", strict=True))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("strata conformance")
        for line in REPORT:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def kit_backend(pytestconfig: pytest.Config) -> Backend:
    return _backend(pytestconfig)


@pytest.fixture(scope="session")
def kit_build(kit_backend: Backend) -> EngineBuild:
    probe = kit_backend.probe()
    if not probe.ok:
        pytest.fail(f"backend {kit_backend.name!r} cannot run here: {probe.reason}")
    return ensure_engine(kit_backend, log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def kit_model(pytestconfig: pytest.Config) -> Path:
    return resolve_model(pytestconfig.getoption("--strata-model")).path


@pytest.fixture(scope="module")
def kit_engine(kit_backend: Backend, kit_build: EngineBuild, kit_model: Path) -> Iterator[EngineProcess]:
    engine = EngineProcess(kit_backend, kit_build, kit_model)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def kit_server(
    kit_backend: Backend, kit_build: EngineBuild, kit_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("kit") / "server.log"
    with Server(["--backend", kit_backend.name, "--model", str(kit_model), "--parallel", "4", "--n-ctx", "1024"], log) as srv:
        yield srv


@pytest.fixture(scope="session")
def kit_reference(pytestconfig: pytest.Config, kit_model: Path) -> dict[str, Any]:
    from strata_core.ops.hub import sha256_of
    from strata_core.testing.reference import greedy_runs

    path = pytestconfig.getoption("--strata-reference")
    if path:
        record: dict[str, Any] = json.loads(Path(path).read_text())
        digest = sha256_of(kit_model)
        if record["model_sha256"] != digest:
            pytest.fail(f"the reference was recorded on another model ({record['model_sha256'][:12]} != {digest[:12]})")
        return record
    from dataclasses import asdict

    from strata_core.backends.cpu import CpuBackend

    cpu = CpuBackend()
    engine = EngineProcess(cpu, ensure_engine(cpu), kit_model)
    try:
        return {"runs": [asdict(r) for r in greedy_runs(engine)]}
    finally:
        engine.close()
