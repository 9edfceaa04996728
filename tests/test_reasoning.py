"""The <think> splitter, and a chat choice's text and logprob entries split between
reasoning and content (server.ChoiceText), at every chunk and token boundary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_core.contract.events import TokenEvent
from strata_core.contract.protocol import Logprob
from strata_core.text.choice import ChatShape, ChoiceText
from strata_core.text.reasoning import Piece, ThinkSplitter, prompt_opens_think


def split(
    text: str, thinking: bool = False, cuts: list[int] | None = None, ends: tuple[str, ...] = ()
) -> tuple[str, str, list[Piece]]:
    s = ThinkSplitter(thinking, ends=ends)
    pieces: list[Piece] = []
    at = 0
    for c in sorted(cuts or []) + [len(text)]:
        pieces += s.push(text[at:c])
        at = c
    pieces += s.flush()
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind == "content")
    return reasoning, content, pieces


CASES = [
    # (reply, the prompt opened <think>, reasoning, content)
    ("<think>\nLet me add.\n</think>\n\nThe answer is 4.", False, "\nLet me add.\n", "The answer is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("Let me add.</think>\n\n4", True, "Let me add.", "4"),
    ("<think>Let me add.</think>4", True, "Let me add.", "4"),  # repeats the prompt's tag
    ("The answer is 4.", False, "", "The answer is 4."),
    ("The answer </think> is 4.", False, "", "The answer </think> is 4."),  # not thinking
    ("x <think>y</think>", False, "", "x <think>y</think>"),  # a tag later is text
    ("Still thinking", True, "Still thinking", ""),  # cut by max_tokens
    ("<think>unfinished </thi", False, "unfinished </thi", ""),
    ("<thin", False, "", "<thin"),  # a partial tag that never completed
    ("<think>a</think>\n\n", False, "a", ""),
    ("</think>\n\nThe answer is 4.", False, "", "The answer is 4."),  # an empty reasoning, closed at once
    (" </think>4", True, "", "4"),
    ("</thi", False, "", "</thi"),  # a partial tag that never completed
    ("", True, "", ""),
    ("a<think>b</think>c", True, "ab", "c"),  # reasoning does not nest: the inner tag is markup
    ("<think>a.</assistant><think>b", False, "a.</assistant>b", ""),  # written on past the turn
]


@pytest.mark.parametrize("reply,thinking,reasoning,content", CASES)
def test_split(reply: str, thinking: bool, reasoning: str, content: str) -> None:
    for cuts in [None, *([i] for i in range(len(reply) + 1)), list(range(1, len(reply)))]:
        r, c, pieces = split(reply, thinking, cuts)
        assert (r, c) == (reasoning, content), cuts
        for p in pieces:
            assert reply[p.start : p.end] == p.text


def test_a_reasoning_never_closed_ends_where_a_calls_section_opens() -> None:
    """The marker begins the content (its calls come after the reasoning, never inside)."""
    for reply, reasoning, content in (("plan <tool_calls>[]", "plan ", "<tool_calls>[]"),
                                      ("plan </think><tool_calls>", "plan ", "<tool_calls>"),
                                      ("a <tool_calls</think>b", "a <tool_calls", "b")):  # fmt: skip
        for cuts in [None, *([i] for i in range(len(reply) + 1)), list(range(1, len(reply)))]:
            r, c, pieces = split(reply, True, cuts, ends=("<tool_calls>",))
            assert (r, c) == (reasoning, content), cuts
            assert all(reply[p.start : p.end] == p.text for p in pieces)


_FRAGMENTS = ["<think>", "</think>", "<", "/", "think", ">", "\n", " ", "a", "é", "😀", "<thi", "nk>"]


@given(
    st.lists(st.sampled_from(_FRAGMENTS), max_size=14),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=80), max_size=6),
)
def test_any_chunking_gives_the_same_split(parts: list[str], thinking: bool, cuts: list[int]) -> None:
    reply = "".join(parts)
    whole = split(reply, thinking)
    chunked = split(reply, thinking, [c for c in cuts if c <= len(reply)])
    assert chunked[:2] == whole[:2]
    for p in chunked[2]:
        assert reply[p.start : p.end] == p.text


@given(st.text(alphabet="ab \n", max_size=20), st.text(alphabet="ab \n", max_size=20))
def test_well_formed_replies_never_leak_tags(reasoning: str, content: str) -> None:
    reply = f"<think>{reasoning}</think>\n\n{content}"
    r, c, _ = split(reply)
    assert r == reasoning and c == content.lstrip()
    assert "<think>" not in c and "</think>" not in c


def test_prompt_opens_think() -> None:
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_think("<|im_start|>assistant\n")
    assert prompt_opens_think("<think>old</think> ... <|im_start|>assistant\n<think>")


# ---- ChoiceText: the server's split, with logprob entries --------------------------------

PIECES = [b"<think>", b"</think>", b"\n", b"Hi", b" there", b"\xe2\x82", b"\xac", b"</", b"think>\n\nok", b"4"]


def choice_of(ids: list[int], thinking: bool = False, alternatives: int | None = 0) -> dict[str, object]:
    ct = ChoiceText(list(PIECES), [], alternatives, ChatShape(thinking))
    reasoning, content = "", ""
    r_entries: list[bytes] = []
    c_entries: list[bytes] = []
    deltas = [ct.push(TokenEvent(t, Logprob("r", -0.5, ((t, -0.5),)))) for t in ids] + [ct.end()]
    for d in deltas:
        reasoning += d.reasoning
        content += d.text
        r_entries += [bytes(e.bytes) for e in d.reasoning_entries or []]
        c_entries += [bytes(e.bytes) for e in d.entries or []]
    return {"reasoning": reasoning, "content": content, "r": b"".join(r_entries).decode(),
            "c": b"".join(c_entries).decode()}  # fmt: skip


@pytest.mark.parametrize(
    "ids,thinking,reasoning,content",
    [
        ([0, 3, 4, 1, 2, 2, 9], False, "Hi there", "4"),
        ([3, 5, 6, 1, 2, 9], True, "Hi€", "4"),  # € split across two tokens
        ([3, 7, 8], True, "Hi", "ok"),  # </think> split, and glued to the content
        ([3, 4], False, "", "Hi there"),
        ([0, 3], False, "Hi", ""),
    ],
)
def test_choice_entries_spell_reasoning_and_content(
    ids: list[int], thinking: bool, reasoning: str, content: str
) -> None:
    got = choice_of(ids, thinking)
    assert got == {"reasoning": reasoning, "content": content, "r": reasoning, "c": content}
    plain = choice_of(ids, thinking, alternatives=None)  # without logprobs: the same text
    assert (plain["reasoning"], plain["content"]) == (reasoning, content)
