"""OpenAI request models for /v1/chat/completions and /v1/completions (pydantic v2).

A field the API documents and we do not implement is refused with a 400 that names it,
unless its value asks for nothing (null, [], the default: schema/neutral.py). Values are normalised on the way in, so the rest of the server sees one spelling:
``top_k=-1`` becomes 0 (off), ``penalty_last_n=-1`` becomes :data:`PENALTY_LAST_N_ALL`,
a seed is stored modulo 2**64, and ``logit_bias`` keys become ints.
"""

from __future__ import annotations

import json
import math
import re
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from strata_core.contract.options import (
    MAX_ALTERNATIVES,  # top_logprobs on chat; logprobs on completions (OpenAI: 5; we take 20)
)

from .errors import ApiError, from_validation_error
from .neutral import drop_neutral
from .sampling import LlamaSampling

#: Most choices one request may ask for.
MAX_N = 16
#: Most stop strings one request may carry. OpenAI takes 4; coding clients send more
#: (Continue's autocomplete: 7 to 9), and a stop costs the matcher little.
MAX_STOP = 16
#: Longest stop string, in characters: the text a stream holds back while a stop may be
#: starting is as long as the longest one.
MAX_STOP_CHARS = 1000
#: Most messages in one chat, and most tools it may offer.
MAX_MESSAGES = 2048
MAX_TOOLS = 128
#: Longest JSON schema (response_format's, a tool's parameters), in characters of its JSON.
MAX_SCHEMA_CHARS = 65536
#: ``penalty_last_n=-1`` ("the whole context") is stored as this window; the engine clamps
#: the window to the history it has, and no context is longer (EngineConfig.n_ctx <= 2**20).
PENALTY_LAST_N_ALL = 1 << 20
#: logit_bias values are clamped to this magnitude by OpenAI; we refuse beyond it instead.
MAX_BIAS = 100.0
#: Seeds: OpenAI clients send signed 64-bit seeds, the engine keys Philox with 64 bits.
SEED_MIN = -(1 << 63)
SEED_MOD = 1 << 64


_TOKEN_ID = re.compile(r"[0-9]+")

# Ranges of the sampling fields, shared with the operator's [sampling] defaults (ops/config.py).
Temperature = Annotated[float | None, Field(ge=0.0, le=2.0)]
TopP = Annotated[float | None, Field(gt=0.0, le=1.0)]
MinP = Annotated[float | None, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float | None, Field(ge=-2.0, le=2.0)]  # presence and frequency, as OpenAI
# Above 10 is no longer a penalty but a ban, which logit_bias expresses honestly.
RepetitionPenalty = Annotated[float | None, Field(gt=0.0, le=10.0)]


def invalid(message: str, kind: str = "invalid_value") -> PydanticCustomError:
    return PydanticCustomError(kind, message)


