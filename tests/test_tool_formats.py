"""Every template of the pinned corpus that reads ``tools``, by file name: (a) its own
rendering of an assistant turn with two calls reads back as those calls in the family's
format, whole and at every chunk boundary; (b) the grammar forcing a call (required, and
named) accepts that rendering. Pure and fast; the HTTP halves, (c) and (d), are in
tests/test_tool_corpus_e2e.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from test_tools import accepts

from strata_core.testing.templates import (
    CALLS,
    TIME,
    TOOLS,
    WEATHER,
    assistant_turn,
    template_source,
    tool_templates,
)
from strata_core.text.chat import ChatTemplate
from strata_core.text.grammars import grammar_error, llguidance_grammar
from strata_core.text.tool_formats import ToolFormat
from strata_core.text.tool_reader import FormatParser, reply_parser
from strata_core.text.tool_setup import ToolSetup, probe, turn_text
from strata_core.text.tool_syntax import Written

TEMPLATES = tool_templates()

#: Templates that write one call a turn: they refuse a second (Llama 3.x) or drop it
#: (GigaChat, gpt-oss end the turn after a call). Checked with one call.
ONE_CALL_A_TURN = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "raises 'only supports single tool-calls at once'",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "raises 'only supports single tool-calls at once'",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "raises 'only supports single tool-calls at once'",
    "GigaChat3-10B-A1.8B.jinja": "renders the first call only",
    "GigaChat3.1-10B-A1.8B.jinja": "renders the first call only",
    "openai-gpt-oss-120b.jinja": "renders the first call only (a call ends the message)",
}
#: Templates that write each call as an assistant message of its own: the model writes one
#: a turn. Checked with one call.
MESSAGE_PER_CALL = {"muse-glimmer.jinja"}


def setup_of(name: str) -> tuple[ChatTemplate, ToolSetup]:
    template = ChatTemplate(template_source(name), bos_token="<s>", eos_token="</s>")
    setup = probe(template)
    assert setup is not None, f"{name}: no format found for its rendering of a call"
    return template, setup


def rendered(name: str) -> tuple[ToolSetup, str, list[tuple[str, dict[str, Any]]]]:
    """The template's setup, the text it renders for an assistant turn making the calls
    (after the generation prompt), and the calls it rendered."""
    template, setup = setup_of(name)
    calls = CALLS
    if name in ONE_CALL_A_TURN or name in MESSAGE_PER_CALL:
        calls = CALLS[:1]
    ids = [setup.new_id() for _ in calls]
    text = turn_text(template, setup.messages([assistant_turn(calls, ids)]), setup.tools(TOOLS))
    assert text is not None, f"{name}: the template refuses the turn"
    for call_name, _ in calls:
        assert call_name in text, f"{name}: the template did not render {call_name}"
    # the reply ends with its calls; some templates go on with the next turn's header or,
    # as Command R+ does, with instructions of their own
    p = FormatParser(setup.format, TOOLS)
    p.push(text)
    p.flush()
    assert p.spans, f"{name} ({setup.format.name}): no calls read in {text!r}"
    return setup, text[: p.spans[-1][1]], calls


def pushed(fmt: ToolFormat, text: str, cuts: list[int]) -> tuple[Any, list[Any]]:
    """A reply parser fed ``text`` in pieces cut at ``cuts``, and the events it made."""
    p = reply_parser(fmt, TOOLS)
    events: list[Any] = []
    at = 0
    for c in cuts + [len(text)]:
        events += p.push(text[at:c])
        at = c
    return p, events + p.flush()


def parse(fmt: ToolFormat, text: str, cuts: list[int]) -> tuple[str, list[tuple[str, Any]], list[Any]]:
    p, events = pushed(fmt, text, cuts)
    content = "".join(e for e in events if isinstance(e, str))
    return content, [(c.name, json.loads(c.arguments)) for c in p.calls], events


def test_the_corpus_is_there() -> None:
    assert len(TEMPLATES) >= 60, TEMPLATES


def test_two_calls_render_in_all_but_the_one_call_templates() -> None:
    for name in TEMPLATES:
        template, setup = setup_of(name)
        ids = [setup.new_id() for _ in CALLS]
        text = turn_text(template, setup.messages([assistant_turn(CALLS, ids)]), setup.tools(TOOLS))
        both = text is not None and all(n in text for n, _ in CALLS)
        assert both == (name not in ONE_CALL_A_TURN), name


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_rendered_turn_reads_back(name: str) -> None:
    """(a): the calls come back, whole and at every chunk boundary, with no call markup in
    the content."""
    setup, text, calls = rendered(name)
    content, got, _ = parse(setup.format, text, [])
    assert got == calls, f"{name} ({setup.format.name}): {text!r}"
    for marker in setup.format.markers():
        assert marker not in content, f"{name}: {marker!r} reached the content {content!r}"
    for n, _ in calls:
        assert n not in content, f"{name}: {content!r}"
    for cut in range(1, len(text)):
        assert parse(setup.format, text, [cut])[:2] == (content, got), f"{name}: cut at {cut}"
    assert parse(setup.format, text, list(range(1, len(text))))[:2] == (content, got)


@pytest.mark.parametrize("name", TEMPLATES)
def test_streamed_calls_have_openai_shape(name: str) -> None:
    setup, text, calls = rendered(name)
    _, _, events = parse(setup.format, text, list(range(1, len(text), 7)))
    deltas = [e for e in events if not isinstance(e, str)]
    seen: set[int] = set()
    for d in deltas:
        assert (d.index not in seen) == (d.id is not None and d.name is not None), (name, d)
        seen.add(d.index)
    assert sorted(seen) == list(range(len(calls)))


def _family_read_templates() -> list[str]:
    """Templates whose family's calls have parameters to stream: XML-style parameters, a notation of the family's own (LFM2's Python
    calls, Gemma 4's objects), a JSON object after the name (Mistral, Kimi K2, gpt-oss,
    DeepSeek R1, ...) or the name and the arguments in one JSON call object, or a list of
    them (Command R, Apertus, Granite, Mistral Nemo, GigaChat, json-tags, Hermes, Llama 3)."""
    from strata_core.text.tool_syntax import Json, Params, Raw

    def own(p: object) -> bool:
        return isinstance(p, Params | Raw | Json)

    return [n for n in TEMPLATES if any(own(p) for p in setup_of(n)[1].format.call)]


@pytest.mark.parametrize("name", _family_read_templates())
def test_arguments_stream_a_parameter_at_a_time(name: str) -> None:
    """A call's arguments stream as its parameters complete, not in one piece at its end;
    the fragments join to the arguments read whole."""
    setup, text, calls = rendered(name)
    _, got, events = parse(setup.format, text, list(range(1, len(text))))
    assert got == calls
    whole, _, _ = parse(setup.format, text, [])
    first = [d for d in events if not isinstance(d, str) and d.index == 0]
    fragments = [d.arguments for d in first[1:]]
    assert first[0].name == calls[0][0] and first[0].arguments == ""
    assert len([f for f in fragments if f]) > 1, f"{name}: {fragments}"  # get_weather has two parameters
    p = reply_parser(setup.format, TOOLS)
    p.push(text)
    p.flush()
    assert "".join(fragments) == p.calls[0].arguments, f"{name}: {fragments}"
    assert fragments[0].startswith("{") and not fragments[0].endswith("}"), fragments


def test_a_list_of_call_objects_streams_each_call_as_it_is_written() -> None:
    """Command R7B's calls are objects of one JSON list: the first is whole, and the second
    under way, before the list closes."""
    _, setup = setup_of("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja")
    head = ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}, '
            '{"tool_call_id": "1", "tool_name": "get_time", "parameters": {"zone": "UTC", ')  # fmt: skip
    p = reply_parser(setup.format, TOOLS)
    deltas = [e for e in p.push(head) if not isinstance(e, str)]
    assert [(d.index, d.name, d.arguments) for d in deltas] == [
        (0, "get_weather", ""), (0, None, '{"city": "Paris"}'), (1, "get_time", ""), (1, None, '{"zone": "UTC"')]  # fmt: skip
    rest = [e for e in p.push('"x": 1}}]<|END_ACTION|>') + p.flush() if not isinstance(e, str)]
    assert [(d.index, d.arguments) for d in rest] == [(1, ', "x": 1}')]
    # Command R+ ran out of tokens inside a call object: its complete parameters stand
    _, plus = setup_of("CohereForAI-c4ai-command-r-plus-tool_use.jinja")
    cut = 'Action:\n```json\n[\n    {\n        "tool_name": "get_weather",\n        "parameters": {"city": "Paris", "sky": "sun'
    assert parse(plus.format, cut, [])[:2] == ("", [("get_weather", {"city": "Paris"})])


def test_a_call_whose_markup_breaks_off_keeps_its_complete_parameters() -> None:
    """What streamed stands: the parameters complete before the markup broke off are the
    call, read whole or a character at a time; at the reply's end the rest is the broken
    call's markup, not content; before it, what follows is read on."""
    _, setup = setup_of("Qwen3-Coder.jinja")
    head = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    for tail in ("<parameter=da", "oops, I stopped"):
        whole = parse(setup.format, head + tail, [])
        assert whole[:2] == ("", [("get_weather", {"city": "Paris"})]), whole
        assert parse(setup.format, head + tail, list(range(1, len(head + tail))))[:2] == whole[:2]
    cut_short = {  # the families' own notations, a string holding a comma and a bracket
        "google-gemma-4-31B-it.jinja": '<|tool_call>call:get_weather{city:<|"|>Paris, (FR)<|"|>,days:',
        "LFM2-8B-A1B.jinja": "<|tool_call_start|>[get_weather(city='Paris, (FR)', days=",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris, (FR)", "days": ',
        # a JSON call object: its name, then the arguments complete so far
        "GigaChat3-10B-A1.8B.jinja": 'function call<|role_sep|>\n{"name": "get_weather", "arguments": {"city": "Paris, (FR)", "days": ',
    }
    for name, text in cut_short.items():
        _, own = setup_of(name)
        whole = parse(own.format, text, [])
        assert whole[:2] == ("", [("get_weather", {"city": "Paris, (FR)"})]), (name, whole)
        assert parse(own.format, text, list(range(1, len(text))))[:2] == whole[:2], name
    text = head + "</function>\nSunny, I guess."
    whole = parse(setup.format, text, [])
    assert (whole[0].strip(), whole[1]) == ("Sunny, I guess.", [("get_weather", {"city": "Paris"})]), whole
    assert parse(setup.format, text, list(range(1, len(text))))[:2] == whole[:2]


