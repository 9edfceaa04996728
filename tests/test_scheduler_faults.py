"""A request the scheduler has taken off its queue always ends with DONE, even when
llama.cpp refuses the cache operations that start it: a request that vanished would leave
its client waiting for ever and the engine idle (the stall
bench/results/2026-12-04-cuda-h200-a14504e.md records)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import run_engine_script

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.contract import protocol as proto
    from strata_core.engine.llama import Llama, LlamaError, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

    m = Llama(ModelOptions(path=MODEL, n_ctx=512, n_seq=2, n_batch=256))
    prompt = m.tokenize(b"<|im_start|>user\\nSay hello.<|im_end|>\\n<|im_start|>assistant\\n", True, True)
    trim, calls = m.seq_trim, []

    def refuse_first(seq, keep):  # llama.cpp refusing to trim, once, as it may on a device
        calls.append((seq, keep))
        if len(calls) == 1:
            raise LlamaError(f"could not trim sequence {seq} to {keep}")
        trim(seq, keep)

    m.seq_trim = refuse_first
    events = []
    sched = Engine(m, events.append)
    for rid in ("a", "b", "c"):
        sched.submit(Request(rid, list(prompt), SamplingParams(), 8, frozenset(), None))
    steps = 0
    while sched.busy and steps < 200:
        sched.step()
        steps += 1
    print(json.dumps({
        "busy": sched.busy,
        "done": {e.rid: e.reason for e in events if isinstance(e, proto.Done)},
        "errors": {e.rid: e.message for e in events if isinstance(e, proto.Error)},
        "tokens": {rid: sum(1 for e in events if isinstance(e, proto.Token) and e.rid == rid) for rid in "abc"},
    }))
    """
)


def test_a_request_whose_start_fails_ends_with_an_error(cpu_engine: EngineBuild, default_model: Path) -> None:
    out = run_engine_script(SCRIPT, cpu_engine, default_model)
    assert not out["busy"]
    assert out["done"] == {"a": "error", "b": "length", "c": "length"}
    assert "could not start the request" in out["errors"]["a"] and set(out["errors"]) == {"a"}
    assert out["tokens"] == {"a": 0, "b": 8, "c": 8}


EVICTED = textwrap.dedent(
    """
    import json
    from strata_core.contract import protocol as proto
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

    m = Llama(ModelOptions(path=MODEL, n_ctx=1024, n_seq=1, n_batch=256))

    def chat(system, user):
        text = f"<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n"
        return m.tokenize(text.encode(), True, True)

    x = "You are a ship's cook who answers every question with a recipe. " * 6
    y = "You are a lighthouse keeper who counts the waves before each answer. " * 6
    events = []
    sched = Engine(m, events.append, saved_bytes=1 << 30)
    log = {}

    def run(rid, prompt):
        sched.submit(Request(rid, list(prompt), SamplingParams(), 4, frozenset(), None))
        while sched.busy:
            sched.step()
        log[rid] = len(sched.scheduler.saved.entries)

    run("x1", chat(x, "Soup?"))
    run("x2", chat(x, "Bread?"))  # reuses x's cache: the slot's cache is worth saving
    run("y1", chat(y, "Storm?"))  # x's cache goes to host memory
    # room for one saved state only: saving y's below evicts x's, the one about to load
    sched.scheduler.saved.capacity = sched.scheduler.saved.size + sched.scheduler.saved.size // 2
    run("y2", chat(y, "Fog?"))
    run("x3", chat(x, "Pie?"))
    print(json.dumps({
        "done": {e.rid: e.reason for e in events if isinstance(e, proto.Done)},
        "errors": {e.rid: e.message for e in events if isinstance(e, proto.Error)},
        "saved": log,
        "cached": {e.rid: int(e.stats["cached"]) for e in events if isinstance(e, proto.Done)},
    }))
    """
)


def test_a_saved_prompt_evicted_while_placing_its_request_is_not_used(
    cpu_engine: EngineBuild, default_model: Path
) -> None:
    """Placing a request looks up the saved prompt it will load, then saves what the slot
    held; when that save evicts the entry for room, the request must not load it (the soak
    lost a request to 'list.remove(x): x not in list' there) and still starts."""
    out = run_engine_script(EVICTED, cpu_engine, default_model)
    assert out["errors"] == {}, out
    assert sorted(out["done"]) == ["x1", "x2", "x3", "y1", "y2"]
    assert set(out["done"].values()) <= {"length", "stop"}
    assert out["saved"]["y1"] == 1 and out["saved"]["x3"] == 1  # the eviction did happen
    assert out["cached"]["x2"] > 16 and out["cached"]["y2"] > 16
