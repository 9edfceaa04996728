"""The scale-out front's retries (strata_core/scale/front.py), over its real ASGI app: a
request no byte of which reached the client is tried again while replicas answer 503
(their engines starting), waiting once every replica was tried, for a bounded time.
The deployment behind the front is a small stand-in here (the real one, on a local Ray
cluster, is tests/test_scale.py's): each replica answers 503 until the moment its
engine is up."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from strata_core.scale import front


class Starting:
    """Replicas A and B whose engines are up ``ready_after`` seconds from now (None: never)."""

    def __init__(self, ready_after: dict[str, float | None], code: str = "engine_unavailable") -> None:
        t0 = time.monotonic()
        self.code = code
        self.up = {r: None if s is None else t0 + s for r, s in ready_after.items()}
        self.calls: list[str] = []

    async def __call__(self, req: dict[str, Any]) -> AsyncIterator[dict[str, Any] | bytes]:
        fresh = [r for r in self.up if r not in req["avoid"]]
        replica = (fresh or list(self.up))[0]
        self.calls.append(replica)
        up = self.up[replica]
        headers = [("x-strata-replica", replica), ("content-type", "application/json")]
        if up is None or time.monotonic() < up:
            yield {"status": 503, "headers": headers}
            yield json.dumps({"error": {"message": "the engine is starting; try again shortly",
                                        "code": self.code}}).encode()
            return
        yield {"status": 200, "headers": headers}
        yield json.dumps({"served_by": replica}).encode()


async def post(app: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        return await client.post("/v1/chat/completions", json={"model": "m", "messages": []})


def test_a_request_waits_while_every_engine_starts() -> None:
    # one replica replaced, the other's engine restarting: both answer 503 for 0.4 s
    replicas = Starting({"A": 0.4, "B": 0.6})
    r = asyncio.run(post(front.create_front(replicas)))
    assert r.status_code == 200, r.text
    assert r.json() == {"served_by": "A"}
    assert replicas.calls[:2] == ["A", "B"]  # the other replica at once, then waits
    assert len(replicas.calls) > front.ATTEMPTS


def test_one_starting_engine_costs_no_wait() -> None:
    replicas = Starting({"A": None, "B": 0.0})
    t0 = time.monotonic()
    r = asyncio.run(post(front.create_front(replicas)))
    assert r.status_code == 200 and r.json() == {"served_by": "B"}
    assert replicas.calls == ["A", "B"]
    assert time.monotonic() - t0 < front.BACKOFF + 0.5


def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front, "RETRY_FOR", 0.5)
    replicas = Starting({"A": None, "B": None})
    t0 = time.monotonic()
    r = asyncio.run(post(front.create_front(replicas)))
    assert r.status_code == 503
    assert "starting" in r.json()["error"]["message"]
    assert 0.3 < time.monotonic() - t0 < 2.0


def test_a_503_of_busy_models_is_not_waited_for() -> None:
    # every replica's models busy (max_loaded): each replica once, then the 503 as it is
    replicas = Starting({"A": None, "B": None}, code="model_not_loaded")
    t0 = time.monotonic()
    r = asyncio.run(post(front.create_front(replicas)))
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
    assert replicas.calls == ["A", "B", "A"]
    assert time.monotonic() - t0 < 0.5
