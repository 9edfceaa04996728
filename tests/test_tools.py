"""Tool calls: the incremental parser (at every chunk boundary), and the
grammar that forces a call, checked offline with llguidance."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_core.text.chat import ChatTemplate
from strata_core.text.generic_tools import (
    generic_grammar,
    generic_instruction,
    generic_messages,
)
from strata_core.text.grammars import grammar_error, llguidance_grammar
from strata_core.text.tool_formats import BY_NAME, ToolFormat
from strata_core.text.tool_reader import reply_parser
from strata_core.text.tools import CallDelta

#: the JSON families of the format registry, and (below) the generic format
H, L = "hermes", "llama3"


def parse(dialect: str | ToolFormat, text: str, cuts: list[int] | None = None) -> tuple[str, list[tuple[str, str]], list[Any]]:
    """(content, [(name, arguments)], events) of ``text`` pushed in pieces cut at ``cuts``."""
    ids = iter(f"call_{i}" for i in range(100))
    new_id = lambda: next(ids)  # noqa: E731
    p = reply_parser(BY_NAME[dialect] if isinstance(dialect, str) else dialect, [], new_id)
    events: list[Any] = []
    at = 0
    for c in sorted(cuts or []) + [len(text)]:
        events += p.push(text[at:c])
        at = c
    events += p.flush()
    content = "".join(e for e in events if isinstance(e, str))
    return content, [(c.name, c.arguments) for c in p.calls], events


def every_cutting(text: str) -> list[list[int]]:
    n = len(text)
    cuts: list[list[int]] = [[], list(range(1, n))]
    cuts += [[i] for i in range(n + 1)]
    cuts += [[i, j] for i in range(0, n + 1, 3) for j in range(i, n + 1, 5)]
    return cuts


WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

CASES = [
    # (dialect, reply, content, calls)
    (H, WEATHER_CALL, "", [("get_weather", '{"city": "Paris"}')]),
    (H, "Let me check.\n" + WEATHER_CALL, "Let me check.\n", [("get_weather", '{"city": "Paris"}')]),
    (
        H,
        WEATHER_CALL + "\n" + '<tool_call>\n{"name": "get_time", "arguments": {"tz": "a}, \\"b"}}\n</tool_call>',
        "",
        [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "a}, \\"b"}')],
    ),
    # keys in another order: sent whole, as canonical JSON
    (H, '<tool_call>{"arguments": {"x": [1, 2]}, "name": "f"}</tool_call>', "", [("f", '{"x": [1, 2]}')]),
    (H, "No call here, just <tool> talk and a < sign.", "No call here, just <tool> talk and a < sign.", []),
    (H, "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    (H, '<tool_call>{"title": "x"}</tool_call>', '<tool_call>{"title": "x"}</tool_call>', []),
    (H, "<tool_ca", "", []),  # a reply that ended partway into the marker (tool_reader.py's rule)
    (L, '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", '{"city": "Paris"}')]),
    (L, '<|python_tag|>{"name": "f", "arguments": {}}', "", [("f", "{}")]),
    (L, '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {"b": "}"}}', "",
     [("f", '{"a": 1}'), ("g", '{"b": "}"}')]),  # fmt: skip
    (L, 'The answer is {"a": 1}', 'The answer is {"a": 1}', []),
    (L, '  {"answer": 42}', '  {"answer": 42}', []),
    (L, "Hello", "Hello", []),
]


@pytest.mark.parametrize("dialect,reply,content,calls", CASES)
def test_parse_at_every_chunk_boundary(dialect: str, reply: str, content: str, calls: list[tuple[str, str]]) -> None:
    for cuts in every_cutting(reply):
        got_content, got_calls, events = parse(dialect, reply, cuts)
        assert (got_content, got_calls) == (content, calls), cuts
        check_deltas(events, got_calls)


def check_deltas(events: list[Any], calls: list[tuple[str, str]]) -> None:
    """Each call's first delta carries id and name; its fragments join to its arguments."""
    deltas = [e for e in events if isinstance(e, CallDelta)]
    by_index: dict[int, list[CallDelta]] = {}
    for d in deltas:
        by_index.setdefault(d.index, []).append(d)
    assert sorted(by_index) == list(range(len(calls)))
    for i, (name, args) in enumerate(calls):
        first, *rest = by_index[i]
        assert first.id == f"call_{i}" and first.name == name
        assert all(d.id is None and d.name is None for d in rest)
        assert "".join(d.arguments for d in by_index[i]) == args
    body = deltas[0].body() if deltas else None
    if body is not None:
        assert body["type"] == "function" and body["function"]["name"] == calls[0][0]


