"""Ollama's API requests (``/api/chat``, ``/api/generate``, ``/api/embed``, ...), validated,
and turned into the requests the shared path runs (requests.ChatRequest, CompletionRequest).

``options`` map onto Strata's sampling: temperature, top_p, top_k, min_p, num_predict
(max_tokens; -1 and -2 leave it to the context), seed, stop, repeat_penalty,
repeat_last_n, presence_penalty, frequency_penalty. ``num_ctx`` is accepted up to the
engine's context. Options that set how a model loads (num_gpu, num_thread, ...) are the
operator's. llama-server's further sampling fields (mirostat, mirostat_tau, mirostat_eta,
typical_p, DRY, XTC, ...; schema/sampling.py) pass through by their names; tfs_z, which
llama.cpp no longer has, is a 400 naming it unless neutral (schema/neutral.py). ``format`` is ``"json"`` or a JSON schema; ``tools`` are
OpenAI's function tools, calls carry their arguments as objects; ``think`` sets the
template's ``enable_thinking``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from strata_core.schema.errors import ApiError
from strata_core.schema.requests import (
    ChatRequest,
    CompletionRequest,
    Strict,
    invalid,
    parse_request,
)
from strata_core.schema.sampling import FIELDS, LlamaSampling

#: Ollama option -> the chat request's field.
SAMPLING = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "seed": "seed", "stop": "stop", "repeat_penalty": "repetition_penalty",
    "repeat_last_n": "penalty_last_n", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "num_predict": "max_tokens",
} | {name: name for name in FIELDS}  # fmt: skip
#: Options that set how the model is loaded: the operator's configuration decides them.
LOAD_OPTIONS = (
    "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
    "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "penalize_newline",
)  # fmt: skip
#: The chat request's field -> the Ollama name, for errors.
PARAMS = {v: f"options.{k}" for k, v in SAMPLING.items()} | {
    "response_format": "format", "chat_template_kwargs": "think", "tools": "tools", "messages": "messages",
}  # fmt: skip


class OllamaOptions(Strict, LlamaSampling):
    """``options``: every name Ollama's documents, checked in ``sampling``."""

    num_ctx: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    num_predict: int | None = Field(default=None, ge=-2)
    seed: int | None = None
    stop: list[str] | str | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = Field(default=None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    num_keep: int | None = None
    penalize_newline: bool | None = None

    # sampling Strata does not have: accepted at the value that leaves it off (schema/neutral.py)
    unimplemented = ("tfs_z",)

    def sampling(self) -> dict[str, Any]:
        """The chat request's sampling fields; 400 naming an option Strata cannot honour."""
        for name in LOAD_OPTIONS:
            if getattr(self, name) is not None:
                raise ApiError(400, f"options.{name} sets how the model is loaded, which this server's "
                               "configuration decides; leave it out", param=f"options.{name}",
                               code="unsupported_parameter")  # fmt: skip
        out: dict[str, Any] = {}
        for name, field in SAMPLING.items():
            value = getattr(self, name)
            if value is None or (name == "num_predict" and value < 0):
                continue
            out[field] = value
        if out.get("top_k") == 0:
            del out["top_k"]
        return out


Format = Literal["", "json"] | dict[str, Any]


class OllamaFunction(Strict):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None
    description: str | None = None


class OllamaToolCall(Strict):
    function: OllamaFunction
    id: str | None = None
    type: Literal["function"] | None = None


class OllamaMessage(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("images")
    @classmethod
    def _no_images(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise invalid("holds images; this server serves text models only (leave images out)",
                          "unsupported_content")  # fmt: skip
        return value


class Generation(Strict):
    """What /api/chat and /api/generate share."""

    model: str = Field(min_length=1)
    format: Format | None = None
    options: OllamaOptions | None = None
    stream: bool = True
    keep_alive: float | str | None = None
    think: bool | Literal["low", "medium", "high"] | None = None

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | str | None:
        keep_alive_seconds(value)
        return value

    def unload_after(self) -> bool:
        """``keep_alive`` 0 ("0", "0s", 0): stop the model once this request is done."""
        return keep_alive_seconds(self.keep_alive) == 0

    def common(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, **(self.options or OllamaOptions()).sampling()}
        if self.format == "json":
            body["response_format"] = {"type": "json_object"}
        elif isinstance(self.format, dict):
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": self.format}}
        if self.think is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.think is not False}
        return body


class OllamaChat(Generation):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    unimplemented = ("logprobs", "top_logprobs")

    def chat_request(self) -> ChatRequest:
        body = {**self.common(), "messages": chat_messages(self.messages)}
        if self.tools:
            body["tools"] = self.tools
        return parsed(ChatRequest, body)


class OllamaGenerate(Generation):
    prompt: str | None = None
    system: str | None = None
    raw: bool = False
    suffix: str | None = None  # fill-in-the-middle: the text after the insertion point

    unimplemented = ("template", "context", "images", "logprobs", "top_logprobs")

    def chat_request(self) -> ChatRequest:
        """The prompt as the user's turn (after ``system``), through the chat template."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.prompt or ""})
        return parsed(ChatRequest, {**self.common(), "messages": messages})

    def completion_request(self) -> CompletionRequest:
        """``raw``: the prompt as it is, no template."""
        body = {k: v for k, v in self.common().items() if k != "chat_template_kwargs"}
        return parsed(CompletionRequest, {**body, "prompt": self.prompt or ""})


class OllamaEmbed(Strict):
    model: str = Field(min_length=1)
    input: str | list[str] = Field(min_length=1)
    truncate: bool = True
    options: OllamaOptions | None = None
    keep_alive: float | str | None = None
    dimensions: int | None = Field(default=None, ge=1)


class OllamaEmbeddings(Strict):
    """The older ``/api/embeddings``: one prompt."""

    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    options: OllamaOptions | None = None
    keep_alive: float | str | None = None


class OllamaModelName(Strict):
    """``/api/show``, ``/api/delete``, ``/api/pull``: a model's name (older clients: ``name``)."""

    model: str | None = Field(default=None, min_length=1)
    name: str | None = Field(default=None, min_length=1)
    verbose: bool | None = None
    insecure: bool | None = None
    stream: bool = True

    @model_validator(mode="after")
    def _named(self) -> OllamaModelName:
        if self.model is None and self.name is None:
            raise invalid("needs the model's name in model")
        return self

    @property
    def model_name(self) -> str:
        return self.model or self.name or ""


def keep_alive_seconds(value: float | str | None) -> float | None:
    """``keep_alive`` in seconds: a number, or Go's durations as Ollama takes them ("5m", "1h30m", "0")."""
    if value is None or isinstance(value, (int, float)):
        return value
    text, total = value.strip(), 0.0
    parts = re.findall(r"(-?\d+(?:\.\d+)?)(h|ms|m|s)?", text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise invalid(f"{value!r} is not seconds or a duration such as \"5m\"")
    for number, unit in parts:
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "": 1}[unit]
    return total


def parsed(cls: type[ChatRequest] | type[CompletionRequest], body: dict[str, Any]) -> Any:
    """``body`` as ``cls``; a 400 names Ollama's parameter, not the chat request's."""
    try:
        return parse_request(cls, body)
    except ApiError as exc:
        top = (exc.param or "").split(".")[0].split("[")[0]
        if top in PARAMS:
            name = PARAMS[top] + (exc.param or "")[len(top):]
            exc.message = exc.message.replace(f"'{exc.param}'", f"'{name}'")
            exc.param = name
        raise


def chat_messages(messages: list[OllamaMessage]) -> list[dict[str, Any]]:
    """Ollama's messages as chat messages: an assistant's calls get ids, and a tool message
    answers the oldest unanswered call of its ``tool_name`` (else the oldest unanswered)."""
    out: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (id, name)
    for i, m in enumerate(messages):
        if m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.content or (None if m.tool_calls else "")}
            if m.tool_calls:
                calls = [(c.id or f"call_{i}_{j}", c.function) for j, c in enumerate(m.tool_calls)]
                msg["tool_calls"] = [{"id": cid, "type": "function", "function": {
                    "name": f.name, "arguments": json.dumps(f.arguments, ensure_ascii=False)}} for cid, f in calls]  # fmt: skip
                open_calls += [(cid, f.name) for cid, f in calls]
            out.append(msg)
        elif m.role == "tool":
            match = [c for c in open_calls if m.tool_call_id in (None, c[0]) and m.tool_name in (None, c[1])]
            if not match:
                raise ApiError(400, f"messages[{i}] is a tool result with no tool call before it to answer "
                               f"(tool_name {m.tool_name!r})", param=f"messages[{i}]",
                               code="invalid_value")  # fmt: skip
            open_calls.remove(match[0])
            out.append({"role": "tool", "tool_call_id": match[0][0], "content": m.content})
        else:
            out.append({"role": m.role, "content": m.content})
    if not out:
        raise ApiError(400, "messages must not be empty (send keep_alive alone with /api/generate to load or "
                       "unload a model)", param="messages", code="invalid_value")  # fmt: skip
    return out
