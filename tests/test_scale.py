"""Issue 16, items 1-4: ``strata serve --replicas 2`` on a local Ray cluster, on the CPU,
with two models: the OpenAI routes through Ray Serve replicas, each model in each
replica, prefix-aware routing, and what happens when a replica's engine, or the replica
itself, is killed. Real engines, a real Ray cluster, the official client."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import ray.serve  # noqa: F401  (the test extra installs Ray: without it this file fails, never skips)

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Count from 1 to 50, separated by commas."}]


@pytest.fixture(scope="module")
def cluster(cpu_engine: EngineBuild, default_model: Path, draft_model: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # fmt: skip
    """2 replicas; ``small`` (the default model) starts with them, ``cut`` (its first 28
    layers) on its first request in a replica."""
    tmp = tmp_path_factory.mktemp("scale")
    (tmp / "strata.toml").write_text(f"""
[cluster]
replicas = 2

[engine]
backend = "cpu"
parallel = 2
n_ctx = 512

[models.small]
path = "{default_model}"

[models.cut]
path = "{draft_model}"
preload = false
""")
    with Server(["--config", str(tmp / "strata.toml")], tmp / "server.log") as srv:
        yield srv


def client_of(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def replicas(server: Server, want: int = 2, within: float = 120) -> dict[str, dict]:  # type: ignore[type-arg]
    """Replica id -> its backend report (pid, engine pid), once ``want`` live ones answered."""
    seen: dict[str, dict] = {}  # type: ignore[type-arg]
    deadline = time.monotonic() + within
    while len(seen) < want:
        assert time.monotonic() < deadline, f"saw only replicas {sorted(seen)}"
        r = httpx.get(f"{server.base}/v1/strata/backend", timeout=30)
        if r.status_code == 200 and r.json()["engine"].get("pid"):
            b = r.json()
            seen[b["replica"]["id"]] = b
        else:
            time.sleep(0.5)
    return seen


def stream_and_kill(server: Server, pid_of: str) -> tuple[str, list[str]]:
    """Start a long stream, kill ``pid_of`` ("engine" or "replica") of the replica serving
    it after 3 events; the replica's id and the stream's data lines."""
    body = {"model": "small", "messages": CHAT, "max_tokens": 400, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        rid = resp.headers["x-strata-replica"]
        victim = replicas(server)[rid]
        pid = victim["engine"]["pid"] if pid_of == "engine" else victim["replica"]["pid"]
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:
                    os.kill(pid, signal.SIGKILL)
    return rid, events


def test_openai_routes_through_two_replicas(cluster: Server) -> None:
    client = client_of(cluster)
    assert [m.id for m in client.models.list()] == ["small", "cut"]
    whole = client.chat.completions.create(model="small", messages=CHAT, max_tokens=12)
    chunks = list(client.chat.completions.create(model="small", messages=CHAT, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12
    r = client.completions.create(model="small", prompt="The capital of France is", max_tokens=8)
    assert "Paris" in r.choices[0].text
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=CHAT, max_tokens=2)
    assert len(replicas(cluster)) == 2  # two replicas, two engines
    assert len({b["engine"]["pid"] for b in replicas(cluster).values()}) == 2


def test_each_replica_serves_every_model(cluster: Server) -> None:
    client = client_of(cluster)
    served = set()
    for i in range(16):  # "cut" loads in each replica on the first request it gets there
        raw = client.chat.completions.with_raw_response.create(
            model="cut", messages=[{"role": "user", "content": f"Say {i}"}], max_tokens=4)  # fmt: skip
        r = raw.parse()
        assert r.model == "cut" and r.usage.completion_tokens == 4
        served.add(raw.headers["x-strata-replica"])
        if len(served) == 2:
            break
    assert len(served) == 2, "16 different prompts all went to one replica"
    report = httpx.get(f"{cluster.base}/v1/strata/backend", params={"model": "cut"}, timeout=30).json()
    loaded = {"backend": "cpu", "loaded": True, "inputs": ["text"]}
    assert report["models"] == {"small": loaded, "cut": loaded}
    small = replicas(cluster)[report["replica"]["id"]]  # the same replica's default model
    assert report["engine"]["pid"] != small["engine"]["pid"]
    assert report["model_file"] != small["model_file"]


def test_a_conversation_stays_on_the_replica_holding_its_prefix(cluster: Server) -> None:
    client = client_of(cluster)
    for conv in range(4):
        msgs = [{"role": "system", "content": f"You are assistant number {conv}. " * 8},
                {"role": "user", "content": f"Tell me about the number {conv * 7}."}]  # fmt: skip
        served, cached = set(), []
        for _ in range(3):
            raw = client.chat.completions.with_raw_response.create(model="small", messages=msgs, max_tokens=4)
            r = raw.parse()
            served.add(raw.headers["x-strata-replica"])
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "More."}]
        assert len(served) == 1, f"conversation {conv} moved between replicas {served}"
        assert all(c > 60 for c in cached[1:]), cached


def error_then_done(events: list[str]) -> None:
    assert events[-1] == "[DONE]", events[-3:]
    assert json.loads(events[-2])["error"]["code"] == "engine_unavailable"


def test_engine_killed_fails_its_stream_others_serve_and_it_restarts(cluster: Server) -> None:
    rid, events = stream_and_kill(cluster, "engine")
    error_then_done(events)
    client = client_of(cluster)
    for i in range(4):  # served at once: by the other replica, or retried there
        r = client.chat.completions.create(model="small", messages=[{"role": "user", "content": f"Hi {i}"}],
                                           max_tokens=3)  # fmt: skip
        assert r.usage.completion_tokens == 3
    deadline = time.monotonic() + 60
    while replicas(cluster)[rid]["restarts"] < 1:
        assert time.monotonic() < deadline, "the killed engine never came back"


def test_replica_killed_fails_its_stream_others_serve_and_it_comes_back(cluster: Server) -> None:
    before = replicas(cluster)
    rid, events = stream_and_kill(cluster, "replica")
    error_then_done(events)
    client = client_of(cluster)
    for i in range(4):
        r = client.chat.completions.create(model="small", messages=[{"role": "user", "content": f"Yo {i}"}],
                                           max_tokens=3)  # fmt: skip
        assert r.usage.completion_tokens == 3
    deadline = time.monotonic() + 90
    while True:  # Ray Serve starts a replacement replica
        now = replicas(cluster, within=90)
        if rid not in now and len(now) == 2:
            break
        assert time.monotonic() < deadline, f"no replacement for {rid}: {sorted(now)}"
    assert set(now) - set(before), "the replacement is a new replica"