def test_arguments_stream_before_the_call_ends() -> None:
    p = reply_parser(BY_NAME[H], [], lambda: "call_x")
    events = p.push('<tool_call>\n{"name": "f", "arguments": {"city": "Paris", "da')
    assert events == [CallDelta(0, "", "call_x", "f"), CallDelta(0, '{"city": "Paris"')]
    assert p.push('ys": 2}}\n</tool_call>') == [CallDelta(0, ', "days": 2}')]
    assert p.flush() == []


def test_a_call_cut_short_keeps_what_was_streamed() -> None:
    content, calls, _ = parse(H, '<tool_call>\n{"name": "f", "arguments": {"a": 1, ')
    assert content == "" and calls == [("f", '{"a": 1}')]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab "\\}{:,é', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="xyz", max_size=3), inner, max_size=3),
    max_leaves=8,
)


@given(
    st.lists(st.dictionaries(st.text(alphabet="abc_", min_size=1, max_size=4), _json, max_size=3), min_size=1, max_size=3),
    st.sampled_from([H, L]),
    st.sampled_from([None, 2]),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_calls_any_chunking(args: list[dict[str, Any]], dialect: str, indent: int | None, cuts: list[int]) -> None:
    key = "arguments" if dialect is H else "parameters"
    objs = [json.dumps({"name": f"fn{i}", key: a}, indent=indent, ensure_ascii=False) for i, a in enumerate(args)]
    if dialect is H:
        reply = "\n".join(f"<tool_call>\n{o}\n</tool_call>" for o in objs)
    else:
        reply = "; ".join(objs)
    content, calls, events = parse(dialect, reply, [c for c in cuts if c <= len(reply)])
    assert content == ""
    assert [(n, json.loads(a)) for n, a in calls] == [(f"fn{i}", a) for i, a in enumerate(args)]
    check_deltas(events, calls)


def test_templates_that_never_read_tools_get_no_format() -> None:
    smollm2 = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% endfor %}"
    assert ChatTemplate(smollm2).tool_setup is None
    assert ChatTemplate("no tool support, only mentions toolsets").tool_setup is None


