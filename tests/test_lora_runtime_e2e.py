"""LoRA adapters loaded and unloaded while the server runs: vLLM's /v1/load_lora_adapter
and /v1/unload_lora_adapter (their status codes and messages), an adapter named as the
request's ``model``, llama-server's POST /lora-adapters (default scales), adapters of
another model or no adapter at all refused with a 400, and an unload that waits for the
request running on its adapter."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server
from strata_core.testing.models import (
    SHAPES,
    write_lora,
    write_random,
    write_reranker,
    write_tokenizer,
)

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def files(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora-runtime")
    write_tokenizer(default_model, d / "tok.gguf")
    write_random(d / "tok.gguf", d / "tiny.gguf", SHAPES["tiny"], n_ctx=512)
    write_reranker(d / "tok.gguf", d / "qwen3.gguf")
    out = {"a": d / "a.gguf", "smaller": d / "smaller.gguf", "qwen3": d / "qwen3-lora.gguf", "junk": d / "junk.gguf"}
    write_lora(default_model, out["a"], seed=1)
    write_lora(d / "tiny.gguf", out["smaller"])  # a llama too, of another size
    write_lora(d / "qwen3.gguf", out["qwen3"])  # another architecture
    out["junk"].write_text("not a GGUF")
    return out


@pytest.fixture(scope="module")
def srv(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("lora-runtime-server")
    cfg = d / "strata.toml"
    cfg.write_text(f'[server]\nlora_loading = true\n\n'
                   f'[engine]\nbackend = "cpu"\nmodel = "{default_model}"\nparallel = 2\nn_ctx = 512\n')  # fmt: skip
    with Server(["--config", str(cfg)], d / "server.log") as s:
        yield s


def post(srv: Server, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{srv.base}{path}", json=body, timeout=300)


def complete(srv: Server, n: int = 8, **fields: Any) -> str:
    r = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": n, **fields})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def adapters(srv: Server) -> list[dict[str, Any]]:
    return httpx.get(f"{srv.base}/lora-adapters", timeout=30).json()  # type: ignore[no-any-return]


def test_load_name_as_model_set_scales_unload(srv: Server, files: dict[str, Path]) -> None:
    base = complete(srv)
    r = post(srv, "/v1/load_lora_adapter", {"lora_name": "pirate", "lora_path": str(files["a"])})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'pirate' added successfully.")
    assert adapters(srv) == [{"id": 0, "name": "pirate", "path": str(files["a"]), "scale": 0.0}]
    cards = {c["id"]: c for c in httpx.get(f"{srv.base}/v1/models").json()["data"]}
    assert cards["pirate"]["parent"] in cards and cards["pirate"]["root"] == str(files["a"])
    assert complete(srv) == base  # loaded at scale 0: nobody gets it unasked
    pirate = complete(srv, model="pirate")
    named = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "model": "pirate"}).json()
    assert named["model"] == "pirate"  # answered by the adapter's name, as vLLM does
    assert pirate != base and pirate == complete(srv, lora=[{"id": 0, "scale": 1.0}])

    again = post(srv, "/v1/load_lora_adapter", {"lora_name": "pirate", "lora_path": str(files["a"])})
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]

    assert post(srv, "/lora-adapters", [{"id": 0, "scale": 1.0}]).json() == {"success": True}
    assert adapters(srv)[0]["scale"] == 1.0 and complete(srv) == pirate  # the default scales now
    assert post(srv, "/lora-adapters", []).json() == {"success": True}
    assert complete(srv) == base
    bad = post(srv, "/lora-adapters", [{"id": 5, "scale": 1.0}])
    assert bad.status_code == 400 and "id 5" in bad.json()["error"]["message"]

    r = post(srv, "/v1/unload_lora_adapter", {"lora_name": "pirate"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'pirate' removed successfully.")
    assert adapters(srv) == []
    assert post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "model": "pirate"}).status_code == 404
    gone = post(srv, "/v1/unload_lora_adapter", {"lora_name": "pirate"})
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "The lora adapter 'pirate' cannot be found."
    assert complete(srv) == base


@pytest.mark.parametrize("name,status,says", [
    ("smaller", 400, "another size"), ("qwen3", 400, "for a qwen3 model"), ("junk", 400, "not a readable GGUF"),
    ("missing", 404, "No adapter found"),
])  # fmt: skip
def test_an_adapter_of_another_model_or_no_adapter_is_refused(
    srv: Server, files: dict[str, Path], name: str, status: int, says: str
) -> None:
    path = files.get(name, files["a"].with_name("missing.gguf"))
    r = post(srv, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    assert name not in {a["name"] for a in adapters(srv)}
    assert complete(srv, n=2)  # the engine serves on


def test_loading_is_off_unless_the_operator_turns_it_on(server: Server, files: dict[str, Path]) -> None:
    for path, body in [("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(files["a"])}),
                       ("/v1/unload_lora_adapter", {"lora_name": "a"})]:  # fmt: skip
        r = post(server, path, body)
        assert r.status_code == 403 and "lora_loading = true" in r.json()["error"]["message"], r.text


def test_a_request_must_name_both(srv: Server) -> None:
    r = post(srv, "/v1/load_lora_adapter", {"lora_name": "x"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."
    assert post(srv, "/v1/unload_lora_adapter", {}).status_code == 400


def stream_while(srv: Server, body: dict[str, Any], action: Any) -> tuple[str, float, Any, float]:
    """Stream ``body``'s reply, running ``action`` once its first chunk is in: the reply's
    text and when it ended, what ``action`` returned and when it did."""
    texts: list[str] = []
    done: dict[str, Any] = {}

    def act() -> None:
        done["result"] = action()
        done["at"] = time.monotonic()

    with httpx.stream("POST", f"{srv.base}/v1/completions", json={**body, "stream": True}, timeout=300) as stream:
        worker = threading.Thread(target=act)
        for line in stream.iter_lines():
            if line.startswith("data: {"):
                texts.append(httpx.Response(200, content=line[6:]).json()["choices"][0]["text"])
                if not worker.is_alive() and "at" not in done:
                    worker.start()
        ended = time.monotonic()
    worker.join(timeout=120)
    return "".join(texts), ended, done["result"], done["at"]


def test_requests_running_keep_their_scales_when_the_defaults_change(srv: Server, files: dict[str, Path]) -> None:
    assert post(srv, "/v1/load_lora_adapter", {"lora_name": "d", "lora_path": str(files["a"])}).status_code == 200
    i = next(a["id"] for a in adapters(srv) if a["name"] == "d")
    body = {"prompt": PROMPT, "max_tokens": 32, "ignore_eos": True}
    base, on_d = complete(srv, n=32, ignore_eos=True), complete(srv, model="d")
    assert not base.startswith(on_d)
    text, _, during, _ = stream_while(srv, body, lambda: (post(srv, "/lora-adapters", [{"id": i, "scale": 1.0}]),
                                                          complete(srv)))  # fmt: skip
    assert text == base  # started under scale 0: ends under it
    assert during[0].json() == {"success": True} and during[1] == on_d  # a new request gets the new scale
    # (short replies: one decoded apart and one in the shared batch may part at a near-tie later on)
    assert complete(srv) == on_d
    assert post(srv, "/lora-adapters", []).json() == {"success": True}
    assert base.startswith(complete(srv))
    assert post(srv, "/v1/unload_lora_adapter", {"lora_name": "d"}).status_code == 200


def test_an_unload_waits_for_the_request_running_on_the_adapter(srv: Server, files: dict[str, Path]) -> None:
    assert post(srv, "/v1/load_lora_adapter", {"lora_name": "slow", "lora_path": str(files["a"])}).status_code == 200
    body = {"prompt": PROMPT, "max_tokens": 32, "model": "slow", "ignore_eos": True}
    whole = complete(srv, n=32, model="slow", ignore_eos=True)
    text, ended, r, unloaded = stream_while(srv, body, lambda: post(srv, "/v1/unload_lora_adapter",
                                                                    {"lora_name": "slow"}))  # fmt: skip
    assert r.status_code == 200 and unloaded >= ended
    assert text == whole  # the whole reply, on the adapter to its end
    assert "slow" not in {a["name"] for a in adapters(srv)}
