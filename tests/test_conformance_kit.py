"""The conformance kit runs green against the CPU reference backend (issue 7)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_kit_passes_on_cpu(cpu_engine) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "strata_core.testing", "--strata-backend", "cpu",
         "-q", "-p", "no:cacheprovider", "-rA"],
        capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "largest |Δ logprob|" in out
    assert " failed" not in out.splitlines()[-1], out[-2000:]


def test_kit_requires_a_backend() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "strata_core.testing", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert "--strata-backend" in done.stdout + done.stderr
