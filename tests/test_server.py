"""Issue 3: the OpenAI routes end to end, with the official client, on the real engine."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]


def metric(server, name: str) -> float:  # type: ignore[no-untyped-def]
    for line in httpx.get(f"{server.base}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def test_models_and_health(client, server) -> None:  # type: ignore[no-untyped-def]
    ids = [m.id for m in client.models.list()]
    assert ids == ["smollm2-135m-instruct"]
    assert httpx.get(f"{server.base}/health").json() == {"status": "ok"}


def test_chat_non_streamed(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=CHAT, max_tokens=12)
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 10


def test_chat_streamed_matches_non_streamed(client) -> None:  # type: ignore[no-untyped-def]
    whole = client.chat.completions.create(messages=CHAT, model="default", max_tokens=20)
    chunks = list(
        client.chat.completions.create(
            messages=CHAT, model="default", max_tokens=20, stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[0].choices[0].delta.role == "assistant"


def test_completions_streamed_and_not(client) -> None:  # type: ignore[no-untyped-def]
    r = client.completions.create(model="default", prompt="The capital of France is", max_tokens=8)
    s = list(client.completions.create(model="default", prompt="The capital of France is", max_tokens=8, stream=True))
    assert r.choices[0].text == "".join(c.choices[0].text for c in s if c.choices)
    assert "Paris" in r.choices[0].text
    assert r.usage.completion_tokens == 8


def test_completions_token_prompt_and_batch(client) -> None:  # type: ignore[no-untyped-def]
    r = client.completions.create(model="default", prompt=["Hello", "The sky is"], max_tokens=4)
    assert [c.index for c in r.choices] == [0, 1]
    ids = client.completions.create(model="default", prompt=[504, 3575, 314], max_tokens=3)
    assert ids.usage.prompt_tokens == 3


def test_n_two_gives_two_choices(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(messages=CHAT, model="default", max_tokens=6, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    # Greedy: both choices are the same reply.
    assert r.choices[0].message.content == r.choices[1].message.content
    assert r.usage.completion_tokens == 12
    s = list(client.chat.completions.create(messages=CHAT, model="default", max_tokens=6, n=2, stream=True))
    texts = {0: "", 1: ""}
    for ch in s:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == texts[1] == r.choices[0].message.content


def test_stop_strings_are_trimmed(client) -> None:  # type: ignore[no-untyped-def]
    free = client.chat.completions.create(messages=CHAT, model="default", max_tokens=40)
    text = free.choices[0].message.content
    assert "5" in text, text  # the fixture must be able to see the stop string
    stop = "5"
    r = client.chat.completions.create(messages=CHAT, model="default", max_tokens=40, stop=[stop, "zzz"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.index(stop)]
    s = client.chat.completions.create(messages=CHAT, model="default", max_tokens=40, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == text[: text.index(stop)]


def test_prefix_reuse_reports_cached_tokens(client) -> None:  # type: ignore[no-untyped-def]
    msgs = [{"role": "system", "content": "You answer tersely. " * 20}, {"role": "user", "content": "Hi"}]
    client.chat.completions.create(messages=msgs, model="default", max_tokens=2)
    msgs[1]["content"] = "Hello there"
    r = client.chat.completions.create(messages=msgs, model="default", max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens > 100


def test_client_disconnect_cancels_engine_request(server) -> None:  # type: ignore[no-untyped-def]
    before = metric(server, "strata_requests_cancelled_total")
    body = {"model": "default", "messages": CHAT, "max_tokens": 500, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=body, timeout=60) as resp:
        got = 0
        for line in resp.iter_lines():
            got += line.startswith("data: ")
            if got >= 3:
                break
    deadline = time.monotonic() + 30
    while metric(server, "strata_requests_cancelled_total") <= before:
        assert time.monotonic() < deadline, "the engine never reported the request cancelled"
        time.sleep(0.1)


def test_engine_killed_mid_stream_then_recovers(client, server) -> None:  # type: ignore[no-untyped-def]
    pid = httpx.get(f"{server.base}/v1/strata/backend").json()["engine"]["pid"]
    body = {"model": "default", "messages": CHAT, "max_tokens": 500, "stream": True}
    events = []
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                os.kill(pid, signal.SIGKILL)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])
    assert err["error"]["code"] == "engine_unavailable"
    deadline = time.monotonic() + 120
    while httpx.get(f"{server.base}/health").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    r = client.chat.completions.create(messages=CHAT, model="default", max_tokens=5)
    assert r.usage.completion_tokens == 5
    assert httpx.get(f"{server.base}/v1/strata/backend").json()["engine"]["pid"] != pid


def test_metrics_exposes_the_required_series(server) -> None:  # type: ignore[no-untyped-def]
    text = httpx.get(f"{server.base}/metrics").text
    for name in (
        "strata_requests_total",
        "strata_generation_tokens_total",
        "strata_time_to_first_token_seconds_bucket",
        "strata_inter_token_latency_seconds_bucket",
        "strata_queue_depth",
        "strata_busy_slots",
    ):
        assert name in text
    assert metric(server, "strata_generation_tokens_total") > 0
