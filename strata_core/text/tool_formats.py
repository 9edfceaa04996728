"""How each model family writes tool calls and reasoning: one :class:`ToolFormat` per family,
in :data:`FORMATS`, the registry.

A format says how one call is written (its parts, tool_syntax.py), the markers around a
turn's calls (``open`` / ``close``, ``sep`` between calls), how reasoning is delimited
(``think``), and markup the family writes that is neither content nor a call (``strip``:
gpt-oss's channel headers, for instance). From that one description come the parser of a
reply (tool_reader.py), the grammar that forces a call in the family's own syntax, and the
text of a call for templates that leave writing it to the caller.

The server's own generic format (:data:`GENERIC`, generic_tools.py) is one more format of
the registry, for templates that never read tools; probing never picks it.

Which family a template belongs to is found by its rendering, not its name:
tool_probe.py renders a probe call through the template and takes the first format here
that reads it back. Order matters only where one family's syntax contains another's (the
Llama 3 bare JSON object comes last).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from strata_core.text.generic_tools import (
    calls_text,
    generic_grammar,
    generic_instruction,
    generic_messages,
)
from strata_core.text.tool_notations import (
    gemma_decode,
    gemma_encode,
    gemma_grammar,
    gemma_partial,
    python_call_end,
    python_decode,
    python_encode,
    python_grammar,
    python_partial,
)
from strata_core.text.tool_syntax import (
    FAIL,
    PARTIAL,
    WS,
    Id,
    Json,
    Lit,
    Name,
    Opt,
    Params,
    Part,
    Raw,
    Read,
    Skip,
    Written,
    lit_rule,
    read_parts,
    rule_of,
    write_parts,
)

THINK = ("<think>", "</think>")

#: Most calls a forced turn may make with parallel_tool_calls: as many as tools are offered,
#: within these bounds (a small model otherwise repeats a call until max_tokens).
MIN_CALLS, MAX_CALLS = 2, 8


def most_calls(tools: int) -> int:
    return min(max(tools, MIN_CALLS), MAX_CALLS)


#: A short value of each JSON type: what a call's parameters are estimated to cost.
_EXAMPLES: dict[str, Any] = {"string": "Paris", "integer": 2, "number": 2.5, "boolean": True, "array": [], "object": {}}


def example_call(tool: Mapping[str, Any]) -> Written:
    """A call of ``tool`` with every parameter given a short value of its type: what one
    call costs, to bound how many a forced turn may make in the tokens it has."""
    fn = tool["function"]
    props = (fn.get("parameters") or {}).get("properties") or {}
    kind = {k: p.get("type") if isinstance(p.get("type"), str) else "string" for k, p in props.items()}
    return Written(fn["name"], {k: _EXAMPLES.get(t, "") for k, t in kind.items()}, "a1B2c3D4e")


@dataclass(frozen=True)
class ToolFormat:
    name: str
    call: tuple[Part, ...]
    open: str = ""  # before a turn's calls
    close: str = ""  # after them
    sep: str = ""  # between two calls
    starts: tuple[str, ...] = ()  # more markers a call may begin with
    strip: tuple[str, ...] = ()  # markup that is neither content nor a call
    think: tuple[str, str] = THINK
    flexible: bool = False  # the family's JSON is indented
    hints: tuple[str, ...] = ()  # text of templates that never write calls themselves
    bare: bool = False  # the generation prompt wrote the call's marker: a reply may open with a call
    lead: str = ""  # what a reply opens with when plain content follows (markup, never shown)
    #: the family's templates write its markup exactly as here: a forced turn does too,
    #: whitespace only where the markup has it, and JSON arguments hold only the tool's
    #: parameters (a small model pads every place it may)
    exact: bool = False
    single: bool = False  # its templates write one call a turn: a forced turn makes one
    header: str = ""  # a message header a marker begins (a regex): markup, also where no call follows
    #: a family whose calls are JSON call objects (``Json("calls")``) writes them in one
    #: bracketed list (True), as objects one after another (False), or either (None); read either way
    listed: bool | None = None
    #: its grammar constrains every reply, an answer in text too (the generic format's;
    #: a family's answers are free, its calls forced only when tool_choice asks)
    answers: bool = False

    # ---- reading ----

    def markers(self) -> tuple[str, ...]:
        """Texts where the calls of a reply may begin."""
        first = self.open or (self.call[0].text if isinstance(self.call[0], Lit) else "")
        return tuple(m for m in (first.strip(), *self.starts) if m)

    def read_call(
        self, text: str, at: int, final: bool, props: Mapping[str, Any], seen: list[Read] | None = None
    ) -> Read | str:
        """One call at ``text[at]`` (``seen`` receives it, also while it is still being read).
        A call whose markup breaks off after some of its XML-style parameters were complete
        is those parameters (they may have streamed), ending where they did; at the reply's
        end the rest of the reply is that call's broken markup."""
        r = Read(props=props)
        got = read_parts(self.call, text, at, r, final)
        if got == FAIL and r.partial is not None:
            r.calls, got = [*r.early, r.partial], len(text) if final else r.upto
        if got != FAIL and seen is not None:
            seen.append(r)
        if isinstance(got, str):
            return got
        r.end = got
        return r

    def read_turn(
        self, text: str, at: int, final: bool, props: Mapping[str, Any] | None = None, seen: list[Read] | None = None
    ) -> list[Read] | str:
        """Every call of the calls block at ``text[at]`` (its end: the last Read's ``end``).
        ``seen`` receives the calls as they are read, the one still being read last."""
        props = props or {}
        if self.open:
            got = Lit(self.open).read(text, at, Read(), final)
            if isinstance(got, str):
                return got
            at = got
        reads: list[Read] = []
        while True:
            if reads and self.sep.strip():
                got = Lit(self.sep).read(text, at, Read(), final)
                if got == PARTIAL:
                    return PARTIAL
                if got == FAIL:
                    break
                assert isinstance(got, int)
                at = got
            r = self.read_call(text, at, final, props, seen)
            if r == PARTIAL:
                return PARTIAL
            if r == FAIL:
                break
            assert isinstance(r, Read)
            reads.append(r)
            at = r.end
        if not reads:
            return FAIL
        if self.close:
            got = Lit(self.close).read(text, at, Read(), final)
            if got == PARTIAL:
                return PARTIAL
            if isinstance(got, int):
                reads[-1].end = got
        return reads

    def content_only(self) -> ToolFormat:
        """This format with no calls: a reply's markup that is not calls still goes."""
        return replace(self, call=(Lit(""),), open="", close="", starts=(), bare=False)

    # ---- writing ----

    def write(self, calls: Sequence[Written], tools: Mapping[str, Any] | None = None) -> str:
        at = self._list_at()
        if at is not None and self.listed and calls:
            items = self.call[at]
            assert isinstance(items, Json)
            head, tail = write_parts(self.call[:at], calls[0], tools or {}), write_parts(self.call[at + 1 :], calls[0], tools or {})
            return self.open + head + items.write_list(calls) + tail + self.close
        body = self.sep.join(write_parts(self.call, c, tools or {}) for c in calls)
        return self.open + body + self.close

    def _list_at(self) -> int | None:
        return next((i for i, p in enumerate(self.call) if isinstance(p, Json) and p.what == "calls"), None)

    def fitted(self, text: str) -> ToolFormat:
        """This format as a template that renders a call as ``text`` writes it: the optional
        markup it never writes left out of a forced call (still read), a list of calls
        where it writes one."""
        call = tuple(replace(p, forced=_shown(p, text)) if isinstance(p, Opt) else p for p in self.call)
        listed = bool(re.search(r"\[\s*\{", text)) if self._list_at() is not None else None
        return replace(self, call=call, listed=listed)

    def grammar(
        self, tools: Sequence[Mapping[str, Any]], parallel: bool = True, close_think: bool = False,
        most: int = MAX_CALLS, answer: bool = False,
    ) -> str:  # fmt: skip
        """A Lark grammar (llguidance's) whose sentences are a turn of calls to ``tools``
        (one call unless ``parallel``; at most ``most``: as many as fit the tokens left),
        written as this family writes them; ``close_think``: the prompt left a reasoning
        block open, which the turn closes first (else the calls would be written inside the
        reasoning); ``answer``: an answer in text may stand instead (only where ``answers``)."""
        listed = self._list_at()
        exact, ws = self.exact, "" if self.exact else WS
        call, before, after = self.call, "", ""
        sep = lit_rule(self.sep, exact) if self.sep.strip() or (exact and self.sep) else ""
        if listed is not None:  # the calls are items of one JSON list
            call, before = self.call[listed : listed + 1], rule_of(self.call[:listed], "", None)
            after = rule_of(self.call[listed + 1 :], "", None)
            either = {True: f'"[" items {WS} "]"', False: "bare", None: f'("[" items {WS} "]" | bare)'}[self.listed]
            before, after, sep = f"{before} {WS} {either} {after}", "", f'{WS} ","'
        alts = []
        for i, tool in enumerate(tools):
            fn = tool["function"]
            alts.append(f"call{i}: {rule_of(call, fn['name'], fn.get('parameters'), self.flexible, exact)}")
        calls = " | ".join(f"call{i}" for i in range(len(tools)))
        more = min(most_calls(len(tools)), most) - 1
        parallel = parallel and not self.single and more > 0
        body = f"call ({sep} {ws} call){{0,{more}}}" if parallel else "call"
        head = lit_rule(self.open, exact) if self.open.strip() else ""
        if close_think:
            head = f"{lit_rule(self.think[1])} {WS} {head}"
        if exact:  # what the prompt ends with decides the whitespace before the turn
            head = f"{WS} {head}"
        tail = lit_rule(self.close, exact) if self.close.strip() else ""
        if listed is not None:  # a list of the calls, or (MiniMax M1) the objects one after another
            bare = f"call (call){{0,{more}}}" if parallel else "call"
            lines = [f"start: {head} {before} {tail}", f"items: {body}", f"bare: {bare}"]
        else:
            lines = [f"start: {head} {body} {tail}"]
        lines += [f"call: {calls}", *alts]
        return "\n".join(" ".join(line.split(" ")) for line in lines) + "\n"


