"""Fill-in-the-middle prompts: the text before and after the cursor (and other files of the
project) around the model's FIM tokens, laid out as llama-server's ``/infill`` lays them
out, so the same request gives the same prompt ids:

    [FIM_REP]myproject\\n [FIM_SEP]name\\n text ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

The prefix keeps its last 3/4 of a batch, the suffix its first 1/4 (less the prompt),
and the other files the end of what the context leaves. Pure: the caller tokenizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
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



class EditorLimits:
    """llama-server's stops for editors, on the text as it is generated: ``n_indent`` ends
    the reply at a line (after the cursor's) indented less than that many spaces or tabs,
    cut before its first character (a blank line included); ``t_max_predict_ms`` ends it
    at a new line once that long has passed since the first token. ``why`` names the one
    that ended it; ``ids`` are the tokens generated (``return_tokens``)."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: int = -1, clock: Callable[[], float] = time.monotonic):
        self.n_indent, self.t_max_predict_ms, self._clock = n_indent, t_max_predict_ms, clock
        self.t_first: float | None = None  # when the first token came (clock's seconds)
        self.ids: list[int] = []
        self.why: str | None = None
        self._text = ""

    def push(self, ids: Sequence[int], text: str) -> str:
        """What to keep of ``text``, released with the tokens ``ids``: all of it, or the
        part before the stop (then ``why`` is set); nothing once stopped."""
        if self.why is not None:
            return ""
        now = self._clock()
        self.t_first = now if self.t_first is None else self.t_first
        self.ids += ids
        start, self._text = len(self._text), self._text + text
        cut = under_indented(self._text, start, self.n_indent) if self.n_indent > 0 else None
        if cut is not None:
            self.why, self._text = "n_indent", self._text[:cut]
            return text[: cut - start]
        if "\n" in text and 0 < self.t_max_predict_ms < (now - self.t_first) * 1000:
            self.why = "t_max_predict_ms"
        return text


def under_indented(text: str, start: int, n_indent: int) -> int | None:
    """Where the first line begun after a new line and indented less than ``n_indent``
    shows its first character, if that character is at ``start`` or later."""
    ls = text.rfind("\n", 0, start) + 1 if "\n" in text[:start] else text.find("\n", start) + 1
    while ls > 0:
        p = ls
        while p < len(text) and text[p] in " \t":
            p += 1
        if p == len(text):
            return None  # the line shows nothing yet
        if p >= start and p - ls < n_indent:
            return p
        ls = text.find("\n", p) + 1
    return None
