"""The prefix router's pure rules (strata_core/scale/prefix.py): routing keys and ranks."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from strata_core.scale.prefix import rank, routing_key

REPLICAS = ["r0", "r1", "r2", "r3"]


def chat(*contents: str) -> bytes:
    roles = ["system", "user", "assistant", "user", "assistant", "user"]
    msgs = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)]
    return json.dumps({"model": "m", "messages": msgs}).encode()


def test_every_turn_of_a_conversation_has_its_first_turns_key() -> None:
    first = routing_key("/v1/chat/completions", chat("sys A", "hello"))
    later = routing_key("/v1/chat/completions", chat("sys A", "hello", "hi!", "more", "ok", "again"))
    other = routing_key("/v1/chat/completions", chat("sys B", "hello"))
    assert first == later and first != other
    assert routing_key("/v1/completions", b'{"prompt": "Once"}') != routing_key("/v1/completions", b'{"prompt": "Twice"}')
    assert routing_key("/v1/models", b"") is None and routing_key("/v1/chat/completions", b"not json") is None


def test_prompt_cache_key_is_the_routing_key_on_any_route() -> None:
    def keyed(body: bytes, key: str) -> bytes:
        return json.dumps({**json.loads(body), "prompt_cache_key": key}).encode()

    a, b = keyed(chat("sys A", "hello"), "conv-1"), keyed(chat("sys B", "other"), "conv-1")
    assert routing_key("/v1/chat/completions", a) == routing_key("/v1/chat/completions", b)  # the key, not the text
    assert routing_key("/v1/chat/completions", a) != routing_key("/v1/chat/completions", keyed(chat("sys A", "hello"), "conv-2"))
    responses = json.dumps({"model": "m", "input": "hi", "prompt_cache_key": "conv-1"}).encode()
    assert routing_key("/v1/responses", responses) == routing_key("/v1/chat/completions", a)
    assert routing_key("/v1/chat/completions", keyed(chat("sys A", "hello"), "")) == routing_key("/v1/chat/completions", chat("sys A", "hello"))


@given(st.text(min_size=1))
def test_the_holder_is_tried_first_while_idle(key: str) -> None:
    ranks = rank(key, REPLICAS, {}, busy=4)
    assert len(ranks[0]) == 1 and sorted(sum(ranks, [])) == REPLICAS
    assert rank(key, list(reversed(REPLICAS)), {}, busy=4)[0] == ranks[0]  # order of the list is irrelevant


@given(st.text(min_size=1))
def test_a_replica_leaving_moves_only_its_own_keys(key: str) -> None:
    holder = rank(key, REPLICAS, {}, busy=4)[0][0]
    for gone in REPLICAS:
        if gone != holder:
            assert rank(key, [r for r in REPLICAS if r != gone], {}, busy=4)[0] == [holder]


@given(st.text(min_size=1))
def test_a_busy_holder_gives_way_to_a_less_loaded_replica(key: str) -> None:
    holder = rank(key, REPLICAS, {}, busy=4)[0][0]
    loads = {r: 1 for r in REPLICAS} | {holder: 4}
    ranks = rank(key, REPLICAS, loads, busy=4)
    assert holder not in ranks[0] and ranks[-1] == [holder]
    everyone_busy = {r: 5 for r in REPLICAS}
    assert rank(key, REPLICAS, everyone_busy, busy=4)[0] == [holder]  # nowhere better to go


@given(st.text(min_size=1))
def test_replicas_that_failed_the_request_come_last(key: str) -> None:
    holder = rank(key, REPLICAS, {}, busy=4)[0][0]
    ranks = rank(key, REPLICAS, {}, busy=4, avoid=frozenset({holder}))
    assert holder not in ranks[0] and ranks[-1] == [holder]
    assert rank(None, REPLICAS, {}, busy=4, avoid=frozenset({"r1"}))[-1] == ["r1"]