_QWEN_PARAMS = Params(
    "</function>", "<parameter={key}>\n{value}\n</parameter>\n",
    r"<parameter=(?P<key>[^>]+)>(?P<value>.*?)</parameter>", trim=True,
)  # fmt: skip
_GLM_PARAMS = Params(
    "</tool_call>", "<arg_key>{key}</arg_key><arg_value>{value}</arg_value>",
    r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>",
)  # fmt: skip
_MM3 = "]<]minimax[>["
_DSML = "｜DSML｜"


def _dsml(section: str) -> ToolFormat:
    return ToolFormat(
        f"deepseek-dsml-{section}",
        (
            Lit(f'<{_DSML}invoke name="'), Name(('">',)), Lit('">\n'),
            Params(f"</{_DSML}invoke>", f'<{_DSML}parameter name="{{key}}" string="{{string}}">{{value}}</{_DSML}parameter>\n',
                   f'<{_DSML}parameter name="(?P<key>[^"]+)" string="(?P<string>true|false)">(?P<value>.*?)</{_DSML}parameter>'),
            Lit(f"</{_DSML}invoke>\n"),
        ),
        open=f"<{_DSML}{section}>\n", close=f"</{_DSML}{section}>", exact=True,
    )  # fmt: skip


FORMATS: tuple[ToolFormat, ...] = (
    # Qwen3-Coder, Qwen3.5, Nemotron 3, StepFun: XML parameters inside <tool_call>
    ToolFormat("qwen3-coder", (
        Lit("<tool_call>\n"), Lit("<function="), Name((">",)), Lit(">\n"), _QWEN_PARAMS,
        Lit("</function>\n"), Lit("</tool_call>"),
    ), sep="\n"),  # fmt: skip
    ToolFormat("seed-oss", (
        Lit("<seed:tool_call>\n"), Lit("<function="), Name((">",)), Lit(">\n"),
        Params("</function>", "<parameter={key}>{value}</parameter>\n",
               r"<parameter=(?P<key>[^>]+)>(?P<value>.*?)</parameter>"),
        Lit("</function>\n"), Lit("</seed:tool_call>"),
    ), sep="\n", think=("<seed:think>", "</seed:think>")),  # fmt: skip
    # GLM-4.6 / 4.7, Laguna, Ling, Spark: <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>
    # (a reasoning tag amid the content is markup a small model copied from the prompt)
    ToolFormat("glm", (Lit("<tool_call>"), Name(("<arg_key>", "</tool_call>")), _GLM_PARAMS, Lit("</tool_call>")), sep="\n",
               strip=THINK),
    ToolFormat("hunyuan", (
        Lit("<tool_call:opensource>"), Name(("<tool_sep:opensource>",)), Lit("<tool_sep:opensource>\n"),
        Params("</tool_call:opensource>",
               "<arg_key:opensource>{key}</arg_key:opensource>\n<arg_value:opensource>{value}</arg_value:opensource>\n",
               r"<arg_key:opensource>(?P<key>.*?)</arg_key:opensource>\s*<arg_value:opensource>(?P<value>.*?)</arg_value:opensource>"),
        Lit("</tool_call:opensource>"),
    ), open="<tool_calls:opensource>\n", close="\n</tool_calls:opensource>", sep="\n",
        think=("<think:opensource>", "</think:opensource>"), exact=True),  # fmt: skip
    ToolFormat("minimax-m2", (
        Lit('<invoke name="'), Name(('">',)), Lit('">\n'),
        Params("</invoke>", '<parameter name="{key}">{value}</parameter>\n',
               r'<parameter name="(?P<key>[^"]+)">(?P<value>.*?)</parameter>'),
        Lit("</invoke>\n"),
    ), open="<minimax:tool_call>\n", close="</minimax:tool_call>"),  # fmt: skip
    ToolFormat("minimax-m3", (
        Lit(_MM3 + '<invoke name="'), Name(('">',)), Lit('">'),
        Params(_MM3 + "</invoke>", _MM3 + "<{key}>{value}" + _MM3 + "</{key}>",
               r"\]<\]minimax\[>\[<(?P<key>[^>/]+)>(?P<value>.*?)\]<\]minimax\[>\[</(?P=key)>"),
        Lit(_MM3 + "</invoke>\n"),
    ), open=_MM3 + "<tool_call>\n", close=_MM3 + "</tool_call>", think=("<mm:think>", "</mm:think>"), exact=True),  # fmt: skip
    _dsml("function_calls"),
    _dsml("tool_calls"),
    ToolFormat("atem", (
        Lit(" to="), Name(("<|message|>",), no_space=True), Lit("<|message|>"), Lit("<atem:function_calls>\n"),
        Lit('<atem:invoke name="'), Name(('">',)), Lit('">\n'),
        Params("</atem:invoke>", '<atem:parameter name="{key}">{value}</atem:parameter>\n',
               r'<atem:parameter name="(?P<key>[^"]+)">(?P<value>.*?)</atem:parameter>'),
        Lit("</atem:invoke>\n"), Lit("</atem:function_calls>"),
    ), strip=("<|eom|>", "<|start|>assistant"), exact=True, single=True,
        header=r"to=[^\s<>]{1,256}<\|message\|>"),  # fmt: skip
    ToolFormat("minicpm", (
        Lit('<function name="'), Name(('">',)), Lit('">'),
        Params("</function>", '<param name="{key}">{value}</param>', r'<param name="(?P<key>[^"]+)">(?P<value>.*?)</param>'),
        Lit("</function>"),
    ), sep="\n"),  # fmt: skip
    ToolFormat("kimi-k2", (
        Lit("<|tool_call_begin|>"),
        Name(("<|tool_call_argument_begin|>",), "functions.{name}:{index}", r"(?:functions\.)?(.+?)(?::(?P<index>\d+))?"),
        Lit("<|tool_call_argument_begin|>"), Json(), Lit("<|tool_call_end|>"),
    ), open="<|tool_calls_section_begin|>", close="<|tool_calls_section_end|>"),  # fmt: skip
    ToolFormat("kimi-k3", (
        Lit('<|open|>call tool="'), Name(('"',)), Lit('" index="'), Skip(('"<|sep|>',), "1", "[0-9]{1,2}"), Lit('"<|sep|>'),
        Params("<|close|>call<|sep|>", '<|open|>argument key="{key}" type="{string}"<|sep|>{value}<|close|>argument<|sep|>',
               r'<\|open\|>argument key="(?P<key>[^"]+)" type="(?P<string>[a-z]*)"<\|sep\|>(?P<value>.*?)<\|close\|>argument<\|sep\|>',
               words=("string", "number")),
        Lit("<|close|>call<|sep|>"),
    ), open="<|open|>tools<|sep|>", close="<|close|>tools<|sep|>",
        strip=("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>", "<|end_of_msg|>"),
        think=("<|open|>think<|sep|>", "<|close|>think<|sep|>"), exact=True),  # fmt: skip
    # Mistral Small 3.2, Devstral, Ministral: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
    ToolFormat("mistral", (
        Lit("[TOOL_CALLS]"), Name(("[CALL_ID]", "[ARGS]")),
        Opt((Lit("[CALL_ID]"), Id(("[ARGS]",), "[A-Za-z0-9]{9}"))), Lit("[ARGS]"), Json(),
    ), think=("[THINK]", "[/THINK]")),  # fmt: skip
    ToolFormat("apertus", (Lit("<|tools_prefix|>"), Json("calls", keyed=True), Lit("<|tools_suffix|>"))),
    ToolFormat("cohere", (Json("calls", ("tool_name", "parameters"), lead={"tool_call_id": "{index}"}),),
               open="<|START_ACTION|>", close="<|END_ACTION|>", think=("<|START_THINKING|>", "<|END_THINKING|>")),
    ToolFormat("command-r", (
        Lit("Action:"), Lit("\n```json\n"), Json("calls", ("tool_name", "parameters"), indent=4), Lit("```"),
    ), flexible=True, strip=("<|CHATBOT_TOKEN|>",)),  # fmt: skip
    ToolFormat("gpt-oss", (
        Lit(" to=functions."), Name(("<|channel|>", " ", "<|constrain|>", "<|message|>")),
        Skip(("<|message|>",), "<|channel|>commentary json"), Lit("<|message|>"), Json(), Opt((Lit("<|call|>"),)),
    ), strip=("<|start|>assistant", "<|channel|>final<|message|>", "<|channel|>commentary", "<|message|>",
              "<|return|>", "<|end|>", "<|call|>"), think=("<|channel|>analysis<|message|>", "<|end|>")),  # fmt: skip
    ToolFormat("deepseek-r1", (
        Lit("<｜tool▁call▁begin｜>"), Skip(("<｜tool▁sep｜>",), "function"), Lit("<｜tool▁sep｜>"),
        Name(("\n", "```")), Lit("\n```json\n"), Json(), Lit("\n```"), Lit("<｜tool▁call▁end｜>"),
    ), open="<｜tool▁calls▁begin｜>", close="<｜tool▁calls▁end｜>", sep="\n", exact=True),  # fmt: skip
    ToolFormat("solar", (
        Lit("<|tool_call:begin|>"), Id(("<|tool_call:name|>",)), Lit("<|tool_call:name|>"),
        Name(("<|tool_call:args|>",)), Lit("<|tool_call:args|>"), Json(), Lit("<|tool_call:end|>"),
    ), open="<|tool_calls|>", close="<|calls|>"),  # fmt: skip
    ToolFormat("lfm2", (Raw("", python_decode, python_encode, python_grammar, python_call_end, python_partial),),
               open="<|tool_call_start|>[", close="]<|tool_call_end|>", sep=", ",
               hints=("<|tool_list_start|>", "List of tools: [")),  # fmt: skip
    ToolFormat("gemma4", (
        Lit("<|tool_call>call:"), Name(("{",)), Raw("<tool_call|>", gemma_decode, gemma_encode, gemma_grammar, partial=gemma_partial),
        Lit("<tool_call|>"),
    ), think=("<|channel>thought", "<channel|>")),  # fmt: skip
    ToolFormat("functionary-v3.1", (Lit("<function="), Name((">",)), Lit(">"), Json(), Lit("</function>"))),
    ToolFormat("functionary-v3.2", (Opt((Lit(">>>"),)), Name(("\n",)), Lit("\n"), Json()), starts=(">>>",),
               strip=(">>>all\n",), sep="\n", bare=True, lead="all\n"),  # `>>>all` is the content channel
    ToolFormat("hermes", (Lit("<tool_call>\n"), Json("call"), Lit("\n</tool_call>")), sep="\n"),
    ToolFormat("json-tags", (Json("calls"),), open="<tool_calls>", close="</tool_calls>"),
    ToolFormat("nemotron-v2", (Json("calls"),), open="<TOOLCALL>", close="</TOOLCALL>"),
    ToolFormat("mistral-nemo", (Json("calls", trail={"id": "{id}"}),), open="[TOOL_CALLS]"),
    ToolFormat("gigachat", (Json("call"),), open="<|function_call|>", strip=("<|function_call|>", "<|message_sep|>"), exact=True,
               single=True),
    ToolFormat("gigachat3", (Json("call"),), open="function call<|role_sep|>\n", strip=("<|message_sep|>",), exact=True,
               single=True),
    ToolFormat("granite", (Json("calls"),), open="<|tool_call|>", hints=("<|tool_call|>",)),
    ToolFormat(
        "llama3", (Opt((Lit("<|python_tag|>"),)), Json("call", ("name", "parameters"))), starts=("<|python_tag|>", '{"name"'), sep="; ",
        bare=True,  # the whole reply is the call, its JSON written any way
    ),
)



