"""Issue 14, item 4: the load limits ([server] max_queued, request_timeout) and client
disconnects, on a real server: a full queue answers 429 with Retry-After, a request past
its time 504 (a stream: an error event), and a client that goes away frees its slot."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata_core.ops.build import EngineBuild

pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0
#: A long reply: 900 tokens with the end-of-text tokens banned, seconds on a CPU. A chat:
#: its stream answers at once (the role chunk), before its request reaches a slot.
LONG = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 900,
        "logit_bias": {"0": -100, "1": -100, "2": -100}}  # fmt: skip
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def limited(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One slot, one request allowed to wait for it, TIMEOUT_S per request."""
    from strata_core.testing.harness import Server

    env = {"STRATA_SERVER_MAX_QUEUED": "1", "STRATA_SERVER_REQUEST_TIMEOUT": str(TIMEOUT_S)}
    args = ["--backend", "cpu", "--parallel", "1", "--n-ctx", "1100"]
    with Server(args, tmp_path_factory.mktemp("limits") / "server.log", env=env) as srv:
        yield srv.base


def metric(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise KeyError(name)


def events(r: httpx.Response) -> Iterator[Any]:
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def open_stream(stack: ExitStack, base: str, body: dict[str, Any]) -> Iterator[Any]:
    client = stack.enter_context(httpx.Client(timeout=60))
    r = stack.enter_context(client.stream("POST", f"{base}{CHAT}", json={**body, "stream": True}))
    assert r.status_code == 200, r.read()
    return events(r)


def wait_until(check: Any, within: float) -> float:
    """Seconds until ``check()`` held (polled every 20 ms); fails after ``within``."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < within, f"not within {within} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def test_a_full_queue_answers_429_with_retry_after(limited: str) -> None:
    refused = metric(limited, "strata_requests_refused_total")
    with ExitStack() as stack:
        running = open_stream(stack, limited, LONG)
        next(running)  # holds the slot
        open_stream(stack, limited, LONG)  # waits for it: the queue is now full
        r = httpx.post(f"{limited}/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=60)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        e = r.json()["error"]
        assert (e["code"], e["type"]) == ("queue_full", "rate_limit_error"), e
        assert "max_queued" in e["message"]
    assert metric(limited, "strata_requests_refused_total") == refused + 1
    wait_until(lambda: metric(limited, "strata_busy_slots") == 0, within=10)
    r = httpx.post(f"{limited}/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_request_past_its_time_is_cancelled_and_answered_504(limited: str) -> None:
    cancelled = metric(limited, "strata_requests_cancelled_total")
    with ExitStack() as stack:
        t0 = time.monotonic()
        running = open_stream(stack, limited, LONG)
        # queued behind the stream, it runs out of time before it gets the slot
        r = httpx.post(f"{limited}{CHAT}", json=LONG, timeout=60)
        assert r.status_code == 504, r.text
        assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + 5
        e = r.json()["error"]
        assert (e["code"], e["type"]) == ("timeout", "server_error") and "request_timeout" in e["message"], e
        rest = list(running)
    assert rest[-1] == "[DONE]" and rest[-2]["error"]["code"] == "timeout", rest[-3:]
    assert not any("error" in ev for ev in rest[:-2])
    wait_until(lambda: metric(limited, "strata_busy_slots") == 0, within=10)
    assert metric(limited, "strata_requests_cancelled_total") == cancelled + 2


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_client_that_goes_away_frees_its_slot(server: Any, stream: bool) -> None:
    base = server.base
    cancelled = metric(base, "strata_requests_cancelled_total")
    assert metric(base, "strata_busy_slots") == 0
    if stream:
        with ExitStack() as stack:
            chunks = open_stream(stack, base, LONG)
            next(chunks), next(chunks)  # the role, a token
            assert metric(base, "strata_busy_slots") == 1
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}{CHAT}", json=LONG, timeout=1.0)
    # the engine cancels at its next step; allow for a loaded machine
    wait_until(lambda: metric(base, "strata_busy_slots") == 0, within=3)
    assert metric(base, "strata_requests_cancelled_total") == cancelled + 1