# ---- (b) the grammar ----------------------------------------------------------------------


def grammar_of(fmt: ToolFormat, tools: list[dict[str, Any]], parallel: bool) -> str:
    return fmt.grammar(tools, parallel=parallel)


def calls_block(setup: ToolSetup, text: str) -> str:
    """The part of ``text`` that holds the calls (what a forced reply writes)."""
    p = FormatParser(setup.format, TOOLS)
    p.push(text)
    p.flush()
    assert len(p.spans) == 1, p.spans
    start, end = p.spans[0]
    return text[start:end].strip()


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_grammar_accepts_the_templates_rendering(name: str, tokenizer: Any) -> None:
    """(b): required (every tool, parallel) and named (one tool, one call)."""
    setup, text, calls = rendered(name)
    required = grammar_of(setup.format, TOOLS, parallel=True)
    assert grammar_error(llguidance_grammar("lark", required)) == "", required
    block = calls_block(setup, text)
    assert accepts(tokenizer, required, block), f"{name}:\n{required}\n{block!r}"
    template, _ = setup_of(name)
    one = turn_text(template, setup.messages([assistant_turn(CALLS[:1], [setup.new_id()])]), setup.tools(TOOLS))
    assert one is not None
    named = grammar_of(setup.format, [WEATHER], parallel=False)
    assert accepts(tokenizer, named, calls_block(setup, one)), f"{name}:\n{named}"
    assert not accepts(tokenizer, grammar_of(setup.format, [TIME], parallel=False), calls_block(setup, one))



