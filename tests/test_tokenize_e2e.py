"""llama-server's /tokenize and /detokenize on the real engine and the default model."""

from __future__ import annotations

import httpx
import pytest

from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

TEXT = "Hello <|im_start|> wörld"


def post(server: Server, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json=body, timeout=60)


def test_tokenize_detokenize_round_trip(server: Server) -> None:
    ids = post(server, "/tokenize", {"content": TEXT}).json()["tokens"]
    assert post(server, "/detokenize", {"tokens": ids}).json() == {"content": TEXT}
    pieces = post(server, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    assert b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                    for p in pieces).decode() == TEXT  # fmt: skip
    # parse_special false: the special token's text is plain text, more tokens
    plain = post(server, "/tokenize", {"content": TEXT, "parse_special": False}).json()["tokens"]
    assert len(plain) > len(ids)
    info = httpx.get(f"{server.base}/v1/strata/backend").json()["engine"]
    special = post(server, "/tokenize", {"content": TEXT, "add_special": True}).json()["tokens"]
    assert special == ([info["bos"]] + ids if info.get("add_bos") else ids)


def test_tokenize_messages_counts_the_chat_prompt(server: Server) -> None:
    messages = [{"role": "user", "content": "What is 2+2?"}]
    ids = post(server, "/tokenize", {"messages": messages}).json()["tokens"]
    plain = post(server, "/tokenize", {"content": "What is 2+2?"}).json()["tokens"]
    assert len(ids) > len(plain)  # the template's markup is counted
    r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()
    assert r["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {}, None), ("/tokenize", {"content": "x", "messages": [{"role": "user", "content": "x"}]}, None),
    ("/detokenize", {"tokens": [-1]}, "tokens.0"), ("/detokenize", {"tokens": [10**9]}, "tokens"),
    # the conversation's own rules: once a ValidationError and a 500 (found by the fuzzer)
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {'"d': {}}},
     "chat_template_kwargs"),
])  # fmt: skip
def test_bad_requests_are_400(server: Server, path: str, body: dict[str, object], param: str | None) -> None:
    r = post(server, path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()
