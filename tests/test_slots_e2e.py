"""llama-server's slots on the real engine and the default model: GET /slots, and a slot's
cache saved to a file, brought back after a restart and reused as a cache hit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

ARGS = ["--backend", "cpu", "--parallel", "2", "--n-ctx", "1024"]
#: a long system prompt an agent session would keep (about 190 tokens)
PROMPT = "You are a careful assistant for a small bakery. " * 19 + "Question: what is bread?"


def post(base: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=300)


def complete(base: str) -> dict[str, Any]:
    r = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200, r.text
    return r.json()["usage"]  # type: ignore[no-any-return]


def slots(base: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/slots", timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


def serve(slot_dir: Path, name: str) -> Server:
    return Server(ARGS, slot_dir.parent / f"{name}.log", env={"STRATA_SERVER_SLOT_SAVE_PATH": str(slot_dir)})


@pytest.fixture(scope="module")
def saved(cpu_engine: EngineBuild, slot_dir: Path) -> Iterator[dict[str, Any]]:
    """A server that answered PROMPT and saved its slot; the save's answer. The server is
    gone when the test runs: the file must outlive it."""
    with serve(slot_dir, "first") as srv:
        assert [s["n_prompt_tokens"] for s in slots(srv.base)] == [0, 0]
        usage = complete(srv.base)
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        [slot] = [s for s in slots(srv.base) if s["n_prompt_tokens"]]
        assert slot["n_ctx"] == 1024 and slot["is_processing"] is False
        r = post(srv.base, f"/slots/{slot['id']}?action=save", {"filename": "bakery.bin"})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["id_slot"] == slot["id"] and answer["n_saved"] == slot["n_prompt_tokens"] >= usage["prompt_tokens"]
        assert answer["n_written"] == (slot_dir / "bakery.bin").stat().st_size
        for bad in ("../bakery.bin", "a/b.bin", "/tmp/x.bin", "..", ""):
            r = post(srv.base, f"/slots/{slot['id']}?action=save", {"filename": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "filename", (bad, r.text)
        r = post(srv.base, f"/slots/{slot['id']}?action=erase")
        assert r.json() == {"id_slot": slot["id"], "n_erased": slot["n_prompt_tokens"]}
        assert [s["n_prompt_tokens"] for s in slots(srv.base)] == [0, 0]
        yield answer


@pytest.fixture(scope="module")
def restarted(saved: dict[str, Any], slot_dir: Path) -> Iterator[Server]:
    """A new server on the same slot directory, after the first one stopped."""
    with serve(slot_dir, "second") as srv:
        yield srv


def test_a_restored_slot_is_a_cache_hit_after_a_restart(saved: dict[str, Any], restarted: Server) -> None:
    base = restarted.base
    assert [s["n_prompt_tokens"] for s in slots(base)] == [0, 0]  # a new engine holds nothing
    r = post(base, "/slots/1?action=restore", {"filename": "bakery.bin"})
    assert r.status_code == 200, r.text
    assert r.json()["n_restored"] == saved["n_saved"] and r.json()["id_slot"] == 1
    assert slots(base)[1]["n_prompt_tokens"] == saved["n_saved"]
    usage = complete(base)
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    r = post(base, "/slots/0?action=restore", {"filename": "missing.bin"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "filename"


def test_a_busy_slot_shows_its_request_and_saves_once_idle(restarted: Server) -> None:
    base = restarted.base
    body = {"prompt": "Count: one, two,", "max_tokens": 64, "temperature": 0.5, "top_k": 7,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()  # (kept: a generator dropped closes the stream, which cancels the request)
        next(lines)  # its first token is out: it is decoding
        [busy] = [s for s in slots(base) if s["is_processing"]]
        assert busy["params"]["temperature"] == 0.5 and busy["params"]["top_k"] == 7
        assert busy["next_token"][0]["n_remain"] + busy["next_token"][0]["n_decoded"] == 64
        # a save waits for the request to end (llama-server defers it), then writes its cache
        saved = post(base, f"/slots/{busy['id']}?action=save", {"filename": "busy.bin"})
        assert saved.status_code == 200 and saved.json()["n_saved"] >= 64, saved.text
        assert "data: [DONE]" in list(lines)


@pytest.mark.parametrize(("path", "param"), [("/slots/9?action=erase", "id_slot"), ("/slots/x?action=erase", "id_slot"),
                                             ("/slots/0?action=drop", "action"), ("/slots/0", "action")])  # fmt: skip
def test_bad_actions_are_400(restarted: Server, path: str, param: str) -> None:
    r = post(restarted.base, path)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_without_a_slot_directory_actions_are_501(server: Server) -> None:
    assert len(slots(server.base)) == 4  # listing needs no directory
    r = post(server.base, "/slots/0?action=save", {"filename": "x.bin"})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
