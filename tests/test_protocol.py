"""The engine protocol codec: round trips, exact lines, and malformed input."""

from __future__ import annotations

import base64
import json
import math
import string
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from strata_core.contract import protocol as proto
from strata_core.contract.protocol import (
    DONE_REASONS,
    PROTOCOL_VERSION,
    Adapters,
    Cancel,
    Command,
    Done,
    Embed,
    Embedding,
    Error,
    Event,
    Gen,
    Logprob,
    LoraAdapter,
    LoraLoad,
    LoraScales,
    LoraUnload,
    ProtocolError,
    Quit,
    Ready,
    SlotCommand,
    SlotInfo,
    Token,
    Tokenize,
    Tokens,
    Vocab,
    VocabRequest,
    Warn,
    encode_command,
    encode_event,
    parse_command,
    parse_event,
)

# Everything str.splitlines() breaks a line on.
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"

# --- strategies --------------------------------------------------------------------------

rids = st.from_regex(r"[A-Za-z0-9_-]+", fullmatch=True).filter(lambda r: r != "-")
ids = st.integers(min_value=0, max_value=2**40)
id_tuples = st.lists(ids, max_size=30).map(tuple)
keys = st.from_regex(r"[a-z_][a-z0-9_]*", fullmatch=True)
values = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1)
pairs = st.dictionaries(keys, values, max_size=8)
logprobs = st.floats(allow_nan=False)  # includes inf, -inf, -0.0 and subnormals
messages = st.text().map(lambda s: s.translate({ord(c): " " for c in LINE_BREAKS}))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)

commands = st.one_of(
    st.builds(Gen, rids, pairs, id_tuples),
    st.builds(Cancel, rids),
    st.builds(Tokenize, rids, st.text(), st.booleans()),
    st.builds(VocabRequest, rids),
    st.builds(Embed, rids, st.lists(ids, min_size=1, max_size=30).map(tuple)),
    st.builds(SlotCommand, rids, st.just("list")),
    st.builds(SlotCommand, rids, st.sampled_from(["save", "restore"]), ids, st.text()),
    st.builds(SlotCommand, rids, st.just("erase"), ids),
    st.builds(LoraLoad, rids, st.text()),
    st.builds(LoraUnload, rids, ids),
    st.builds(LoraScales, rids, st.lists(st.tuples(ids, st.floats(allow_nan=False, allow_infinity=False)),
                                         max_size=4).map(tuple)),
    st.just(Quit()),
)
events = st.one_of(
    st.builds(Ready, st.dictionaries(st.text(), json_values, max_size=6)),
    st.builds(Token, rids, ids),
    st.builds(Logprob, rids, logprobs, st.lists(st.tuples(ids, logprobs), max_size=20).map(tuple)),
    st.builds(Done, rids, st.sampled_from(sorted(DONE_REASONS)), pairs),
    st.builds(Tokens, rids, id_tuples),
    st.builds(Vocab, rids, st.lists(st.binary(max_size=64), max_size=40).map(tuple)),
    st.builds(Embedding, rids, st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                                        max_size=40).map(tuple)),
    st.builds(SlotInfo, rids, json_values),
    st.builds(Adapters, rids, st.lists(st.builds(LoraAdapter, ids, st.floats(allow_nan=False, allow_infinity=False),
                                                  st.text()), max_size=4).map(tuple)),
    st.builds(Error, st.none() | rids, messages),
    st.builds(Warn, st.none() | rids, messages),
)