@pytest.mark.parametrize("name", TEMPLATES)
def test_a_forced_call_starts_as_the_template_renders_one(name: str, tokenizer: Any) -> None:
    """The native check: the text a forced call makes (the format's writing of the calls,
    which the grammar accepts) opens as the template's own rendering does, up to the first
    name (whitespace aside, which only the exact families fix)."""
    template, setup = setup_of(name)
    calls = CALLS[:1] if name in ONE_CALL_A_TURN or name in MESSAGE_PER_CALL else CALLS
    ids = [setup.new_id() for _ in calls]
    text = turn_text(template, setup.messages([assistant_turn(calls, ids)]), setup.tools(TOOLS))
    assert text is not None
    block = calls_block(setup, text)
    made = setup.format.write([Written(n, a, i, k) for k, ((n, a), i) in enumerate(zip(calls, ids, strict=True))], {})
    assert accepts(tokenizer, grammar_of(setup.format, TOOLS, parallel=len(calls) > 1), made.strip()), f"{name}: {made!r}"
    if setup.format.bare:  # the generation prompt wrote the first call's marker (Functionary v3.2's >>>)
        made = made.removeprefix(setup.format.starts[0])
    first = calls[0][0]
    opening, rendered_opening = ("".join(t[: t.find(first)].split()) for t in (made, block))
    assert opening == rendered_opening, f"{name}: {made!r} / {block!r}"


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_forced_call_writes_only_the_declared_parameters(name: str, tokenizer: Any) -> None:
    """The forcing grammar refuses a parameter the tool does not declare (its schema leaves
    the object open; a small model invents keys until max_tokens otherwise)."""
    template, setup = setup_of(name)
    invented = [("get_weather", {"city": "Paris", "hours": 3})]
    text = turn_text(template, setup.messages([assistant_turn(invented, [setup.new_id()])]), setup.tools(TOOLS))
    assert text is not None and "hours" in text, name
    assert not accepts(tokenizer, grammar_of(setup.format, [WEATHER], parallel=False), calls_block(setup, text)), name


