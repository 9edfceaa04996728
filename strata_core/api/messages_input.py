"""Anthropic's Messages API request (``POST /v1/messages``, ``/v1/messages/count_tokens``),
validated, and turned into the chat request the shared path runs (requests.ChatRequest).

What is taken: ``system``, the ``messages`` (text, ``tool_use`` and ``tool_result``
blocks; an earlier turn's ``thinking`` blocks are dropped, as Anthropic drops them from
the context), ``max_tokens``, ``stop_sequences``, ``temperature`` / ``top_p`` / ``top_k``,
custom ``tools`` and ``tool_choice``, ``thinking`` (the template's ``enable_thinking``;
``budget_tokens`` bounds the thinking, as the chat's ``reasoning_budget``; max_tokens
bounds thinking and answer together), ``metadata``, ``stream``. ``cache_control`` marks are accepted: Strata reuses
cached prefixes on its own. A parameter Strata does not implement is accepted only with a
value that asks for nothing (``mcp_servers: []``, ``service_tier: "auto"``:
schema/neutral.py); any other parameter or value is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, field_validator, model_validator

from strata_core.schema.requests import (
    MAX_STOP,
    ChatRequest,
    Strict,
    TopP,
    check_stop_lengths,
    invalid,
    parse_request,
)

BLOCK_KINDS = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: None = None


class Base64Source(Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp", "image/bmp"]
    data: str


class UrlSource(Strict):
    type: Literal["url"]
    url: str


class ImageBlock(Strict):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Discriminator("type")]
    cache_control: dict[str, Any] | None = None

    def chat_part(self) -> dict[str, Any]:
        src = self.source
        url = src.url if isinstance(src, UrlSource) else f"data:{src.media_type};base64,{src.data}"
        return {"type": "image_url", "image_url": {"url": url}}


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Discriminator("type"),
]


class Message(Strict):
    role: Literal["user", "assistant"]
    content: list[ContentBlock]  # text is one text block

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        for block in value if isinstance(value, list) else ():
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in BLOCK_KINDS:
                raise invalid(f"has a content block of type {kind!r}; Strata accepts "
                              f"{', '.join(BLOCK_KINDS)}", "unsupported_content")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> Message:
        wrong = (ToolResultBlock, ImageBlock) if self.role == "assistant" else (ToolUseBlock, ThinkingBlock, RedactedThinkingBlock)
        for block in self.blocks():
            if isinstance(block, wrong):
                raise invalid(f"a {self.role} message cannot hold a {block.type} block")
        return self

    def blocks(self) -> list[Any]:
        return list(self.content)


class Tool(Strict):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_iff_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise invalid('name is required with type "tool", and only there')
        return self


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1024)
    display: Literal["summarized"] | None = None


class Metadata(Strict):
    user_id: str | None = None


class CountTokensRequest(Strict):
    """``/v1/messages/count_tokens``: what makes the prompt."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: dict[str, Any] | None = None

    # accepted only with a value that asks for nothing (schema/neutral.py)
    unimplemented = ("container", "context_management", "diagnostics", "inference_geo", "mcp_servers",
                     "output_config", "service_tier", "speed", "user_profile_id", "workspace_id")  # fmt: skip

    def chat_request(self) -> ChatRequest:
        """The chat request that runs this on the shared path."""
        return chat_request(self, {})


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: TopP = None
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    stream: bool | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(value):
            raise invalid("stop sequences must not be empty")
        check_stop_lengths(value or [])
        return value

    @model_validator(mode="after")
    def _thinking_budget(self) -> MessagesRequest:
        t = self.thinking
        if t is not None and t.type == "enabled":
            if t.budget_tokens is None:
                raise invalid('thinking of type "enabled" needs budget_tokens')
            if t.budget_tokens >= self.max_tokens:
                raise invalid(f"thinking.budget_tokens ({t.budget_tokens}) must be less than "
                              f"max_tokens ({self.max_tokens})")  # fmt: skip
        return self

    def chat_request(self) -> ChatRequest:
        """The chat request that runs this message on the shared path."""
        body: dict[str, Any] = {"max_tokens": self.max_tokens}
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if self.thinking is not None and self.thinking.type == "enabled":
            body["reasoning_budget"] = self.thinking.budget_tokens
        return chat_request(self, body)


def chat_request(req: CountTokensRequest, body: dict[str, Any]) -> ChatRequest:
    """The chat request of ``req``'s conversation, with ``body``'s sampling fields."""
    messages: list[dict[str, Any]] = []
    if req.system is not None:
        text = req.system if isinstance(req.system, str) else "".join(b.text for b in req.system)
        messages.append({"role": "system", "content": text})
    for m in req.messages:
        messages += chat_messages(m)
    body = {**body, "model": req.model, "messages": messages}
    if req.tools:
        body["tools"] = [{"type": "function", "function": chat_function(t)} for t in req.tools]
    if req.tool_choice is not None:
        body.update(chat_tool_choice(req.tool_choice))
    if req.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking.type != "disabled"}
    return parse_request(ChatRequest, body)


def chat_function(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        out["description"] = tool.description
    if tool.strict is not None:
        out["strict"] = tool.strict
    return out


def chat_tool_choice(choice: ToolChoice) -> dict[str, Any]:
    """tool_choice (and parallel_tool_calls) of the chat request."""
    out: dict[str, Any] = {}
    if choice.type == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = {"any": "required"}.get(choice.type, choice.type)
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


def chat_messages(m: Message) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user turn's tool results become tool
    messages (before its text), an assistant turn's tool_use blocks its tool calls."""
    blocks = m.blocks()
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    if m.role == "assistant":
        calls = [{"id": b.id, "type": "function",
                  "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
                 for b in blocks if isinstance(b, ToolUseBlock)]  # fmt: skip
        out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            out["tool_calls"] = calls
        return [out]
    results = [{"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
               for b in blocks if isinstance(b, ToolResultBlock)]  # fmt: skip
    if any(isinstance(b, ImageBlock) for b in blocks):  # text and images, in order
        parts = [b.chat_part() if isinstance(b, ImageBlock) else {"type": "text", "text": b.text}
                 for b in blocks if isinstance(b, (TextBlock, ImageBlock))]  # fmt: skip
        return [*results, {"role": "user", "content": parts}]
    if text or not results:
        results.append({"role": "user", "content": text})
    return results


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's arguments as a tool_use block's input ({} when the text the model wrote is
    not a JSON object, e.g. cut short by max_tokens)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
