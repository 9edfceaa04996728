"""How a step's prefill shares the step with the running decodes: how many prompt rows it
may take (``prefill_budget``) and which waiting prompts take them first (``prefill_order``).
Pure arithmetic, which the scheduler applies (scheduler.py)."""

from __future__ import annotations

from collections.abc import Sequence

#: On a CPU a prompt row costs nearly the same however many rows share the step, so
#: prompts prefilled together all wait for their sum. There a step takes the shortest
#: pending prompts first and stops once it holds a whole prompt and at least this many
#: rows: each prompt's first token comes after its own prefill and those before it, and
#: only the last one's later than beside the others, by the decode steps between
#: (bench/results/2026-12-06-cpu-serving-shortest-first.md).
CPU_PREFILL_ROWS = 16

#: On a GPU the step's prefill gets at least this share of a batch while prompts wait,
#: whatever the decodes take: at many slots (or wide windows) the decodes alone fill the
#: batch, and a new request would wait for a slot to end before its prompt ran, its time to
#: first token growing with the load (vLLM's chunked prefill keeps it bounded the same way:
#: a token budget per step that prompts share with the running decodes).
PREFILL_SHARE = 4  # a quarter


def prefill_budget(capacity: int, decode_rows: int, on_gpu: bool) -> int:
    """Rows the step's prefill may take: what the decodes leave of a batch of ``capacity``
    rows; on a GPU never less than a ``PREFILL_SHARE``-th of it. (On a CPU a prompt row
    costs what a decode row does and the decodes come first: the step's time stays what
    its rows cost.)"""
    left = capacity - decode_rows
    return max(left, capacity // PREFILL_SHARE) if on_gpu else left


def prefill_order(prompts: Sequence[tuple[int, float]], on_gpu: bool) -> list[int]:
    """The order in which waiting prompts (``(pending tokens, arrival)`` each) take the
    step's prefill budget: on a GPU first come, first served (a prompt's wait is bounded by
    those that came before it, vLLM's rule); on a CPU shortest first (one prompt's rows
    cost what they would beside others, ``CPU_PREFILL_ROWS``)."""
    if on_gpu:
        return sorted(range(len(prompts)), key=lambda i: prompts[i][1])
    return sorted(range(len(prompts)), key=lambda i: prompts[i][0])
