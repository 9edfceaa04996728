"""Media parts of a chat (images, audio) made into the engine's prompt: each part's bytes
from its data URL, or fetched from its http(s) URL where ``[server] fetch_media`` allows
(``media_fetch.py``, which refuses what only the server can reach), then the rendered
prompt cut at each media marker and tokenized by the engine's mtmd (``MTOKENIZE``).
Every refusal is a 400 naming the part."""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Sequence

from strata_core.api.media_fetch import bad_part, fetch
from strata_core.client.reader import EngineClient, EngineRefused, MediaPrompt
from strata_core.ops.config import ServerConfig
from strata_core.schema.requests import MediaPart

_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,(?P<data>.*)", re.S)


def media_marker() -> str:
    """Where a media item sits in the rendered prompt: random, so no text can fake one."""
    return f"<__media_{secrets.token_hex(8)}__>"


def check_media(media: Sequence[tuple[str, MediaPart]], inputs: Sequence[str], server: ServerConfig) -> None:
    """Refuse media the model cannot take, and more items than the server allows."""
    for param, part in media:
        if part.kind not in inputs:
            takes = ", ".join(inputs)
            raise bad_part(param, f"this model takes {takes} only, not {part.kind} (serve it with its "
                           "projector: [models.NAME] mmproj or --mmproj)", "unsupported_content")  # fmt: skip
    if len(media) > server.max_media_per_request:
        raise bad_part(media[server.max_media_per_request][0], f"the request carries {len(media)} media items; "
                       f"this server takes at most {server.max_media_per_request} ([server] max_media_per_request)",
                       "too_many_media")  # fmt: skip


def data_url_bytes(url: str, param: str) -> bytes:
    m = _DATA_URL.fullmatch(url)
    if m is None:
        raise bad_part(param, "expected a base64 data URL (data:<type>;base64,<data>) or an http(s) URL")
    try:
        data = base64.b64decode(m["data"], validate=True)
    except (binascii.Error, ValueError):
        raise bad_part(param, "the data URL's payload is not valid base64") from None
    if not data:
        raise bad_part(param, "the data URL is empty")
    return data


async def media_bytes(param: str, part: MediaPart, server: ServerConfig) -> bytes:
    url = part.source()
    if url.startswith(("http://", "https://")):
        return await fetch(url, param, server)
    if url.startswith("data:"):
        return data_url_bytes(url, param)
    raise bad_part(param, "expected a base64 data URL (data:<type>;base64,<data>) or an http(s) URL")


async def media_prompt(
    engine: EngineClient, text: str, marker: str, media: Sequence[tuple[str, MediaPart]], server: ServerConfig
) -> MediaPrompt:
    """The rendered prompt ``text``, whose media items are written as ``marker``, tokenized
    with each item's bytes by the engine."""
    pieces = text.split(marker)
    if len(pieces) != len(media) + 1:
        raise bad_part("messages", f"the chat template kept {len(pieces) - 1} of the {len(media)} media items "
                       "(it drops content where they sit, e.g. a system message's)")  # fmt: skip
    parts: list[tuple[str, bytes]] = [("text", pieces[0].encode())]
    for (param, part), piece in zip(media, pieces[1:], strict=True):
        parts += [("media", await media_bytes(param, part, server)), ("text", piece.encode())]
    try:
        return await engine.tokenize_media(parts)
    except EngineRefused as exc:
        m = re.search(r"media item (\d+)", str(exc))
        param = media[int(m[1])][0] if m and int(m[1]) < len(media) else "messages"
        raise bad_part(param, str(exc), "invalid_media") from None
