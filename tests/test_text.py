"""Stop strings in streamed text, and the held-back tail they share with tag parsers."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from strata_core.text.detokenize import StopMatcher, held_prefix


def test_held_prefix() -> None:
    assert held_prefix("abc<thi", "<think>") == 4
    assert held_prefix("abc", "<think>") == 0
    assert held_prefix("<think>", "<think>") == 0  # the whole tag is not held: it is found
    assert held_prefix("x<", "<") == 0


@given(
    st.text(alphabet="ab<>", max_size=20),
    st.lists(st.text(alphabet="ab<>", min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.integers(min_value=0, max_value=20), max_size=5),
)
@example(text="<a<", stops=["a", "<a<"], cuts=[2])  # "a" is found in "<a", but "<a<" begins first
@example(text="<a", stops=["a", "<a<"], cuts=[])  # ... and the text ends before "<a<" can: "a" cuts
def test_stop_matcher_cuts_at_the_first_stop_whatever_the_chunks(text: str, stops: list[str], cuts: list[int]) -> None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(found)] if found else text
    m = StopMatcher(stops)
    out, at, stopped = "", 0, False
    for c in sorted(c for c in cuts if c <= len(text)) + [len(text)]:
        safe, stopped = m.push(text[at:c])
        out += safe
        at = c
        if stopped:
            break
        assert expected.startswith(out)  # nothing past a stop, nothing taken back
    if not stopped:  # only the end can decide a stop held behind a longer one's prefix
        out += m.flush()
        stopped = m.stopped
    assert out == expected and stopped == bool(found)
