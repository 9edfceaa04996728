"""llama-server's router API (strata_core/api/router.py) end to end: ``strata serve`` on
loopback with a catalog over a loopback hub (HF_ENDPOINT), a configured tiny random model,
a configured "broken" one whose GGUF is garbage, and models downloaded through
``POST /models`` and Ollama's ``/api/pull`` (the official ``ollama`` client)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.fake_hub import FakeHub
from strata_core.testing.harness import Server
from strata_core.testing.models import SHAPES, write_random, write_tokenizer

pytestmark = pytest.mark.slow

REPO = "strata/Tiny-GGUF"
OTHER = "strata/Other-GGUF"
BIG = "strata/Big-GGUF"
PROMPT = {"prompt": "abc", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def served(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, FakeHub, Path]]:
    d = tmp_path_factory.mktemp("router")
    write_tokenizer(default_model, d / "tok.gguf")
    write_random(d / "tok.gguf", d / "tiny.gguf", SHAPES["tiny"], n_ctx=512)
    write_random(d / "tok.gguf", d / "other.gguf", SHAPES["tiny"], seed=1, n_ctx=512)
    (d / "broken.gguf").write_bytes((d / "tiny.gguf").read_bytes()[:4096])  # a truncated GGUF
    config = d / "strata.toml"
    config.write_text(f"""
[server]
catalog = true

[models.tiny]
path = "{d / 'tiny.gguf'}"
n_ctx = 512

