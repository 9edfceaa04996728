"""llama-server's ``POST /tokenize`` and ``POST /detokenize``, in its shapes.

``/tokenize`` takes ``content`` (with ``add_special``: the model's BOS first, and
``parse_special``: special tokens' text as those tokens) or, instead, chat ``messages``
(with ``tools`` and ``chat_template_kwargs``), counted as the chat prompt they make: the
template applied, the generation prompt added. ``with_pieces`` gives each token's text
(its bytes, as a list, when they are not UTF-8 on their own). A chat's media items take
positions that hold no token: each is -1 there (llama.cpp's null token), and with pieces
``{"id": -1, "piece": null, "media": N}``, N the item's place in the request.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from strata_core.api import openapi
from strata_core.api.service import json_body, service_for
from strata_core.client.reader import MediaPrompt
from strata_core.schema.requests import (
    ChatMessage,
    ChatRequest,
    Strict,
    Tool,
    invalid,
    parse_request,
)
from strata_core.text.detokenize import decode

router = APIRouter()

PATHS = ("/tokenize", "/detokenize")


class TokenizeRequest(Strict):
    content: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    @model_validator(mode="after")
    def _content_or_messages(self) -> TokenizeRequest:
        if (self.content is None) == (self.messages is None):
            raise invalid("send content or messages (one of them)")
        if self.messages is None and (self.tools is not None or self.chat_template_kwargs is not None):
            raise invalid("tools and chat_template_kwargs go with messages")
        return self

    def chat_request(self) -> ChatRequest:
        # the conversation's own rules (ChatRequest's) answer a 400 here too
        return parse_request(ChatRequest, {"messages": self.messages, "tools": self.tools,
                                           "chat_template_kwargs": self.chat_template_kwargs})  # fmt: skip


class DetokenizeRequest(Strict):
    tokens: list[Annotated[int, Field(ge=0)]]


def piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


@router.post("/tokenize", **openapi.route(TokenizeRequest, "the tokens of a text or chat", {"type": "object", "required": ["tokens"]}, stream=False))
async def tokenize(request: Request) -> dict[str, Any]:
    req = parse_request(TokenizeRequest, await json_body(request))
    service = await service_for(request, getattr(req, "model", None))
    service.ready()
    if req.messages is not None:
        ids, _ = await service.chat_prompt(req.chat_request())
    else:
        ids = await service.tokenize(req.content or "", add_bos=req.add_special, special=req.parse_special)
    media = media_positions(ids)
    ids = [-1 if i in media else t for i, t in enumerate(ids)]
    if not req.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": -1, "piece": None, "media": media[i]} if i in media
                       else {"id": t, "piece": piece(service.pieces[t])} for i, t in enumerate(ids)]}  # fmt: skip


def media_positions(ids: list[int]) -> dict[int, int]:
    """Prompt position -> the index of the media item that takes it."""
    spans = ids.spans if isinstance(ids, MediaPrompt) else ()
    return {pos: k for k, s in enumerate(spans) for pos in range(s.pos, s.pos + s.n)}


@router.post("/detokenize", **openapi.route(DetokenizeRequest, "the text of tokens", {"type": "object", "required": ["content"]}, stream=False))
async def detokenize(request: Request) -> dict[str, str]:
    req = parse_request(DetokenizeRequest, await json_body(request))
    service = await service_for(request, getattr(req, "model", None))
    service.ready()
    service.check_token_ids(req.tokens, "tokens")
    return {"content": decode(service.pieces, req.tokens)}