def _exact(obj: Any) -> Any:
    """A comparable form that also tells -0.0 from 0.0 and keeps mapping order."""
    if isinstance(obj, float):
        return ("float", math.copysign(1.0, obj), repr(obj))
    if isinstance(obj, dict):
        return ("dict", [(k, _exact(v)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return ("seq", [_exact(x) for x in obj])
    if hasattr(obj, "__slots__") and not isinstance(obj, (str, bytes)):
        return (type(obj).__name__, [_exact(getattr(obj, f)) for f in obj.__slots__])
    return obj


# --- round trips -------------------------------------------------------------------------


@given(commands)
def test_command_round_trip(cmd: Command) -> None:
    line = encode_command(cmd)
    assert line.splitlines() == [line] and line.isascii()
    back = parse_command(line)
    assert back == cmd
    assert _exact(back) == _exact(cmd)  # key order and exact values survive
    assert parse_command(line + "\n") == cmd
    assert parse_command(line + "\r\n") == cmd
    assert encode_command(back) == line


@given(events)
def test_event_round_trip(ev: Event) -> None:
    line = encode_event(ev)
    assert line.splitlines() == [line]
    back = parse_event(line)
    assert back == ev
    assert _exact(back) == _exact(ev)
    assert parse_event(line + "\n") == ev
    assert parse_event(line + "\r\n") == ev
    assert encode_event(back) == line


@given(st.none() | rids, st.text())
def test_messages_with_line_breaks_stay_on_one_line(rid: str | None, message: str) -> None:
    line = encode_event(Error(rid, message))
    assert line.splitlines() == [line]
    back = parse_event(line + "\n")
    assert isinstance(back, Error) and back.rid == rid
    assert back.message == message.translate({ord(c): " " for c in LINE_BREAKS})


@given(st.lists(st.binary(max_size=70), max_size=50))
def test_vocab_payload_is_length_prefixed_pieces(pieces: list[bytes]) -> None:
    field = encode_event(Vocab("v", tuple(pieces))).split(" ")[2]
    expected = b"".join(len(p).to_bytes(2, "little") + p for p in pieces)
    assert field == (base64.b64encode(expected).decode() if expected else "-")


# --- exact lines -------------------------------------------------------------------------

EVENT_FIXTURES: list[tuple[str, Event]] = [
    ("T r1 42", Token("r1", 42)),
    ("LP r1 -0.5 3:-0.5 9:-1.25", Logprob("r1", -0.5, ((3, -0.5), (9, -1.25)))),
    ("LP r1 -inf 5:-inf", Logprob("r1", -math.inf, ((5, -math.inf),))),
    ("LP r-2 -1e-05", Logprob("r-2", -1e-05, ())),
    (
        "DONE r1 stop prompt=5 cached=0 gen=3",
        Done("r1", "stop", {"prompt": "5", "cached": "0", "gen": "3"}),
    ),
    ("DONE a_b cancelled", Done("a_b", "cancelled", {})),
    ("TOKENS t 1 22 333", Tokens("t", (1, 22, 333))),
    ("TOKENS t", Tokens("t", ())),
    # pieces b"a", b"", b"\xff": 01 00 'a' | 00 00 | 01 00 ff
    ("VOCAB v AQBhAAABAP8=", Vocab("v", (b"a", b"", b"\xff"))),
    ("VOCAB v -", Vocab("v", ())),
    # 1.0, -0.5 as float32 little-endian: 00 00 80 3f | 00 00 00 bf
    ("EMBEDDING e AACAPwAAAL8=", Embedding("e", (1.0, -0.5))),
    ('SLOTINFO s [{"id":0,"n_ctx":512}]', SlotInfo("s", [{"id": 0, "n_ctx": 512}])),
    ("ADAPTERS l 0:1.0:YS5nZ3Vm 3:0.0:Yi5nZ3Vm", Adapters("l", (LoraAdapter(0, 1.0, "a.gguf"), LoraAdapter(3, 0.0, "b.gguf")))),
    ("ADAPTERS l", Adapters("l", ())),
    ("ERR r1 prompt is empty", Error("r1", "prompt is empty")),
    ("ERR - engine  out of memory ", Error(None, "engine  out of memory ")),
    ("WARN r1 unknown key foo", Warn("r1", "unknown key foo")),
    ("WARN - ", Warn(None, "")),
    (
        'READY {"protocol":1,"n_vocab":32000,"eos":[2],"name":"a b"}',
        Ready({"protocol": 1, "n_vocab": 32000, "eos": [2], "name": "a b"}),
    ),
]

COMMAND_FIXTURES: list[tuple[str, Command]] = [
    ("GEN a temperature=0.8 : 1 2", Gen("a", {"temperature": "0.8"}, (1, 2))),
    ("GEN a :", Gen("a", {}, ())),
    (
        "GEN r-1 grammar=json_schema:eyJ9 bias=5:-1.5,7:2 stop_ids=2,3 x=a=b : 5 6 7",
        Gen(
            "r-1",
            {"grammar": "json_schema:eyJ9", "bias": "5:-1.5,7:2", "stop_ids": "2,3", "x": "a=b"},
            (5, 6, 7),
        ),
    ),
    ("CANCEL a", Cancel("a")),
    ("TOKENIZE r aGk=", Tokenize("r", "hi")),
    ("TOKENIZE r - special=1", Tokenize("r", "", True)),
    ("TOKENIZE r 4pyTIMOp", Tokenize("r", "✓ é")),
    ("VOCAB r", VocabRequest("r")),
    ("EMBED e 1 22 333", Embed("e", (1, 22, 333))),
    ("SLOT s list", SlotCommand("s", "list")),
    ("SLOT s save 1 L3RtcC9hLmJpbg==", SlotCommand("s", "save", 1, "/tmp/a.bin")),
    ("SLOT s erase 0", SlotCommand("s", "erase", 0)),
    ("LORA l load YS5nZ3Vm", LoraLoad("l", "a.gguf")),
    ("LORA l unload 3", LoraUnload("l", 3)),
    ("LORA l scales 0:0.5,2:1.0", LoraScales("l", ((0, 0.5), (2, 1.0)))),
    ("LORA l scales -", LoraScales("l", ())),
    ("QUIT", Quit()),
]


@pytest.mark.parametrize(("line", "event"), EVENT_FIXTURES)
def test_event_fixture(line: str, event: Event) -> None:
    assert parse_event(line) == event
    assert parse_event(line + "\n") == event
    assert encode_event(event) == line


@pytest.mark.parametrize(("line", "command"), COMMAND_FIXTURES)
def test_command_fixture(line: str, command: Command) -> None:
    assert parse_command(line) == command
    assert parse_command(line + "\r\n") == command
    assert encode_command(command) == line


def test_gen_keeps_key_order() -> None:
    gen = parse_command("GEN a z=1 a=2 m=3 : 7")
    assert isinstance(gen, Gen) and list(gen.keys) == ["z", "a", "m"]
    assert encode_command(Gen("a", {"z": "1", "a": "2"}, (7,))) == "GEN a z=1 a=2 : 7"


def test_parsers_tolerate_extra_whitespace_between_fields() -> None:
    assert parse_event("T  r1\t7 \n") == Token("r1", 7)
    assert parse_command("GEN  a  k=v  :  1  2") == Gen("a", {"k": "v"}, (1, 2))
    assert parse_command("TOKENIZE r aGk= special=0") == Tokenize("r", "hi", False)


def test_ready_is_compact_json_and_carries_the_version() -> None:
    line = encode_event(Ready({"protocol": PROTOCOL_VERSION, "template": "a\nb ü"}))
    assert line == 'READY {"protocol":1,"template":"a\\nb \\u00fc"}'
    assert json.loads(line[len("READY ") :])["protocol"] == 1


def test_logprob_floats_are_written_exactly() -> None:
    value = -0.1 - 0.2  # -0.30000000000000004: a short format would lose it
    line = encode_event(Logprob("r", value, ((1, 5e-324),)))
    assert line == "LP r -0.30000000000000004 1:5e-324"
    back = parse_event(line)
    assert isinstance(back, Logprob) and back.logprob == value and back.top[0][1] == 5e-324


# --- malformed lines ---------------------------------------------------------------------

BAD_EVENTS = [
    ("", "empty line"),
    ("  \n", "empty line"),
    ("X r1", "unknown event 'X'"),
    ("t r1 5", "unknown event 't'"),
    ("T r1", "expected 'T <rid> <id>'"),
    ("T r1 5 6", "expected 'T <rid> <id>'"),
    ("T r!1 5", "bad rid 'r!1'"),
    ("T - 5", "bad rid '-'"),
    ("T r1 -3", "bad token id '-3'"),
    ("T r1 +3", "bad token id '+3'"),
    ("T r1 1_0", "bad token id '1_0'"),
    ("T r1 \u0663", "bad token id"),  # an Arabic-Indic digit: int() would take it
    ("T r1 5.0", "bad token id '5.0'"),
    ("T r1 " + "9" * 5000, "T r1 999"),
    ("LP r1", "expected 'LP <rid> <logprob>"),
    ("LP r1 nan", "bad logprob 'nan'"),
    ("LP r1 x", "bad logprob 'x'"),
    ("LP r1 -0.5 3-0.5", "bad alternative '3-0.5'"),
    ("LP r1 -0.5 x:-0.5", "bad token id 'x'"),
    ("LP r1 -0.5 3:NaN", "bad logprob 'NaN'"),
    ("DONE r1", "expected 'DONE <rid> <reason>"),
    ("DONE r1 finished", "bad reason 'finished'"),
    ("DONE r1 stop prompt", "expected key=value, got 'prompt'"),
    ("DONE r1 stop Prompt=1", "bad key 'Prompt'"),
    ("DONE r1 stop prompt=", "bad value ''"),
    ("DONE r1 stop a=1 a=2", "key 'a' given twice"),
    ("TOKENS", "expected 'TOKENS <rid>"),
    ("TOKENS r1 1 x 3", "bad token id 'x'"),
    ("VOCAB r1", "expected 'VOCAB <rid> <b64>'"),
    ("VOCAB r1 !!!!", "bad base64"),
    ("VOCAB r1 AQ==", "truncated in piece 0"),
    ("VOCAB r1 AQBhAgBi", "truncated in piece 1"),
    ("EMBEDDING r1", "expected 'EMBEDDING <rid> <b64>'"),
    ("EMBEDDING r1 AAA=", "is not float32s"),
    ("EMBEDDING r1 AADAfw==", "only finite values"),  # NaN
    ("READY", "expected 'READY <json object>'"),
    ("READY [1]", "must be an object, got list"),
    ("READY {", "bad READY json"),
    ("READY " + "[" * 100_000, "bad READY json"),
    ("ERR", "expected 'ERR <rid or -> <message>'"),
    ("ERR\tr1 oops", "single-spaced"),
    ("ERR r!1 oops", "bad rid 'r!1'"),
    ("WARN - two\rlines", "line break"),
]

BAD_COMMANDS = [
    ("", "empty line"),
    ("STOP a", "unknown command 'STOP'"),
    ("GEN", "with a lone ':'"),
    ("GEN a 1 2", "with a lone ':'"),
    ("GEN a t=1: 1", "with a lone ':'"),
    ("GEN a! : 1", "bad rid 'a!'"),
    ("GEN a Temp=1 : 1", "bad key 'Temp'"),
    ("GEN a t= : 1", "bad value ''"),
    ("GEN a top_k : 1", "expected key=value, got 'top_k'"),
    ("GEN a t=1 t=2 : 1", "key 't' given twice"),
    ("GEN a : 1 -2", "bad token id '-2'"),
    ("GEN a : 1 : 2", "bad token id ':'"),
    ("CANCEL", "expected 'CANCEL <rid>'"),
    ("CANCEL a b", "expected 'CANCEL <rid>'"),
    ("TOKENIZE a", "expected 'TOKENIZE <rid> <b64 text>"),
    ("TOKENIZE a aGk= special=2", "bad TOKENIZE flags 'special=2'"),
    ("TOKENIZE a aGk= special=1 x", "bad TOKENIZE flags"),
    ("TOKENIZE a aGk", "bad base64 'aGk'"),
    ("TOKENIZE a //8=", "not UTF-8"),
    ("VOCAB", "expected 'VOCAB <rid>'"),
    ("EMBED a", "expected 'EMBED <rid> <id> ...'"),
    ("LORA a unload", "expected 'LORA <rid> load"),
    ("LORA a drop 1", "bad LORA operation 'drop'"),
    ("LORA a scales 0:nan", "bad LoRA scale 'nan'"),
    ("EMBED a 1 x", "bad token id 'x'"),
    ("QUIT now", "expected 'QUIT'"),
    ("SLOT s drop 1", "bad SLOT action 'drop'"),
    ("SLOT s save 1", "expected 'SLOT <rid> save <slot> <b64 path>'"),
    ("SLOT s erase x", "bad token id 'x'"),
]


@pytest.mark.parametrize(("line", "why"), BAD_EVENTS)
def test_bad_event(line: str, why: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_event(line)
    assert why in str(info.value)
    assert len(str(info.value)) < 400  # the line is quoted, but truncated


@pytest.mark.parametrize(("line", "why"), BAD_COMMANDS)
def test_bad_command(line: str, why: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_command(line)
    assert why in str(info.value)
    assert line.strip() == "" or repr(line)[:-1] in str(info.value)  # quotes the line


def test_direction_matters() -> None:
    assert parse_command("VOCAB r1") == VocabRequest("r1")
    with pytest.raises(ProtocolError, match="expected 'VOCAB <rid> <b64>'"):
        parse_event("VOCAB r1")
    with pytest.raises(ProtocolError, match="unknown command 'T'"):
        parse_command("T r1 5")


BAD_TO_ENCODE: list[tuple[Event | Command, str]] = [
    (Token("a b", 1), "bad rid 'a b'"),
    (Token("", 1), "bad rid ''"),
    (Token("-", 1), "bad rid '-'"),
    (Token("a", -1), "bad token id -1"),
    (Token("a", 1.0), "cannot be interpreted as an integer"),  # type: ignore[arg-type]
    (Logprob("a", math.nan, ()), "cannot be NaN"),
    (Logprob("a", -1.0, ((1, math.nan),)), "cannot be NaN"),
    (Done("a", "finished", {}), "bad reason 'finished'"),
    (Done("a", "stop", {"t": "1 ms"}), "bad value '1 ms'"),
    (Tokens("a", (1, -2)), "bad token id -2"),
    (Vocab("a", (b"x", b"y" * 70_000)), "vocab piece 1 is 70000 bytes"),
    (Error("-", "x"), "bad rid '-'"),
    (Ready({"x": object()}), "not JSON serializable"),
    (Gen("a", {"Temp": "1"}, ()), "bad key 'Temp'"),
    (Gen("a", {"k": ""}, ()), "bad value ''"),
    (Gen("a", {"k": "a b"}, ()), "bad value 'a b'"),
    (Gen("a", {"k": "é"}, ()), "bad value 'é'"),
    (Gen("a", {"k": 5}, ()), "bad value 5"),  # type: ignore[dict-item]
    (Gen("a", {}, (1, -1)), "bad token id -1"),
    (Tokenize("a", "\ud800"), "surrogates not allowed"),
    (Cancel("a\n"), "bad rid"),
    (Embed("a", ()), "at least one token id"),
    (Embedding("a", (1.0, math.inf)), "only finite values"),
    (Embedding("a", (1e300,)), "float too large"),
]


@pytest.mark.parametrize(("obj", "why"), BAD_TO_ENCODE)
def test_bad_value_to_encode(obj: Event | Command, why: str) -> None:
    encode = (
        encode_command
        if isinstance(obj, Command)
        else encode_event
    )
    with pytest.raises(ProtocolError) as info:
        encode(obj)  # type: ignore[arg-type]
    assert why in str(info.value) and "cannot encode" in str(info.value)


def test_numpy_style_integers_encode() -> None:
    class Int:  # what numpy.int64 offers: __index__, not an int subclass
        def __index__(self) -> int:
            return 7

    assert encode_event(Token("r", Int())) == "T r 7"  # type: ignore[arg-type]


# --- arbitrary input never escapes as another exception type -----------------------------

VERBS = [
    "T",
    "LP",
    "DONE",
    "TOKENS",
    "VOCAB",
    "ERR",
    "WARN",
    "READY",
    "GEN",
    "CANCEL",
    "TOKENIZE",
    "EMBED",
    "EMBEDDING",
    "SLOT",
    "SLOTINFO",
    "LORA",
    "ADAPTERS",
    "QUIT",
    ":",
]
fields = st.one_of(
    st.sampled_from(VERBS),
    rids,
    ids.map(str),
    st.text(max_size=12),
    values,
    st.builds(lambda k, v: f"{k}={v}", keys, st.text(max_size=8)),
    st.builds(lambda i, f: f"{i}:{f}", st.integers(), st.floats().map(repr)),
    st.binary(max_size=20).map(lambda b: base64.b64encode(b).decode()),
)
lines = st.one_of(
    st.text(),
    st.builds(
        lambda vs, sep: sep.join(vs),
        st.lists(fields, max_size=8),
        st.sampled_from([" ", "  ", "\t"]),
    ),
    st.builds(lambda v, rest: f"{v} {rest}", st.sampled_from(VERBS), st.text()),
)


def _mutate(line: str, pos: int, junk: str, cut: int) -> str:
    pos %= len(line) + 1
    return line[:pos] + junk + line[pos + cut :]


@given(lines)
@example("T r1 " + "1" * 5000)
@example("READY " + "{" * 5000)
@example("READY 1e999999")
def test_parsers_raise_only_protocol_error(line: str) -> None:
    for parse in (parse_event, parse_command):
        try:
            parse(line)
        except ProtocolError:
            pass


@given(events | commands, st.integers(0, 10_000), st.text(max_size=3), st.integers(0, 3))
def test_mutated_lines_raise_only_protocol_error(obj: Any, pos: int, junk: str, cut: int) -> None:
    is_event = not isinstance(obj, Command)
    line = _mutate(encode_event(obj) if is_event else encode_command(obj), pos, junk, cut)
    for parse in (parse_event, parse_command):
        try:
            parse(line)
        except ProtocolError:
            pass


@given(st.text(alphabet=string.printable, max_size=40))
def test_error_messages_name_the_line(junk: str) -> None:
    line = "T " + junk + " !"
    with pytest.raises(ProtocolError) as info:
        parse_event(line)
    assert "in line 'T " in str(info.value) or 'in line "T ' in str(info.value)


# ---- grammar values: free text through a GEN key ------------------------------------------


@given(st.sampled_from(proto.GRAMMAR_KINDS), st.text())
def test_grammar_text_round_trips_through_a_gen_line(kind: str, text: str) -> None:
    value = proto.encode_grammar(kind, text)
    line = encode_command(Gen("g", {"grammar": value, "max_tokens": "3"}, (1, 2)))
    assert "\n" not in line and line.isascii()
    cmd = parse_command(line + "\n")
    assert isinstance(cmd, Gen) and cmd.keys["max_tokens"] == "3"
    assert proto.parse_grammar(cmd.keys["grammar"]) == (kind, text)


def test_grammar_values_with_spaces_newlines_and_equals() -> None:
    lark = 'start: "a = b" obj\nobj: %json{"type": "object"}\n'
    value = proto.encode_grammar("lark", lark)
    assert " " not in value and "=" not in value.partition(":")[0]
    assert proto.parse_grammar(value) == ("lark", lark)
    assert proto.parse_grammar(proto.encode_grammar("json_object")) == ("json_object", "")
    assert proto.parse_grammar("regex:-") == ("regex", "")


@pytest.mark.parametrize(
    "value, message",
    [("bnf:eyJ9", "bad grammar"), ("lark", "bad grammar"), ("lark:%%%", "bad base64"),
     ("lark:/w==", "not UTF-8")],
)  # fmt: skip
def test_bad_grammar_values(value: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        proto.parse_grammar(value)
    with pytest.raises(ProtocolError, match="bad grammar kind"):
        proto.encode_grammar("gbnf", "x")
