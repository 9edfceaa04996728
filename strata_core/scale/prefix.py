"""Prefix-aware routing, as pure functions: a request's routing key (the leading text of
its rendered prompt) and the order in which replicas should be tried for it.

Rendezvous hashing: each replica scores ``hash(key, replica)`` and the highest score
holds the key, so every front agrees without shared state, and when a replica leaves
only the keys it held move. The holder is skipped while it is busy and another replica
has room, so a hot prefix cannot pile every request onto one replica."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

#: Characters of the rendered prompt the key covers: about 500 tokens, the part of a
#: conversation every later turn repeats (the system prompt and the first user message).
PREFIX_CHARS = 2048


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text, in order
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def routing_key(path: str, body: bytes) -> str | None:
    """The request's ``prompt_cache_key`` when it sends one (the client's name for the
    prefix its requests share, on any route); else the leading text of the prompt it
    renders (chat: its messages up to and including the first user message; completions:
    its prompt); None when it has neither."""
    try:
        req = json.loads(body)
    except ValueError:
        return None
    if not isinstance(req, dict):
        return None
    model = str(req.get("model"))
    if isinstance(req.get("prompt_cache_key"), str) and req["prompt_cache_key"]:
        return f"{model}\ncache key\n{req['prompt_cache_key']}"
    if path.endswith("/chat/completions") and isinstance(req.get("messages"), list):
        parts = []
        for m in req["messages"]:
            if not isinstance(m, dict):
                break
            parts.append(f"{m.get('role')}\n{_text(m.get('content'))}\n")
            if m.get("role") == "user":
                break
        text = "".join(parts)
    elif path.endswith("/completions") and "prompt" in req:
        p = req["prompt"]
        text = p if isinstance(p, str) else json.dumps(p)
    else:
        return None
    return f"{model}\n{text[:PREFIX_CHARS]}"


def score(key: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{replica}\0{key}".encode(), digest_size=8).digest(), "big")


def rank(
    key: str | None,
    replicas: Sequence[str],
    loads: Mapping[str, int],
    busy: int,
    avoid: frozenset[str] = frozenset(),
    rng: random.Random | None = None,
) -> list[list[str]]:
    """Replicas to try, best first, in ranks (a rank's replicas are equally good and the
    least loaded of them wins). ``loads``: requests in flight per replica (absent: 0);
    ``busy``: the load at which the holder gives way to a less loaded replica; ``avoid``:
    replicas that just failed this request, tried last. Without a key: a random order."""
    fresh = [r for r in replicas if r not in avoid]
    last = [r for r in replicas if r in avoid]
    if key is None:
        order = list(fresh)
        (rng or random).shuffle(order)
        return [[r] for r in order] + ([last] if last else [])
    if not fresh:
        return [last] if last else []
    by_score = sorted(fresh, key=lambda r: score(key, r), reverse=True)
    holder, others = by_score[0], by_score[1:]
    load = loads.get(holder, 0)
    if load >= busy and others and min(loads.get(r, 0) for r in others) < load:
        ranks = [others, [holder]]
    else:
        ranks = [[holder], others] if others else [[holder]]
    return ranks + ([last] if last else [])