def test_a_call_objects_index_is_bounded(tokenizer: Any) -> None:
    """Command R7B numbers its calls in the call object: digits, not a string of any length."""
    _, setup = setup_of("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja")
    grammar = grammar_of(setup.format, [WEATHER], parallel=False)
    call = '<|START_ACTION|>[{"tool_call_id": "%s", "tool_name": "get_weather", "parameters": {"city": "Paris"}}]<|END_ACTION|>'
    assert accepts(tokenizer, grammar, call % "0")
    assert not accepts(tokenizer, grammar, call % "1234567")


@pytest.mark.parametrize("name", ["Qwen3.5-4B.jinja", "MiniMax-M2.jinja", "GLM-4.7-Flash.jinja"])
def test_a_forced_call_after_an_open_reasoning_block_closes_it_first(name: str, tokenizer: Any) -> None:
    """A template whose prompt leaves reasoning open: the forced turn closes the reasoning
    with the family's marker before the calls, so they are read as calls, not reasoning."""
    setup, text, _ = rendered(name)
    block = calls_block(setup, text)
    closed = setup.format.grammar(TOOLS, parallel=True, close_think=True)
    close = setup.format.think[1]
    assert accepts(tokenizer, closed, close + "\n\n" + block), f"{name}:\n{closed}"
    assert not accepts(tokenizer, closed, block), "the fixture: the close marker must be required"

@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-V3.2.jinja", "Kimi-K3.jinja", "MiniMax-M3.jinja", "tencent-Hy3.jinja",
                                  "GigaChat3.1-10B-A1.8B.jinja"])
def test_an_exact_familys_forced_turn_is_written_as_its_template_writes_it(name: str, tokenizer: Any) -> None:
    """Families whose templates write their markup one way: the forced turn may not pad it
    with whitespace (a small model writes every newline it may until max_tokens), nor give
    a tool parameters it does not have; the template's own rendering still passes."""
    setup, text, _ = rendered(name)
    assert setup.format.exact
    block = calls_block(setup, text)
    grammar = setup.format.grammar(TOOLS)
    assert accepts(tokenizer, grammar, "\n\n" + block)
    padded = block.replace(">", ">\n\n", 2)
    assert padded != block and not accepts(tokenizer, grammar, padded), padded
    if '"city": "Paris"' in block:  # JSON arguments
        assert not accepts(tokenizer, grammar, block.replace('"city": "Paris"', '"city": "Paris", "zone": "x"'))
    else:  # an XML-style number: of bounded length
        days = re.compile(r">2(?=[<\]])")  # the value, before the marker after it
        assert days.search(block), block
        assert accepts(tokenizer, grammar, days.sub(">-2026", block, 1))
        assert not accepts(tokenizer, grammar, days.sub(">" + "1" * 17, block, 1))


