"""Tool calling over HTTP on every tool-reading template of the pinned corpus, each served
as a model of its own (the default model's weights, the template as its chat_template):
the checks tests/test_tool_corpus_e2e.py makes and ``python -m bench.tool_formats`` scores, against
any OpenAI-compatible server.

(c) ``tool_choice: "required"`` answers with calls whose arguments validate against the
tool's schema, and the same request streamed gives the same calls and content;
(d) a conversation holding the server's own call (its id) and the tool's result renders
and is answered with no call markup in the content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import openai

from strata_core.testing.templates import TOOLS, template_source
from strata_core.text.chat import ChatTemplate
from strata_core.text.tool_formats import THINK

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = '{"temperature_c": 21, "sky": "sunny"}'
MAX_TOKENS = 160
#: Markup of the families that do not know their own (the template's are added).
COMMON_MARKUP = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<function=", "<|python_tag|>", *THINK)


def model_name(template: str) -> str:
    """The name a corpus template's model is served as."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", template.removesuffix(".jinja"))


def write_templates(into: Path, templates: list[str]) -> dict[str, Path]:
    """Each template's file, by template name: a model entry's ``chat_template``, with the
    default model's one GGUF carrying them all."""
    into.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in templates:
        path = into / f"{model_name(name)}.jinja"
        path.write_text(template_source(name), encoding="utf-8")
        out[name] = path
    return out


def server_config(model: Path, templates: dict[str, Path], n_ctx: int = 4096) -> str:
    """A ``strata serve`` config serving ``model`` under each template's name, with that
    template, one engine at a time."""
    lines = ["[server]", "max_loaded = 1", ""]
    for name, path in templates.items():
        lines += [f"[models.{model_name(name)}]", f'path = "{model}"', f'chat_template = "{path}"', "preload = false",
                  "parallel = 1", f"n_ctx = {n_ctx}", ""]  # fmt: skip
    return "\n".join(lines)


def markup(template: str) -> tuple[str, ...]:
    """Texts that are call or reasoning markup in this template's family."""
    setup = ChatTemplate(template_source(template)).tool_setup
    if setup is None:
        return COMMON_MARKUP
    fmt = setup.format
    return tuple(m for m in {*COMMON_MARKUP, *fmt.markers(), *fmt.think, fmt.open.strip(), fmt.close.strip()} if m)


@dataclass
class Outcome:
    required: bool = False
    streamed: bool = False
    history: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.required and self.streamed and self.history


def _schemas() -> dict[str, Any]:
    return {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _valid(name: str, arguments: str) -> str:
    """Why a call is not a valid call of one of TOOLS ("" when it is)."""
    schema = _schemas().get(name)
    if schema is None:
        return f"unknown function {name!r}"
    try:
        jsonschema.validate(json.loads(arguments), schema)
    except (ValueError, jsonschema.ValidationError) as e:
        return f"arguments {arguments!r}: {str(e).splitlines()[0]}"
    return ""


def _streamed(client: openai.OpenAI, model: str, **kw: Any) -> tuple[str, list[tuple[str, str]], str | None]:
    """(content, [(name, arguments)], finish_reason) of a streamed request."""
    content, finish = "", None
    calls: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or ():
            entry = calls.setdefault(d.index, ["", ""])
            if d.function is not None:
                entry[0] += d.function.name or ""
                entry[1] += d.function.arguments or ""
    return content, [(n, a) for _, (n, a) in sorted(calls.items())], finish


def check(client: openai.OpenAI, template: str, model: str | None = None) -> Outcome:
    """(c) and (d) for one template's model (``model``: the name the server knows it by)."""
    model = model or model_name(template)
    out = Outcome()
    kw: dict[str, Any] = {"messages": QUESTION, "tools": TOOLS, "tool_choice": "required",
                          "max_tokens": MAX_TOKENS, "temperature": 0}  # fmt: skip
    try:
        r = client.chat.completions.create(model=model, **kw)
    except openai.APIError as e:
        out.notes.append(f"required: {e}")
        return out
    msg = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or ()]
    problems = [p for p in (_valid(n, a) for n, a in calls) if p]
    out.required = bool(calls) and not problems and r.choices[0].finish_reason == "tool_calls"
    if not out.required:
        out.notes.append(f"required: finish {r.choices[0].finish_reason}, calls {calls}, content {msg.content!r}, {problems}")
    try:
        streamed = _streamed(client, model, **kw)
        out.streamed = streamed == (msg.content or "", calls, r.choices[0].finish_reason)
        if not out.streamed:
            out.notes.append(f"streamed {streamed} != {(msg.content or '', calls, r.choices[0].finish_reason)}")
    except openai.APIError as e:
        out.notes.append(f"streamed: {e}")
    if not msg.tool_calls:
        return out
    call = msg.tool_calls[0]
    history: list[Any] = [*QUESTION,
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
               {"role": "tool", "tool_call_id": call.id, "content": RESULT}]  # fmt: skip
    try:
        tools: Any = TOOLS
        h = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=48, temperature=0)
    except openai.APIError as e:
        out.notes.append(f"history: {e}")
        return out
    text = (h.choices[0].message.content or "") + (getattr(h.choices[0].message, "reasoning_content", None) or "")
    leaked = [m for m in markup(template) if m in text]
    out.history = not leaked
    if leaked:
        out.notes.append(f"history: markup {leaked} in {text!r}")
    return out
