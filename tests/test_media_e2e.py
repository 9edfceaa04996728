"""Images in: chat image_url parts (and the Responses and Messages forms) through the real
engine's mtmd, with a random-weight LLaVA-style projector over the default model, checked
against llama.cpp's own llama-server --mmproj on the same build."""

from __future__ import annotations

import base64
import os
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild, source_dir
from strata_core.testing.harness import EngineProcess, Server, llama_server_binary
from strata_core.testing.harness import llama_server as run_llama_server
from strata_core.testing.projector import image_tokens, write_vision_projector

pytestmark = pytest.mark.slow

N_EMBD = 576  # the default model's embedding width
MAX_MEDIA = 3


def png(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    """A small RGB PNG: ``color`` shaded left to right (no imaging library needed)."""
    rows = b"".join(
        b"\x00" + b"".join(bytes(c * (width + x) // (2 * width) for c in color) for x in range(width))
        for _ in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


RED, BLUE = png(40, 30, (250, 20, 20)), png(24, 24, (20, 40, 250))


def ask(text: str, *images: bytes, before: bool = False) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    parts = [*parts, {"type": "text", "text": text}] if before else [{"type": "text", "text": text}, *parts]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mmproj") / "mmproj-random.gguf"
    write_vision_projector(path, N_EMBD)
    return path


@pytest.fixture(scope="module")
def media_server(cpu_engine: EngineBuild, mmproj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("media") / "server.log"
    env = {"STRATA_SERVER_MAX_MEDIA_PER_REQUEST": str(MAX_MEDIA), "STRATA_SERVER_MAX_BODY_BYTES": str(256 << 10)}
    with Server(["--backend", "cpu", "--mmproj", str(mmproj), "--parallel", "2", "--n-ctx", "1024"], log, env) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(media_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{media_server.base}/v1", api_key="unused", max_retries=0, timeout=300)


def reply(client: openai.OpenAI, messages: list[dict[str, Any]], max_tokens: int = 16) -> tuple[str, int]:
    r = client.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=max_tokens)  # type: ignore[arg-type]
    assert r.usage is not None
    return r.choices[0].message.content or "", r.usage.prompt_tokens


@pytest.fixture(scope="module")
def engine(cpu_engine: EngineBuild, default_model: Path, mmproj: Path) -> Iterator[EngineProcess]:
    eng = EngineProcess(CpuBackend(), cpu_engine, default_model, mmproj=mmproj)
    yield eng
    eng.close()


def tokenize(engine: EngineProcess, rid: str, *parts: tuple[str, bytes]) -> proto.Event:
    engine.send(proto.MediaTokenize(rid, parts))
    return engine.next_event()


def test_the_engine_tokenizes_media_and_reuses_their_cache(engine: EngineProcess) -> None:
    assert engine.ready.info["inputs"] == ["text", "image"]
    ev = tokenize(engine, "m1", ("text", b"<|im_start|>user\nLook:"), ("media", RED), ("text", b" ok?<|im_end|>\n"))
    assert isinstance(ev, proto.MediaTokens) and len(ev.spans) == 1
    span = ev.spans[0]
    assert span.n == image_tokens() and ev.ids[span.pos : span.pos + span.n] == (0,) * span.n
    media = proto.encode_spans(ev.spans)
    first = engine.run("g1", list(ev.ids), max_tokens=4, media=media)
    again = engine.run("g2", list(ev.ids), max_tokens=4, media=media)
    tokens = [[e.id for e in evs if isinstance(e, proto.Token)] for evs in (first, again)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 4
    done = [evs[-1] for evs in (first, again)]
    assert isinstance(done[1], proto.Done) and int(done[1].stats["prompt"]) == len(ev.ids)
    assert int(done[1].stats["cached"]) > span.pos + span.n  # the image came from the cache
    other = tokenize(engine, "m2", ("text", b"<|im_start|>user\nLook:"), ("media", BLUE), ("text", b" ok?<|im_end|>\n"))
    assert isinstance(other, proto.MediaTokens) and other.spans[0].key != span.key


def test_the_engine_refuses_media_it_cannot_take(engine: EngineProcess) -> None:
    ev = tokenize(engine, "m3", ("text", b"x"), ("media", b"not an image at all"), ("text", b"y"))
    assert isinstance(ev, proto.Error) and "media item 0" in ev.message
    unknown = engine.run("g3", [1, 0, 0, 2], media="00ff:1:2")
    assert isinstance(unknown[0], proto.Error) and "not known" in unknown[0].message


def test_models_and_backend_say_the_model_takes_images(media_server: Server) -> None:
    models = httpx.get(f"{media_server.base}/v1/models").json()["data"]
    assert models[0]["inputs"] == ["text", "image"]
    backend = httpx.get(f"{media_server.base}/v1/strata/backend").json()
    assert backend["inputs"] == ["text", "image"] and backend["engine"]["inputs"] == ["text", "image"]


def test_an_image_is_seen_and_counted(api: openai.OpenAI) -> None:
    text, n_text = reply(api, [{"role": "user", "content": "Describe the picture."}])
    red, n_red = reply(api, ask("Describe the picture.", RED))
    blue, n_blue = reply(api, ask("Describe the picture.", BLUE))
    assert n_red == n_blue == n_text + image_tokens()  # usage counts the image's positions
    assert len({text, red, blue}) == 3, (text, red, blue)  # the model sees each image
    again, _ = reply(api, ask("Describe the picture.", RED))
    assert again == red


def test_several_images_in_order(api: openai.OpenAI) -> None:
    both, n = reply(api, ask("Compare them.", RED, BLUE))
    swapped, n_swapped = reply(api, ask("Compare them.", BLUE, RED))
    assert n == n_swapped
    assert both != swapped


def test_seeded_replay_and_logprobs_with_an_image(api: openai.OpenAI) -> None:
    def sampled() -> tuple[str, list[float]]:
        r = api.chat.completions.create(model="default", messages=ask("Tell me a story.", RED), temperature=1.0,  # type: ignore[arg-type]
                                        seed=1234, max_tokens=12, logprobs=True)  # fmt: skip
        assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content
        return r.choices[0].message.content or "", [t.logprob for t in r.choices[0].logprobs.content]

    assert sampled() == sampled()


def test_tokenize_with_messages_counts_media(media_server: Server, api: openai.OpenAI) -> None:
    messages = ask("Describe the picture.", RED)
    tokens = httpx.post(f"{media_server.base}/tokenize", json={"messages": messages}, timeout=300).json()["tokens"]
    _, n = reply(api, messages, max_tokens=1)
    assert len(tokens) == n
    assert tokens.count(-1) == image_tokens() and -1 not in tokens[:20], "the image's positions hold no token"
    two = ask("Compare them.", RED, BLUE)
    body = {"messages": two, "with_pieces": True}
    pieces = httpx.post(f"{media_server.base}/tokenize", json=body, timeout=300).json()["tokens"]
    media = [p["media"] for p in pieces if p["id"] == -1]
    assert media == [0] * image_tokens() + [1] * image_tokens()
    assert all(p["piece"] is None for p in pieces if p["id"] == -1)
    assert "".join(p["piece"] for p in pieces if p["id"] != -1).count("Compare them.") == 1


def test_a_resent_image_reuses_the_cache(media_server: Server, api: openai.OpenAI) -> None:
    first = ask("What is in this image? Answer in one word.", BLUE)
    answer, _ = reply(api, first, max_tokens=4)
    follow = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
    r = httpx.post(f"{media_server.base}/v1/chat/completions",
                   json={"messages": follow, "temperature": 0, "max_tokens": 2}, timeout=300).json()  # fmt: skip
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > image_tokens()


def test_responses_and_messages_take_images(media_server: Server, api: openai.OpenAI) -> None:
    chat, _ = reply(api, ask("Describe the picture.", RED))
    resp = httpx.post(f"{media_server.base}/v1/responses", json={
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Describe the picture."},
                                               {"type": "input_image", "image_url": data_url(RED)}]}],
        "temperature": 0, "max_output_tokens": 16}, timeout=300).json()  # fmt: skip
    assert resp["output"][0]["content"][0]["text"] == chat
    msg = httpx.post(f"{media_server.base}/v1/messages", json={
        "model": "default", "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe the picture."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(RED).decode()}}]}]}, timeout=300).json()  # fmt: skip
    assert msg["content"][0]["text"] == chat


