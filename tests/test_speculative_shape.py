"""Windows that keep the batch's shape on a GPU-like cost model, through the real engine.

The CPU prices a change of shape at nothing, so filler rows are exercised here by giving
the scheduler a GPU's measured costs: rows nearly free up to eight, and a millisecond to
change shape. The windows must then run padded wherever the n-gram index drafts fewer
tokens than the window holds, emit exactly what speculation off emits, and count only
real drafts.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import run_engine_script as run_script

pytestmark = pytest.mark.slow


SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.contract import protocol as proto
    from strata_core.engine.speculation.cost import StepCost
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

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
        sched = Engine(m, events.append, adaptive=True, shape_costs=True)
        sched.spec.cost = GpuLike()
        windows = []  # (rows, filler) of each window verified
        judge = sched.spec.judge
        def spy(slot, prop, rows, judge=judge):
            if prop.tokens:
                windows.append((len(prop.tokens), prop.filler))
            judge(slot, prop, rows)
        sched.spec.judge = spy
        params = SamplingParams()
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
    out = run_script(SCRIPT, cpu_engine, default_model)
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
    from strata_core.engine.speculation.cost import StepCost
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

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
        # a GPU's sizing: a window once open is kept, padded with filler, while rows look free
        sched = Engine(m, lambda ev: None, adaptive=True, shape_costs=True, trace=steps.append)
        sched.spec.cost = FreeRows()
        if not guarded:
            sched.spec.guard = NoGuard()
        params = SamplingParams(temperature=1.5, seed=3)
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
    out = run_script(GUARD_SCRIPT, cpu_engine, default_model)
    unguarded, guarded = out["False"], out["True"]

    def rate(steps: list[list[float]], windowed: bool) -> float:
        chosen = [s for s in steps if bool(s[0]) == windowed]
        return sum(s[1] for s in chosen) / sum(s[2] for s in chosen)

    # the premise: without the guard the model opens windows on most steps, and they lose
    assert sum(1 for s in unguarded if s[0]) > len(unguarded) / 2
    assert rate(unguarded, True) < rate(unguarded, False) or not any(not s[0] for s in unguarded)
    late = guarded[len(guarded) // 2 :]
    assert sum(1 for s in late if s[0]) < len(late) / 5, late


JUDGED_SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.engine.speculation.cost import StepCost
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

    class Rows(StepCost):
        def __init__(self, per_row):
            super().__init__()
            self.per_row = per_row

        def seconds(self, rows):
            return 0.001 + self.per_row * (rows - 1)

    class Refusing:  # windows shut; counts what it is taught
        def __init__(self):
            self.taught = 0

        def allows(self, n):
            return False

        def add(self, n, tokens, seconds):
            self.taught += 1

    m = Llama(ModelOptions(path=MODEL, n_ctx=1024, n_seq=1, n_batch=256))
    passage = ("The keeper climbed the ninety steps every night, trimmed the wick, and wrote the "
               "name of every ship in the logbook by the stairs.")
    text = (f"<|im_start|>user\\nRepeat the following passage exactly, word for word:\\n\\n{passage}"
            "<|im_end|>\\n<|im_start|>assistant\\n")
    prompt = m.tokenize(text.encode(), True, True)
    out = {}
    for name, per_row in (("free", 0.0), ("costly", 1.0)):
        steps = []
        sched = Engine(m, lambda ev: None, adaptive=True, trace=steps.append)
        sched.spec.cost = Rows(per_row)
        sched.spec.guard = guard = Refusing()
        req = Request("r", list(prompt), SamplingParams(), 40, frozenset(), None, spec_k=7)
        sched.submit(req)
        while sched.busy:
            sched.step()
        out[name] = {"taught": guard.taught, "steps": len(steps), "tested": req.acceptance.whole,
                     "windows": sum(1 for s in steps if s.get("windows"))}
    print(json.dumps(out))
    """
)


