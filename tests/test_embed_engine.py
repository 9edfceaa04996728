"""The engine's ``EMBED`` command on the real engine: READY's facts, a vector of n_embd
finite floats that does not depend on what was embedded before, and an ``ERR`` (never a
dead engine) for token ids it cannot embed."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import EngineProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(cpu_engine: EngineBuild, default_model: Path):  # type: ignore[no-untyped-def]
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1)
    yield e
    e.close()


def embed(engine: EngineProcess, rid: str, ids: list[int]) -> proto.Embedding | proto.Error:
    engine.send(proto.Embed(rid, tuple(ids)))
    ev = engine.next_event()
    assert isinstance(ev, (proto.Embedding, proto.Error)) and ev.rid == rid, ev
    return ev


def test_ready_says_how_it_embeds(engine: EngineProcess) -> None:
    info = engine.ready.info
    assert "embeddings" in info["capabilities"]
    assert info["embeddings"] == {"pooling": "mean", "max_tokens": 256}  # the harness's n_batch
    assert info["n_embd"] > 0


def test_each_input_alone(engine: EngineProcess) -> None:
    first = embed(engine, "a", [504, 2644, 2643])
    assert isinstance(first, proto.Embedding) and len(first.vector) == engine.ready.info["n_embd"]
    embed(engine, "b", list(range(100, 300)))  # a longer input between: its memory is cleared
    again = embed(engine, "c", [504, 2644, 2643])
    assert isinstance(again, proto.Embedding) and again.vector == first.vector
    other = embed(engine, "d", [504, 2644, 2644])
    assert isinstance(other, proto.Embedding) and other.vector != first.vector


def test_bad_inputs_are_errors_not_deaths(engine: EngineProcess) -> None:
    n_vocab, most = engine.ready.info["n_vocab"], engine.ready.info["embeddings"]["max_tokens"]
    outside = embed(engine, "x", [1, n_vocab])
    assert isinstance(outside, proto.Error) and "outside the vocabulary" in outside.message
    long = embed(engine, "y", [1] * (most + 1))
    assert isinstance(long, proto.Error) and f"1..{most} tokens" in long.message
    assert isinstance(embed(engine, "z", [1] * most), proto.Embedding)