@dataclass(frozen=True)
class GenericFormat(ToolFormat):
    """The server's own format, for templates that never read tools (generic_tools.py): its
    prompt (the tools shown in the system message, tool turns as text), its grammar (every
    reply constrained, an answer too), its text of calls; its reader is generic_tools'."""

    def prompt(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, mode: str,
        parallel: bool, named: str | None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """``messages`` as the template renders them (it is given no tools): the tools and
        the reply's forms for ``mode`` in the system message, none without ``tools``."""
        return generic_messages(messages, None if tools is None else generic_instruction(tools, mode, parallel, named))

    def grammar(
        self, tools: Sequence[Mapping[str, Any]], parallel: bool = True, close_think: bool = False,
        most: int = MAX_CALLS, answer: bool = False,
    ) -> str:  # fmt: skip
        return generic_grammar(tools, parallel, text=answer)

    def write(self, calls: Sequence[Written], tools: Mapping[str, Any] | None = None) -> str:
        return calls_text([(c.name, c.arguments) for c in calls])


#: not a family probing finds (FORMATS): the one a template that reads no tools is served in
GENERIC = GenericFormat("generic", (Lit(""),), answers=True)

BY_NAME = {f.name: f for f in (*FORMATS, GENERIC)}


def _shown(opt: Opt, text: str) -> bool:
    """Whether a template's rendering ``text`` writes the optional markup ``opt`` opens with."""
    first = opt.parts[0]
    return not isinstance(first, Lit) or first.text.strip() in text


def props_of(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """Each tool's parameter schemas by name: how XML-style values are typed."""
    out: dict[str, Any] = {}
    for t in tools or ():
        fn = t.get("function") or {}
        out[fn.get("name", "")] = (fn.get("parameters") or {}).get("properties") or {}
    return out


def as_json(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False)