@pytest.mark.parametrize("name", ["GigaChat3-10B-A1.8B.jinja", "GigaChat3.1-10B-A1.8B.jinja", "muse-glimmer.jinja"])
def test_a_family_that_writes_one_call_a_turn_is_forced_to_one(name: str, tokenizer: Any) -> None:
    setup, text, _ = rendered(name)
    block = calls_block(setup, text)
    assert accepts(tokenizer, setup.format.grammar(TOOLS), block)
    assert not accepts(tokenizer, setup.format.grammar(TOOLS), block + block)


def test_a_forced_turn_makes_no_more_calls_than_fit(tokenizer: Any) -> None:
    """``most``: the calls that fit the tokens left (the server counts each as its tool's
    example call costs); one at least, whatever parallel_tool_calls says."""
    from strata_core.text.tool_formats import example_call

    assert example_call(WEATHER).arguments == {"city": "Paris", "days": 2}
    _, setup = setup_of("Qwen3-Coder.jinja")
    one = '<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>'
    assert accepts(tokenizer, setup.format.grammar(TOOLS, most=2), one + "\n" + one)
    assert not accepts(tokenizer, setup.format.grammar(TOOLS, most=1), one + "\n" + one)
    assert accepts(tokenizer, setup.format.grammar(TOOLS, most=1), one)


def test_a_familys_marker_that_begins_no_call_makes_no_content() -> None:
    """GigaChat 3.1's ``<|function_call|>`` before a copy of a tool's result: markup, not
    content; the text after it stays."""
    _, setup = setup_of("GigaChat3.1-10B-A1.8B.jinja")
    text = '<|function_call|>{"temperature_c": 21}<|message_sep|>\n\nIt is sunny.'
    for cuts in ([], list(range(1, len(text)))):
        content, calls, _ = parse(setup.format, text, cuts)
        assert calls == [] and content == '{"temperature_c": 21}\n\nIt is sunny.', cuts


def test_a_message_header_before_no_call_makes_no_content() -> None:
    """muse's ``to=RECIPIENT<|message|>`` heads a message: before a call it is the call's,
    before anything else (the user's channel, a copy of a tool's output) it makes no text."""
    _, setup = setup_of("muse-glimmer.jinja")
    for text, content in ((" to=user<|message|>It is sunny.", "It is sunny."),
                          ('to=get_weather<|message|><tool_output name="get_weather">', '<tool_output name="get_weather">'),
                          ("Go to=the shop", "Go to=the shop")):  # fmt: skip
        for cuts in ([], list(range(1, len(text)))):
            got = parse(setup.format, text, cuts)
            assert got[:2] == (content, []), (text, cuts, got[:2])


def test_a_reasoning_tag_amid_a_glm_reply_makes_no_content() -> None:
    """Laguna (the GLM format): a small model writes on past its turn's end, copying the
    prompt's ``<think>`` / ``</think>``; they are markup, not content."""
    _, setup = setup_of("poolside-Laguna-XS.2.jinja")
    text = "It is sunny.\n</assistant>\n<assistant>\n</think>\nWarm.<think>"
    for cuts in ([], list(range(1, len(text)))):
        assert parse(setup.format, text, cuts)[:2] == ("It is sunny.\n</assistant>\n<assistant>\n\nWarm.", []), cuts


