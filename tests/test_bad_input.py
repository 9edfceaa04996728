"""Issue 14: the bad-input matrix. Every case gets an OpenAI error object with the right
status, param and code (never a 500, never plain text), and the server answers a valid
request right after it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest

from strata_core.schema.requests import MAX_MESSAGES, MAX_SCHEMA_CHARS, MAX_STOP_CHARS, MAX_TOOLS

pytestmark = pytest.mark.slow

CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
N_CTX, N_VOCAB = 1024, 49152  # the session server (conftest.py) on the default model
DEPTH = 64  # [server] max_json_depth's default
MB = 1 << 20


class Case(NamedTuple):
    name: str
    path: str
    body: Any  # sent as JSON, unless raw is given
    raw: bytes | None
    status: int
    param: str | None
    code: str


def chat(name: str, fields: dict[str, Any], param: str | None, code: str = "invalid_value",
         status: int = 400) -> Case:  # fmt: skip
    return Case(name, CHAT, {"messages": MSG, "max_tokens": 2, **fields}, None, status, param, code)


def compl(name: str, fields: dict[str, Any], param: str | None, code: str = "invalid_value",
          status: int = 400) -> Case:  # fmt: skip
    return Case(name, COMPL, {"prompt": "hi", "max_tokens": 2, **fields}, None, status, param, code)


def raw(name: str, path: str, data: bytes, param: str | None, code: str, status: int = 400) -> Case:
    return Case(name, path, None, data, status, param, code)


def nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` arrays, one inside the other."""
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def tool(name: str = "f", **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **function}}


def user(content: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}]}


#: A schema no value satisfies (every value must contain itself); it compiles, and the
#: grammar engine found it empty only once asked for the first token (a 503 before).
SELF_REF = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
#: json_object must start with "{"; this token id (the end of text) never does, so the
#: grammar is refused in the engine, at its first sample.
NOT_A_BRACE = 0

BIG = b'{"prompt": "' + b"a" * (10 * MB) + b'"}'
CTX = "context_length_exceeded"
UNSUPPORTED = "unsupported_parameter"

BODY_CASES = [
    c
    for path, field in ((CHAT, "messages"), (COMPL, "prompt"))
    for c in (
        raw("malformed json", path, b'{"messages": [', None, "invalid_json"),
        raw("empty body", path, b"", None, "invalid_json"),
        raw("whitespace body", path, b" \n\t ", None, "invalid_json"),
        raw("trailing garbage", path, b'{"prompt": "x"} x', None, "invalid_json"),
        raw("invalid utf-8", path, b'{"prompt": "caf\xe9 \xff"}', None, "invalid_json"),
        raw("utf-16 body", path, '{"prompt": "x"}'.encode("utf-16"), None, "invalid_json"),
        raw("NaN", path, b'{"temperature": NaN}', "temperature", "invalid_value"),
        raw("Infinity", path, b'{"max_tokens": Infinity}', "max_tokens", "invalid_value"),
        raw("-Infinity in logit_bias", path, b'{"logit_bias": {"5": -Infinity}}', "logit_bias.5", "invalid_value"),
        raw("lone surrogate", path, b'{"user": "a\\ud800b"}', "user", "invalid_value"),
        raw("lone low surrogate in a list", path, b'{"stop": ["ok", "\\udc00"]}', "stop.1", "invalid_value"),
        raw("lone surrogate in a key", path, b'{"logit_bias": {"\\ud83d": 1}}', "logit_bias.\\ud83d", "invalid_value"),
        raw("10 MB body", path, BIG, None, "request_too_large", 413),
        raw("nesting past max_json_depth", path, json.dumps({"stop": nested(DEPTH)}).encode(),
            "stop" + ".0" * (DEPTH - 1), "too_deep"),  # fmt: skip
        raw("nesting past the parser's recursion", path, b"[" * 100_000 + b"]" * 100_000, None, "too_deep"),
        Case("body an array", path, [1, 2], None, 400, None, "invalid_type"),
        Case("body a string", path, "hello", None, 400, None, "invalid_type"),
        Case("body null", path, None, b"null", 400, None, "invalid_type"),
        Case(f"missing {field}", path, {"max_tokens": 2}, None, 400, field, "missing_required_parameter"),
    )
]

