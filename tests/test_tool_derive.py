"""A template's call format derived from its own rendering (text/tool_derive.py), on
templates no registered format reads: written by hand in the shapes published families use,
and synthetic ones from random choices of those shapes. For each, the derived format reads
the template's rendering of calls back as those calls (whole and streamed, in OpenAI's
shape), its grammar forces a call the template renders the same way (it accepts the
template's rendering), and it writes calls as the template does. Pure and fast."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tools import accepts

from strata_core.testing import shaped_templates as shaped
from strata_core.text.chat import ChatTemplate
from strata_core.text.tool_derive import PROBE_TOOLS
from strata_core.text.tool_formats import BY_NAME, ToolFormat
from strata_core.text.tool_reader import FormatParser
from strata_core.text.tool_setup import ToolSetup, derive_format, turn_text
from strata_core.text.tool_syntax import Written

Calls = list[tuple[str, dict[str, Any]]]
TWO: Calls = [("get_weather", {"location": "Lyon", "days": 3}), ("get_time", {"zone": "CET"})]


def rendered(template: ChatTemplate, calls: Calls) -> str:
    """The template's text for an assistant turn making ``calls`` (after the generation
    prompt)."""
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call{i}x", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]}  # fmt: skip
    text = turn_text(template, [turn], PROBE_TOOLS)
    assert text is not None
    return text


def read(fmt: ToolFormat, text: str, cuts: list[int]) -> tuple[str, Calls, list[Any], FormatParser]:
    p = FormatParser(fmt, PROBE_TOOLS)
    events: list[Any] = []
    at = 0
    for c in [*cuts, len(text)]:
        events += p.push(text[at:c])
        at = c
    events += p.flush()
    content = "".join(e for e in events if isinstance(e, str))
    return content, [(c.name, json.loads(c.arguments)) for c in p.calls], events, p


def check(source: str, calls: Calls, tokenizer: Any, cuts: list[int] | None = None) -> ToolFormat:
    """The derivation's promises for ``source`` on ``calls``; the derived format."""
    template = ChatTemplate(source)
    fmt = derive_format(template, ToolSetup(BY_NAME["hermes"]))
    assert isinstance(fmt, ToolFormat), fmt
    text = rendered(template, calls)
    content, got, _, p = read(fmt, text, [])
    assert got == calls, (fmt, text)
    assert not text[: p.spans[0][0]].strip(), (fmt, text)  # no markup before the calls in the content
    region = text[p.spans[0][0] : p.spans[-1][1]].strip()
    # streamed, cut anywhere: the same calls, in OpenAI's shape
    content2, got2, events, _ = read(fmt, text, cuts if cuts is not None else list(range(1, len(text), 3)))
    assert (content2, got2) == (content, got)
    seen: dict[int, str] = {}
    for e in events:
        if isinstance(e, str):
            continue
        assert (e.index not in seen) == (e.id is not None and e.name is not None), e
        seen[e.index] = seen.get(e.index, "") + e.arguments
    assert [json.loads(seen[i]) for i in sorted(seen)] == [a for _, a in calls]
    # forced: the grammar accepts the template's own rendering of the calls
    assert accepts(tokenizer, fmt.grammar(PROBE_TOOLS, parallel=len(calls) > 1), region), (fmt, region)
    if fmt.exact:  # and a forced call is written as the template writes it
        assert fmt.write([Written(n, a, f"call{i}x", i) for i, (n, a) in enumerate(calls)]).strip() == region
    return fmt


@pytest.mark.parametrize("name", list(shaped.BY_HAND))
def test_a_hand_written_template_gets_its_own_format(name: str, tokenizer: Any) -> None:
    source = shaped.BY_HAND[name]
    setup = ChatTemplate(source).tool_setup
    assert setup is not None and setup.derived, name
    fmt = check(source, TWO, tokenizer)
    assert fmt.exact, f"{name}: {fmt}"
    check(source, TWO[:1], tokenizer)