def test_a_call_block_cut_short_makes_no_content() -> None:
    """A reply that ran out of tokens mid-call: the calls before stand, the one cut short
    comes back as far as it was written (its name, no parameter complete: none), the
    fragment is no content (it is markup), also where no call came before it; a marker
    followed by what can be no call stays content."""
    _, setup = setup_of("Qwen3-Coder.jinja")
    one = '<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>'
    cut = "\n<tool_call>\n<function=get_time>\n<parameter=zo"
    content, calls, _ = parse(setup.format, one + cut, [len(one) + 5])
    assert calls == [("get_time", {"zone": "UTC"}), ("get_time", {})] and content == ""
    content, calls, _ = parse(setup.format, "Maybe " + cut, [])
    assert calls == [("get_time", {})] and content == "Maybe \n"
    content, calls, _ = parse(setup.format, "Maybe \n<tool_call>\n<function=get_ti", [])
    assert calls == [] and content == "Maybe \n"
    content, calls, _ = parse(setup.format, "Say <tool_call> twice: <tool_call>, then stop.", [])
    assert calls == [] and content == "Say <tool_call> twice: <tool_call>, then stop."
    _, kimi = setup_of("Kimi-K2-Instruct.jinja")  # a closing marker with no block open
    assert parse(kimi.format, "#\n<|tool_calls_section_end|><|tool_calls_section_end|>\nok", [3, 9])[:2] == ("#\n\nok", [])
    _, gpt = setup_of("openai-gpt-oss-120b.jinja")  # the reply ended partway into a marker
    call = ' to=functions.get_weather<|channel|>json<|message|>{"city": "Paris"}<|call|>'
    for tail in ("<|start|>ass", "<|start|>assistant to=functions", "<|start|>assistant to=functions.get_we", "\r\n\n<"):
        for cuts in ([], list(range(1, len(call + tail)))):
            assert parse(gpt.format, call + tail, cuts)[:2] == ("", [("get_weather", {"city": "Paris"})]), (tail, cuts)
    for text in ("I want to", "It is 3 <", "Sunny. <|start|>assistant<|channel|>final<|message|>Warm",
                 call + "<|start|>assistant<|channel|>final<|message|>I want to"):
        want = text.replace("<|start|>assistant<|channel|>final<|message|>", "").replace(call, "")
        calls = [("get_weather", {"city": "Paris"})] if call in text else []
        for cuts in ([], list(range(1, len(text)))):
            assert parse(gpt.format, text, cuts)[:2] == (want, calls), (text, cuts)
    _, gemma = setup_of("google-gemma-4-31B-it.jinja")  # its closing marker never came: the call as written
    content, calls, _ = parse(gemma.format, 'So <|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call>\n<', [])
    assert calls == [("get_weather", {"city": "Paris"})] and content == "So "


def test_a_forced_turn_makes_as_many_calls_as_tools_are_offered(tokenizer: Any) -> None:
    from strata_core.text.tool_formats import most_calls

    _, setup = setup_of("Qwen3-Coder.jinja")
    one = '<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>'
    for tools in ([TIME], TOOLS, [TIME] * 3, [TIME] * 20):
        n = most_calls(len(tools))
        assert n == min(max(len(tools), 2), 8)
        g = setup.format.grammar(tools)
        assert accepts(tokenizer, g, "\n".join([one] * n))
        assert not accepts(tokenizer, g, "\n".join([one] * (n + 1)))


# ---- reasoning per family, history shapes, derived formats --------------------------------


def reply(name: str, text: str, thinking: bool = False) -> tuple[str, str, list[tuple[str, Any]]]:
    """(reasoning, content, calls) of a reply in ``name``'s family, as the server splits it."""
    from strata_core.text.reasoning import ThinkSplitter

    _, setup = setup_of(name)
    think = ThinkSplitter(thinking, setup.format.think, (setup.format.open.strip(),))
    pieces = think.push(text) + think.flush()
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content, calls, _ = parse(setup.format, "".join(p.text for p in pieces if p.kind == "content"), [])
    return reasoning, content, calls