def test_a_real_jpeg(api: openai.OpenAI) -> None:
    jpeg = (source_dir(print) / "vendor/llama.cpp/tools/mtmd/test-1.jpeg").read_bytes()
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                             {"type": "image_url", "image_url": {"url": data_url(jpeg, "image/jpeg")}}]}]  # fmt: skip
    text, n = reply(api, messages)
    assert text and n > image_tokens()


def image_part(url: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"},
                                                      {"type": "image_url", "image_url": {"url": url}}]}]}  # fmt: skip


BAD = [
    ("not base64", image_part("data:image/png;base64,@@@"), 400, "messages.0.content.1", "invalid_value"),
    ("does not decode", image_part(data_url(b"hello, not an image")), 400, "messages.0.content.1", "invalid_media"),
    ("a format stb reads not", image_part(data_url(b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp")), 400,
     "messages.0.content.1", "invalid_media"),
    ("file URL", image_part("file:///etc/passwd"), 400, "messages.0.content.1", "invalid_value"),
    ("http URL with fetching off", image_part("http://127.0.0.1:9/x.png"), 400, "messages.0.content.1", "fetch_refused"),
    ("image_url without url", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400, "messages.0.content", "invalid_value"),
    ("more images than max_media_per_request", {"messages": ask("x", *[RED] * (MAX_MEDIA + 1))}, 400,
     f"messages.0.content.{MAX_MEDIA + 1}", "too_many_media"),
    ("a data URL over the body limit", image_part(data_url(os.urandom(300 << 10))), 413, None, None),
]


@pytest.mark.parametrize("name,body,status,param,code", BAD, ids=[b[0] for b in BAD])
def test_bad_media(media_server: Server, name: str, body: dict[str, Any], status: int, param: str | None, code: str | None) -> None:
    r = httpx.post(f"{media_server.base}/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=300)
    assert r.status_code == status, r.text
    if param is not None:
        e = r.json()["error"]
        assert (e["param"], e["code"]) == (param, code), e
    # the engine is unharmed: a good request still works
    assert reply(openai.OpenAI(base_url=f"{media_server.base}/v1", api_key="x", max_retries=0), ask("Hi", RED), 2)[0]


# ---- the same request through llama.cpp's own llama-server --mmproj ----------------------


@pytest.fixture(scope="module")
def llama_server(cpu_engine: EngineBuild, default_model: Path, mmproj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary(cpu_engine)
    if binary is None:
        pytest.skip("no llama-server in the engine's build tree (python -m bench.peers builds it)")
    flash = {True: "on", False: "off", None: "auto"}[CpuBackend().engine_defaults().flash_attn]
    log_path = tmp_path_factory.mktemp("llama-server") / "llama-server.log"
    args = ["-m", str(default_model), "--mmproj", str(mmproj), "-fa", flash, "-c", "2048", "-np", "2", "-t", "2",
            "--no-webui"]  # fmt: skip
    with run_llama_server(binary, args, log_path) as base:
        yield base


PEER_CASES = [
    ("image after text", ask("Describe the picture.", RED)),
    ("image before text", ask("What do you see?", BLUE, before=True)),
    ("two images", ask("Which is brighter?", RED, BLUE)),
]


def peer_reply(base: str, messages: list[dict[str, Any]], n: int = 24) -> tuple[str, int]:
    # cache_prompt off: a prompt llama-server has seen is otherwise re-read from its cache
    # but for the last token, decoded alone, and its reply then parts from its own first one
    body = {"messages": messages, "temperature": 0, "max_tokens": n, "model": "default", "cache_prompt": False}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300).json()
    return r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens"]


def test_prompt_and_reply_start_match_llama_servers(api: openai.OpenAI, llama_server: str) -> None:
    """The same prompt positions (text and image tokens) and the same start of the greedy
    reply as llama-server --mmproj: the image is encoded and placed as llama-server does."""
    for name, messages in PEER_CASES:
        theirs = peer_reply(llama_server, messages, 8)
        ours = reply(api, messages, max_tokens=8)
        assert ours[1] == theirs[1], name
        assert ours[0][:16] == theirs[0][:16], (name, ours, theirs)


def test_greedy_tokens_equal_llama_servers(api: openai.OpenAI, llama_server: str) -> None:
    for name, messages in PEER_CASES:
        theirs = peer_reply(llama_server, messages)
        ours = reply(api, messages, max_tokens=24)
        assert ours == theirs, name


def test_equal_beside_other_requests(media_server: Server, api: openai.OpenAI, llama_server: str) -> None:
    theirs = [peer_reply(llama_server, m) for _, m in PEER_CASES]
    others = [[{"role": "user", "content": f"Count to {k} in words."}] for k in range(3, 7)]
    with ThreadPoolExecutor(8) as pool:
        ours = [pool.submit(reply, api, m, 24) for _, m in PEER_CASES]
        busy = [pool.submit(reply, api, m, 40) for m in others]
        assert [f.result() for f in ours] == theirs
        assert all(f.result()[0] for f in busy)
