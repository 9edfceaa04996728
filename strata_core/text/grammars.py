"""Grammar sources for constrained decoding with llguidance, shared by the server (which
checks a request's grammar and answers 400 before anything reaches the engine) and the
engine (which compiles the GEN value into its matcher, engine/grammar.py).
"""

from __future__ import annotations

from typing import Any

import llguidance

from strata_core import protocol as proto

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


def grammar_error(grammar: str) -> str:
    """Why llguidance refuses ``grammar`` without a tokenizer, or ``""`` when it accepts it."""
    return llguidance.LLMatcher.validate_grammar(grammar)