def test_a_calls_section_with_no_call_makes_no_markup_even_inside_an_open_reasoning() -> None:
    """Kimi K3's prompt after a tool result opens the reasoning; the 135M model never closed
    it and opened the calls section with no call inside: the section's opener ends the
    reasoning and is markup, not content; a call in such a section is read."""
    seen = "<|close|>response<|sep|><|open|>tools<|sep|><|open|><|close|><|open|><|close|><|open|><|close"
    assert reply("Kimi-K3.jinja", seen, thinking=True) == ("<|close|>response<|sep|>", "<|open|><|close|><|open|><|close|><|open|>", [])
    _, setup = setup_of("Kimi-K3.jinja")
    call = setup.format.write([Written("get_time", {"zone": "UTC"})])
    assert reply("Kimi-K3.jinja", "Hmm." + call, thinking=True) == ("Hmm.", "", [("get_time", {"zone": "UTC"})])
    assert parse(setup.format, "Fine.<|open|>tools<|sep|>", list(range(1, 20)))[:2] == ("Fine.", [])


def test_harmony_channels() -> None:
    gpt = "openai-gpt-oss-120b.jinja"
    call = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')  # fmt: skip
    assert reply(gpt, call) == ("Need the weather.", "", [("get_weather", {"city": "Paris"})])
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|return|>"
    assert reply(gpt, final) == ("Easy.", "Hi there", [])
    # a message with no channel, and a commentary message to the user: the header is markup
    assert reply(gpt, "<|message|>Hi there<|end|>") == ("", "Hi there", [])
    assert reply(gpt, "<|channel|>commentary<|message|>Checking.<|end|>") == ("", "Checking.", [])


def test_family_reasoning_tags() -> None:
    assert reply("ByteDance-Seed-OSS.jinja", "<seed:think>hmm</seed:think>Hello") == ("hmm", "Hello", [])
    assert reply("Cohere2MoE.jinja", "<|START_THINKING|>plan<|END_THINKING|>Hi") == ("plan", "Hi", [])
    assert reply("mistralai-Ministral-3-14B-Reasoning-2512.jinja", '[THINK]a[/THINK][TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}') == (
        "a", "", [("get_time", {"zone": "UTC"})])  # fmt: skip
    # the generation prompt opened the block: the reply starts inside it
    assert reply("Qwen3.5-4B.jinja", "mull</think>\n\nok", thinking=True) == ("mull", "ok", [])


