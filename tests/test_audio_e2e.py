"""Audio in: chat input_audio parts (and Responses audio input_file parts) through the real
engine's mtmd, with a random-weight Ultravox-style audio projector over the default model,
checked against llama.cpp's own llama-server --mmproj on the same build."""

from __future__ import annotations

import base64
import io
import math
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import test_media_e2e as images
from test_media_e2e import N_EMBD, RED, data_url, peer_reply, reply

from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild, source_dir
from strata_core.testing.harness import EngineProcess, Server
from strata_core.testing.projector import audio_tokens, write_audio_projector

pytestmark = pytest.mark.slow

# the image tests' fixtures, over this module's mmproj and media_server
api, engine, llama_server = images.api, images.engine, images.llama_server


def wav(seconds: float, rate: int, tone: float) -> bytes:
    """A mono 16-bit WAV: a tone rising from ``tone`` Hz, loud enough to fill the mel bins."""
    frames = bytearray()
    for i in range(int(seconds * rate)):
        t = i / rate
        frames += int(12000 * math.sin(2 * math.pi * tone * t * (1 + t))).to_bytes(2, "little", signed=True)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(frames))
    return out.getvalue()


MP3 = (source_dir(print) / "vendor/llama.cpp/tools/mtmd/test-2.mp3").read_bytes()
CHIRP = wav(2.0, 16000, 300.0)
LONG = wav(31.0, 8000, 150.0)  # over one 30 s window: two chunks (mtmd resamples to 16 kHz)


def clip(data: bytes, fmt: str) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def ask(text: str, *clips: tuple[bytes, str], before: bool = False) -> list[dict[str, Any]]:
    parts = [clip(*c) for c in clips]
    parts = [*parts, {"type": "text", "text": text}] if before else [{"type": "text", "text": text}, *parts]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mmproj") / "mmproj-audio-random.gguf"
    write_audio_projector(path, N_EMBD)
    return path


@pytest.fixture(scope="module")
def media_server(cpu_engine: EngineBuild, mmproj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("audio") / "server.log"
    env = {"STRATA_SERVER_MAX_BODY_BYTES": str(2 << 20)}
    with Server(["--backend", "cpu", "--mmproj", str(mmproj), "--parallel", "2", "--n-ctx", "1024"], log, env) as srv:
        yield srv


def test_the_engine_cuts_a_long_clip_into_windows_keyed_apart(engine: EngineProcess) -> None:
    assert engine.ready.info["inputs"] == ["text", "audio"]
    parts = (("text", b"<|im_start|>user\nHear:"), ("media", LONG), ("text", b" ok?<|im_end|>\n"))
    engine.send(proto.MediaTokenize("a1", parts))
    ev = engine.next_event()
    assert isinstance(ev, proto.MediaTokens) and [s.n for s in ev.spans] == [audio_tokens()] * 2
    first, second = ev.spans
    assert second.pos == first.pos + first.n and second.key != first.key  # each window its own embeddings
    done = engine.run("g1", list(ev.ids), max_tokens=2, media=proto.encode_spans(ev.spans))[-1]
    assert isinstance(done, proto.Done) and int(done.stats["prompt"]) == len(ev.ids)


def test_models_say_the_model_takes_audio_not_images(media_server: Server) -> None:
    models = httpx.get(f"{media_server.base}/v1/models").json()["data"]
    assert models[0]["inputs"] == ["text", "audio"]


def test_a_clip_is_heard_and_counted(api: openai.OpenAI) -> None:
    text, n_text = reply(api, [{"role": "user", "content": "What do you hear?"}])
    mp3, n_mp3 = reply(api, ask("What do you hear?", (MP3, "mp3")))
    chirp, n_chirp = reply(api, ask("What do you hear?", (CHIRP, "wav")))
    assert n_mp3 == n_chirp == n_text + audio_tokens()  # usage counts the clip's positions
    assert len({text, mp3, chirp}) == 3, (text, mp3, chirp)  # the model hears each clip
    _, n_long = reply(api, ask("What do you hear?", (LONG, "wav")), max_tokens=1)
    assert n_long == n_text + 2 * audio_tokens()


def test_responses_take_an_audio_file(media_server: Server, api: openai.OpenAI) -> None:
    chat, _ = reply(api, ask("What do you hear?", (MP3, "mp3")))
    resp = httpx.post(f"{media_server.base}/v1/responses", json={
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "What do you hear?"},
                                               {"type": "input_file", "file_data": data_url(MP3, "audio/mpeg")}]}],
        "temperature": 0, "max_output_tokens": 16}, timeout=600).json()  # fmt: skip
    assert resp["output"][0]["content"][0]["text"] == chat


BAD = [
    ("an image to an audio-only model",
     [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": data_url(RED)}}], "unsupported_content"),
    ("audio that does not decode", [{"type": "text", "text": "x"}, clip(b"hello, not a sound at all", "wav")],
     "invalid_media"),
]  # fmt: skip


@pytest.mark.parametrize("name,content,code", BAD, ids=[b[0] for b in BAD])
def test_bad_parts_are_400s_naming_the_part(media_server: Server, api: openai.OpenAI, name: str, content: list[Any], code: str) -> None:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    r = httpx.post(f"{media_server.base}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert (e["param"], e["code"]) == ("messages.0.content.1", code), e
    assert reply(api, ask("Hi", (CHIRP, "wav")), 2)[0]  # the engine is unharmed


# ---- the same request through llama.cpp's own llama-server --mmproj ----------------------


PEER_CASES = [
    ("mp3 after text", ask("What do you hear?", (MP3, "mp3"))),
    ("wav before text", ask("Describe the sound.", (CHIRP, "wav"), before=True)),
    ("a clip of two windows", ask("What do you hear?", (LONG, "wav"))),
    ("the same clip twice, then another", ask("Which differs?", (CHIRP, "wav"), (CHIRP, "wav"), (MP3, "mp3"))),
]


def test_greedy_tokens_equal_llama_servers(api: openai.OpenAI, llama_server: str) -> None:
    theirs = {name: peer_reply(llama_server, m, 16) for name, m in PEER_CASES}
    assert theirs["mp3 after text"] != theirs["wav before text"]  # llama-server hears the clips too
    for name, messages in PEER_CASES:
        assert reply(api, messages, max_tokens=16) == theirs[name], name


def test_equal_beside_other_requests(api: openai.OpenAI, llama_server: str) -> None:
    theirs = [peer_reply(llama_server, m, 16) for _, m in PEER_CASES]
    others = [[{"role": "user", "content": f"Count to {k} in words."}] for k in (3, 4)]
    with ThreadPoolExecutor(5) as pool:
        ours = [pool.submit(reply, api, m, 16) for _, m in PEER_CASES]
        busy = [pool.submit(reply, api, m, 24) for m in others]
        assert [f.result() for f in ours] == theirs
        assert all(f.result()[0] for f in busy)