def test_a_forced_number_is_bounded(tokenizer: Any) -> None:
    """The typed-object family's forced call on the 135M model wrote ``"days":1234...`` until
    max_tokens: a number its schema leaves unbounded gets 16 digits."""
    setup = ChatTemplate(shaped.TYPED_OBJECT).tool_setup
    assert setup is not None
    grammar = setup.format.grammar(PROBE_TOOLS[:1], parallel=False)
    call = '<|tool▁call|>{"type":"function","id":"c1","function_name":"get_weather","args":{"location":"Lyon","days":%s}}<|tool▁call▁end|>'
    assert accepts(tokenizer, grammar, call % "1234567890123456")
    assert not accepts(tokenizer, grammar, call % "12345678901234567890")


def test_a_template_that_writes_no_derivable_call_says_why() -> None:
    template = ChatTemplate(shaped.PROSE)
    assert template.tool_setup is None
    assert "I would use get_weather" in template.tool_problem


# ---- synthetic templates ----------------------------------------------------------------------

WORDS = st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,7}( [A-Za-z0-9]{1,5})?", fullmatch=True)


@st.composite
def shapes(draw: st.DrawFn) -> shaped.Shape:
    body = draw(st.sampled_from(("json", "python", "named", "xml")))
    markers = draw(st.sampled_from(shaped.MARKERS))
    if body in ("named", "xml") and not markers[0]:
        markers = ("<tool_call>", "</tool_call>")  # a name alone opening the reply is no call
    block = draw(st.booleans())
    listed = block and body in ("json", "python") and draw(st.booleans())
    if not markers[0] and not listed:
        block = True
    return shaped.Shape(
        body, markers, block, listed, sep=draw(st.sampled_from(("\n", "", " "))) if not listed else ", ",
        name_key=draw(st.sampled_from(shaped.NAME_KEYS)), args_key=draw(st.sampled_from(shaped.ARGS_KEYS)),
        args_first=draw(st.booleans()), typed=draw(st.booleans()), separators=draw(st.sampled_from(shaped.SEPARATORS)),
        sort_keys=draw(st.booleans()), quote=draw(st.sampled_from(('"', "'"))), mid=draw(st.sampled_from(shaped.MIDS)),
        xml=draw(st.sampled_from(shaped.XML_PARAMS)),
    )  # fmt: skip


@st.composite
def call_lists(draw: st.DrawFn) -> Calls:
    out: Calls = []
    for _ in range(draw(st.integers(1, 2))):  # (a forced turn of two tools makes at most two)
        if draw(st.booleans()):
            args: dict[str, Any] = {"location": draw(WORDS)}
            if draw(st.booleans()):
                args["days"] = draw(st.integers(0, 400))
            out.append(("get_weather", args))
        else:
            out.append(("get_time", {"zone": draw(WORDS)}))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=shapes(), calls=call_lists(), step=st.integers(1, 9))
def test_a_synthetic_template_gets_its_own_format(shape: shaped.Shape, calls: Calls, step: int, tokenizer: Any) -> None:
    source = shape.template()
    check(source, calls, tokenizer, list(range(1, 4000, step)))



def test_doctor_says_which_format_a_template_gets(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``strata doctor --template FILE``: the format, how it was found, a call as a forced
    reply writes it and as the template renders it; the generic format and why."""
    from strata_core.ops.cli import main

    (tmp_path / "py.jinja").write_text(shaped.PYTHONIC)
    (tmp_path / "prose.jinja").write_text(shaped.PROSE)
    assert main(["doctor", "--template", str(tmp_path / "py.jinja")]) == 0
    out = capsys.readouterr().out
    assert "format: derived" in out and "example call: '[get_weather(city=\"Paris\", days=2)]'" in out, out
    assert "the template renders it: '[get_weather(city=\"Paris\", days=2)]" in out, out
    assert main(["doctor", "--template", str(tmp_path / "prose.jinja")]) == 0
    out = capsys.readouterr().out
    assert "format: generic (" in out and "I would use get_weather" in out, out
    assert main(["doctor", "--template", str(tmp_path / "none.jinja")]) == 2
