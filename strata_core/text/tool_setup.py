"""What a chat template wants for tools, found by rendering probes through it: the family
format its model writes calls in (tool_formats.py), and the history shape it accepts
(arguments as objects or as JSON text, call ids of any form or 9 alphanumerics, every
parameter described, calls written by the template or left to the caller).

A template that writes calls in no registered format gets one derived from its own
rendering of a probe call: the markers around the name and the arguments.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from strata_core.text.tool_derive import CALL_ID, FLAT_TOOLS, PROBE_TOOLS, TWO, derive
from strata_core.text.tool_formats import FORMATS, GENERIC, GenericFormat, ToolFormat
from strata_core.text.tool_reader import FormatParser
from strata_core.text.tool_syntax import Written
from strata_core.text.tools import new_call_id

if TYPE_CHECKING:
    from strata_core.text.chat import ChatTemplate

PROBE_NAME = "get_weather"
PROBE_ARGS = {"city": "Paris", "days": 2}
PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "the city"},
                "days": {"type": "integer", "description": "how many days"},
            },
            "required": ["city"],
        },
    },
}
_BASE = [{"role": "user", "content": "What is the weather in Paris?"}]
_SHORT_ID = "a1B2c3D4e"
_ALNUM = string.ascii_letters + string.digits


def short_call_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def short_id_of(call_id: str) -> str:
    """A 9-alphanumeric id standing for ``call_id`` (the same one each time)."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])


