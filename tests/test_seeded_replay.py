"""A request that names a seed replays token for token, logprob for logprob, whatever
ran before it or runs beside it (README, ``[sampling] exact_seed_replay``).

llama.cpp computes a prompt token's KV differently by the size of the chunk it was
decoded in: on the CPU, flash attention takes a tiled path for 64 or more query rows of
one sequence and a row-by-row path below that (bench/results/2026-12-04-soak-short-runs.md).
A cached prefix that
another request computed, or a prompt split by the batch budget beside other prompts,
then changes the logits of a seeded request by up to about one logit, and a sampled
near-tie breaks the other way: the soak saw it."""

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
    from strata_core.engine.llama import Llama, ModelOptions
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request

    m = Llama(ModelOptions(path=MODEL, n_ctx=1024, n_seq=2, n_batch=128))

    def chat(system, user):
        text = f"<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n<|im_start|>assistant\\n"
        return m.tokenize(text.encode(), True, True)

    tutor = "You are a patient tutor who explains each idea with one everyday example."
    compiler = "Explain how a compiler turns source code into machine code, step by step. " * 4
    short = chat(tutor, "Tell me a short joke about cats.")
    long = chat(tutor, compiler + "Keep it short.")
    events = []
    sched = Engine(m, events.append)

    def seeded(rid, prompt):
        return Request(rid, list(prompt), SamplingParams(temperature=1.0, seed=1234), 24, frozenset(), 0, isolate=True)

    def greedy(rid, prompt):
        return Request(rid, list(prompt), SamplingParams(), 4, frozenset(), None)

    def run(*requests, fresh=True):
        if fresh:  # nothing cached anywhere: the prompt is computed from its first token
            for slot in sched.slots:
                m.seq_trim(slot.seq, 0)
                slot.cached = []
        for req in requests:
            sched.submit(req)
        while sched.busy:
            sched.step()

    run(seeded("short alone", short))
    # the tutor's preamble is cached by a long prompt, computed in one chunk of 100+ rows
    run(greedy("long greedy", chat(tutor, compiler)))
    run(seeded("short after a long prompt", short), fresh=False)
    run(seeded("long alone", long))
    # prefilled in the same steps as another long prompt, which takes the batch's budget first
    run(greedy("other", chat("You answer in rhymes.", compiler)), seeded("long beside another", long))
    out = {}
    for e in events:
        if isinstance(e, proto.Token):
            out.setdefault(e.rid, {"tokens": [], "logprobs": []})["tokens"].append(e.id)
        elif isinstance(e, proto.Logprob):
            out[e.rid]["logprobs"].append(e.logprob)
        elif isinstance(e, proto.Done):
            out.setdefault(e.rid, {"tokens": [], "logprobs": []}).update(reason=e.reason, cached=int(e.stats["cached"]))
    print(json.dumps({"prompts": [len(short), len(long)], "runs": out}))
    """
)


def test_a_seeded_request_replays_after_and_beside_long_prompts(cpu_engine: EngineBuild, default_model: Path) -> None:
    out = run_engine_script(SCRIPT, cpu_engine, default_model)
    runs = out["runs"]
    assert out["prompts"][1] >= 64 + 16, out["prompts"]  # the long prompt takes the tiled path
    for rid in ("short alone", "long alone"):
        assert runs[rid]["reason"] == "length" and len(runs[rid]["tokens"]) == 24, runs[rid]
        assert len(runs[rid]["logprobs"]) == 24
    same = ("tokens", "logprobs")
    for replay, first in (("short after a long prompt", "short alone"), ("long beside another", "long alone")):
        assert [runs[replay][k] for k in same] == [runs[first][k] for k in same], replay
        assert runs[replay]["cached"] == 0  # the replay computed its prompt itself
    assert runs["other"]["reason"] == "length" and runs["long greedy"]["reason"] == "length"
