"""What a request may cost before the server looks at it (docs/reliability.md, "Limits"):
the body's size, its JSON (strict: UTF-8, finite numbers, no lone surrogates, bounded
nesting), and room in the queue. Every refusal is an ApiError naming what was wrong."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request

from strata_core.ops.config import ServerConfig
from strata_core.schema.errors import ApiError

#: Seconds a client refused for a full queue is told to wait (Retry-After).
RETRY_AFTER_S = 1

_SURROGATE = re.compile(r"[\ud800-\udfff]")


class _NonFinite(str):
    """NaN, Infinity or -Infinity where the body had it: found by the walk, which knows where."""


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to be larger than ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"the request body has {size} bytes or more; this server takes at most {limit} "
                    "(the operator's [server] max_body_bytes)", code="request_too_large")  # fmt: skip


def invalid_json(why: str, param: str | None = None) -> ApiError:
    return ApiError(400, f"the request body is not valid JSON: {why}", param=param, code="invalid_json")


def parse_json(raw: bytes, max_depth: int) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity, no lone surrogates, nesting at most ``max_depth``."""
    if not raw.strip():
        raise invalid_json("the body is empty (send a JSON object)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_json(f"byte {exc.start} is not UTF-8 ({raw[exc.start:exc.start + 1]!r})") from None
    try:
        value = json.loads(text, parse_constant=_NonFinite)
    except RecursionError:
        raise too_deep(None, max_depth) from None
    except ValueError as exc:
        raise invalid_json(str(exc)) from None
    check_tree(value, max_depth)
    return value


def too_deep(param: str | None, max_depth: int) -> ApiError:
    return ApiError(400, f"the request body nests arrays and objects more than {max_depth} deep "
                    "(the operator's [server] max_json_depth)", param=param, code="too_deep")  # fmt: skip


def check_tree(value: Any, max_depth: int) -> None:
    """Walk the decoded body without recursion; refuse what JSON parsers let through."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, (dict, list)):
            if len(path) >= max_depth:
                raise too_deep(_param(path), max_depth)
            items = list(node.items() if isinstance(node, dict) else enumerate(node))
            for key, child in reversed(items):  # popped in document order: the first problem is named
                at = (*path, str(key))
                if isinstance(key, str) and _SURROGATE.search(key):
                    raise _surrogate(at)
                stack.append((child, at))
        elif isinstance(node, _NonFinite):
            raise ApiError(400, f"{_param(path) or 'the body'} is {node}, which JSON does not allow "
                           "(send a finite number)", param=_param(path), code="invalid_value")  # fmt: skip
        elif isinstance(node, str) and _SURROGATE.search(node):
            raise _surrogate(path)


def _surrogate(path: tuple[str, ...]) -> ApiError:
    return ApiError(400, f"{_param(path) or 'the body'} holds a lone UTF-16 surrogate (\\ud800-\\udfff "
                    "without its pair), which is not text", param=_param(path), code="invalid_value")  # fmt: skip


def _param(path: tuple[str, ...]) -> str | None:
    """The dotted path pydantic's errors use (errors.from_validation_error): ``messages.0.content``;
    a lone surrogate in a key is written as its escape, since the answer must be UTF-8."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", ".".join(path)) or None


async def read_json(request: Request, cfg: ServerConfig) -> Any:
    """The request's JSON body within the operator's limits."""
    return parse_json(await read_body(request, cfg.max_body_bytes), cfg.max_json_depth)


def queue_full(waiting: int, limit: int) -> ApiError:
    return ApiError(
        429,
        f"the server is busy: {waiting} requests are waiting for a slot and at most {limit} may "
        f"(the operator's [server] max_queued); retry after {RETRY_AFTER_S} s",
        type="rate_limit_error",
        code="queue_full",
        headers={"retry-after": str(RETRY_AFTER_S)},
    )
