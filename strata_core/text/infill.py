"""Fill-in-the-middle prompts: the text before and after the cursor (and other files of the
project) around the model's FIM tokens, laid out as llama-server's ``/infill`` lays them
out, so the same request gives the same prompt ids:

    [FIM_REP]myproject\\n [FIM_SEP]name\\n text ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

The prefix keeps its last 3/4 of a batch, the suffix its first 1/4 (less the prompt),
and the other files the end of what the context leaves. Pure: the caller tokenizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The project's and the current file's names llama-server writes (it takes neither as input).
REPO_NAME = "myproject\n"
FILE_NAME = "filename\n"
#: Between the other files' texts, for a model without FIM_SEP (llama-server's separator).
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None

    @classmethod
    def of(cls, fim: Mapping[str, Any] | None) -> FimTokens | None:
        """The model's FIM tokens from READY's ``fim``; None without all three of FIM_PRE,
        FIM_SUF and FIM_MID."""
        fim = fim or {}
        if any(fim.get(k) is None for k in ("pre", "suf", "mid")):
            return None
        return cls(fim["pre"], fim["suf"], fim["mid"], fim.get("rep"), fim.get("sep"))


@dataclass
class Pieces:
    """A request's parts as token ids: ``extra`` is each other file's (name + "\\n", text);
    ``repo``, ``here`` and ``chunk`` are REPO_NAME, FILE_NAME and CHUNK_SEPARATOR's."""

    prefix: list[int]
    suffix: list[int]
    prompt: list[int]
    extra: list[tuple[list[int], list[int]]]
    repo: list[int]
    here: list[int]
    chunk: list[int]


def infill_prompt(fim: FimTokens, p: Pieces, n_batch: int, n_ctx: int, bos: int | None) -> list[int]:
    """The prompt ids (``bos``: the model's BOS where it wants one, else None)."""
    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *p.repo]
    for name, text in p.extra:
        extra += [fim.sep, *name] if fim.sep is not None else p.chunk
        extra += text
    if fim.sep is not None:
        extra += [fim.sep, *p.here]
    n_prefix = min(len(p.prefix), 3 * (n_batch // 4))
    n_suffix = min(len(p.suffix), max(0, n_batch // 4 - (2 + len(p.prompt))))
    # llama-server leaves room for twice its n_predict, -1 by default
    n_extra = min(max(0, n_ctx - n_batch + 2), len(extra))
    head = [fim.pre, *p.prefix[len(p.prefix) - n_prefix :], *p.prompt]
    if bos is not None:
        head.insert(0, bos)
    return [*extra[len(extra) - n_extra :], *head, fim.suf, *p.suffix[:n_suffix], fim.mid]

