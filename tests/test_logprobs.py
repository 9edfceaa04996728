"""Logprob entries aligned with the text: real byte pieces that split characters."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_core.api.bodies import completion_logprobs as legacy
from strata_core.api.bodies import entry_body
from strata_core.contract.protocol import Logprob
from strata_core.text.detokenize import Detokenizer
from strata_core.text.logprobs import UNLIKELY, Aligner, Alt, Entry, Span

# A small vocabulary whose pieces split multi-byte characters the way byte-fallback
# and BPE vocabularies do. 😀 = F0 9F 98 80, 東 = E6 9D B1, 京 = E4 BA AC, é = C3 A9,
# € = E2 82 AC.
PIECES: list[bytes] = [
    b"Hello", b" ", b"\xf0", b"\x9f", b"\x98", b"\x80",  # 0-5
    b"\xf0\x9f", b"\x98\x80", b"\xf0\x9f\x98", b"!",  # 6-9
    b"\xe6\x9d", b"\xb1\xe4", b"\xba\xac",  # 10-12: 東 | 京 straddling a token edge
    b"caf", b"\xc3", b"\xa9", b"\xc3\xa9",  # 13-16
    b"\xe2", b"\x82\xac", b"5",  # 17-19
    b"def", b" f", b"(x", b"):", b"\n", b"    return", b" x", b"+1",  # 20-27
    b"</think>", b"\n\n", b"\n\nThe", b" answer", b"",  # 28-32 (32: empty piece)
    b"\x98\x80!", b"A", b"\xff", b"\xe6\x9d\xb1",  # 33-36
]
V = {p: i for i, p in enumerate(PIECES)}


def lp(logprob: float, *top: tuple[int, float]) -> Logprob:
    return Logprob("r", logprob, tuple(top))


def run(ids: list[int], alternatives: int = 0, lps: list[Logprob] | None = None) -> Aligner:
    a = Aligner(PIECES, alternatives)
    for n, i in enumerate(ids):
        a.add(i, lps[n] if lps else lp(-0.5 - n))
    a.flush()
    return a


def spelled(entries: list[Entry]) -> tuple[str, bytes]:
    return "".join(e.token for e in entries), b"".join(bytes(e.bytes) for e in entries)


def ids(*pieces: bytes) -> list[int]:
    return [V[p] for p in pieces]


# ---- alignment ---------------------------------------------------------------------------


def test_emoji_in_four_tokens_belongs_to_the_last():
    a = run(ids(b"Hello", b" ", b"\xf0", b"\x9f", b"\x98", b"\x80", b"!"))
    es = a.entries()
    assert [e.token for e in es] == ["Hello", " ", "", "", "", "😀", "!"]
    assert [e.bytes for e in es] == [
        tuple(b"Hello"), (0x20,), (0xF0,), (0x9F,), (0x98,), (0x80,), (0x21,)
    ]
    assert spelled(es) == ("Hello 😀!", "Hello 😀!".encode())
    assert a.text == "Hello 😀!"


@pytest.mark.parametrize(
    "pieces, tokens",
    [
        ((b"\xf0\x9f", b"\x98\x80"), ["", "😀"]),
        ((b"\xf0\x9f\x98", b"\x80"), ["", "😀"]),
        ((b"\xf0", b"\x9f", b"\x98\x80!"), ["", "", "😀!"]),
        ((b"\xe6\x9d", b"\xb1\xe4", b"\xba\xac"), ["", "東", "京"]),
        ((b"caf", b"\xc3", b"\xa9"), ["caf", "", "é"]),
        ((b"caf", b"\xc3\xa9", b" ", b"\xe2", b"\x82\xac", b"5"), ["caf", "é", " ", "", "€", "5"]),
    ],
)
def test_split_characters_sit_with_the_token_that_finishes_them(pieces, tokens):
    a = run(ids(*pieces))
    es = a.entries()
    assert [e.token for e in es] == tokens
    assert [bytes(e.bytes) for e in es] == list(pieces)  # each token's own bytes
    text = b"".join(pieces).decode()
    assert spelled(es) == (text, text.encode())


def test_code_and_ids_and_logprobs_follow_the_tokens():
    seq = ids(b"def", b" f", b"(x", b"):", b"\n", b"    return", b" x", b"+1")
    a = run(seq)
    es = a.entries()
    assert [e.id for e in es] == seq
    assert [e.logprob for e in es] == [-0.5 - n for n in range(len(seq))]
    assert spelled(es)[0] == "def f(x):\n    return x+1"


def test_add_and_flush_match_the_detokenizer():
    seq = ids(b"Hello", b"\xf0", b"\x9f", b"\x98\x80!", b"\xe6\x9d", b"\xb1\xe4", b"\xff",
              b"A", b"\xc3")
    a, d = Aligner(PIECES), Detokenizer(PIECES)
    for i in seq:
        assert a.add(i) == d.feed(i)
    assert a.flush() == d.flush() == "\ufffd"
    assert a.text == b"".join(PIECES[i] for i in seq).decode("utf-8", "replace")


def test_invalid_bytes_still_spell_the_text():
    # F0 then "A": the decoder emits U+FFFD for F0 only when "A" arrives; \xff alone is
    # one U+FFFD; a dangling \xc3 becomes U+FFFD at flush, owned by the last byte token.
    seq = ids(b"\xf0", b"A", b"\xff", b"A", b"\xc3", b"")
    a = run(seq)
    es = a.entries()
    assert [e.token for e in es] == ["", "\ufffdA", "\ufffd", "A", "\ufffd"]
    raw = b"".join(PIECES[i] for i in seq)
    assert spelled(es) == (raw.decode("utf-8", "replace"), raw)
    # a span holding only the first U+FFFD: its bytes sit in one token, its text in the next
    es = a.entries(0, 1)
    assert [(e.token, bytes(e.bytes)) for e in es] == [("", b"\xf0"), ("\ufffd", b"")]


def test_empty_pieces_make_no_entry():
    a = run(ids(b"Hello", b"", b"!", b""))
    assert [e.token for e in a.entries()] == ["Hello", "!"]


# ---- spans: reasoning, stop strings ------------------------------------------------------


def test_content_after_think_leaves_out_the_tag_and_cuts_the_newlines():
    a = run(ids(b"Hello", b"</think>", b"\n\nThe", b" answer"))
    start = a.text.index("</think>\n\n") + len("</think>\n\n")
    es = a.entries(start)
    assert [(e.token, bytes(e.bytes)) for e in es] == [("The", b"The"), (" answer", b" answer")]
    assert [e.id for e in es] == ids(b"\n\nThe", b" answer")
    assert [e.token for e in a.entries(0, a.text.index("</think>"))] == ["Hello"]


def test_stop_string_mid_token_keeps_the_part_before_the_cut():
    a = run(ids(b"Hello", b" ", b"\xf0\x9f", b"\x98\x80!", b"caf", b"\xc3\xa9"))
    text = a.text  # "Hello 😀!café"
    cut = text.index("!c")  # a stop string "!c" cuts inside "😀!" and drops "caf" after it
    es = a.entries(0, cut)
    assert [e.token for e in es] == ["Hello", " ", "", "😀"]
    assert bytes(es[-1].bytes) == b"\x98\x80"
    assert es[-1].logprob == -0.5 - 3  # the cut entry keeps its token's logprob
    assert spelled(es) == (text[:cut], text[:cut].encode())


def test_cut_before_a_split_character_drops_its_partial_tokens():
    a = run(ids(b"Hello", b"\xf0", b"\x9f", b"\x98\x80!"))
    es = a.entries(0, len("Hello"))
    assert [e.token for e in es] == ["Hello"]
    assert spelled(es) == ("Hello", b"Hello")
    assert a.entries(0, 0) == []


def test_cut_inside_a_token_that_finishes_one_character_and_starts_another():
    a = run(ids(b"\xe6\x9d", b"\xb1\xe4", b"\xba\xac"))
    es = a.entries(0, 1)  # "東": 東's bytes, without the E4 that starts 京
    assert [(e.token, bytes(e.bytes)) for e in es] == [("", b"\xe6\x9d"), ("東", b"\xb1")]
    es = a.entries(1, 2)  # "京"
    assert [(e.token, bytes(e.bytes)) for e in es] == [("", b"\xe4"), ("京", b"\xba\xac")]


def test_bad_spans_are_refused():
    a = run(ids(b"Hello"))
    with pytest.raises(ValueError, match=r"span \[3, 2\)"):
        a.entries(3, 2)
    with pytest.raises(ValueError, match="<= 5"):
        a.entries(0, 6)
    with pytest.raises(ValueError, match="token id 999 is out of range"):
        Aligner(PIECES).add(999)
    with pytest.raises(ValueError, match="alternatives = 21"):
        Aligner(PIECES, 21)
    with pytest.raises(RuntimeError, match="after flush"):
        a.add(0)


# ---- streaming ---------------------------------------------------------------------------


def test_span_holds_a_token_until_its_text_is_released():
    a = Aligner(PIECES)
    s = Span(a, 0)
    a.add(V[b"Hello"])
    a.add(V[b"\xf0\x9f"])
    assert [e.token for e in s.take(len(a))] == ["Hello"]  # F0 9F waits for its character
    a.add(V[b"\x98\x80!"])
    # a stop matcher released "😀" and holds "!": the token "😀!" waits
    assert [(e.token, bytes(e.bytes)) for e in s.take(len("Hello😀"))] == [("", b"\xf0\x9f")]
    assert [e.token for e in s.take(len(a))] == ["😀!"]
    a.add(V[b"caf"])
    assert [e.token for e in s.close(len(a) - 1)] == ["ca"]  # stopped by "f"
    with pytest.raises(RuntimeError, match="closed"):
        s.take(len(a))


# ---- top alternatives and shapes ---------------------------------------------------------


def test_alternatives_sorted_cut_to_k_with_their_own_text_and_bytes():
    top = ((V[b"!"], -2.0), (V[b"\x98\x80"], -0.1), (V[b"A"], -2.0), (V[b"\xe6\x9d\xb1"], -1.0))
    a = Aligner(PIECES, alternatives=3)
    a.add(V[b"\xf0\x9f"], lp(-0.2, *top))
    a.add(V[b"\x98\x80"], lp(-0.1, *top))
    e = a.entries()[1]
    assert e.token == "😀"
    assert e.top == (
        Alt("\ufffd\ufffd", -0.1, (0x98, 0x80)),  # a piece of a character reads as U+FFFD
        Alt("東", -1.0, tuple("東".encode())),
        Alt("!", -2.0, (0x21,)),  # tie at -2.0: the lower id first
    )
    assert bytes(e.top[0].bytes) == bytes(e.bytes)  # the chosen one, matched by bytes
    assert Aligner(PIECES, 0).add(0, lp(-0.1, *top)) == "Hello"
    a0 = Aligner(PIECES, 0)
    a0.add(V[b"A"], lp(-0.1, *top))
    assert a0.entries()[0].top == ()
    assert entry_body(a0.entries()[0])["top_logprobs"] == []


def test_chat_shape_and_json_safe_logprobs():
    a = Aligner(PIECES, alternatives=2)
    a.add(V[b"A"], lp(-math.inf, (V[b"A"], -math.inf), (V[b"!"], -math.inf)))
    a.add(V[b"!"], None)  # a token whose LP line never came
    es = [entry_body(e) for e in a.entries()]
    assert es[0] == {
        "token": "A",
        "logprob": UNLIKELY,
        "bytes": [0x41],
        "top_logprobs": [
            {"token": "!", "logprob": UNLIKELY, "bytes": [0x21]},
            {"token": "A", "logprob": UNLIKELY, "bytes": [0x41]},
        ],
    }
    assert es[1] == {"token": "!", "logprob": UNLIKELY, "bytes": [0x21], "top_logprobs": []}
    json.dumps(es, allow_nan=False)


def test_legacy_arrays_offsets_and_key_collisions():
    top = ((V[b"\x98"], -0.5), (V[b"\x80"], -0.7), (V[b"A"], -0.9))
    lps = [lp(-0.1, *top), lp(-0.2, *top), lp(-0.3, *top), lp(-0.4, *top)]
    a = run(ids(b"Hello", b"\xf0\x9f", b"\x98\x80", b"!"), alternatives=3, lps=lps)
    out = legacy(a.entries(), text_offset0=7)
    assert set(out) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len({len(v) for v in out.values()}) == 1
    assert out["tokens"] == ["Hello", "", "😀", "!"]
    assert out["token_logprobs"] == [-0.1, -0.2, -0.3, -0.4]
    assert out["text_offset"] == [7, 12, 12, 13]
    # \x98 and \x80 both read U+FFFD: the more likely one keeps the key
    assert out["top_logprobs"][0] == {"\ufffd": -0.5, "A": -0.9}
    assert legacy([]) == {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


# ---- properties --------------------------------------------------------------------------


@st.composite
def split_text(draw: st.DrawFn) -> list[bytes]:
    """Valid UTF-8 text with multi-byte characters, cut into pieces at any byte."""
    text = draw(st.text(st.sampled_from("ab \n€é東京😀\u00e9\U0001f600"), max_size=30))
    raw = text.encode()
    cuts = sorted(draw(st.sets(st.integers(0, len(raw)), max_size=len(raw) + 1)))
    bounds = [0, *cuts, len(raw)]
    return [raw[i:j] for i, j in itertools.pairwise(bounds)]


@settings(max_examples=150, deadline=None)
@given(split_text(), st.data())
def test_valid_utf8_pieces_spell_the_text_and_any_span(pieces, data):
    a = Aligner(pieces)
    for i in range(len(pieces)):
        a.add(i)
    assert a.flush() == ""
    text = b"".join(pieces).decode()
    es = a.entries()
    assert spelled(es) == (text, b"".join(pieces))
    for e in es:  # every token keeps its own bytes; only a character's last token has it
        assert bytes(e.bytes) == pieces[e.id]
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    assert spelled(a.entries(start, end)) == (text[start:end], text[start:end].encode())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=4), max_size=12), st.data())
def test_any_bytes_spell_the_replace_decoding(pieces, data):
    a, d = Aligner(pieces), Detokenizer(pieces)
    for i in range(len(pieces)):
        assert a.add(i) == d.feed(i)
    assert a.flush() == d.flush()
    raw = b"".join(pieces)
    text = raw.decode("utf-8", "replace")
    assert a.text == text
    assert spelled(a.entries()) == (text, raw)
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    tokens, got = spelled(a.entries(start, end))
    assert tokens == text[start:end]
    assert got.decode("utf-8", "replace") == text[start:end]


@settings(max_examples=100, deadline=None)
@given(split_text(), st.data())
def test_streamed_span_hands_out_each_entry_once_and_spells_the_span(pieces, data):
    a = Aligner(pieces)
    start = released = 0
    span: Span | None = None
    got: list[Entry] = []
    for i in range(len(pieces)):
        a.add(i)
        if span is None and data.draw(st.booleans()):
            start = released = data.draw(st.integers(0, len(a)))
            span = Span(a, start)
        if span is not None:  # a stop matcher may hold back a tail of the text
            released = data.draw(st.integers(released, len(a)))
            got += span.take(released)
    if span is None:
        span = Span(a, start)
    end = data.draw(st.integers(released, len(a)))
    got += span.close(end)
    assert got == a.entries(start, end)
    assert len({e.id for e in got}) == len(got)  # ids are the piece indexes: each once