def _schema_size(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None and len(text := json.dumps(value)) > MAX_SCHEMA_CHARS:
        raise invalid(f"a schema is at most {MAX_SCHEMA_CHARS} characters of JSON, got {len(text)}")
    return value


def check_stop_lengths(stops: list[str]) -> None:
    """Refuse a stop string longer than :data:`MAX_STOP_CHARS`."""
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise invalid(f"a stop string is at most {MAX_STOP_CHARS} characters, got one of {longest}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Strict(BaseModel):
    # strict: "0.7" is not a number and 1 is not true; floats must be finite.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    #: Parameters the API documents that Strata does not implement: accepted only with a
    #: value that asks for nothing (schema/neutral.py), refused with a 400 otherwise.
    unimplemented: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _neutral_only(cls, data: Any) -> Any:
        return drop_neutral(data, cls.unimplemented)


#: The base of every request model, also the other API families' (api/responses_input.py ...).
Strict = _Strict


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``; the schema itself is checked by structured.py."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    # "schema" would shadow BaseModel.schema(): the JSON key is an alias.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    _size = field_validator("schema_")(_schema_size)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise invalid('json_schema is required with type "json_schema", and only there')
        return self


#: Most choices ``structured_outputs.choice`` may list.
MAX_CHOICES = 256


def _text_size(value: str | None) -> str | None:
    if value is not None and len(value) > MAX_SCHEMA_CHARS:
        raise invalid(f"is at most {MAX_SCHEMA_CHARS} characters, got {len(value)}")
    return value


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: one constraint on the reply (checked and compiled by
    text/constraints.py)."""

    # "json" would shadow BaseModel.json(): the JSON key is an alias.
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    _sizes = field_validator("regex", "grammar")(_text_size)

    @field_validator("json_")
    @classmethod
    def _json(cls, value: dict[str, Any] | str | None) -> dict[str, Any] | None:
        if isinstance(value, str):
            _text_size(value)
            try:
                value = json.loads(value)
            except ValueError:
                raise invalid("a JSON schema (an object, or its JSON text), got text that is not JSON") from None
            if not isinstance(value, dict):
                raise invalid("a JSON schema must be an object")
        return _schema_size(value)

    @field_validator("choice")
    @classmethod
    def _choice(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not 1 <= len(value) <= MAX_CHOICES:
            raise invalid(f"expected 1 to {MAX_CHOICES} choices, got {len(value)}")
        if value is not None and not all(value):
            raise invalid("choices must not be empty strings")
        return value

    @model_validator(mode="after")
    def _one(self) -> StructuredOutputs:
        kinds = self.kinds()
        if len(kinds) != 1:
            raise invalid("expected exactly one of json, regex, choice, grammar, json_object (true); "
                          f"got {', '.join(kinds) or 'none'}")  # fmt: skip
        return self

    def kinds(self) -> list[str]:
        """The constraints set (exactly one, once validated), by their JSON names."""
        values = {"json": self.json_, "regex": self.regex, "choice": self.choice, "grammar": self.grammar,
                  "json_object": self.json_object or None}  # fmt: skip
        return [k for k, v in values.items() if v is not None]


class LoraScale(_Strict):
    """One entry of a request's ``lora`` (llama-server's shape): an adapter's id (its place
    in ``GET /lora-adapters``) and its scale for this request."""

    id: int = Field(ge=0)
    scale: float


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str  # a data URL (base64), or http(s) where [server] fetch_media allows
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl

    kind: ClassVar[str] = "image"

    def source(self) -> str:
        return self.image_url.url


class InputAudio(_Strict):
    data: str  # base64 of the file
    format: Literal["wav", "mp3", "flac"] | None = None


class AudioPart(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio

    kind: ClassVar[str] = "audio"

    def source(self) -> str:
        return f"data:audio/{self.input_audio.format or 'wav'};base64,{self.input_audio.data}"


MediaPart = ImagePart | AudioPart
ContentPart = TextPart | ImagePart | AudioPart
_PART_MODELS: dict[str, type[TextPart | ImagePart | AudioPart]] = {
    "text": TextPart, "image_url": ImagePart, "input_audio": AudioPart,
}  # fmt: skip
_PART_FORMS = {
    "text": '{"type": "text", "text": "..."}',
    "image_url": '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}',
    "input_audio": '{"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}',
}


def join_parts(parts: list[ContentPart], marker: str | None) -> str:
    """A message's parts as the text a chat template reads. Text alone is joined as it
    stands; beside media (each written as ``marker``), text parts are joined by a line
    break, none next to a media item: llama-server's rule, so prompts match its own."""
    if marker is None or not any(isinstance(p, (ImagePart, AudioPart)) for p in parts):
        return "".join(p.text for p in parts if isinstance(p, TextPart))
    out, after_media = "", False
    for p in parts:
        if isinstance(p, TextPart):
            out += ("\n" if out and not after_media else "") + p.text
            after_media = False
        else:
            out += marker
            after_media = True
    return out


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _tool_name(value: str) -> str:
    if not _TOOL_NAME.fullmatch(value):
        raise invalid("a function name is 1 to 64 letters, digits, underscores or dashes")
    return value


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class MessageToolCall(_Strict):
    """A call of an earlier assistant turn, echoed back by the client."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


def _json_object(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(default=None, validate_default=True)
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    # an assistant message echoed back by a client carries these as null or []
    unimplemented = ("function_call", "refusal", "audio", "annotations")

    @field_validator("content", mode="plain", json_schema_input_type=str | list[ContentPart] | None)
    @classmethod
    def _content(cls, value: Any, info: ValidationInfo) -> str | list[ContentPart] | None:
        if value is None:
            role = info.data.get("role")
            if role is not None and role != "assistant":
                raise invalid(f"content is required for role '{role}'")
            return None
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise invalid("expected a string or a list of content parts", "invalid_type")
        parts: list[ContentPart] = []
        for i, part in enumerate(value):
            if not isinstance(part, dict):
                raise invalid("expected content parts to be objects", "invalid_type")
            kind = part.get("type")
            model = _PART_MODELS.get(kind) if isinstance(kind, str) else None
            if model is None or not isinstance(kind, str):
                raise PydanticCustomError(
                    "unsupported_content",
                    "has a content part of type {kind} (Strata accepts text, image_url and input_audio parts)",
                    {"kind": repr(kind)},
                )
            try:
                parts.append(model.model_validate(part))
            except ValidationError:
                raise invalid(f"content part {i} is not of the form {_PART_FORMS[kind]}") from None
        return parts

    def media(self) -> list[tuple[int, MediaPart]]:
        """The message's media parts with their index among its parts."""
        content = self.content if isinstance(self.content, list) else []
        return [(i, p) for i, p in enumerate(content) if isinstance(p, (ImagePart, AudioPart))]

    def template_view(self, marker: str | None = None) -> dict[str, Any]:
        """The message as chat templates read it (Hugging Face's form): parts joined (each
        media item written as ``marker``: join_parts), null content as "", and call
        arguments as the object they spell, which templates render with ``tojson`` (text
        that is not a JSON object stays text)."""
        content = self.content
        if isinstance(content, list):
            content = join_parts(content, marker)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {"name": c.function.name, "arguments": _json_object(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        return out

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise invalid("tool_calls are only allowed on assistant messages")
        if self.role == "tool" and not self.tool_call_id:
            raise invalid("a tool message needs the tool_call_id of the call it answers")
        if self.tool_call_id is not None and self.role != "tool":
            raise invalid("tool_call_id is only allowed on tool messages")
        return self


class BaseRequest(_Strict, LlamaSampling):
    """Fields both endpoints share (llama-server's further sampling fields: LlamaSampling)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, lt=SEED_MOD)
    temperature: Temperature = None
    top_p: TopP = None
    top_k: int | None = Field(default=None, ge=-1)
    min_p: MinP = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    repetition_penalty: RepetitionPenalty = None
    penalty_last_n: int | None = Field(default=None, ge=-1)
    logit_bias: dict[int, float] | None = None
    # Extensions (vLLM's names): sample only among these ids, logprobs renormalised over
    # them; which distribution logprobs describe. The server checks ids against n_vocab.
    allowed_token_ids: list[int] | None = None
    logprobs_mode: Literal["raw", "processed"] | None = None
    # Extension: false turns off the server's speculative decoding for this request.
    speculative: bool | None = None
    # Extension (llama-server's and vLLM's name, llama-server's meaning): the model's
    # end-of-generation tokens are never sampled, so the reply runs to its token limit.
    ignore_eos: bool | None = None
    response_format: ResponseFormat | None = None
    # Extensions: vLLM's structured_outputs (json, regex, choice, grammar as Lark or GBNF,
    # json_object) and llama-server's grammar (GBNF, or Lark).
    structured_outputs: StructuredOutputs | None = None
    grammar: str | None = None
    # Extension (llama-server): LoRA adapter scales for this request; an adapter it leaves
    # out gets 0, and a request without lora gets the configured scales.
    lora: list[LoraScale] | None = None

    # Hints: they cannot change a reply.
    user: str | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # the routing key of scale/'s prefix-aware front
    prompt_cache_retention: str | None = None

    _grammar_size = field_validator("grammar")(_text_size)

    @model_validator(mode="after")
    def _one_constraint(self) -> BaseRequest:
        fmt = self.response_format
        given = [name for name, v in (("response_format", fmt if fmt is not None and fmt.type != "text" else None),
                 ("structured_outputs", self.structured_outputs), ("grammar", self.grammar)) if v is not None]  # fmt: skip
        if len(given) > 1:
            raise PydanticCustomError("invalid_value", "{first} and {second} both constrain the reply; send one",
                                      {"first": given[0], "second": given[1], "field": given[1]})  # fmt: skip
        return self

    @field_validator("allowed_token_ids", mode="plain", json_schema_input_type=list[int] | None)
    @classmethod
    def _allowed_token_ids(cls, value: Any) -> list[int] | None:
        if value is None:
            return None
        if not isinstance(value, list) or not all(_is_int(t) for t in value):
            raise invalid("expected a list of token ids (integers)", "invalid_type")
        if not value:
            raise invalid("expected at least one token id (leave it out to allow every token)")
        if min(value) < 0:
            raise invalid(f"token ids must be non-negative, got {min(value)}")
        return list(dict.fromkeys(value))

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return cls.model_fields[info.field_name or ""].default
        return value

    @field_validator("stop", mode="plain", json_schema_input_type=str | list[str] | None)
    @classmethod
    def _stop(cls, value: Any) -> str | list[str] | None:
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise invalid("expected a string or a list of strings", "invalid_type")
        if len(items) > MAX_STOP:
            raise invalid(f"expected at most {MAX_STOP} stop strings, got {len(items)}")
        if not all(items):
            raise invalid("stop strings must not be empty")
        check_stop_lengths(items)
        return value  # type: ignore[no-any-return]

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("stream") is False:
            raise invalid("stream_options is only allowed when stream is true")
        return value

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int | None) -> int | None:
        return None if value is None else value % SEED_MOD

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        return 0 if value == -1 else value

    @field_validator("penalty_last_n")
    @classmethod
    def _penalty_last_n(cls, value: int | None) -> int | None:
        return PENALTY_LAST_N_ALL if value == -1 else value

    @field_validator("logit_bias", mode="plain", json_schema_input_type=dict[str, float] | None)
    @classmethod
    def _logit_bias(cls, value: Any) -> dict[int, float] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid("expected an object mapping token ids to biases", "invalid_type")
        out: dict[int, float] = {}
        for key, bias in value.items():
            if _is_int(key) and key >= 0:
                token = key
            elif isinstance(key, str) and _TOKEN_ID.fullmatch(key):
                token = int(key)
            else:
                raise invalid(f"keys must be token ids (non-negative integers), got {key!r}")
            if token in out:
                raise invalid(f"token id {token} appears more than once")
            if not _is_number(bias) or not math.isfinite(bias):
                raise invalid(f"bias for token {token} must be a finite number")
            if not -MAX_BIAS <= bias <= MAX_BIAS:
                raise invalid(f"bias for token {token} must be in -100..100, got {bias!r}")
            out[token] = float(bias)
        return out

    def max_new_tokens(self) -> int | None:
        """The most tokens to generate, or None for "until stop or the context ends"."""
        return self.max_tokens

    def logprob_alternatives(self) -> int | None:
        """Alternatives per token when logprobs are asked for (0..20), else None."""
        return None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def _top_count(value: int) -> int:
    if not 0 <= value <= MAX_ALTERNATIVES:
        raise invalid(f"expected an integer in 0..{MAX_ALTERNATIVES}, got {value}")
    return value


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None

    _size = field_validator("parameters")(_schema_size)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _tool_name(value)


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef

    def template_view(self) -> dict[str, Any]:
        """The tool as chat templates read it (Hugging Face's form)."""
        return self.model_dump(exclude_none=True)


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

#: ``reasoning_effort`` (chat) and ``reasoning.effort`` (Responses) as a reasoning budget in
#: tokens; ``none`` turns thinking off, ``xhigh`` reasons until the model closes its
#: reasoning itself.
EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096, "high": 16384}
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]

#: chat_template_kwargs that would replace what the server itself hands the template.
RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt", "documents")


class ChatRequest(BaseRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # true, or (vLLM / legacy form) an int taken as top_logprobs
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Extension (vLLM, SGLang): variables for the chat template, e.g. enable_thinking.
    chat_template_kwargs: dict[str, Any] | None = None
    # Extension (llama-server's name): the most tokens the reply may reason for; then the
    # engine closes the reasoning (</think>) and the answer follows. -1: no limit.
    reasoning_budget: int | None = Field(default=None, ge=-1)
    # The template's enable_thinking (off for none) and a reasoning_budget (EFFORT_BUDGETS);
    # either, sent as well, wins.
    reasoning_effort: Effort | None = None
    # Extension (Responses' name): the most tool calls a reply makes; the model's further
    # calls are ignored (a forced call's grammar admits no more).
    max_tool_calls: int | None = Field(default=None, ge=1)

    unimplemented = ("functions", "function_call", "audio", "prediction", "web_search_options", "modalities",
                     "service_tier", "store", "verbosity")  # fmt: skip

    @field_validator("reasoning_budget")
    @classmethod
    def _no_limit(cls, value: int | None) -> int | None:
        return None if value == -1 else value

    @model_validator(mode="after")
    def _effort(self) -> ChatRequest:
        effort = self.reasoning_effort
        if effort is not None:
            self.chat_template_kwargs = {"enable_thinking": effort != "none", **(self.chat_template_kwargs or {})}
            if self.reasoning_budget is None and "reasoning_budget" not in self.model_fields_set:
                self.reasoning_budget = EFFORT_BUDGETS.get(effort)
        return self

    def media(self) -> list[tuple[str, MediaPart]]:
        """Every media part in prompt order, with its parameter path (messages.I.content.J)."""
        return [(f"messages.{i}.content.{j}", p) for i, m in enumerate(self.messages) for j, p in m.media()]

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[Tool] | None) -> list[Tool] | None:
        if value is None:
            return None
        if not value:
            raise invalid("expected at least one tool (leave tools out for none)")
        names = [t.function.name for t in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise invalid(f"function names must be unique; {twice[0]!r} appears more than once")
        return value

    @field_validator("tool_choice", mode="plain", json_schema_input_type=ToolChoice | None)
    @classmethod
    def _tool_choice(cls, value: Any, info: ValidationInfo) -> ToolChoice | None:
        if value is None:
            return None
        if isinstance(value, dict):
            try:
                value = NamedToolChoice.model_validate(value)
            except ValidationError:
                raise invalid(
                    'expected {"type": "function", "function": {"name": "..."}}', "invalid_type"
                ) from None
        elif value not in ("none", "auto", "required"):
            raise invalid(
                "expected 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": "..."}}'
            )
        if "tools" not in info.data:
            return value  # tools itself failed; that error is reported
        tools = info.data.get("tools")
        if not tools:
            raise invalid("tool_choice is only allowed when tools are given")
        fmt = info.data.get("response_format")
        if value == "required" or isinstance(value, NamedToolChoice):
            if fmt is not None and fmt.type != "text":
                raise invalid(
                    "a forced tool call and response_format both constrain the reply; send one"
                )
        if isinstance(value, NamedToolChoice):
            names = [t.function.name for t in tools]
            if value.function.name not in names:
                raise invalid(
                    f"names the function {value.function.name!r}, which is not among "
                    f"the tools ({', '.join(names)})"
                )
        return value  # type: ignore[no-any-return]

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        for key in value:
            if key in RESERVED_TEMPLATE_KWARGS:
                raise invalid(
                    f"{key!r} cannot be set here: the server passes it to the template "
                    f"(send it as its own parameter)"
                )
            if not key.isidentifier():
                raise invalid(f"{key!r} is not a template variable name")
        return value

    def tool_mode(self) -> Literal["none", "auto", "required", "named"]:
        """What the request asks of tools: none (no tools, or tool_choice none), auto,
        required, or named (one function, :meth:`named_tool`)."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    @cached_property
    def tool_views(self) -> tuple[dict[str, Any], ...]:
        """Every tool as chat templates read it (Tool.template_view), made once."""
        return tuple(t.template_view() for t in self.tools or ())

    def forced_views(self) -> list[dict[str, Any]]:
        """The template views of :meth:`forced_tools`."""
        names = {t.function.name for t in self.forced_tools()}
        return [v for v in self.tool_views if v["function"]["name"] in names]

    def forced_tools(self) -> list[Tool]:
        """The tools one of which must be called (required: all; named: that one)."""
        tools = self.tools or []
        if isinstance(self.tool_choice, NamedToolChoice):
            return [t for t in tools if t.function.name == self.tool_choice.function.name]
        return list(tools)

    @field_validator("logprobs", mode="plain", json_schema_input_type=bool | int | None)
    @classmethod
    def _logprobs(cls, value: Any) -> bool | int | None:
        if value is None or isinstance(value, bool):
            return value
        if not _is_int(value):
            raise invalid("expected true, false or an integer (taken as top_logprobs)", "invalid_type")
        return _top_count(value)

    @field_validator("top_logprobs", mode="plain", json_schema_input_type=int | None)
    @classmethod
    def _top_logprobs(cls, value: Any, info: ValidationInfo) -> int | None:
        if value is None:
            return None
        if not _is_int(value):
            raise invalid(f"expected an integer in 0..{MAX_ALTERNATIVES}", "invalid_type")
        _top_count(value)
        asked = info.data.get("logprobs")
        if asked is None or asked is False:
            raise invalid("top_logprobs needs logprobs: true (send both, or leave it out)")
        if not isinstance(asked, bool) and asked != value:
            raise invalid(f"top_logprobs ({value}) and logprobs ({asked}) disagree; send one")
        return value

    def logprob_alternatives(self) -> int | None:
        if self.logprobs is None or self.logprobs is False:
            return None
        if self.logprobs is True:
            return self.top_logprobs or 0
        return self.logprobs

    @field_validator("max_completion_tokens")
    @classmethod
    def _same_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        other = info.data.get("max_tokens")
        if value is not None and other is not None and value != other:
            raise invalid(
                f"max_completion_tokens ({value}) and max_tokens ({other}) disagree; send one"
            )
        return value

    def max_new_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


#: A prompt or an embeddings input: text(s) or token ids, one list or several.
Prompt = str | list[str] | list[int] | list[list[int]]


def token_ids(value: list[Any]) -> list[int]:
    """A prompt's (or an input's) token ids, checked: a non-empty list of non-negative ints."""
    if not value:
        raise invalid("a list of token ids must not be empty")
    if not all(_is_int(t) for t in value):
        raise invalid("expected every token id to be an integer", "invalid_type")
    if min(value) < 0:
        raise invalid("token ids must be non-negative")
    return value


class CompletionRequest(BaseRequest):
    prompt: Prompt
    logprobs: int | None = None
    echo: bool | None = None
    # fill-in-the-middle: the text after the insertion point (api/infill.py)
    suffix: str | None = None

    unimplemented = ("best_of",)

    @field_validator("logprobs", mode="plain", json_schema_input_type=int | bool | None)
    @classmethod
    def _logprobs(cls, value: Any) -> int | None:
        if value is None or value is False:  # false: "not asked", as some clients send it
            return None
        if not _is_int(value):
            raise invalid(f"expected an integer in 0..{MAX_ALTERNATIVES}", "invalid_type")
        return _top_count(value)

    @field_validator("echo")
    @classmethod
    def _echo(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value and info.data.get("logprobs") is not None:
            raise PydanticCustomError(
                "unsupported_value",
                "with logprobs is not supported yet: it needs the prompt's tokens scored, "
                "which the engine does not do (send echo or logprobs, not both)",
            )
        return value

    def logprob_alternatives(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="plain", json_schema_input_type=Prompt)
    @classmethod
    def _prompt(cls, value: Any) -> Prompt:
        if isinstance(value, str):
            if not value:
                raise invalid("prompt must not be empty")
            return value
        if not isinstance(value, list):
            raise invalid(
                "expected a string, a list of strings, a list of token ids "
                "or a list of lists of token ids",
                "invalid_type",
            )
        if not value:
            raise invalid("prompt must not be empty")
        if all(isinstance(p, str) for p in value):
            if not all(value):
                raise invalid("prompt strings must not be empty")
            return value
        if all(isinstance(p, list) for p in value):
            return [token_ids(p) for p in value]
        return token_ids(value)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else type(value).__name__


RequestT = TypeVar("RequestT", bound=_Strict)


def parse_request(model_cls: type[RequestT], body: Any) -> RequestT:
    """Validate a decoded JSON body; every failure is an :class:`ApiError` (400)."""
    if not isinstance(body, dict):
        raise ApiError(
            400,
            f"the request body must be a JSON object, got {_json_kind(body)}",
            code="invalid_type",
        )
    try:
        return model_cls.model_validate(body)
    except ValidationError as err:
        raise from_validation_error(err) from None
