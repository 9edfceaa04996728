"""The OpenAPI document (``/openapi.json``) as the API is: the request models' JSON schemas
as the routes' bodies, what a reply holds, and every error an OpenAI error object. The
routes parse their bodies themselves (requests.parse_request, for OpenAI-shaped errors), so
FastAPI cannot see the models; ``route`` and ``document`` tell it. Fuzzing reads this
document (tests/test_fuzz.py)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from strata_core import __version__
from strata_core.schema.requests import ChatRequest, CompletionRequest

REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error object."""

    error: ErrorDetail


def error_response(why: str, **extra: Any) -> dict[str, Any]:
    # JSON whatever the route's own replies are (/metrics is text)
    schema = {"$ref": REF.format(model="ErrorBody")}
    return {"description": why, "content": {"application/json": {"schema": schema}}, **extra}


#: Errors any route may answer.
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    401: error_response("missing or wrong API key (when the server has one)"),
    404: error_response("no such route"),
    405: error_response("the route does not take this method"),
    500: error_response("a bug in the server (internal_error); its traceback is in the log"),
}

#: What the completion routes answer besides their reply (docs/reliability.md).
REQUEST_ERRORS: dict[int | str, dict[str, Any]] = {
    400: error_response("the request is wrong; param names the field"),
    404: error_response("no such route, or no such model (model_not_found)"),
    413: error_response("the body is larger than [server] max_body_bytes"),
    429: error_response(
        "more requests wait for a slot than [server] max_queued (queue_full)",
        headers={"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
    ),
    503: error_response("the engine is starting or restarting (engine_unavailable)"),
    504: error_response("the request ran longer than [server] request_timeout (timeout)"),
}

_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"]}


def _reply(obj: str) -> dict[str, Any]:
    """The reply's outline: what every body of this route holds."""
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": obj},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": {"type": "object", "required": ["index", "finish_reason"]}},
            "usage": _USAGE,
        },
    }


#: One event of a stream: a chunk's JSON, an error object's, or [DONE].
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}

REPLIES = {ChatRequest: _reply("chat.completion"), CompletionRequest: _reply("text_completion")}

#: Anthropic's error object, which the Messages routes answer with.
ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"const": "error"},
                   "error": {"type": "object", "required": ["type", "message"]}},
}  # fmt: skip

#: Request models that ``route`` was given, for ``document`` to put among the components.
_BODIES: list[type[BaseModel]] = [ChatRequest, CompletionRequest]


def route(model: type[BaseModel], what: str, reply: dict[str, Any] | None = None, stream: bool = True,
          anthropic: bool = False, error_schema: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """A POST route's OpenAPI details: ``model`` as its body, its reply (``reply``'s outline,
    else the completion routes'; with ``stream``, SSE events too) and its errors (OpenAI
    error objects, with ``anthropic`` Anthropic's, or ``error_schema``'s for every status)."""
    if model not in _BODIES:
        _BODIES.append(model)
    content: dict[str, Any] = {"application/json": {"schema": reply or REPLIES[model]}}
    if stream:
        content["text/event-stream"] = {"schema": SSE_EVENT}
    ok = {"description": what + (", or with stream true its SSE events" if stream else ""), "content": content}
    body = {"required": True, "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}
    errors = REQUEST_ERRORS
    error_schema = ANTHROPIC_ERROR if anthropic else error_schema
    if error_schema is not None:  # every status, so that none falls back to the app's OpenAI-shaped ones
        shape = {"application/json": {"schema": error_schema}}
        errors = {code: {**e, "content": shape} for code, e in {**COMMON_ERRORS, **REQUEST_ERRORS}.items()}
    return {
        "summary": f"Create {what}",
        "openapi_extra": {"requestBody": body},
        "responses": {200: ok, **errors},
    }


def document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document, with the request models among its components."""
    if app.openapi_schema is None:
        spec = get_openapi(title=app.title, version=__version__, routes=app.routes)
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        models: list[type[BaseModel]] = [ErrorBody, *_BODIES]
        for model in models:
            schema = model.model_json_schema(ref_template=REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        app.openapi_schema = spec
    return app.openapi_schema
