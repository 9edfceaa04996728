"""The OpenAI Responses API's request (``POST /v1/responses``), validated, and turned into
the chat request the shared path runs (requests.ChatRequest).

What is taken: ``input`` (text, or items: messages, ``function_call`` and
``function_call_output`` items, and ``reasoning`` items, which are dropped as chat
templates drop an earlier turn's reasoning), ``instructions``, ``max_output_tokens``,
``temperature``, ``top_p``, ``text.format``, function ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``max_tool_calls`` (calls past it are ignored), ``reasoning.effort``
(the chat's ``reasoning_effort``), ``top_logprobs`` with ``include:
["message.output_text.logprobs"]``, ``store`` / ``previous_response_id``, ``stream``, and the
hints ``metadata``, ``user``, ``safety_identifier``, ``prompt_cache_key``,
``prompt_cache_retention`` (echoed in the response); as extensions, llama-server's
sampling fields (typical_p, DRY, XTC, Mirostat, ...: schema/sampling.py). A parameter Strata does not implement
is accepted only with a value that asks for nothing (schema/neutral.py); any other
parameter or value is a 400 naming it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from strata_core.contract.options import MAX_ALTERNATIVES
from strata_core.schema.requests import (
    ChatRequest,
    Effort,
    JsonSchemaFormat,
    Strict,
    Temperature,
    TopP,
    invalid,
    parse_request,
)
from strata_core.schema.sampling import FIELDS, LlamaSampling

#: What ``include`` may ask for: the output text's logprobs (top_logprobs: how many
#: alternatives each token lists).
LOGPROBS = "message.output_text.logprobs"


MESSAGE_PARTS = "input_text, output_text, input_image and input_file (audio)"


def _text_of(value: Any, kinds: tuple[str, ...], accepts: str = "") -> str:
    """A message's content (a string, or a list of text parts of ``kinds``) as one text."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid("expected a string or a list of content parts", "invalid_type")
    texts = []
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise invalid(
                f"has a content part of type {kind!r}; Strata accepts {accepts or ', '.join(kinds)} parts",
                "unsupported_content",
            )
        texts.append(part["text"])
    return "".join(texts)


def _chat_part(part: Any) -> dict[str, Any] | None:
    """A Responses media part as a chat content part (None: not a media part):
    ``input_image`` as ``image_url``, an audio ``input_file`` as ``input_audio``."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise invalid("an input_image part needs image_url (a data URL, or an http(s) URL); file_id is not supported")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "input_file":
        data = part.get("file_data")
        m = re.fullmatch(r"data:audio/([\w.+-]+);base64,(.*)", data, re.S) if isinstance(data, str) else None
        if m is None:
            raise invalid("an input_file part is taken as audio only: file_data as data:audio/<format>;base64,...",
                          "unsupported_content")  # fmt: skip
        fmt = {"mpeg": "mp3", "x-wav": "wav", "wave": "wav"}.get(m[1], m[1])
        return {"type": "input_audio", "input_audio": {"data": m[2], "format": fmt}}
    return None


def _content_of(value: Any) -> str | list[dict[str, Any]]:
    """A message's content: one text, or (with media) chat content parts in order."""
    if isinstance(value, list) and any(isinstance(p, dict) and p.get("type") in ("input_image", "input_file") for p in value):
        parts = []
        for part in value:
            chat = _chat_part(part)
            text = None if chat is not None else _text_of([part], ("input_text", "output_text"), MESSAGE_PARTS)
            parts.append(chat if chat is not None else {"type": "text", "text": text})
        return parts
    return _text_of(value, ("input_text", "output_text"), MESSAGE_PARTS)


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    id: str | None = None  # an output message sent back: its id and status name it only
    status: str | None = None
    phase: str | None = None

    @field_validator("content", mode="plain")
    @classmethod
    def _content(cls, value: Any) -> str | list[dict[str, Any]]:
        return _content_of(value)

    @model_validator(mode="before")
    @classmethod
    def _output_parts(cls, data: Any) -> Any:
        # output_text parts sent back carry annotations and logprobs: only the text matters
        if isinstance(data, dict) and isinstance(data.get("content"), list):
            keep = ("type", "text", "image_url", "file_data", "filename", "detail")
            parts = [{k: v for k, v in p.items() if k in keep} if isinstance(p, dict) else p
                     for p in data["content"]]  # fmt: skip
            data = {**data, "content": parts}
        return data


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None

    @field_validator("output", mode="plain")
    @classmethod
    def _output(cls, value: Any) -> str:
        return _text_of(value, ("input_text",))