# ---- the grammar ----------------------------------------------------------------------------


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def accepts(tokenizer: Any, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(tokenizer, llguidance_grammar("lark", grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    return bool(m.consume_tokens(list(text.encode()))) and m.is_accepting() and not m.is_error()


def call_grammar(tools: list[Any], family: str, parallel: bool = True) -> str:
    """The grammar forcing a call in ``family``'s registered format."""
    return BY_NAME[family].grammar(tools, parallel=parallel)


def test_grammars_are_valid() -> None:
    for dialect in (H, L):
        for parallel in (True, False):
            assert grammar_error(llguidance_grammar("lark", call_grammar([WEATHER, CLOCK], dialect, parallel))) == ""
    assert grammar_error(llguidance_grammar("lark", "start: %json {")) != ""


def test_required_grammar_accepts_calls_and_rejects_the_rest(tokenizer: Any) -> None:
    g = call_grammar([WEATHER, CLOCK], H)
    assert accepts(tokenizer, g, WEATHER_CALL)
    assert accepts(tokenizer, g, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert accepts(tokenizer, g, WEATHER_CALL + "\n" + WEATHER_CALL)  # parallel calls
    assert not accepts(tokenizer, g, "Sure! " + WEATHER_CALL)  # no content instead
    assert not accepts(tokenizer, g, '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>')
    assert not accepts(tokenizer, g, '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')
    assert not accepts(tokenizer, g, '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>')
    assert not accepts(tokenizer, g, "The weather is nice.")
    # JSON without free whitespace, as structured outputs write it
    assert not accepts(tokenizer, g, '<tool_call>\n{"name": "get_time",\n "arguments": {}}\n</tool_call>')
    # what the grammar accepts, the parser reads as the call
    assert parse(H, WEATHER_CALL)[1] == [("get_weather", '{"city": "Paris"}')]


def test_named_and_single_call_grammars(tokenizer: Any) -> None:
    named = call_grammar([CLOCK], H, parallel=False)
    assert accepts(tokenizer, named, '<tool_call>\n{"name": "get_time", "arguments": {"tz": 1}}\n</tool_call>')
    assert not accepts(tokenizer, named, WEATHER_CALL)
    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert not accepts(tokenizer, named, one + "\n" + one)


def test_llama3_grammar(tokenizer: Any) -> None:
    g = call_grammar([WEATHER], L)
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert accepts(tokenizer, g, text)
    assert not accepts(tokenizer, g, '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert parse(L, text)[1] == [("get_weather", '{"city": "Paris"}')]


# ---- the generic format (templates that never read tools) ----------------------------------

G = BY_NAME["generic"]

GENERIC_CASES = [
    # (reply, content, calls)
    ('{"response": "Hello!"}', "Hello!", []),
    ('{"response": "say \\"hi\\"\\n\\u00e9\\ud83d\\ude00 \\\\ / \\/ }"}', 'say "hi"\né😀 \\ / / }', []),
    ('{"response": "lone \\ud83d surrogate"}', "lone \ufffd surrogate", []),
    (' { "response" : "spaced" } ', "spaced", []),
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [("get_weather", '{"city": "Paris"}')]),
    ('{"tool_calls": [{"name": "f", "arguments": {"a": "}]"}}, {"name": "g", "arguments": {}}]}', "",
     [("f", '{"a": "}]"}'), ("g", "{}")]),  # fmt: skip
    # keys in another order, or other keys first: read whole when the object closes
    ('{"tool_call": {"arguments": {"x": [1]}, "name": "f"}}', "", [("f", '{"x": [1]}')]),
    ('{"id": 1, "tool_calls": [{"name": "f", "arguments": {"x": 1}}]}', "", [("f", '{"x": 1}')]),
    ('{"id": 1, "response": "late"}', "late", []),
    # not the format: content, unchanged
    ("Just text, {not json}.", "Just text, {not json}.", []),
    ('{"answer": 42}', '{"answer": 42}', []),
    ('{"tool_calls": []}', '{"tool_calls": []}', []),
    ('{"tool_call": {"title": "x"}}', '{"tool_call": {"title": "x"}}', []),
    ("{never closed", "{never closed", []),
    ('{"resp', '{"resp', []),
    # cut short (max_tokens): what was decided stands
    ('{"response": "cut sho', "cut sho", []),
    ('{"response": "half an escape \\u00', "half an escape ", []),
    ('{"tool_call": {"name": "f", "arguments": {"a": 1, ', "", [("f", '{"a": 1,')]),
]


@pytest.mark.parametrize("reply,content,calls", GENERIC_CASES)
def test_generic_parse_at_every_chunk_boundary(reply: str, content: str, calls: list[tuple[str, str]]) -> None:
    for cuts in every_cutting(reply):
        got_content, got_calls, events = parse(G, reply, cuts)
        assert (got_content, got_calls) == (content, calls), cuts
        check_deltas(events, got_calls)


def test_generic_response_streams_as_it_comes() -> None:
    p = reply_parser(G, [], lambda: "call_x")
    assert p.push('{"response": ') == []  # undecided until the string opens
    assert p.push('"Hel') == ["Hel"]
    assert p.push('lo\\') == ["lo"]  # an escape is held until it is whole
    assert p.push('n wor') == ["\n wor"]
    assert p.push('ld"}') == ["ld"]
    assert p.flush() == [] and p.calls == []


def test_generic_call_streams_before_it_ends() -> None:
    p = reply_parser(G, [], lambda: "call_x")
    assert p.push('{"tool_call": {"name": "f", "arguments": {"city": "Par') == [
        CallDelta(0, "", "call_x", "f"), CallDelta(0, '{"city": "Par')]  # fmt: skip
    assert p.push('is"}}}') == [CallDelta(0, 'is"}')]
    assert p.flush() == []


@given(
    st.lists(st.dictionaries(st.text(alphabet="abc_", min_size=1, max_size=4), _json, max_size=3), min_size=1, max_size=3),
    st.sampled_from([None, 2]),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_generic_any_calls_any_chunking(args: list[dict[str, Any]], indent: int | None, cuts: list[int]) -> None:
    objs = [{"name": f"fn{i}", "arguments": a} for i, a in enumerate(args)]
    value = {"tool_call": objs[0]} if len(objs) == 1 else {"tool_calls": objs}
    reply = json.dumps(value, indent=indent, ensure_ascii=False)
    content, calls, events = parse(G, reply, [c for c in cuts if c <= len(reply)])
    assert content == ""
    assert [(n, json.loads(a)) for n, a in calls] == [(f"fn{i}", a) for i, a in enumerate(args)]
    check_deltas(events, calls)


@given(st.text(max_size=12), st.lists(st.integers(min_value=0, max_value=100), max_size=6))
def test_generic_any_response_any_chunking(text: str, cuts: list[int]) -> None:
    for ascii_only in (True, False):
        reply = json.dumps({"response": text}, ensure_ascii=ascii_only)
        content, calls, _ = parse(G, reply, [c for c in cuts if c <= len(reply)])
        expected = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        assert (content, calls) == (expected, [])


def test_generic_grammar(tokenizer: Any) -> None:
    auto = generic_grammar([WEATHER, CLOCK], parallel=True, text=True)
    required = generic_grammar([WEATHER, CLOCK], parallel=True, text=False)
    single = generic_grammar([CLOCK], parallel=False, text=False)
    for g in (auto, required, single):
        assert grammar_error(llguidance_grammar("lark", g)) == ""
    weather = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    both = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]}'
    answer = '{"response": "It is sunny."}'
    assert accepts(tokenizer, auto, weather) and accepts(tokenizer, auto, both) and accepts(tokenizer, auto, answer)
    assert accepts(tokenizer, required, weather) and accepts(tokenizer, required, both)
    assert not accepts(tokenizer, required, answer)  # required: no text answer
    assert not accepts(tokenizer, auto, "It is sunny.")
    assert not accepts(tokenizer, auto, '{"tool_call": {"name": "get_weather", "arguments": {"city": 3}}}')
    assert not accepts(tokenizer, auto, '{"tool_call": {"name": "other", "arguments": {}}}')
    assert not accepts(tokenizer, auto, '{"tool_calls": []}')
    assert not accepts(tokenizer, auto, '{"tool_call": {"name": "get_weather",\n "arguments": {"city": "Paris"}}}')
    assert accepts(tokenizer, single, '{"tool_call": {"name": "get_time", "arguments": {}}}')
    assert not accepts(tokenizer, single, weather)  # named: only that tool
    assert not accepts(tokenizer, single, '{"tool_calls": [{"name": "get_time", "arguments": {}}]}')  # not parallel
    # what the grammar accepts, the parser reads
    assert parse(G, both)[1] == [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    assert parse(G, answer)[0] == "It is sunny."


def test_generic_instruction_names_only_the_allowed_forms() -> None:
    auto = generic_instruction([WEATHER, CLOCK], "auto", parallel=True)
    assert '"tool_call"' in auto and '"tool_calls"' in auto and '"response"' in auto
    assert '{"name": "get_weather", "parameters": {"type": "object"' in auto
    assert '{"name": "get_time", "parameters": {"type": "object"}}' in auto
    required = generic_instruction([WEATHER], "required", parallel=False)
    assert '"response"' not in required and '"tool_calls"' not in required and "must call a tool" in required
    assert "must call the tool get_time" in generic_instruction([CLOCK], "named", True, named="get_time")


def test_generic_messages_render_tool_turns_as_text() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 25 C"},
        {"role": "tool", "tool_call_id": "call_unknown", "content": "?"},
    ]
    out = generic_messages(history, "INSTRUCTION")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"] == "Be brief.\n\nINSTRUCTION"
    assert json.loads(out[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert "tool_calls" not in out[2]
    first, second = (json.loads(line) for line in out[3]["content"].splitlines())
    assert first == {"tool_result": {"name": "get_weather", "content": "Sunny, 25 C"}}
    assert second == {"tool_result": {"tool_call_id": "call_unknown", "content": "?"}}
    # no system message: one is added; no instruction (tool_choice none): none added
    assert generic_messages(history[1:2], "I")[0] == {"role": "system", "content": "I"}
    assert generic_messages(history[1:2], None) == history[1:2]
    two = {**history[2], "content": "Checking.", "tool_calls": [call, {**call, "id": "call_2"}]}
    text = generic_messages([two], None)[0]["content"]
    assert text.startswith("Checking.\n") and len(json.loads(text.split("\n", 1)[1])["tool_calls"]) == 2


def test_generic_opt_out_key(tmp_path: Any) -> None:
    from strata_core.ops.config import ConfigError, load_config

    assert load_config(env={}).tools.generic is True
    assert load_config(env={"STRATA_TOOLS_GENERIC": "false"}).tools.generic is False
    path = tmp_path / "strata.toml"
    path.write_text("[tools]\ngeneric = false\n")
    assert load_config(path, env={}).tools.generic is False
    path.write_text("[tools]\ngeneric_format = false\n")
    with pytest.raises(ConfigError, match="generic_format"):
        load_config(path, env={})
