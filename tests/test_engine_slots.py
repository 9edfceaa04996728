"""Slots on the real engine: a new request starts from the longest cached prefix, its own
slot's, a copy of another slot's, or one saved in host memory, and a copy computes what a
fresh prefill would; on a CPU, prompts waiting together are prefilled shortest first."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import EngineProcess, run_engine_script

pytestmark = pytest.mark.slow

PREAMBLE = "You are a careful assistant. Answer in full sentences and cite your sources. " * 4


@pytest.fixture(scope="module")
def engine(cpu_engine: EngineBuild, default_model: Path) -> Iterator[EngineProcess]:
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=2)
    yield e
    e.close()


def tokenize(engine: EngineProcess, text: str) -> list[int]:
    engine.send(proto.Tokenize("tk", text, True))
    return list(engine.expect(proto.Tokens).ids)


def outcome(events: list[proto.Event]) -> tuple[list[int], int]:
    done = events[-1]
    assert isinstance(done, proto.Done) and done.reason in ("stop", "length"), done
    return [e.id for e in events if isinstance(e, proto.Token)], int(done.stats["cached"])


def test_a_new_request_copies_the_prefix_a_busy_slot_holds(engine: EngineProcess) -> None:
    shared = tokenize(engine, PREAMBLE)
    assert len(shared) > 16  # the scheduler's COPY_MIN_GAIN: worth a copy
    first = shared + tokenize(engine, " Question: what is a lighthouse?")[1:]
    second = shared + tokenize(engine, " Question: name three rivers.")[1:]

    # Alone, on an empty slot: the reference output, with nothing cached.
    ref, cached = outcome(engine.run("ref", second, max_tokens=12))
    assert cached == 0

    # `first` takes the slot that holds the preamble and keeps it busy; `second` then gets
    # the other slot, which holds nothing it shares, and starts from a copy of the busy one.
    engine.send(proto.Gen("busy", {"max_tokens": "400"}, tuple(first)))
    while not isinstance(ev := engine.next_event(), proto.Token):
        assert not isinstance(ev, proto.Done | proto.Error), ev
    events = engine.run("copied", second, max_tokens=12)
    engine.send(proto.Cancel("busy"))
    got, cached = outcome(events)
    assert cached >= len(shared) - 1
    assert got == ref  # greedy: the copied cache computes what a fresh prefill computed
    while not (isinstance(ev := engine.next_event(), proto.Done) and ev.rid == "busy"):
        pass


@pytest.mark.parametrize("mib", [256, 0], ids=["saved", "no-host-cache"])
def test_a_prompt_whose_slot_moved_on_is_loaded_from_host_memory(
    cpu_engine: EngineBuild, default_model: Path, mib: int
) -> None:
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=1, prompt_cache_mib=mib)
    try:
        shared = tokenize(e, PREAMBLE)
        first = shared + tokenize(e, " Question: what is a lighthouse?")[1:]
        ref, cached = outcome(e.run("ref", first, max_tokens=12))
        assert cached == 0
        # asked again (a conversation going on): its cache was reused, so it is worth saving
        _, cached = outcome(e.run("reused", first, max_tokens=12))
        assert cached >= len(first) - 1
        # the only slot moves on to a prompt sharing nothing with the first
        outcome(e.run("other", tokenize(e, "Write a haiku about the sea. " * 8), max_tokens=4))
        got, cached = outcome(e.run("again", first, max_tokens=12))
        assert got == ref
        if mib:
            assert cached >= len(first) - 1  # the whole prompt but its last token came back
        else:
            assert cached <= 1
    finally:
        e.close()


PREFILL_SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.contract import protocol as proto
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

    m = Llama(ModelOptions(path=MODEL, n_ctx=512, n_seq=3, n_batch=256))
    def chat(text):
        return m.tokenize(f"<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n".encode(), True, True)
    prompts = {
        "long": chat("Tell me, in as much detail as you can, how a steam engine turns the heat of burning "
                     "coal into the motion of a train's wheels, and why it needs so much water."),
        "short": chat("Say hello to my friend Anna and to her brother Tom from me."),
        "mid": chat("Name three rivers in Europe, one in Africa and one in Asia, with the seas they reach."),
    }
    events, steps = [], []
    sched = Engine(m, events.append, trace=steps.append)
    for rid, p in prompts.items():
        sched.submit(Request(rid, list(p), SamplingParams(), 4, frozenset(), None))
    first, n = {}, 0
    while sched.busy:
        sched.step()
        n += 1
        for e in events:
            if isinstance(e, proto.Token):
                first.setdefault(e.rid, n)
    print(json.dumps({"lengths": {r: len(p) for r, p in prompts.items()}, "first": first,
                      "prefill": [s.get("prefill_rows", 0) for s in steps]}))
    """
)


def test_on_a_cpu_the_shortest_waiting_prompt_is_answered_first(cpu_engine: EngineBuild, default_model: Path) -> None:
    """Prompt rows cost a CPU about the same with or without others beside them, so three
    prompts that arrive together are prefilled shortest first, each in its own step, and
    each gets its first token in that step, not after all three."""
    out = run_engine_script(PREFILL_SCRIPT, cpu_engine, default_model)
    lengths, first = out["lengths"], out["first"]
    assert lengths["short"] < lengths["mid"] < lengths["long"], out
    assert first["short"] < first["mid"] < first["long"], out
    assert max(out["prefill"]) < lengths["long"] + lengths["mid"], out  # never two of the longer ones at once