CHAT_CASES = [
    chat("empty messages", {"messages": []}, "messages"),
    chat("messages a string", {"messages": "hi"}, "messages", "invalid_type"),
    chat("too many messages", {"messages": MSG * (MAX_MESSAGES + 1)}, "messages"),
    chat("message not an object", {"messages": [1]}, "messages.0", "invalid_type"),
    chat("role missing", {"messages": [{"content": "x"}]}, "messages.0.role", "missing_required_parameter"),
    chat("bad role", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    chat("content a number", user(5), "messages.0.content", "invalid_type"),
    chat("content null for a user", user(None), "messages.0.content"),
    chat("image part refused by name", user([{"type": "image_url", "image_url": {"url": "data:,"}}]),
         "messages.0.content.0", "unsupported_content"),  # fmt: skip
    chat("audio part refused by name", user([{"type": "input_audio", "input_audio": {"data": ""}}]),
         "messages.0.content.0", "unsupported_content"),  # fmt: skip
    chat("text part with extra keys", user([{"type": "text", "text": "x", "x": 1}]), "messages.0.content"),
    chat("message field unknown", {"messages": [{"role": "user", "content": "x", "foo": 1}]},
         "messages.0.foo", UNSUPPORTED),  # fmt: skip
    chat("tool message without tool_call_id", {"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
    chat("prompt beyond the context", user("word " * 1500), "messages", CTX),
    chat("unknown model", {"model": "gpt-9"}, "model", "model_not_found", 404),
    chat("model a number", {"model": 5}, "model", "invalid_type"),
    chat("max_tokens a string", {"max_tokens": "ten"}, "max_tokens", "invalid_type"),
    chat("max_tokens a float", {"max_tokens": 1.5}, "max_tokens", "invalid_type"),
    chat("max_tokens a boolean", {"max_tokens": True}, "max_tokens", "invalid_type"),
    chat("max_tokens zero", {"max_tokens": 0}, "max_tokens"),
    chat("max_tokens negative", {"max_tokens": -1}, "max_tokens"),
    chat("max_tokens huge", {"max_tokens": 10**30}, "max_tokens", CTX),
    chat("max_completion_tokens beyond the context", {"max_tokens": None, "max_completion_tokens": 5000},
         "max_completion_tokens", CTX),  # fmt: skip
    chat("max_tokens and max_completion_tokens disagree", {"max_completion_tokens": 3}, "max_completion_tokens"),
    chat("n zero", {"n": 0}, "n"),
    chat("n beyond 16", {"n": 17}, "n"),
    chat("n huge", {"n": 10**20}, "n"),
    chat("n a string", {"n": "2"}, "n", "invalid_type"),
    chat("n x max_tokens, each beyond the context", {"n": 2, "max_tokens": N_CTX}, "max_tokens", CTX),
    chat("temperature negative", {"temperature": -0.1}, "temperature"),
    chat("temperature above 2", {"temperature": 2.5}, "temperature"),
    chat("temperature a string", {"temperature": "hot"}, "temperature", "invalid_type"),
    chat("temperature huge", {"temperature": 1e308}, "temperature"),
    chat("top_p zero", {"top_p": 0}, "top_p"),
    chat("top_p above 1", {"top_p": 1.5}, "top_p"),
    chat("top_k below -1", {"top_k": -2}, "top_k"),
    chat("top_k a float", {"top_k": 1.5}, "top_k", "invalid_type"),
    chat("min_p above 1", {"min_p": 2}, "min_p"),
    chat("presence_penalty above 2", {"presence_penalty": 3}, "presence_penalty"),
    chat("frequency_penalty below -2", {"frequency_penalty": -3}, "frequency_penalty"),
    chat("repetition_penalty zero", {"repetition_penalty": 0}, "repetition_penalty"),
    chat("repetition_penalty above 10", {"repetition_penalty": 11}, "repetition_penalty"),
    chat("penalty_last_n below -1", {"penalty_last_n": -2}, "penalty_last_n"),
    chat("seed 2**64", {"seed": 2**64}, "seed"),
    chat("seed below -2**63", {"seed": -(2**63) - 1}, "seed"),
    chat("seed a float", {"seed": 1.5}, "seed", "invalid_type"),
    chat("logit_bias out of vocabulary", {"logit_bias": {str(N_VOCAB): 1}}, "logit_bias"),
    chat("logit_bias id huge", {"logit_bias": {str(10**30): 1}}, "logit_bias"),
    chat("logit_bias id negative", {"logit_bias": {"-1": 1}}, "logit_bias"),
    chat("logit_bias id not a number", {"logit_bias": {"abc": 1}}, "logit_bias"),
    chat("logit_bias above 100", {"logit_bias": {"5": 101}}, "logit_bias"),
    chat("logit_bias value a string", {"logit_bias": {"5": "x"}}, "logit_bias"),
    chat("logit_bias a list", {"logit_bias": [5]}, "logit_bias", "invalid_type"),
    chat("allowed_token_ids out of vocabulary", {"allowed_token_ids": [1, N_VOCAB]}, "allowed_token_ids"),
    chat("allowed_token_ids huge", {"allowed_token_ids": [10**30]}, "allowed_token_ids"),
    chat("allowed_token_ids negative", {"allowed_token_ids": [-1]}, "allowed_token_ids"),
    chat("allowed_token_ids empty", {"allowed_token_ids": []}, "allowed_token_ids"),
    chat("allowed_token_ids floats", {"allowed_token_ids": [1.5]}, "allowed_token_ids", "invalid_type"),
    chat("stop token ids (not a parameter)", {"stop_token_ids": [N_VOCAB]}, "stop_token_ids", UNSUPPORTED),
    chat("17 stop strings", {"stop": list("abcdefghijklmnopq")}, "stop"),
    chat("empty stop string", {"stop": [""]}, "stop"),
    chat("stop string of 100,000 characters", {"stop": ["x" * 100_000]}, "stop"),
    chat("stop string one past the length limit", {"stop": ["ok", "x" * (MAX_STOP_CHARS + 1)]}, "stop"),
    chat("stop a number", {"stop": 5}, "stop", "invalid_type"),
    chat("stream a string", {"stream": "yes"}, "stream", "invalid_type"),
    chat("stream_options without stream", {"stream_options": {"include_usage": True}}, "stream_options"),
    chat("stream_options with stream false", {"stream": False, "stream_options": {"include_usage": True}},
         "stream_options"),  # fmt: skip
    chat("stream_options unknown key", {"stream": True, "stream_options": {"x": 1}}, "stream_options.x", UNSUPPORTED),
    chat("logprobs a string", {"logprobs": "yes"}, "logprobs", "invalid_type"),
    chat("top_logprobs above 20", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    chat("top_logprobs without logprobs", {"top_logprobs": 2}, "top_logprobs"),
    chat("logprobs_mode unknown", {"logprobs_mode": "cooked"}, "logprobs_mode"),
    chat("response_format type unknown", {"response_format": {"type": "xml"}}, "response_format.type"),
    chat("json_schema without its object", {"response_format": {"type": "json_schema"}}, "response_format"),
    chat("json_schema name invalid", {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
         "response_format.json_schema.name"),  # fmt: skip
    chat("json_schema not a schema", {"response_format": json_schema({"type": 5})}, "response_format"),
    chat("json_schema too large", {"response_format": json_schema({"description": "x" * MAX_SCHEMA_CHARS})},
         "response_format.json_schema.schema"),  # fmt: skip
    chat("json_schema nested 300 deep", {"response_format": json_schema(deep_schema(300))},
         "response_format.json_schema.schema" + ".properties.a" * 30 + ".properties", "too_deep"),  # fmt: skip
    chat("json_schema admitting no value", {"response_format": json_schema(SELF_REF)}, "response_format"),
    chat("json_schema admitting no value, strict", {"response_format": {"type": "json_schema", "json_schema": {
         "name": "x", "schema": SELF_REF, "strict": True}}}, "response_format"),  # fmt: skip
    chat("json_object where allowed_token_ids leave nothing", {"response_format": {"type": "json_object"},
         "allowed_token_ids": [NOT_A_BRACE]}, "response_format"),  # fmt: skip
    # the default model's template never reads tools: the generic format's grammar enforces them
    chat("tool parameters not a schema", {"tools": [tool(parameters={"type": 5})]}, "tools"),
    chat("generic tools with response_format", {"tools": [tool()], "response_format": {"type": "json_object"}},
         "response_format", "unsupported_value"),  # fmt: skip
    chat("tool parameters admitting no value", {"tools": [tool(parameters=SELF_REF)], "tool_choice": "required"},
         "tools"),  # fmt: skip
    chat("too many tools", {"tools": [tool(f"f{i}") for i in range(MAX_TOOLS + 1)]}, "tools"),
    chat("tools empty", {"tools": []}, "tools"),
    chat("tool type unknown", {"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type"),
    chat("tool name invalid", {"tools": [tool("a b")]}, "tools.0.function.name"),
    chat("tool names twice", {"tools": [tool(), tool()]}, "tools"),
    chat("tool parameters too large", {"tools": [tool(parameters={"description": "x" * MAX_SCHEMA_CHARS})]},
         "tools.0.function.parameters"),  # fmt: skip
    chat("tool_choice without tools", {"tool_choice": "required"}, "tool_choice"),
    chat("tool_choice unknown", {"tools": [tool()], "tool_choice": "maybe"}, "tool_choice"),
    chat("chat_template_kwargs reserved", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    chat("chat_template_kwargs bad name", {"chat_template_kwargs": {"1x": 1}}, "chat_template_kwargs"),
    chat("functions (legacy)", {"functions": [{"name": "f"}]}, "functions", UNSUPPORTED),
    chat("unknown parameter", {"frobnicate": True}, "frobnicate", UNSUPPORTED),
    chat("user a number", {"user": 5}, "user", "invalid_type"),
    chat("speculative a string", {"speculative": "yes"}, "speculative", "invalid_type"),
]

COMPLETION_CASES = [
    compl("prompt empty", {"prompt": ""}, "prompt"),
    compl("prompt an empty list", {"prompt": []}, "prompt"),
    compl("prompt with an empty string", {"prompt": ["a", ""]}, "prompt"),
    compl("prompt an empty id list", {"prompt": [[]]}, "prompt"),
    compl("prompt a number", {"prompt": 5}, "prompt", "invalid_type"),
    compl("prompt mixing ids and text", {"prompt": [1, "a"]}, "prompt", "invalid_type"),
    compl("prompt id negative", {"prompt": [-1]}, "prompt"),
    compl("prompt id out of vocabulary", {"prompt": [1, N_VOCAB]}, "prompt"),
    compl("prompt id huge", {"prompt": [10**30]}, "prompt"),
    compl("prompt ids out of vocabulary in the 2nd", {"prompt": [[1], [N_VOCAB]]}, "prompt"),
    compl("prompt exactly the context", {"prompt": [28] * N_CTX, "max_tokens": 1}, "prompt", CTX),
    compl("prompt + max_tokens past the context", {"prompt": [28] * (N_CTX - 10), "max_tokens": 11}, "max_tokens", CTX),
    compl("n x prompts past the queue", {"prompt": ["a"] * 20, "n": 16}, "n"),
    compl("echo with logprobs", {"echo": True, "logprobs": 1}, "echo", "unsupported_value"),
    compl("logprobs above 20", {"logprobs": 21}, "logprobs"),
    compl("logprobs a string", {"logprobs": "x"}, "logprobs", "invalid_type"),
    compl("suffix on a model without FIM tokens", {"suffix": "x"}, "suffix", "unsupported_value"),
    compl("stop string of 100,000 characters", {"stop": "x" * 100_000}, "stop"),
    compl("json_schema admitting no value", {"response_format": json_schema(SELF_REF)}, "response_format"),
    compl("best_of", {"best_of": 2}, "best_of", UNSUPPORTED),
    compl("logit_bias out of vocabulary", {"logit_bias": {str(N_VOCAB): -100}}, "logit_bias"),
    compl("unknown model", {"model": "text-davinci-003"}, "model", "model_not_found", 404),
]

ROUTE_CASES = [
    Case("unknown route", "GET /v1/nothing", None, None, 404, None, "not_found"),
    Case("POST on a GET route", "POST /v1/models", {}, None, 405, None, "method_not_allowed"),
    Case("GET on a POST route", "GET /v1/chat/completions", None, None, 405, None, "method_not_allowed"),
    Case("DELETE on a POST route", "DELETE /v1/completions", None, None, 405, None, "method_not_allowed"),
]

CASES = BODY_CASES + CHAT_CASES + COMPLETION_CASES + ROUTE_CASES
VALID = {CHAT: {"messages": MSG, "max_tokens": 1}, COMPL: {"prompt": "The sky is", "max_tokens": 1}}


def send(base: str, case: Case) -> httpx.Response:
    method, _, path = case.path.rpartition(" ")
    if case.raw is not None:
        content = case.raw
    elif case.body is None and method:
        content = b""
    else:
        content = json.dumps(case.body).encode()
    return httpx.request(method or "POST", f"{base}{path}", content=content,
                         headers={"content-type": "application/json"}, timeout=120)  # fmt: skip


def internal_errors(base: str) -> int:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return int(next(ln for ln in text.splitlines() if ln.startswith("strata_internal_errors_total ")).split()[1])


@pytest.fixture(scope="module")
def base(server: Any) -> Iterator[str]:
    """The session server; after the module, no case may have reached the 500 handler."""
    before = internal_errors(server.base)
    yield server.base
    assert internal_errors(server.base) == before, "a bad input reached the internal-error (500) handler"


def test_the_matrix_is_large() -> None:
    assert len(CASES) >= 80
    assert len({c.name + c.path for c in CASES}) == len(CASES)


def case_id(c: Case) -> str:
    where = {CHAT: "chat", COMPL: "completions"}.get(c.path, c.path)
    return f"{where}: {c.name}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_bad_input(base: str, case: Case) -> None:
    r = send(base, case)
    assert r.status_code == case.status, r.text[:600]
    assert r.headers["content-type"] == "application/json", r.headers
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert (e["param"], e["code"]) == (case.param, case.code), e
    assert e["message"] and e["type"] == "invalid_request_error", e
    path = case.path.rpartition(" ")[2]
    ok = httpx.post(f"{base}{path if path in VALID else COMPL}", json=VALID.get(path, VALID[COMPL]), timeout=120)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1, ok.text


def test_a_stop_string_at_the_length_limit_is_accepted(base: str) -> None:
    r = httpx.post(f"{base}{COMPL}", json={**VALID[COMPL], "stop": "x" * MAX_STOP_CHARS}, timeout=120)
    assert r.status_code == 200, r.text


def test_a_grammar_the_engine_refuses_ends_a_stream_with_a_400_error_event(base: str) -> None:
    body = {"messages": MSG, "max_tokens": 2, "stream": True, "response_format": {"type": "json_object"},
            "allowed_token_ids": [NOT_A_BRACE]}  # fmt: skip
    r = httpx.post(f"{base}{CHAT}", json=body, timeout=120)
    events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
    error = events[-1]["error"]
    assert (error["param"], error["code"]) == ("response_format", "invalid_value"), error
    assert "no token is permitted" in error["message"] and "\n" not in error["message"], error


def test_a_body_over_the_limit_without_content_length(base: str) -> None:
    """A chunked body has no Content-Length: the server counts as it reads."""

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(9):
            yield b"a" * MB
        yield b'"}'

    r = httpx.post(f"{base}{COMPL}", content=chunks(), headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text[:300]


def test_nesting_at_the_limit_is_accepted(base: str) -> None:
    # the body is level 1, chat_template_kwargs 2, its value 3 and deeper
    body = {"messages": MSG, "max_tokens": 1, "chat_template_kwargs": {"x": nested(DEPTH - 2)}}
    r = httpx.post(f"{base}{CHAT}", json=body, timeout=120)
    assert r.status_code == 200, r.text[:300]
    body["chat_template_kwargs"] = {"x": nested(DEPTH - 1)}
    r = httpx.post(f"{base}{CHAT}", json=body, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_deep", r.text[:300]


def test_a_prompt_one_token_short_of_the_context_gets_its_token(base: str) -> None:
    r = httpx.post(f"{base}{COMPL}", json={"prompt": [28] * (N_CTX - 1), "max_tokens": 1}, timeout=120)
    assert r.status_code == 200, r.text[:300]
    usage = r.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (N_CTX - 1, 1, N_CTX)


def test_n_times_max_tokens_beyond_the_context_is_accepted(base: str) -> None:
    """Each choice has a slot and its own context: 16 x 900 tokens is no error (the choices
    end at once: only the end-of-text token is allowed)."""
    eos = 2  # SmolLM2's <|im_end|>
    body = {"prompt": "hi", "n": 16, "max_tokens": 900, "allowed_token_ids": [eos]}
    r = httpx.post(f"{base}{COMPL}", json=body, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["choices"]) == 16
