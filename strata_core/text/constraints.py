"""Constraints beyond JSON: vLLM's ``structured_outputs`` and llama-server's ``grammar``,
turned into the engine's ``grammar`` value and checked before anything reaches the engine.

- ``structured_outputs.json``: a JSON schema, enforced and reconciled as
  ``response_format``'s json_schema is (structured.py);
- ``structured_outputs.json_object``: any JSON object;
- ``structured_outputs.regex``: the reply matches the regular expression (llguidance's
  syntax: Rust's regex crate, with no anchors or lookaround);
- ``structured_outputs.choice``: the reply is exactly one of the strings;
- ``structured_outputs.grammar`` and ``grammar``: a context-free grammar, in Lark (the
  dialect llguidance reads: ``start: ...``) or GBNF (llama.cpp's: ``root ::= ...``),
  converted to Lark here.

An invalid pattern or grammar, or one that admits no output, is a 400 naming the parameter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llguidance.gbnf_to_lark import gbnf_to_lark

from strata_core.contract import protocol as proto
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import BaseRequest, JsonSchemaFormat, ResponseFormat
from strata_core.text.grammars import grammar_error, llguidance_grammar
from strata_core.text.structured import Constraint, constraint_for

#: A GBNF rule's head (``root ::=``), which Lark never writes.
_GBNF_RULE = re.compile(r"(?m)^\s*[A-Za-z][A-Za-z0-9_-]*\s*::=")


@dataclass(frozen=True)
class RequestConstraint:
    """A request's constraint: the engine's grammar value, the parameter it came from (for
    errors), and the schema answers are reconciled with (JSON constraints only)."""

    gen_value: str
    param: str
    json: Constraint | None = None


def _refused(param: str, what: str, reason: str) -> ApiError:
    return ApiError(400, f"invalid {what} in '{param}': {reason}", param=param, code="invalid_value")


def lark_source(text: str) -> str:
    """A grammar's Lark text: GBNF converted, Lark as it is; ValueError if GBNF is malformed."""
    if not _GBNF_RULE.search(text):
        return text
    try:
        return gbnf_to_lark(text)
    except Exception as exc:  # GbnfToLarkError, and a bare Exception for an undefined rule
        raise ValueError(f"GBNF: {exc}") from None


def _checked(kind: str, text: str, param: str, what: str) -> str:
    """The ``grammar`` GEN value for (kind, text), once llguidance has compiled it and found
    it admits some output; 400 naming ``param`` otherwise."""
    try:
        problem = grammar_error(llguidance_grammar(kind, text))
    except ValueError as exc:
        problem = " ".join(str(exc).split())
    if problem:
        raise _refused(param, what, problem)
    return proto.encode_grammar(kind, text)


def choice_grammar(choices: list[str]) -> str:
    """A Lark grammar whose sentences are exactly ``choices`` (JSON string literals are
    Lark string literals)."""
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices) + "\n"


def request_constraint(req: BaseRequest, format_param: str = "response_format") -> RequestConstraint | None:
    """The constraint a request asks for (response_format, structured_outputs or grammar:
    the request model lets at most one through), or None."""
    if req.grammar is not None:
        return _grammar(req.grammar, "grammar")
    so = req.structured_outputs
    if so is None:
        json_constraint = constraint_for(req.response_format)
        if json_constraint is None:
            return None
        return RequestConstraint(json_constraint.gen_value(), format_param, json_constraint)
    if so.regex is not None:
        return RequestConstraint(_checked("regex", so.regex, "structured_outputs.regex", "regular expression"),
                                 "structured_outputs.regex")  # fmt: skip
    if so.choice is not None:
        value = _checked("lark", choice_grammar(so.choice), "structured_outputs.choice", "choice list")
        return RequestConstraint(value, "structured_outputs.choice")
    if so.grammar is not None:
        return _grammar(so.grammar, "structured_outputs.grammar")
    if so.json_ is not None:
        schema = JsonSchemaFormat.model_validate({"name": "structured_outputs", "schema": so.json_})
        fmt, param = ResponseFormat(type="json_schema", json_schema=schema), "structured_outputs.json"
    else:
        fmt, param = ResponseFormat(type="json_object"), "structured_outputs.json_object"
    json_constraint = _renamed(fmt, param)
    assert json_constraint is not None
    return RequestConstraint(json_constraint.gen_value(), param, json_constraint)


def _grammar(text: str, param: str) -> RequestConstraint:
    try:
        lark = lark_source(text)
    except ValueError as exc:
        raise _refused(param, "grammar", str(exc)) from None
    return RequestConstraint(_checked("lark", lark, param, "grammar"), param)


def _renamed(fmt: ResponseFormat, param: str) -> Constraint | None:
    """constraint_for, its 400 naming ``param`` instead of response_format."""
    try:
        return constraint_for(fmt)
    except ApiError as exc:
        message = exc.message.replace("'response_format'", f"'{param}'")
        raise ApiError(exc.status, message, param=param, code=exc.code) from None