def test_the_guard_is_taught_only_by_steps_that_would_open_windows(
    cpu_engine: EngineBuild, default_model: Path
) -> None:
    """A step in which the cost model proposes no window runs the same with windows allowed
    or not, so it must not move the guard: on the H200 the open-ended text's plain steps
    once decided, by noise, that windows lose, and shut them for the copy-heavy text after
    it (x1.19 where the first round had realised x1.6). Drafts the guard refuses are still
    scored as shadows, so acceptance keeps learning while windows are shut."""
    out = run_script(JUDGED_SCRIPT, cpu_engine, default_model)
    free, costly = out["free"], out["costly"]
    assert free["windows"] == 0 and costly["windows"] == 0  # the guard refused every window
    # rows cost a second each: no window is ever worth proposing, nothing is judged
    assert costly["taught"] == 0 and costly["steps"] > 20, costly
    # rows free: copying, most steps propose one; those (and only those) are judged
    assert 0 < free["taught"] < free["steps"], free
    assert free["tested"] != 2.0, free  # the refused drafts were scored as shadows (2.0: none)


GAP_SCRIPT = textwrap.dedent(
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
    prompts = [chat("Name three rivers."), chat("Say hi."), chat("Count to ten.")]
    params = SamplingParams()
    out = {}
    for gpu_like in (False, True):
        for seq in range(3):
            m.seq_trim(seq, 0)
        events, steps = [], []
        sched = Engine(m, events.append, shape_costs=gpu_like, trace=steps.append)
        for i, (p, n) in enumerate(zip(prompts, (40, 2, 40))):  # the middle slot finishes first
            sched.submit(Request(f"r{i}", list(p), params, n, frozenset(), None))
        while sched.busy:
            sched.step()
        sched.submit(Request("again", list(prompts[1]), params, 2, frozenset(), None))  # slot 1's cache
        while sched.busy:
            sched.step()
        tokens = {}
        for e in events:
            if isinstance(e, proto.Token):
                tokens.setdefault(e.rid, []).append(e.id)
        cached = [e.stats["cached"] for e in events if isinstance(e, proto.Done) and e.rid == "again"]
        parts = sorted({s["micro_batches"] for s in steps if s.get("seqs") == [0, 2]})
        out[str(gpu_like)] = {"tokens": tokens, "cached": cached[0], "parts": parts}
    print(json.dumps(out))
    """
)


def test_a_gap_between_decoding_slots_is_filled_on_a_gpu(cpu_engine: EngineBuild, default_model: Path) -> None:
    """Slots 0 and 2 decode while slot 1 idles: llama.cpp would split the step in two
    micro-batches (no graph replays on a GPU); with shape costs on, slot 1 gets rows that
    are decoded and trimmed, the step is one micro-batch, and neither the other slots'
    tokens nor slot 1's cached prompt change."""
    out = run_script(GAP_SCRIPT, cpu_engine, default_model)
    plain, filled = out["False"], out["True"]
    assert plain["parts"] == [2] and filled["parts"] == [1]  # the gap split the step, and was filled
    assert filled["tokens"] == plain["tokens"]
    assert len(plain["tokens"]["r0"]) > 10 and len(plain["tokens"]["r2"]) > 10
    assert filled["cached"] == plain["cached"] and int(filled["cached"]) > 5  # slot 1's cache held


PAUSE_SCRIPT = textwrap.dedent(
    """
    import json
    from strata_core.contract import protocol as proto
    from strata_core.engine.speculation.cost import StepCost
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request
    from strata_core.engine.speculation.ngram import NgramIndex

    class Costly(StepCost):  # every row costs a whole step: no window ever pays
        def seconds(self, rows):
            return 0.001 * rows

    indexed = []
    index = NgramIndex.index
    def counted(self):
        indexed.append(1)
        return index(self)
    NgramIndex.index = counted

    m = Llama(ModelOptions(path=MODEL, n_ctx=1024, n_seq=1, n_batch=256))
    passage = ("The keeper climbed the ninety steps every night, trimmed the wick, and wrote the "
               "name of every ship in the logbook by the stairs. In winter the storms came from "
               "the north, and the spray reached the windows of the lamp room, where the keeper "
               "sat with his tea and listened to the foghorn calling across the water.")
    text = (f"<|im_start|>user\\nRepeat the following passage exactly, word for word:\\n\\n{passage}"
            "<|im_end|>\\n<|im_start|>assistant\\n")
    prompt = m.tokenize(text.encode(), True, True)
    out = {}
    for k in (0, 7):
        m.seq_trim(0, 0)
        events, steps, drafting = [], [], []
        sched = Engine(m, events.append, adaptive=True, shape_costs=True, trace=steps.append)
        sched.spec.cost = Costly()
        drafts = sched.spec._ngram_drafts
        def spy(slot, n, drafts=drafts):
            drafting.append(len(steps))
            return drafts(slot, n)
        sched.spec._ngram_drafts = spy
        req = Request("r", list(prompt), SamplingParams(), 80, frozenset(), None, spec_k=k)
        sched.submit(req)
        while sched.busy:
            sched.step()
        out[k] = {"tokens": [e.id for e in events if isinstance(e, proto.Token)], "steps": len(steps),
                  "drafting": drafting, "windows": sum(1 for s in steps if s.get("windows")),
                  "tested": req.acceptance.whole, "indexed": len(indexed)}
        indexed.clear()
    print(json.dumps(out))
    """
)


def test_ngram_drafting_pauses_where_no_window_pays(cpu_engine: EngineBuild, default_model: Path) -> None:
    """Where n-gram drafts open no window, drafting them and sizing windows every step was
    the whole cost of speculation on a GPU (open-ended text: x0.96 at 4 slots on an H200).
    After a step where no window could have paid, drafting pauses for 1, 2, 4, ... then
    32 steps: the tokens are those of speculation off, and the drafts made are still
    scored as shadows."""
    out = run_script(PAUSE_SCRIPT, cpu_engine, default_model)
    off, on = out["0"], out["7"]
    assert on["tokens"] == off["tokens"] and len(on["tokens"]) > 40
    assert on["windows"] == 0 and off["drafting"] == []
    steps, drafting = on["steps"], on["drafting"]
    assert len(set(drafting)) <= 6 + steps / 33, on  # steps 1, 3, 6, 11, 20, 37, then every 33rd
    assert len(set(drafting)) >= 4, on
    assert on["tested"] != 2.0, on  # shadows were scored (2.0: none ever was)
    # nor is the index kept up every step while drafting pauses: only for a step that drafts
    assert on["indexed"] <= 2 * len(set(drafting)) + 2, on


# SCRIPT's costs, model and copy prompt, then one request with speculation on
WAKE_SCRIPT = SCRIPT[: SCRIPT.index("out = {}")] + textwrap.dedent(
    """
    events, steps, drafting = [], [], []
    sched = Engine(m, events.append, adaptive=True, shape_costs=True, trace=steps.append)
    sched.spec.cost = GpuLike()
    drafts = sched.spec._ngram_drafts
    def spy(slot, n):
        drafting.append(len(steps))
        return drafts(slot, n)
    sched.spec._ngram_drafts = spy
    req = Request("r", list(prompt), SamplingParams(), 60, frozenset(), None, spec_k=7)
    sched.submit(req)
    shadows, streamed = {}, []  # shadow drafts recorded: (start, tokens); stream length after each step
    while sched.busy:
        sched.step()
        if req.shadow is not None:
            shadows.setdefault(id(req.shadow), (req.shadow.start, list(req.shadow.tokens)))
        streamed.append(len(req.ngrams.tokens) if req.ngrams is not None else 0)
    stream = req.ngrams.tokens
    whole = []  # for each shadow its stream kept whole: the step that emitted its last token
    for start, tokens in shadows.values():
        if stream[start : start + len(tokens)] == tokens:
            whole.append(next(i for i, n in enumerate(streamed) if n >= start + len(tokens)))
    print(json.dumps({"whole": whole, "drafting": drafting, "steps": len(streamed),
                      "windows": sum(1 for s in steps if s.get("windows"))}))
    """
)


def test_a_shadow_draft_kept_whole_ends_the_pause(cpu_engine: EngineBuild, default_model: Path) -> None:
    """At a request's start its acceptance is a coin flip, at which no window pays where a
    change of shape is dear: the first drafts are only recorded (shadows) and drafting
    pauses. A shadow kept whole (text being copied) is scored as its last token is emitted
    and, since a window now pays, the very next step drafts again instead of waiting out
    the pause: on the H100's costs (python -m bench.speculation whatif) that took copy-heavy text at one
    slot from 158 to 135 steps for 512 tokens."""
    out = run_script(WAKE_SCRIPT, cpu_engine, default_model)
    assert out["whole"], out  # the copy kept a shadow whole
    for step in out["whole"]:
        if step + 1 < out["steps"]:
            assert step + 1 in out["drafting"], out
    assert out["windows"] > 0, out
