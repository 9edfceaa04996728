"""How llama.cpp splits a batch into micro-batches (where its KV cache keeps a stream per
sequence): the runner counts them for the step trace, and speculation sizes windows so a
step stays one."""

from __future__ import annotations

from collections.abc import Sequence


def micro_batches(rows: Sequence[tuple[int, int]]) -> int:
    """How many micro-batches llama.cpp computes for a batch holding ``rows`` (sequence id,
    row count) in ascending sequence order, when each sequence has a KV stream of its own:
    a micro-batch takes a run of consecutive sequence ids from the first with rows left,
    and as many rows from each as the one with fewest left has (llama_batch_allocr::
    split_equal, sequential)."""
    if rows and rows[-1][0] - rows[0][0] == len(rows) - 1 and len({n for _, n in rows}) == 1 and rows[0][1] > 0:
        return 1  # consecutive sequences holding equal rows, the usual step: asked every step
    left = [[seq, n] for seq, n in rows if n > 0]
    count = 0
    while left:
        run = [left[0]]
        for item in left[1:]:
            if item[0] != run[-1][0] + 1:
                break
            run.append(item)
        take = min(n for _, n in run)
        for item in run:
            item[1] -= take
        left = [item for item in left if item[1] > 0]
        count += 1
    return count