@dataclass(frozen=True)
class ToolSetup:
    format: ToolFormat
    args_text: bool = False  # the template joins arguments as text
    short_ids: bool = False  # call ids must be 9 alphanumerics (Mistral)
    described: bool = False  # every parameter must carry a description (Command R+)
    calls_in_content: bool = False  # the template writes no calls: they go into content
    derived: bool = False  # the format was derived from the template's rendering

    @property
    def new_id(self) -> Callable[[], str]:
        return short_call_id if self.short_ids else new_call_id

    def tools(self, tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
        if tools is None:
            return None
        return [_described(t) if self.described else dict(t) for t in tools]

    def prompt(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, mode: str = "auto",
        parallel: bool = True, named: str | None = None,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:  # fmt: skip
        """A request's messages and tools (template views, None: no tools) as the template is
        given them: in the shape it reads, or (the generic format) the tools shown in the
        system message as ``mode``, ``parallel`` and ``named`` allow calls, and none given."""
        if isinstance(self.format, GenericFormat):
            return self.format.prompt(messages, tools, mode, parallel, named), None
        return self.messages(messages), self.tools(tools)

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Template views of ``messages`` in the shape this template reads."""
        return [self._message(m) for m in messages]

    def _message(self, m: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(m)
        if self.short_ids and out.get("tool_call_id"):
            out["tool_call_id"] = short_id_of(out["tool_call_id"])
        calls = out.get("tool_calls")
        if not calls:
            return out
        calls = [{**c, "id": short_id_of(c.get("id") or "") if self.short_ids else c.get("id")} for c in calls]
        if self.calls_in_content:
            written = [Written(c["function"]["name"], c["function"]["arguments"], c["id"] or "", i) for i, c in enumerate(calls)]
            out["content"] = (out.get("content") or "") + self.format.write(written)
            del out["tool_calls"]
            return out
        if self.args_text:
            calls = [{**c, "function": {**c["function"], "arguments": _text(c["function"]["arguments"])}} for c in calls]
        out["tool_calls"] = calls
        return out


#: the server's own format for a template that never reads tools (generic_tools.py)
GENERIC_SETUP = ToolSetup(GENERIC)


def _text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _described(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = dict(tool.get("function") or {})
    params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
    params["properties"] = {k: {"description": "", **v} for k, v in (params.get("properties") or {}).items()}
    fn.setdefault("description", "")
    return {**tool, "function": {**fn, "parameters": params}}


# ---- probing --------------------------------------------------------------------------------


def _call(call_id: str, args_text: bool) -> dict[str, Any]:
    args: Any = json.dumps(PROBE_ARGS) if args_text else dict(PROBE_ARGS)
    return {"id": call_id, "type": "function", "function": {"name": PROBE_NAME, "arguments": args}}


def _renders(template: ChatTemplate, messages: list[dict[str, Any]], tools: list[Any], gen: bool) -> str | None:
    from strata_core.text.chat import TemplateError

    try:
        return template.render(messages, add_generation_prompt=gen, tools=tools)
    except TemplateError:
        return None


def turn_text(template: ChatTemplate, turn: list[dict[str, Any]], tools: list[Any] | None = None) -> str | None:
    """What ``turn`` (messages after the probe's user message) adds to the prompt after the
    generation prompt: the reply as the model would have written it."""
    tools = tools or [PROBE_TOOL]
    before = _renders(template, _BASE, tools, True)
    after = _renders(template, _BASE + turn, tools, False)
    if before is None or after is None:
        return None
    n = 0
    while n < min(len(before), len(after)) and before[n] == after[n]:
        n += 1
    if n < len(before):  # the two part inside a marker (<think> / </think>): from its start
        while n > 0 and after[n - 1] not in ">]}\n\t ":
            n -= 1
    return after[n:]


def _reads(fmt: ToolFormat, text: str, calls: list[tuple[str, Any]]) -> bool:
    """Whether ``fmt`` reads ``text`` as exactly ``calls``, with nothing but reasoning
    markup before them."""
    p = FormatParser(fmt, [PROBE_TOOL])
    p.push(text)
    p.flush()
    if [(c.name, json.loads(c.arguments)) for c in p.calls] != calls or not p.spans:
        return False
    before = text[: p.spans[0][0]]
    for tag in (*fmt.think, "<think>", "</think>", *fmt.strip):
        before = before.replace(tag, "")
    return not before.strip()


def find_format(text: str, calls: list[tuple[str, Any]]) -> ToolFormat | None:
    return next((f for f in FORMATS if _reads(f, text, calls)), None)


def _raises(template: ChatTemplate, messages: list[dict[str, Any]], tools: list[Any]) -> bool:
    return _renders(template, _BASE + messages, tools, False) is None


def probe(template: ChatTemplate) -> ToolSetup | None:
    """How ``template`` wants tools; None when it never reads them or writes calls in a way
    nothing can be derived from (then only the server's generic format can serve)."""
    got = setup_or_why(template)
    return got if isinstance(got, ToolSetup) else None


def setup_or_why(template: ChatTemplate) -> ToolSetup | str | None:
    """How ``template`` wants tools; None when it never reads them; why, in words, when it
    renders calls in a shape no format can be derived from."""
    if not re.search(r"\btools\b", template.source):
        return None
    try:
        return _probe(template)
    except Exception as exc:  # a template's oddity is a reason to serve the generic format, never a failure
        return f"probing it failed: {type(exc).__name__}: {exc}"


def _probe(template: ChatTemplate) -> ToolSetup | str:
    bare = {**PROBE_TOOL, "function": {**PROBE_TOOL["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}  # fmt: skip
    described = _renders(template, _BASE, [bare], True) is None and _renders(template, _BASE, [PROBE_TOOL], True) is not None
    args_text = _raises(template, [_turn(_SHORT_ID, False)], [PROBE_TOOL]) and not _raises(
        template, [_turn(_SHORT_ID, True)], [PROBE_TOOL]
    )
    short = _raises(template, [_turn(new_call_id(), args_text)], [PROBE_TOOL]) and not _raises(
        template, [_turn(_SHORT_ID, args_text)], [PROBE_TOOL]
    )
    text = turn_text(template, [_turn(_SHORT_ID, args_text)]) or ""
    setup = ToolSetup(FORMATS[-1], args_text, short, described)
    if PROBE_NAME not in text:  # the template writes no calls: the caller does
        fmt = next((f for f in FORMATS if f.hints and any(h in template.source for h in f.hints)), None)
        return replace(setup, format=fmt or _HERMES, calls_in_content=True)
    fmt = find_format(text, [(PROBE_NAME, PROBE_ARGS)])
    if fmt is not None:  # fitted to what the template writes for one call and for two (where it takes two)
        two = turn_text(template, setup.messages([_two_calls()]), setup.tools(PROBE_TOOLS)) or ""
        return replace(setup, format=fmt.fitted(text + two))
    derived = derive_format(template, setup)
    if isinstance(derived, str):
        return derived
    return replace(setup, format=derived, derived=True)


def derive_format(template: ChatTemplate, setup: ToolSetup) -> ToolFormat | str:
    """The format the template's own rendering of probe calls shows (tool_derive.py), or
    why there is none."""

    # a template that refuses the probe's object parameter (Command R+ wants every object
    # schema to say additionalProperties) is probed without it
    tools = PROBE_TOOLS if _renders(template, _BASE, setup.tools(PROBE_TOOLS) or [], True) is not None else FLAT_TOOLS

    def render(calls: list[tuple[str, Any]]) -> str | None:
        made = [{"id": CALL_ID, "type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
        turn = {"role": "assistant", "content": "", "tool_calls": made}
        return turn_text(template, setup.messages([turn]), setup.tools(tools))

    plain = turn_text(template, [{"role": "assistant", "content": "Hello."}], setup.tools(tools)) or ""
    end = plain[plain.find("Hello.") + len("Hello.") :] if "Hello." in plain else ""
    return derive(render, end)


def _two_calls() -> dict[str, Any]:
    calls = [{"id": CALL_ID, "type": "function", "function": {"name": n, "arguments": a}} for n, a in TWO]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def _turn(call_id: str, args_text: bool) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [_call(call_id, args_text)]}


_HERMES = next(f for f in FORMATS if f.name == "hermes")


def report(template: ChatTemplate) -> list[str]:
    """What Strata makes of ``template`` for tools, in lines for a person: the format its
    calls are read and forced in (and how it was found), the history shape it reads, and a
    call as a forced reply writes it (``strata doctor --template``)."""
    got = setup_or_why(template)
    example = [Written(PROBE_NAME, dict(PROBE_ARGS), _SHORT_ID)]
    if got is None or isinstance(got, str):
        why = "it never reads `tools`" if got is None else got
        return [f"format: generic ({why}): the server shows the tools in the system message",
                f"example call: {GENERIC.write(example)}"]  # fmt: skip
    fmt = got.format
    found = "derived from the template's rendering of probe calls" if got.derived else "in the registry"
    lines = [f"format: {fmt.name} ({found}{', written byte for byte as the template writes it' if fmt.exact else ''})"]
    shape = [what for what, on in (("arguments as JSON text", got.args_text), ("9-alphanumeric call ids", got.short_ids),
             ("every parameter described", got.described), ("calls written into the content", got.calls_in_content)) if on]  # fmt: skip
    if shape:
        lines.append(f"history: {', '.join(shape)}")
    lines.append(f"example call: {fmt.write(example, {})!r}")
    if not got.calls_in_content:
        rendered = turn_text(template, got.messages([_turn(_SHORT_ID, got.args_text)]), got.tools([PROBE_TOOL]))
        lines.append(f"the template renders it: {rendered!r}")
    return lines
