"""Grammar sources for constrained decoding with llguidance, shared by the server (which
checks a request's grammar and answers 400 before anything reaches the engine) and the
engine (which compiles the GEN value into its matcher, engine/grammar.py).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import llguidance
from llguidance._tokenizer import TokenizerWrapper

from strata_core.contract import protocol as proto

#: How constrained JSON is written: no free whitespace (a small model otherwise pads with
#: newlines until max_tokens), json.dumps' separators. structured.canonical_json writes
#: the same style, so a canonical answer looks like a constrained one.
JSON_STYLE: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_schema_grammar(schema: dict[str, Any] | str, *, lenient: bool = False) -> str:
    """The llguidance grammar for a JSON schema, in :data:`JSON_STYLE`.

    ``lenient``: ignore keywords llguidance does not implement instead of refusing them.
    """
    options: Any = {**JSON_STYLE, "lenient": lenient}  # llguidance's JsonCompileOptions
    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)


def llguidance_grammar(kind: str, text: str) -> str:
    """An llguidance grammar for a ``grammar`` value's (kind, text); ValueError if malformed."""
    if kind == proto.JSON_OBJECT:
        return json_schema_grammar({"type": "object"})
    if kind == "json_schema":
        return json_schema_grammar(text)
    if kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(text)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(text)
    return text  # "llguidance": already one


class _Bytes:
    """A vocabulary of the 256 bytes and an end token: enough to compile a grammar and
    compute its first mask without the model's tokenizer (which only the engine has)."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"\xff<eos>"]
    special_token_ids = [256]

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


@cache
def _byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(TokenizerWrapper(_Bytes()))


#: Longest reason from llguidance passed on to a client.
_REASON_CHARS = 300


def short_error(message: str) -> str:
    """llguidance's error on one line, without the parser state it may append, in words
    where it has none a client could read."""
    reason = " ".join(message.split("<state>")[0].split()) or "refused"
    if reason == "NoExtensionBias":
        return "it admits no output at all (for example a schema whose every value must contain itself)"
    return reason[:_REASON_CHARS]


def grammar_error(grammar: str) -> str:
    """Why ``grammar`` cannot be enforced, or ``""``: llguidance compiles it over a byte
    vocabulary and computes its first mask, which finds a grammar that admits nothing
    (a ``$ref`` that only refers to itself compiles, and then no token may start it)."""
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        return short_error(error)
    matcher = llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)
    if not matcher.is_error():
        matcher.compute_bitmask()
    return short_error(matcher.get_error()) if matcher.is_error() else ""
