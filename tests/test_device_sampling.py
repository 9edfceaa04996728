"""Greedy rows picked in the decode (llama.cpp's backend sampling, ``device_sampling``):
the engine then reads a token id per row instead of a logits row, and must emit exactly
what it emits with the argmax taken on the host. Run on the CPU engine, which computes
the same graph a GPU would (the argmax node after the output layer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import EngineProcess

pytestmark = pytest.mark.slow

#: <|im_start|>user\nWhat is a GGUF?<|im_end|>\n<|im_start|>assistant\n, and variations
CHAT = [1, 4093, 198, 1780, 314, 253, 34079, 4198, 47, 2, 198, 1, 520, 9531, 198]
OTHER = [1, 4093, 198, 23722, 549, 260, 2253, 30, 2, 198, 1, 520, 9531, 198]
LONG = CHAT[:-4] + [28, 29, 30, 31, 28, 29, 30, 31] + CHAT[-4:]

#: (rid, prompt, GEN keys): sent together, so their rows share decodes: greedy rows beside
#: rows that need their logits (logprobs, a seeded draw, penalties, bias), and an n-gram
#: window of several rows of one sequence
MIXED = [
    ("plain", CHAT, {"max_tokens": 24}),
    ("logprobs", OTHER, {"max_tokens": 24, "logprobs": 3}),
    ("seeded", CHAT, {"max_tokens": 24, "temperature": 0.9, "seed": 7}),
    ("penalised", OTHER, {"max_tokens": 24, "penalty_repeat": 1.3}),
    ("ngram", LONG, {"max_tokens": 24, "spec": "ngram"}),
    # greedy after a logit bias, also picked in the decode: ignore_eos's (-inf on the
    # end-of-generation tokens) and one that moves the argmax
    ("no-eos", OTHER, {"max_tokens": 24, "bias": "0:-inf,2:-inf,4:-inf"}),
    ("biased", CHAT, {"max_tokens": 24, "bias": "28:6.5,30:-inf"}),
]


def run_together(engine: EngineProcess, gens: list[tuple[str, list[int], dict[str, object]]]) -> dict[str, list[str]]:
    """Send every GEN, then read until each is done: each request's events, as lines."""
    for rid, prompt, keys in gens:
        engine.send(proto.Gen(rid, {k: str(v) for k, v in keys.items()}, tuple(prompt)))
    events: dict[str, list[str]] = {rid: [] for rid, _, _ in gens}
    open_ = set(events)
    while open_:
        ev = engine.next_event()
        rid = getattr(ev, "rid", None)
        if rid not in events:
            continue
        if isinstance(ev, proto.Done):  # its reason; the stats hold timings
            events[rid].append(f"DONE {ev.reason} gen={ev.stats['gen']}")
            open_.discard(rid)
        else:
            events[rid].append(proto.encode_event(ev))
    return events


def transcript(engine: EngineProcess) -> dict[str, list[str]]:
    out = run_together(engine, MIXED)
    # the same prompt again: its first token from what the cache kept (on the device: the
    # token, not a row), then with logprobs, which needs the row the device did not send
    # ... and under a bias, which must not take the first token picked without it
    for rid, keys in (("again", {"max_tokens": 16}), ("again-logprobs", {"max_tokens": 16, "logprobs": 2}),
                      ("again-biased", {"max_tokens": 16, "bias": "28:6.5,30:-inf"}),
                      ("again-biased-2", {"max_tokens": 16, "bias": "28:6.5,30:-inf"})):  # fmt: skip
        out.update(run_together(engine, [(rid, CHAT, keys)]))
    out.update(run_together(engine, [(f"c{i}", p, {"max_tokens": 16}) for i, p in enumerate([CHAT, OTHER, LONG])]))
    return out


@pytest.fixture(scope="module")
def transcripts(cpu_engine: EngineBuild, default_model: Path) -> Iterator[dict[bool, dict[str, list[str]]]]:
    runs: dict[bool, dict[str, list[str]]] = {}
    for on in (False, True):
        engine = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=3, device_sampling=on, spec_k=4)
        try:
            assert engine.ready.info["device_sampling"] is on
            runs[on] = transcript(engine)
        finally:
            engine.close()
    yield runs


def test_the_same_events_as_the_host_argmax(transcripts: dict[bool, dict[str, list[str]]]) -> None:
    host, device = transcripts[False], transcripts[True]
    assert list(device) == list(host)
    for rid in host:
        assert device[rid] == host[rid], rid
    # the runs are not trivially equal: the requests wrote different things
    tokens = {rid: [line.split()[2] for line in lines if line.startswith("T ")] for rid, lines in host.items()}
    assert len(tokens["plain"]) >= 8 and tokens["plain"] != tokens["seeded"] != tokens["penalised"]
    assert tokens["biased"] != tokens["plain"] and "30" not in tokens["biased"]
    assert tokens["again-biased"] == tokens["again-biased-2"]  # the second from the first's kept pick
    assert any(line.startswith("LP ") for line in host["logprobs"]) and len(tokens["no-eos"]) == 24


def test_off_by_default_on_the_cpu(cpu_engine: EngineBuild, default_model: Path) -> None:
    engine = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1)
    try:
        assert engine.ready.info["device_sampling"] is False
    finally:
        engine.close()
