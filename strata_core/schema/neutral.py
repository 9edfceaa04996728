"""The one rule for parameters an API documents and Strata does not implement, in every
API family (chat, completions, Responses, Messages, Ollama).

Such a parameter is accepted, and dropped, when its value asks for nothing: null, false,
an empty list or object, or the API's documented default for it (:data:`DEFAULTS`).
Any other value asks for behaviour Strata lacks: a 400 naming the parameter. A request
model lists the names it knows but does not implement in its ``unimplemented`` class
variable (requests.Strict applies this rule to them before the fields are read); a name
no model lists is refused as unknown. Hints that cannot change a reply (``user``,
``metadata``, ``safety_identifier``, ``prompt_cache_key``, ``prompt_cache_retention``)
are ordinary fields of the models, kept where they are useful.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticCustomError

#: A parameter's documented default, or another value that asks for nothing here, by name
#: (the same name means the same in every family that has it).
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "service_tier": ("auto", "default"),  # the project's usual tier: the only one here
    "verbosity": ("medium",),  # chat's verbosity and Responses' text.verbosity
    "modalities": (["text"],),  # text out is all a chat reply ever is
    "truncation": ("disabled",),  # Responses: a prompt too long is an error, as here
    "top_logprobs": (0,),  # Ollama: no alternatives
    "best_of": (1,),  # completions: one candidate per choice
    "function_call": ("none",),  # legacy chat: no function called
    "stream_options": ({"include_obfuscation": True}, {"include_obfuscation": False}),  # Responses: no padding is needed
    "suffix": ("",),  # Ollama's generate: no text after the insertion point
    "template": ("",),  # Ollama's generate: the model's own template
    "tfs_z": (1.0,),  # Ollama's options: tail-free sampling (llama.cpp dropped it), at "off"
}


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``false`` is not ``0``, ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def asks_nothing(name: str, value: Any) -> bool:
    """Whether ``value`` for the unimplemented parameter ``name`` asks for nothing."""
    if value is None or value is False or value == [] or value == {}:
        return True
    return any(_same(value, d) for d in DEFAULTS.get(name, ()))


def neutral_forms(name: str, refused: Any) -> str:
    """The values of ``name`` that are accepted, for the error that refuses ``refused``:
    null, the empty value of its type, and its defaults."""
    empty = {bool: "false", list: "[]", dict: "{}"}.get(type(refused))
    return ", ".join(["null", *([empty] if empty else []), *(json.dumps(d) for d in DEFAULTS.get(name, ()))])


def drop_neutral(data: Any, names: tuple[str, ...]) -> Any:
    """``data`` without the parameters of ``names`` whose value asks for nothing; 400
    (an ``unsupported_parameter`` error naming it) for any other value of one."""
    if not isinstance(data, dict) or not names:
        return data
    data = dict(data)
    for name in names:
        if name not in data:
            continue
        if not asks_nothing(name, data[name]):
            raise PydanticCustomError(
                "unsupported_parameter",
                "is not supported yet: {value} asks for what Strata does not implement "
                "(leave it out, or send a value that asks for nothing: {forms})",
                {"field": name, "value": json.dumps(data[name])[:80], "forms": neutral_forms(name, data[name])},
            )
        del data[name]
    return data
