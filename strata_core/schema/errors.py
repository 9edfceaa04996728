"""OpenAI-shaped API errors, and the translation of pydantic validation errors into them."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

#: Longest rendering of an offending value inside an error message.
_VALUE_CHARS = 60

#: pydantic error types that mean "wrong kind of value" rather than "value out of range".
_TYPE_ERRORS = ("_type", "_parsing", "int_from_float")


class ApiError(Exception):
    """An error the HTTP layer returns as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return (
            f"ApiError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"
        )


def internal_error(exc: BaseException) -> ApiError:
    """The answer to a bug: an OpenAI-shaped 500, never a plain-text one."""
    return ApiError(500, f"internal error: {type(exc).__name__} (a bug in Strata; the server's log has "
                    "its traceback)", type="server_error", code="internal_error")  # fmt: skip


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 3] + "..."


def _param(loc: tuple[int | str, ...]) -> str | None:
    return ".".join(str(p) for p in loc) or None


def from_validation_error(err: ValidationError) -> ApiError:
    """A 400 describing the first error; ``param`` is its dotted field path.

    A validator that runs before the fields (a model "before" validator) names the field
    through the error context, ``ctx["field"]``; it is appended to the error's location.
    """
    first = err.errors(include_url=False)[0]
    kind = first["type"]
    ctx = first.get("ctx") or {}
    loc = tuple(first["loc"]) + ((ctx["field"],) if "field" in ctx else ())
    param = _param(loc)
    msg = first["msg"]
    if kind == "extra_forbidden":
        return ApiError(
            400,
            f"unsupported parameter: '{param}' (Strata does not implement it)",
            param=param,
            code="unsupported_parameter",
        )
    if kind == "missing":
        return ApiError(
            400,
            f"missing required parameter: '{param}'",
            param=param,
            code="missing_required_parameter",
        )
    name = param or "request body"
    if kind.startswith("unsupported"):
        # Raised by our own validators, whose message is a predicate about the field.
        return ApiError(400, f"'{name}' {msg}", param=param, code=kind)
    is_type = any(kind.endswith(t) for t in _TYPE_ERRORS)
    what = "type" if is_type else "value"
    expected = msg[:1].lower() + msg[1:]
    return ApiError(
        400,
        f"invalid {what} for '{name}': {_show(first.get('input'))} ({expected})",
        param=param,
        code=f"invalid_{what}",
    )
