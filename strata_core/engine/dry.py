"""DRY ("don't repeat yourself"), llama.cpp's definition (src/llama-sampler.cpp, from
koboldcpp): a token that would extend a sequence already seen in the last
``dry_penalty_last_n`` tokens loses ``dry_multiplier * dry_base ** (length - dry_allowed_length)``
from its logit, the length counted back to the latest sequence breaker.

A breaker is text; on a vocabulary it becomes token sequences (``Breakers``): every token
whose piece holds the text is a breaker alone, and a token whose piece ends with the text's
start heads the sequence that tokenizes the text's rest. The matching is per row (a Z
function over the row's own history): no two rows share it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from strata_core.contract.options import SamplingParams

#: head token -> the tails that follow it (an empty tail: the head is a breaker alone)
Breakers = Mapping[int, tuple[tuple[int, ...], ...]]
_MAX_BYTES = 40  # a breaker's text is cut to this many bytes (llama.cpp's limit)
_MAX_TAIL = 20  # and a tail to this many tokens
_FLOAT_MAX_LOG = 88.7228391  # log of float32's largest value: the exponent's ceiling


def breakers(texts: Sequence[str], pieces: Sequence[bytes], tokenize: Callable[[bytes], list[int]]) -> Breakers:
    """The token sequences of ``texts`` on a vocabulary of ``pieces`` (by token id)."""
    out: dict[int, list[tuple[int, ...]]] = {}
    for text in texts:
        s = text.encode()[:_MAX_BYTES]
        if not s:
            continue
        for tok, word in enumerate(pieces):
            tails = out.setdefault(tok, [])
            if s in word:
                if () not in tails:
                    tails.append(())
                continue
            pos = word.find(s[:1])
            while pos >= 0:
                n = len(word) - pos  # the piece ends inside the text: its rest follows
                if word[pos:] == s[:n]:
                    tail = tuple(tokenize(s[n:])[:_MAX_TAIL])
                    if tail not in tails:
                        tails.append(tail)
                pos = word.find(s[:1], pos + 1)
    return {t: tuple(v) for t, v in out.items() if v}


def _rep_limit(rev: list[int], heads: Breakers) -> int:
    """How far back a repetition may reach: to the latest complete breaker sequence."""
    for i, tok in enumerate(rev):
        tails = heads.get(tok)
        if not tails:
            continue
        longest = -1
        for tail in tails:
            n = len(tail)
            if longest < n <= i and all(tail[j] == rev[i - j - 1] for j in range(n)):
                longest = n
        if longest >= 0:
            return i - longest
    return len(rev)


def _suffix_matches(rev: list[int]) -> list[int]:
    """z[k]: how many tokens ending k back repeat the history's last ones (a Z function
    over the reversed history; z[0] unused)."""
    n = len(rev)
    z = [0] * n
    lt = rt = 0
    for k in range(1, n):
        m = min(z[k - lt], rt - k + 1) if k <= rt else 0
        while k + m < n and rev[m] == rev[k + m]:
            m += 1
        z[k] = m
        if m and k + m - 1 > rt:
            lt, rt = k, k + m - 1
    return z


def penalties(history: Sequence[int] | np.ndarray, p: SamplingParams, heads: Breakers) -> dict[int, float]:
    """The amount DRY takes off each token's logit (float32 arithmetic, as llama.cpp)."""
    window = p.dry_penalty_last_n
    tokens = list(history if window < 0 else history[-window:]) if window else []
    allowed = p.dry_allowed_length
    if len(tokens) <= allowed:
        return {}
    rev = tokens[::-1]
    limit = _rep_limit(rev, heads)
    if limit < allowed:
        return {}
    z = _suffix_matches(rev)
    longest: dict[int, int] = {}
    for k in range(1, len(rev)):
        n = min(z[k], limit)
        if n >= allowed and n > longest.get(tok := rev[k - 1], -1):
            longest[tok] = n
    top = int(_FLOAT_MAX_LOG / math.log(p.dry_base)) if p.dry_base > 1.000001 else 0
    out = {}
    with np.errstate(over="ignore"):  # a penalty past float32's range is -inf's worth, as in C
        mult, base = float(np.float32(p.dry_multiplier)), float(np.float32(p.dry_base))
        for tok, n in longest.items():
            if () in heads.get(tok, ()):
                continue  # a breaker alone is never penalised
            e = n - allowed if top <= 0 else min(n - allowed, top)
            out[tok] = float(np.float32(mult * np.float64(base) ** e))
    return out


def apply(x: np.ndarray, history: Sequence[int] | np.ndarray, p: SamplingParams, heads: Breakers) -> np.ndarray:
    """``x`` less DRY's penalties (a copy where any applies)."""
    amounts = penalties(history, p, heads)
    if not amounts:
        return x
    ids = np.fromiter(amounts.keys(), np.int64, len(amounts))
    ids_ok = (ids >= 0) & (ids < x.size)
    x = x.copy()
    x[ids[ids_ok]] -= np.fromiter(amounts.values(), np.float32, len(amounts))[ids_ok]
    return x