class ReasoningItem(Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


def _item_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return None


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


class FunctionTool(Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(Strict):
    type: Literal["function"]
    name: str


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_fields(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise invalid('type "json_schema" needs a name and a schema')
        if self.type != "json_schema" and (self.name, self.schema_, self.strict) != (None, None, None):
            raise invalid(f'name, schema and strict belong to type "json_schema", not {self.type!r}')
        return self

    def response_format(self) -> dict[str, Any]:
        """The chat request's response_format."""
        if self.type != "json_schema":
            return {"type": self.type}
        schema = JsonSchemaFormat(name=self.name or "", schema=self.schema_, strict=self.strict)
        return {"type": "json_schema", "json_schema": schema.model_dump(by_alias=True, exclude_none=True)}


class TextConfig(Strict):
    format: TextFormat | None = None

    unimplemented = ("verbosity",)


class ReasoningConfig(Strict):
    effort: Effort | None = None

    unimplemented = ("summary", "generate_summary")  # no summaries are written


class ResponsesRequest(Strict, LlamaSampling):
    model: str | None = None
    input: list[InputItem]  # text is one user message
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: Temperature = None
    top_p: TopP = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    stream: bool | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_ALTERNATIVES)
    max_tool_calls: int | None = Field(default=None, ge=1)
    # Hints: they cannot change a reply; echoed in the response.
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None

    unimplemented = ("background", "conversation", "prompt", "service_tier", "stream_options",
                     "context_management", "truncation")  # fmt: skip

    @field_validator("include")
    @classmethod
    def _include(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            if name != LOGPROBS:
                raise invalid(f"asks for {name!r}; Strata can include only {LOGPROBS!r}", "unsupported_value")
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _text_input(cls, value: Any) -> Any:
        return [{"role": "user", "content": value}] if isinstance(value, str) else value

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        for tool in value if isinstance(value, list) else ():  # a non-list fails as a list
            if isinstance(tool, dict) and tool.get("type") != "function":
                raise invalid(
                    f"has a tool of type {tool.get('type')!r}; Strata runs function tools only",
                    "unsupported_value",
                )
        return value

    def conversation(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as chat messages: ``history`` (a stored earlier response's),
        then this request's input; ``instructions`` are not part of it (a later response
        continuing it brings its own)."""
        out = [dict(m) for m in history]
        for item in self.input:
            add_item(out, item)
        return out

    def chat_request(self, conversation: list[dict[str, Any]]) -> ChatRequest:
        """The chat request that runs this response on the shared path: ``instructions``
        as a system message leading the conversation."""
        lead = [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        body: dict[str, Any] = {"model": self.model, "messages": lead + conversation}
        for name in ("temperature", "top_p", "parallel_tool_calls", "max_tool_calls", "user", "metadata",
                     "safety_identifier", "prompt_cache_key", "prompt_cache_retention", *FIELDS):  # fmt: skip
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if LOGPROBS in (self.include or ()):
            body.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        if self.max_output_tokens is not None:
            body["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                             for t in self.tools]  # fmt: skip
        if isinstance(self.tool_choice, FunctionChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.text is not None and self.text.format is not None:
            body["response_format"] = self.text.format.response_format()
        if self.reasoning is not None and self.reasoning.effort is not None:
            body["reasoning_effort"] = self.reasoning.effort
        return parse_request(ChatRequest, body)


def add_item(messages: list[dict[str, Any]], item: Any) -> None:
    """One input item appended to chat ``messages``: a function call joins the assistant
    message before it (or opens one), its output is a tool message."""
    if isinstance(item, MessageItem):
        messages.append({"role": item.role, "content": item.content})
    elif isinstance(item, FunctionCallItem):
        call = {"id": item.call_id, "type": "function",
                "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": None}
            messages.append(last)
        last.setdefault("tool_calls", []).append(call)
    elif isinstance(item, FunctionCallOutputItem):
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})


def assistant_message(text: str, calls: list[tuple[str, str, str]]) -> dict[str, Any]:
    """A response's output as the chat message a later response continues from:
    ``calls`` are (call_id, name, arguments)."""
    out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        out["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                             for i, n, a in calls]  # fmt: skip
    return out

