"""Media in prompts, the pure parts: how parts join around media markers (llama-server's
rule), the MTOKENIZE / MTOKENS lines, the scheduler's media runs, data URLs and the checks
that refuse media before the engine sees them."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_core.api.media import check_media, data_url_bytes
from strata_core.contract import protocol as proto
from strata_core.engine.media_runs import decode_media_ahead, media_boundary, text_ahead
from strata_core.ops.config import Config, ServerConfig
from strata_core.ops.models import projector_inputs
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import ChatRequest, ImagePart, TextPart, join_parts
from strata_core.testing.projector import image_tokens, write_vision_projector

M = "<M>"


def image(url: str = "data:image/png;base64,AAAA") -> ImagePart:
    return ImagePart.model_validate({"type": "image_url", "image_url": {"url": url}})


def text(t: str) -> TextPart:
    return TextPart(type="text", text=t)


def test_parts_join_as_llama_server_joins_them() -> None:
    assert join_parts([text("a"), text("b")], M) == "ab"  # text alone: as before
    assert join_parts([text("a"), image(), text("b")], M) == "a<M>b"
    assert join_parts([text("a"), text("b"), image()], M) == "a\nb<M>"
    assert join_parts([image(), image(), text("b"), text("c")], M) == "<M><M>b\nc"


def test_a_chat_request_lists_its_media_with_their_paths() -> None:
    req = ChatRequest.model_validate({"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "u"}},
                                     {"type": "input_audio", "input_audio": {"data": "QQ==", "format": "mp3"}}]}]})  # fmt: skip
    media = req.media()
    assert [p for p, _ in media] == ["messages.1.content.1", "messages.1.content.2"]
    assert [m.kind for _, m in media] == ["image", "audio"]
    assert media[1][1].source() == "data:audio/mp3;base64,QQ=="


def test_mtokenize_and_mtokens_round_trip() -> None:
    cmd = proto.MediaTokenize("m1", (("text", "héllo <b>".encode()), ("media", b"\x89PNG\x00"), ("text", b"")))
    assert proto.parse_command(proto.encode_command(cmd)) == cmd
    ev = proto.MediaTokens("m1", (5, 0, 0, 0, 7), (proto.MediaSpan("00ff", 1, 3),))
    line = proto.encode_event(ev)
    assert line == "MTOKENS m1 00ff:1:3 5 0 0 0 7"
    assert proto.parse_event(line) == ev
    assert proto.parse_event("MTOKENS m1 - 4") == proto.MediaTokens("m1", (4,), ())


@pytest.mark.parametrize("line", ["MTOKENIZE m1 x:AAAA", "MTOKENIZE m1 t:@@", "MTOKENS m1 zz:1:2 3", "MTOKENS m1 ab:1 3"])
def test_malformed_media_lines_are_refused(line: str) -> None:
    with pytest.raises(proto.ProtocolError):
        (proto.parse_command if line.startswith("MTOKENIZE") else proto.parse_event)(line)


class FakeItem:
    def __init__(self, n: int) -> None:
        self.n, self.calls = n, []  # type: list[tuple[int, int]]

    def decode(self, llama: object, seq: int, pos: int) -> int:
        self.calls.append((seq, pos))
        return pos + self.n


def test_text_runs_stop_at_media() -> None:
    assert text_ahead([1, 2, -5, -5, 3], 10) == 2
    assert text_ahead([-5, -5, 3], 10) == 0
    assert text_ahead([1, 2, 3], 2) == 2


def test_a_cached_prefix_never_cuts_a_media_item() -> None:
    items = {-5: FakeItem(3)}
    prompt = [1, -5, -5, -5, -5, -5, -5, 2]  # two equal images side by side
    assert [media_boundary(prompt, k, items) for k in range(8)] == [0, 1, 1, 1, 4, 4, 4, 7]


def test_a_media_item_ahead_is_decoded_whole() -> None:
    item = FakeItem(2)
    cached, pending = [1, 2], [-9, -9, 3]
    assert decode_media_ahead(None, 4, cached, pending, {-9: item})
    assert (cached, pending, item.calls) == ([1, 2, -9, -9], [3], [(4, 2)])
    assert not decode_media_ahead(None, 4, cached, pending, {-9: item})


def test_data_urls() -> None:
    assert data_url_bytes("data:image/png;base64,QUJD", "p") == b"ABC"
    assert data_url_bytes("data:;base64,QUJD", "p") == b"ABC"
    for bad in ("data:image/png,QUJD", "data:image/png;base64,@@", "data:image/png;base64,", "QUJD"):
        with pytest.raises(ApiError) as err:
            data_url_bytes(bad, "messages.0.content.1")
        assert err.value.status == 400 and err.value.param == "messages.0.content.1"


def test_media_the_model_cannot_take_or_too_many() -> None:
    media = [("messages.0.content.0", image()), ("messages.0.content.1", image())]
    with pytest.raises(ApiError) as err:
        check_media(media, ["text"], ServerConfig())
    assert (err.value.param, err.value.code) == ("messages.0.content.0", "unsupported_content")
    with pytest.raises(ApiError) as err:
        check_media(media, ["text", "image"], ServerConfig(max_media_per_request=1))
    assert (err.value.param, err.value.code) == ("messages.0.content.1", "too_many_media")
    check_media(media, ["text", "image"], ServerConfig(max_media_per_request=2))


def test_the_random_projector_says_it_takes_images(tmp_path: Path) -> None:
    path = tmp_path / "mmproj.gguf"
    write_vision_projector(path, 576)
    assert projector_inputs(path) == ["text", "image"]
    assert projector_inputs(None) == ["text"]
    assert image_tokens() == 16


def test_a_models_table_names_its_projector() -> None:
    cfg = Config.model_validate({"engine": {"mmproj": "/a.gguf"},
                                 "models": {"v": {"path": "m.gguf", "mmproj": "/b.gguf"}, "t": {"path": "t.gguf"}}})  # fmt: skip
    assert cfg.for_model("v").engine.mmproj == "/b.gguf"
    assert cfg.for_model("t").engine.mmproj == "/a.gguf"