[models.broken]
path = "{d / 'broken.gguf'}"
preload = false
n_ctx = 512
""")
    with FakeHub() as hub:
        hub.add(REPO, {"tiny-Q8_0.gguf": (d / "tiny.gguf").read_bytes(), "tiny-F16.gguf": (d / "other.gguf").read_bytes()})
        hub.add(OTHER, {"other-Q4_K_M.gguf": (d / "other.gguf").read_bytes()})
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(d / "hf"), "HF_HUB_OFFLINE": "0"}
        with Server(["--backend", "cpu", "--config", str(config)], d / "server.log", env=env) as srv:
            yield srv, hub, d


class Events:
    """``GET /models/sse`` read on a thread into ``seen``, from subscription on."""

    def __init__(self, base: str) -> None:
        self.seen: list[dict[str, Any]] = []
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._read, args=(base,), daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the event stream did not open"

    def _read(self, base: str) -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.stream("GET", f"{base}/models/sse", timeout=None) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                self._ready.set()  # the first line (a comment) comes once the queue is subscribed
                if self._stop.is_set():
                    return  # (a stream the server ends as it stops is an HTTPError: ignored)
                if line.startswith("data: "):
                    self.seen.append(json.loads(line[6:]))

    def wait(self, model: str, event: str, status: str | None = None, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.seen:
                if e["model"] == model and e["event"] == event and (status is None or e["data"]["status"] == status):
                    return e
            time.sleep(0.05)
        raise AssertionError(f"no {event} {status or ''} for {model}; seen: {self.seen}")

    def close(self) -> None:
        self._stop.set()


def listed(base: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{base}/models", timeout=60)
    assert r.status_code == 200
    return {m["id"]: m for m in r.json()["data"]}


def wait_status(base: str, model: str, value: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = listed(base).get(model)
        if row is not None and row["status"]["value"] == value:
            return row
        time.sleep(0.1)
    raise AssertionError(f"{model} never {value}: {listed(base).get(model)}")


def metric(base: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=60).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.MULTILINE)
    assert m, f"{name}{{{want}}} not in /metrics"
    return float(m.group(1))


def test_models_lists_each_model_with_its_status(served: tuple[Server, FakeHub, Path]) -> None:
    base = served[0].base
    rows = listed(base)
    assert rows["tiny"]["status"]["value"] == "loaded" and rows["tiny"]["source"] == "config"
    assert rows["tiny"]["status"]["args"][0].endswith("python") or rows["tiny"]["status"]["args"]
    assert rows["broken"]["status"] == {"value": "unloaded", "args": rows["broken"]["status"]["args"]}
    assert rows["tiny"]["architecture"] == {"input_modalities": ["text"], "output_modalities": ["text"]}
    assert rows["tiny"]["can_remove"] is False
    assert metric(base, "strata_model_state", model="tiny", state="loaded") == 1
    assert metric(base, "strata_models", state="loaded") >= 1


def test_a_model_that_fails_to_load_is_failed_and_the_next_load_retries(served: tuple[Server, FakeHub, Path]) -> None:
    base, d = served[0].base, served[2]
    events = Events(base)
    try:
        r = httpx.post(f"{base}/models/load", json={"model": "broken"}, timeout=60)
        assert r.status_code == 200 and r.json() == {"success": True}  # the load runs in the background
        events.wait("broken", "status_change", "loading")
        failed = events.wait("broken", "status_change", "unloaded")["data"]
        assert failed["failed"] is True and failed["reason"]
        row = listed(base)["broken"]["status"]
        assert row["value"] == "unloaded" and row["failed"] is True and row["reason"] == failed["reason"]
        # a request for it: 503 naming the model and why; the others are served as before
        r = httpx.post(f"{base}/v1/completions", json={**PROMPT, "model": "broken"}, timeout=120)
        assert r.status_code == 503 and "'broken' could not be loaded" in r.json()["error"]["message"]
        r = httpx.post(f"{base}/v1/completions", json={**PROMPT, "model": "tiny"}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert metric(base, "strata_model_load_failures_total", model="broken") == 2
        assert metric(base, "strata_model_state", model="broken", state="failed") == 1
        # mended, the next load succeeds
        (d / "broken.gguf").write_bytes((d / "tiny.gguf").read_bytes())
        assert httpx.post(f"{base}/models/load", json={"model": "broken"}, timeout=60).status_code == 200
        assert "failed" not in wait_status(base, "broken", "loaded")["status"]
        events.wait("broken", "status_change", "loaded")
        assert metric(base, "strata_model_loads_total", model="broken") == 1
        r = httpx.post(f"{base}/models/load", json={"model": "broken"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model" and "already running" in r.text
    finally:
        events.close()


def test_unload_and_load(served: tuple[Server, FakeHub, Path]) -> None:
    base = served[0].base
    loads = metric(base, "strata_model_loads_total", model="tiny")
    r = httpx.post(f"{base}/models/unload", json={"model": "tiny"}, timeout=60)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert listed(base)["tiny"]["status"]["value"] == "unloaded"
    assert metric(base, "strata_model_state", model="tiny", state="unloaded") == 1
    r = httpx.post(f"{base}/models/unload", json={"model": "tiny"}, timeout=60)
    assert r.status_code == 400 and "not running" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/models/load", json={"model": "nothing"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(f"{base}/models/load", json={}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert httpx.post(f"{base}/models/load", json={"model": "tiny"}, timeout=60).status_code == 200
    wait_status(base, "tiny", "loaded")
    assert metric(base, "strata_model_loads_total", model="tiny") == loads + 1


def test_download_with_progress_then_delete(served: tuple[Server, FakeHub, Path]) -> None:
    base, hub = served[0].base, served[1]
    name = f"{REPO}:Q8_0"
    events = Events(base)
    try:
        r = httpx.post(f"{base}/models", json={"model": name}, timeout=60)
        assert r.status_code == 200 and r.json() == {"success": True}
        events.wait(name, "download_finished")
        progress = [e["data"] for e in events.seen if e["event"] == "download_progress" and e["model"] == name]
        assert progress, events.seen
        (url, last), = progress[-1].items()
        assert url.endswith("/tiny-Q8_0.gguf") and last["done"] == last["total"] > 0
        row = listed(base)[name]
        assert row["status"]["value"] == "unloaded" and row["source"] == "cache" and row["can_remove"] is True
        r = httpx.post(f"{base}/v1/completions", json={**PROMPT, "model": name}, timeout=120)
        assert r.status_code == 200  # served from the catalog, loaded on first use
        r = httpx.post(f"{base}/models", json={"model": name}, timeout=60)
        assert r.status_code == 400 and "already exists" in r.json()["error"]["message"]
        r = httpx.delete(f"{base}/models", params={"model": name}, timeout=60)
        assert r.status_code == 200 and r.json() == {"success": True}
        events.wait(name, "model_remove")
        assert name not in listed(base)
    finally:
        events.close()
    for model, status, words in (("tiny", 400, "not removable"), ("strata/Nothing-GGUF:Q8_0", 404, "does not exist"),
                                 ("", 400, "?model=NAME")):  # fmt: skip
        r = httpx.delete(f"{base}/models", params={"model": model}, timeout=60)
        assert r.status_code == status and words in r.json()["error"]["message"], r.text
    assert hub.requests


def test_download_errors_name_what_is_wrong(served: tuple[Server, FakeHub, Path]) -> None:
    base = served[0].base
    for model, status, words in (
        ("not a repo", 400, "OWNER/NAME"),
        (f"{REPO}:Q9_K", 404, "its quants: F16, Q8_0"),
        ("strata/Nothing-GGUF", 404, "no repository"),
    ):
        r = httpx.post(f"{base}/models", json={"model": model}, timeout=60)
        err = r.json()["error"]
        assert r.status_code == status and words in err["message"] and err["param"] == "model", r.text


def test_a_cut_download_resumes_and_a_stopped_one_too(served: tuple[Server, FakeHub, Path]) -> None:
    """The connection dropped half way through a file: huggingface_hub asks for the rest
    (Range from what it wrote, in chunks of 10 MiB: the file is larger than two). A download
    stopped through /models/unload keeps what it wrote, and the next one asks for the rest."""
    base, hub = served[0].base, served[1]
    big, name = "big-Q4_K_M.gguf", f"{BIG}:Q4_K_M"
    data = (served[2] / "tiny.gguf").read_bytes()
    hub.add(BIG, {big: data + bytes(24 * 2**20 - len(data))})  # zeros after the tensors: still a readable GGUF
    hub.cut.add(big)
    events = Events(base)
    try:
        assert httpx.post(f"{base}/models", json={"model": BIG}, timeout=60).status_code == 200
        events.wait(name, "download_finished")
        first, second = hub.downloads(big)
        assert "range" not in first and second["range"] == f"bytes={10 * 2**20}-"
        assert httpx.delete(f"{base}/models", params={"model": name}, timeout=60).status_code == 200
        # stopped half way: the first 10 MiB chunk written, then the file stalls
        events.seen.clear()
        hub.stall[big] = release = threading.Event()
        assert httpx.post(f"{base}/models", json={"model": BIG}, timeout=60).status_code == 200
        events.wait(name, "download_progress")
        assert listed(base)[name]["status"]["value"] == "downloading"
        r = httpx.post(f"{base}/models/unload", json={"model": name}, timeout=60)
        assert r.status_code == 200 and r.json() == {"success": True}
        release.set()
        assert "stopped" in events.wait(name, "download_failed")["data"]["reason"]
        assert name not in listed(base)
        assert httpx.post(f"{base}/models", json={"model": BIG}, timeout=60).status_code == 200
        events.wait(name, "download_finished", timeout=120)
        assert hub.downloads(big)[-1]["range"] == f"bytes={10 * 2**20}-"
        assert httpx.delete(f"{base}/models", params={"model": name}, timeout=60).status_code == 200
    finally:
        events.close()


def test_ollama_pull_streams_progress_and_refuses_clearly(served: tuple[Server, FakeHub, Path]) -> None:
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=served[0].base, timeout=120)
    lines = list(client.pull(OTHER, stream=True))
    assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
    progress = [ln for ln in lines if ln.total]
    assert progress and progress[-1].completed == progress[-1].total and progress[-1].digest.startswith("sha256:")
    assert client.pull(OTHER, stream=False).status == "success"  # the final line only
    for model, status, words in ((f"{REPO}:Q9_K", 404, "its quants"), ("strata/Nothing-GGUF", 404, "no repository"),
                                 ("a/b/c", 400, "OWNER/NAME")):  # fmt: skip
        with pytest.raises(ollama.ResponseError) as e:
            list(client.pull(model, stream=True))  # refused before the stream starts: a status, not a line
        assert e.value.status_code == status and words in e.value.error


@pytest.fixture(scope="module")
def sleepy(served: tuple[Server, FakeHub, Path]) -> Iterator[Server]:
    """One model (no [models.*], no catalog) whose engine sleeps after a second idle."""
    d = served[2]
    args = ["--backend", "cpu", "--model", str(d / "tiny.gguf"), "--n-ctx", "512", "--sleep-idle-seconds", "1"]
    with Server(args, d / "sleepy.log") as srv:
        yield srv


def test_an_idle_engine_sleeps_and_the_next_request_wakes_it(sleepy: Server) -> None:
    base = sleepy.base
    (name,) = listed(base)
    events = Events(base)
    try:
        events.wait(name, "status_change", "sleeping", timeout=30)
        # what asks about the server neither wakes it nor keeps it awake (llama-server's list)
        for _ in range(2):
            assert httpx.get(f"{base}/health", timeout=60).json() == {"status": "ok"}
            assert listed(base)[name]["status"]["value"] == "sleeping"
            assert metric(base, "strata_model_state", model=name, state="sleeping") == 1
            time.sleep(0.6)
        assert httpx.get(f"{base}/v1/strata/backend", timeout=60).json()["models"][name]["loaded"] is False
        r = httpx.post(f"{base}/v1/completions", json={**PROMPT, "model": name}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        woke = [e["data"]["status"] for e in events.seen if e["event"] == "status_change"]
        assert woke[-3:] == ["sleeping", "loading", "loaded"] or woke[-4:-1] == ["sleeping", "loading", "loaded"]
        assert metric(base, "strata_model_loads_total", model=name) == 2  # at start, and the wake
    finally:
        events.close()


def test_a_server_with_an_event_stream_open_stops_when_told(sleepy: Server) -> None:
    """uvicorn waits for open responses before it stops; the endless event stream ends then."""
    events = Events(sleepy.base)
    sleepy.stop()  # SIGTERM, then SIGKILL after 20 s
    assert sleepy.proc.returncode == -signal.SIGTERM, sleepy.proc.returncode
    events.close()
