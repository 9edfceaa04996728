"""Windows that keep the batch's shape on a GPU-like cost model, through the real engine.

The CPU prices a change of shape at nothing, so filler rows are exercised here by giving
the scheduler a GPU's measured costs: rows nearly free up to eight, and a millisecond to
change shape. The windows must then run padded wherever the n-gram index drafts fewer
tokens than the window holds, emit exactly what speculation off emits, and count only
real drafts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from strata_core.build import EngineBuild

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core import protocol as proto
    from strata_core.engine.adaptive import StepCost
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.engine.sampler import SamplingParams
    from strata_core.engine.scheduler import Request, Scheduler

    class GpuLike(StepCost):  # H200, default model: one kernel path up to 8 rows
        switch = 0.001

        def seconds(self, rows):
            return 0.00112 + 0.0001 * (rows - 1) if rows <= 8 else 0.0032 + 0.00003 * (rows - 9)

    m = Llama(ModelOptions(path=MODEL, n_ctx=512, n_seq=2, n_batch=256))
    passage = ("The keeper climbed the ninety steps every night, trimmed the wick, and wrote the "
               "name of every ship in the logbook by the stairs. In winter the storms came from "
               "the north, and the spray reached the windows of the lamp room.")
    text = (f"<|im_start|>user\\nRepeat the following passage exactly, word for word:\\n\\n{passage}"
            "<|im_end|>\\n<|im_start|>assistant\\n")
    prompt = m.tokenize(text.encode(), True, True)
    out = {}
    for k in (0, 7):
        events = []
        sched = Scheduler(m, events.append, adaptive=True, shape_costs=True)
        sched.cost = GpuLike()
        windows = []  # (rows, filler) of each window verified
        verify = sched._verify
        def spy(slot, idx, prop, verify=verify):
            if prop.tokens:
                windows.append((len(prop.tokens), prop.filler))
            verify(slot, idx, prop)
        sched._verify = spy
        params = SamplingParams.from_keys({}, m.n_vocab)
        sched.submit(Request("r", list(prompt), params, 64, frozenset(), None, spec_k=k))
        while sched.busy:
            sched.step()
        done = [e for e in events if isinstance(e, proto.Done)][0]
        out[k] = {"tokens": [e.id for e in events if isinstance(e, proto.Token)],
                  "stats": dict(done.stats), "windows": windows}
    print(json.dumps(out))
    """
)


def test_padded_windows_keep_the_output_and_count_real_drafts(cpu_engine: EngineBuild, default_model: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{cpu_engine.path}{os.pathsep}{Path(__file__).parents[1]}"}
    code = f"MODEL = {str(default_model)!r}\n{SCRIPT}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    off, on = out["0"], out["7"]
    assert on["tokens"] == off["tokens"]
    stats, windows = on["stats"], on["windows"]
    assert len(off["tokens"]) > 30 and len(windows) > 3, on
    assert any(filler for _, filler in windows), on  # windows ran padded with filler rows
    # filler rows are not counted as drafted
    assert int(stats["drafted"]) == sum(rows - filler for rows, filler in windows), on
    assert 0 < int(stats["accepted"]) <= int(stats["drafted"])


GUARD_SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.engine.adaptive import StepCost
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.engine.sampler import SamplingParams
    from strata_core.engine.scheduler import Request, Scheduler

    class FreeRows(StepCost):  # a cost model that is wrong here: rows cost nothing
        def seconds(self, rows):
            return 0.001

    class NoGuard:
        def allows(self, n):
            return True

        def add(self, n, tokens, seconds):
            pass

    m = Llama(ModelOptions(path=MODEL, n_ctx=1024, n_seq=1, n_batch=256))
    line = "the cat sat on the mat and the dog sat on the log and "
    text = (f"<|im_start|>user\\nContinue this with new words: {line * 6}<|im_end|>\\n"
            "<|im_start|>assistant\\n" + line * 2)
    prompt = m.tokenize(text.encode(), True, True)
    out = {}
    for guarded in (False, True):
        steps = []
        sched = Scheduler(m, lambda ev: None, adaptive=True, trace=steps.append)
        sched.cost = FreeRows()
        if not guarded:
            sched.guard = NoGuard()
        params = SamplingParams.from_keys({"temperature": "1.5", "seed": "3"}, m.n_vocab)
        sched.submit(Request("r", list(prompt), params, 240, frozenset(), None, spec_k=7))
        while sched.busy:
            sched.step()
        out[str(guarded)] = [[s.get("windows", 0), s.get("emitted", 0), s["step_ms"]] for s in steps]
    print(json.dumps(out))
    """
)


def test_the_guard_shuts_windows_a_wrong_cost_model_opens(cpu_engine: EngineBuild, default_model: Path) -> None:
    """Windows the cost model proposes but that realise fewer tokens per second than plain
    steps (on two CPU cores eight rows cost several steps, and sampled text at temperature
    1.5 keeps few drafts) are shut by the guard, whatever the model says."""
    env = {**os.environ, "PYTHONPATH": f"{cpu_engine.path}{os.pathsep}{Path(__file__).parents[1]}"}
    code = f"MODEL = {str(default_model)!r}\n{GUARD_SCRIPT}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    unguarded, guarded = out["False"], out["True"]

    def rate(steps: list[list[float]], windowed: bool) -> float:
        chosen = [s for s in steps if bool(s[0]) == windowed]
        return sum(s[1] for s in chosen) / sum(s[2] for s in chosen)

    # the premise: without the guard the model opens windows on most steps, and they lose
    assert sum(1 for s in unguarded if s[0]) > len(unguarded) / 2
    assert rate(unguarded, True) < rate(unguarded, False) or not any(not s[0] for s in unguarded)
    late = guarded[len(guarded) // 2 :]
    assert sum(1 for s in late if s[0]) < len(late) / 5, late
