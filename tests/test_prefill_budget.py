"""The step's prefill budget and order (engine/prefill.py): pure arithmetic, no engine."""

from __future__ import annotations

from strata_core.engine.prefill import PREFILL_SHARE, prefill_budget, prefill_order


def test_the_prefill_takes_what_the_decodes_leave_of_the_batch() -> None:
    assert prefill_budget(512, 64, on_gpu=True) == 448
    assert prefill_budget(512, 64, on_gpu=False) == 448
    assert prefill_budget(512, 0, on_gpu=True) == 512


def test_on_a_gpu_waiting_prompts_keep_a_share_of_the_batch_however_many_slots_decode() -> None:
    # 256 slots with windows of one draft: 512 decode rows, the whole batch
    assert prefill_budget(512, 512, on_gpu=True) == 512 // PREFILL_SHARE
    assert prefill_budget(512, 480, on_gpu=True) == 512 // PREFILL_SHARE
    assert prefill_budget(512, 600, on_gpu=True) == 512 // PREFILL_SHARE > 0


def test_on_a_cpu_the_decodes_come_first() -> None:
    # there a prompt row costs what a decode row does: no floor, the step's rows stay bounded
    assert prefill_budget(512, 512, on_gpu=False) == 0
    assert prefill_budget(512, 600, on_gpu=False) < 0


def test_a_gpu_serves_prompts_in_arrival_order() -> None:
    prompts = [(300, 2.0), (10, 3.0), (50, 1.0)]  # (pending tokens, arrival)
    assert prefill_order(prompts, on_gpu=True) == [2, 0, 1]


def test_a_cpu_serves_the_shortest_prompt_first_ties_in_slot_order() -> None:
    prompts = [(300, 2.0), (10, 3.0), (50, 1.0), (10, 0.5)]
    assert prefill_order(prompts, on_gpu=False) == [1, 3, 2, 0]