def test_functionary_v32_content_channel() -> None:
    """The generation prompt ends with ``>>>``: a reply opening ``all\n`` is content (the
    recipient is markup), one opening with a function's name is a call; more messages follow
    as ``>>>all\n...`` or ``>>>name\n{...}``. Whole and at every chunk boundary."""
    name = "meetkai-functionary-medium-v3.2.jinja"
    _, setup = setup_of(name)
    cases = {
        "all\nHello there": ("Hello there", []),
        'all\nLet me check.>>>get_time\n{"zone": "UTC"}': ("Let me check.", [("get_time", {"zone": "UTC"})]),
        'get_time\n{"zone": "UTC"}>>>get_weather\n{"city": "Paris"}': (
            "", [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Paris"})]),
        'get_time\n{"zone": "UTC"}>>>all\nDone.': ("Done.", [("get_time", {"zone": "UTC"})]),
        "allow me": ("allow me", []),
        # what its grammar lets a forced turn write: newlines around the name
        '\n\nget_time\n\n{"zone": "UTC"}\n\nget_weather\n{"city": "Paris"}': (
            "", [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Paris"})]),
    }  # fmt: skip
    for text, want in cases.items():
        assert reply(name, text)[1:] == want, text
        for cut in range(1, len(text)):
            assert parse(setup.format, text, [cut])[:2] == want, (text, cut)
    # tool_choice none: no calls read, and the content channel's marker still goes
    only = setup.format.content_only()
    assert parse(only, 'all\nHi>>>get_time\n{"zone": "UTC"}', [2])[:2] == ('Hi>>>get_time\n{"zone": "UTC"}', [])


KIMI_K2 = ("Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja")


@pytest.mark.parametrize("name", KIMI_K2)
def test_kimi_k2_call_ids_are_the_ones_its_template_renders(name: str) -> None:
    """Kimi K2 writes a call as ``functions.NAME:IDX`` (IDX counts the conversation's calls):
    that is the call's id, so a tool result sent back with it renders as the model saw it."""
    setup, text, calls = rendered(name)
    assert setup.format.name == "kimi-k2"
    p = reply_parser(setup.format, TOOLS)
    p.push(text)
    p.flush()
    assert [c.id for c in p.calls] == [f"functions.{n}:{i}" for i, (n, _) in enumerate(calls)], text
    later = '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:7<|tool_call_argument_begin|>{"zone": "UTC"}<|tool_call_end|><|tool_calls_section_end|>'
    _, got, events = parse(setup.format, later, [])
    assert got == [("get_time", {"zone": "UTC"})] and events[0].id == "functions.get_time:7"
    template, _ = setup_of(name)
    call = p.calls[0].body()
    history = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]  # fmt: skip
    prompt = template.render(setup.messages(history), add_generation_prompt=True, tools=setup.tools(TOOLS))
    assert "## Return of functions.get_weather:0" in prompt, prompt


def test_history_shapes() -> None:
    """Mistral: 9-alphanumeric ids (the same for a call and its result); Functionary v3.2:
    arguments as text; LFM2 and Granite 3.3: the calls written into the content."""
    call = {"id": "call_" + "x" * 24, "type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}
    history = [{"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call["id"], "content": "noon"}]  # fmt: skip
    _, mistral = setup_of("Mistral-Small-3.2-24B-Instruct-2506.jinja")
    shaped = mistral.messages(history)
    short = shaped[0]["tool_calls"][0]["id"]
    assert len(short) == 9 and short.isalnum() and shaped[1]["tool_call_id"] == short
    assert len(mistral.new_id()) == 9
    _, functionary = setup_of("meetkai-functionary-medium-v3.2.jinja")
    assert functionary.messages(history)[0]["tool_calls"][0]["function"]["arguments"] == '{"zone": "UTC"}'
    _, lfm = setup_of("LFM2-8B-A1B.jinja")
    shaped = lfm.messages(history)
    assert "tool_calls" not in shaped[0]
    assert shaped[0]["content"] == "<|tool_call_start|>[get_time(zone='UTC')]<|tool_call_end|>"
    _, command_r = setup_of("CohereForAI-c4ai-command-r-plus-tool_use.jinja")
    tools = command_r.tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}])  # fmt: skip
    assert tools is not None and tools[0]["function"]["parameters"]["properties"]["a"]["description"] == ""


UNKNOWN = (
    "{% if tools %}tools: {{ tools | tojson }}{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<<CALL {{ c.function.name }} ARGS {{ c.function.arguments | tojson }}>>{% endfor %}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_format_is_derived_from_an_unknown_template(tokenizer: Any) -> None:
    setup = ChatTemplate(UNKNOWN).tool_setup
    assert setup is not None and setup.derived and setup.format.name == "derived"
    text = 'Sure. <<CALL get_time ARGS {"zone": "UTC"}>>'
    content, calls, _ = parse(setup.format, text, [])
    assert (content, calls) == ("Sure. ", [("get_time", {"zone": "UTC"})])
    for cut in range(1, len(text)):
        assert parse(setup.format, text, [cut])[:2] == (content, calls)
    assert accepts(tokenizer, setup.format.grammar([TIME], parallel=False), '<<CALL get_time ARGS {"zone": "UTC"}>>')


def test_nothing_derivable_leaves_the_generic_format() -> None:
    odd = "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.name }}{% endfor %}{% endfor %}{{ tools | length }}"
    assert ChatTemplate(odd).tool_setup is None


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_call_cut_short_in_a_value_comes_back_as_written(name: str) -> None:
    """max_tokens ended the reply inside the first call's first value (``Par`` of
    ``Paris``): the call comes back with its name and its arguments so far, the value
    as far as written, whole and streamed (OpenAI's answer to a call cut short)."""
    setup, text, _ = rendered(name)
    cut = text[: text.index("Paris") + 3]
    for cuts in ([], list(range(1, len(cut)))):
        p, events = pushed(setup.format, cut, cuts)
        assert [c.name for c in p.calls] == ["get_weather"], (name, cuts, events)
        assert p.calls[0].arguments.startswith('{"city": "Par'), (name, p.calls[0])
        streamed = "".join(e.arguments for e in events if not isinstance(e, str))
        assert streamed == p.calls[0].arguments, (name, events)
