"""The draft-model drafter: a smaller GGUF sharing the target's vocabulary, loaded in the
engine process with its own context that holds one sequence per slot.

Each draft sequence follows its slot lazily: when the slot drafts, the sequence is trimmed
to the longest prefix it shares with the target's context (so rejected drafts leave it)
and the rest is decoded, in chunks when a prompt is longer than the batch. Drafting then
runs up to k steps, each one ``llama_decode`` for every slot still drafting.

A sampled request draws each proposal from q, the draft's row put through the request's
own sampling chain, with the confidence gate (verify.py) (``propose``: a refused draw
is NULL and ends the window); q travels with the proposal so the target can verify it
with ``verify_window``. A greedy request drafts point masses (the draft's pick) and stops
when the draft's own confidence in its pick is below the gate, since the target verifies
them by exact match.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from strata_core.contract.options import SamplingParams
from strata_core.engine.llama import Batch, Llama
from strata_core.engine.prompt_cache import common_prefix
from strata_core.engine.sampler import adjust
from strata_core.engine.speculation.verify import NULL, Proposal, sampled_proposal


class DraftJob(NamedTuple):
    seq: int  # the slot's sequence, in both contexts
    context: list[int]  # the target's tokens, up to the one it decodes this step
    k: int  # most proposals
    params: SamplingParams


def check_shared_vocab(target: Llama, draft: Llama, draft_path: str) -> None:
    """Refuse a draft model whose vocabulary differs from the target's."""
    if draft.n_vocab != target.n_vocab:
        raise ValueError(
            f"draft model {draft_path} has n_vocab {draft.n_vocab}, the model {target.n_vocab}: "
            "a draft model must share the model's vocabulary (use a smaller model of the same family)"
        )
    for t in range(target.n_vocab):
        if draft.piece(t) != target.piece(t):
            raise ValueError(
                f"draft model {draft_path} does not share the model's vocabulary: token {t} is "
                f"{draft.piece(t)!r} there and {target.piece(t)!r} in the model"
            )


class DraftModel:
    def __init__(self, llama: Llama, tau: float) -> None:
        if not 0.0 <= tau <= 1.0:
            raise ValueError(f"threshold={tau} is out of range: expected in [0, 1]")
        self.llama = llama
        self.tau = tau
        self.cached: list[list[int]] = [[] for _ in range(llama.n_seq)]
        self.batch = Batch(max(llama.n_batch, llama.n_seq))

    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        """One proposal per job; an empty one when the job's sequence is still catching up."""
        try:
            return self._propose(jobs)
        except Exception:
            for seq, cached in enumerate(self.cached):  # a failed decode leaves the KV unknown
                cached.clear()
                self.llama.seq_trim(seq, 0)
            raise

    def _propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        out = [Proposal(q_rows=None if job.params.greedy else []) for job in jobs]
        rows = self._catch_up(jobs)
        while rows:
            b = self.batch
            b.clear()
            following: dict[int, int] = {}
            for j, row in rows.items():
                job, prop = jobs[j], out[j]
                history = job.context + prop.tokens
                tok = self._draw(self.llama.logits(row), job.params, history, prop)
                if tok is None or tok == NULL or len(prop.tokens) == job.k:
                    continue
                following[j] = b.add_one(tok, len(history), job.seq)
                self.cached[job.seq].append(tok)
            if following:
                self.llama.decode(b)
            rows = following
        return out

    def _catch_up(self, jobs: list[DraftJob]) -> dict[int, int]:
        """Bring each job's draft sequence to its context; the batch row of each job whose
        last context token was decoded (its logits give the first proposal)."""
        b = self.batch
        b.clear()
        rows: dict[int, int] = {}
        for j, job in enumerate(jobs):
            have = self.cached[job.seq]
            keep = min(common_prefix(have, job.context), len(job.context) - 1)
            if keep < len(have):
                self.llama.seq_trim(job.seq, keep)
                del have[keep:]
            todo = job.context[keep:]
            chunk = todo[: b.capacity - b.n]
            if not chunk:
                continue
            i = b.add(chunk, keep, job.seq, "none")
            have.extend(chunk)
            if len(chunk) == len(todo):
                rows[j] = i + len(chunk) - 1
                b.logits[rows[j]] = 1
        if b.n:
            self.llama.decode(b)
        return rows

    def _draw(
        self, row: np.ndarray, params: SamplingParams, history: list[int], prop: Proposal
    ) -> int | None:
        """The next proposal, appended to prop; None when a greedy draft is not confident."""
        if prop.q_rows is None:
            x = adjust(row, params, history).astype(np.float64)
            best = int(np.argmax(x))
            if 1.0 / np.exp(x - x[best]).sum() < self.tau:  # softmax of the pick
                return None
            prop.tokens.append(best)
            return best
        tok, q = sampled_proposal(row, params, history, self.tau)
        prop.tokens.append(tok)
        prop.q_rows.append(q)
        return tok