REPEAT_SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.contract import protocol as proto
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

    m = Llama(ModelOptions(path=MODEL, n_ctx=512, n_seq=2, n_batch=256))
    prompt = m.tokenize(b"<|im_start|>user\\nWhy is the sky blue?<|im_end|>\\n<|im_start|>assistant\\n", True, True)
    events, steps = [], []
    sched = Engine(m, events.append, trace=steps.append)
    runs = {}
    for rid in ("first", "again"):
        events.clear()
        sched.submit(Request(rid, list(prompt), SamplingParams(), 6, frozenset(), 5))
        while sched.busy:
            sched.step()
        done = [e for e in events if isinstance(e, proto.Done)][0]
        runs[rid] = {"tokens": [e.id for e in events if isinstance(e, proto.Token)],
                     "logprobs": [[e.logprob, e.top] for e in events if isinstance(e, proto.Logprob)],
                     "cached": int(done.stats["cached"])}
    print(json.dumps({"n": len(prompt), "runs": runs,
                      "steps": [{k: s.get(k, 0) for k in ("prefill_rows", "rows", "emitted")} for s in steps]}))
    """
)


def test_a_prompt_asked_again_takes_its_first_token_from_the_row_kept(cpu_engine: EngineBuild, default_model: Path) -> None:
    """A prompt's first token comes from its last chunk's last row: the step that
    prefills the prompt emits it, with no decode rows. Asked again, the same prompt finds
    itself cached whole with that row and is sampled from it, computing nothing, so its
    tokens and logprobs are those of the first time, bit for bit."""
    out = run_engine_script(REPEAT_SCRIPT, cpu_engine, default_model)
    n, first, again = out["n"], out["runs"]["first"], out["runs"]["again"]
    assert first["cached"] == 0 and again["cached"] == n, out
    assert again["tokens"] == first["tokens"] and again["logprobs"] == first["logprobs"], out
    emitting = [s for s in out["steps"] if s["emitted"]]
    assert emitting[0] == {"prefill_rows": n, "rows": 0, "emitted": 1}, out  # the prompt, its first token
    repeat = emitting[len(first["tokens"])]  # the first step of the repeat that emitted a token
    assert repeat == {"prefill_rows": 0, "rows": 0, "emitted": 1}, out  # sampled, nothing computed


SAVE_SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request
    from strata_core.engine.prompt_cache import common_prefix

    m = Llama(ModelOptions(path=MODEL, n_ctx=512, n_seq=4, n_batch=512))
    system = "You are a ship's cook who answers every question with a recipe and a song. " * 3
    def chat(n):  # alike: each cache holds about as much past what the prompts share
        text = f"<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\nQuestion {n}.<|im_end|>\\n<|im_start|>assistant\\n"
        return m.tokenize(text.encode(), True, True)
    n_shared = common_prefix(chat(1), chat(2))  # what a new request keeps of a slot's cache
    sched = Engine(m, lambda ev: None, saved_bytes=1 << 30)

    def burst(*names):
        for name in names:
            sched.submit(Request(name, list(chat(name)), SamplingParams(), 24, frozenset(), None))
        while sched.busy:
            sched.step()
        return len(sched.scheduler.saved.entries)

    out = {"warm-up": burst(10)}
    out["a"] = burst(1, 2, 3, 4)  # each starts from the cached system prompt: worth saving later
    lost = [len(s.cached) - n_shared for s in sched.slots]
    # a GPU's costs: prefilling what any slot would lose costs more than a copy and less
    # than two, so one request waiting for the copy is worth it, two or more are not
    sched.scheduler.prefill_secs, sched.scheduler.copy_secs = 1e-4, max(lost) * 1e-4 / 1.9
    out["b"] = burst(5, 6, 7, 8)
    out["lost"] = [min(lost), max(lost)]
    # idle: the free slots' caches go to host memory one a call, till none is left
    sched.scheduler.prefill_secs, sched.scheduler.copy_secs = 1e-3, 1e-6
    calls = [sched.save_idle() for _ in range(6)]
    out["idle"] = [calls, len(sched.scheduler.saved.entries)]
    out["c"] = burst(11, 12, 13, 14)  # their caches are saved already: no copy on admission
    print(json.dumps(out))
    """
)


def test_a_burst_waits_for_no_copy_that_costs_it_more_than_it_saves(cpu_engine: EngineBuild, default_model: Path) -> None:
    """A slot's cache is copied to host memory before a new request takes the slot only when
    the prefill it may save beats the wait of every request queued for the copy; while the
    engine idles, the free slots' caches are saved one at a time, so requests to come find
    them saved."""
    out = run_engine_script(SAVE_SCRIPT, cpu_engine, default_model)
    lo, hi = out["lost"]
    assert lo >= 16 and hi < 1.9 * lo, out  # caches alike enough for the costs to split as meant
    assert out["warm-up"] == 0 and out["a"] == 0, out  # nothing reused before: nothing saved
    assert out["b"] == 1, out  # four requests in a burst: only the last one, waited for alone, copies
    assert out["idle"] == [[True, True, True, True, False, False], 5], out
    assert out["c"] == 5, out
