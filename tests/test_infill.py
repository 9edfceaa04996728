"""The fill-in-the-middle layout (text/infill.py), exactly as llama-server's
format_prompt_infill lays it out: markers, extra files, BOS, and the cuts of a long prefix,
suffix and project."""

from __future__ import annotations

from strata_core.contract.events import TokenEvent
from strata_core.text.choice import ChoiceText
from strata_core.text.infill import EditorLimits, FimTokens, Pieces, infill_prompt, under_indented

PRE, SUF, MID, REP, SEP, BOS = 900, 901, 902, 903, 904, 1
FULL = FimTokens(PRE, SUF, MID, REP, SEP)
BARE = FimTokens(PRE, SUF, MID)


def pieces(prefix: list[int], suffix: list[int], prompt: tuple[int, ...] = (),
           extra: list[tuple[list[int], list[int]]] | None = None) -> Pieces:  # fmt: skip
    return Pieces(prefix, suffix, list(prompt), extra or [], repo=[70], here=[71], chunk=[72, 72])


def test_the_plain_layout() -> None:
    assert infill_prompt(BARE, pieces([1, 2], [3], [4]), 512, 1024, None) == [PRE, 1, 2, 4, SUF, 3, MID]
    assert infill_prompt(BARE, pieces([1, 2], [3]), 512, 1024, BOS) == [BOS, PRE, 1, 2, SUF, 3, MID]


def test_extra_files_come_first_with_the_project_and_file_markers() -> None:
    extra = [([10], [11, 12]), ([20], [21])]
    got = infill_prompt(FULL, pieces([1], [3], extra=extra), 512, 1024, BOS)
    assert got == [REP, 70, SEP, 10, 11, 12, SEP, 20, 21, SEP, 71, BOS, PRE, 1, SUF, 3, MID]
    # without FIM_REP and FIM_SEP: the files' texts after the snippet separator, no names
    assert infill_prompt(BARE, pieces([1], [3], extra=extra), 512, 1024, None) == [72, 72, 11, 12, 72, 72, 21, PRE, 1, SUF, 3, MID]


def test_long_parts_are_cut_to_the_batch_and_context() -> None:
    prefix, suffix = list(range(100, 200)), list(range(200, 300))
    # n_batch 16: the prefix keeps its last 12, the suffix its first 4 - (2 + prompt)
    got = infill_prompt(BARE, pieces(prefix, suffix, [5]), 16, 1024, None)
    assert got == [PRE, *prefix[-12:], 5, SUF, suffix[0], MID]
    # the project keeps its end: n_ctx - n_batch + 2 tokens
    extra = [([10], list(range(300, 340)))]
    got = infill_prompt(FULL, pieces([1], [3], extra=extra), 16, 30, None)
    whole = [REP, 70, SEP, 10, *range(300, 340), SEP, 71]
    assert got == [*whole[-16:], PRE, 1, SUF, 3, MID]


def test_fim_tokens_from_ready() -> None:
    assert FimTokens.of({"pre": 1, "suf": 2, "mid": 3, "rep": None, "sep": 5}) == FimTokens(1, 2, 3, None, 5)
    assert FimTokens.of({"pre": 1, "suf": 2, "mid": None}) is None
    assert FimTokens.of(None) is None


def test_n_indent_cuts_before_the_first_line_indented_less() -> None:
    text = "x = 1\n    y = 2\nz = 3\n"
    assert under_indented(text, 0, 4) == text.index("z")
    assert under_indented("x = 1\n    y = 2\n  z\n", 0, 2) is None
    assert under_indented("foo\n\n  bar", 0, 2) == 4  # a blank line ends it too
    assert under_indented("foo\n  ", 0, 4) is None  # the line shows nothing yet
    assert under_indented("foo\n  b", 7, 4) is None  # decided before ``start``
    assert under_indented("x\ny", 0, 1) == 2  # the cursor's own line is never cut
    limits = EditorLimits(n_indent=4)
    kept = [limits.push([i], t) for i, t in enumerate(["if x:\n", "    a\n", "b = 1", "more"])]
    assert kept == ["if x:\n", "    a\n", "", ""] and limits.why == "n_indent" and limits.ids == [0, 1, 2]


def test_the_time_limit_ends_at_a_new_line_after_it_passed() -> None:
    clock = iter([0.0, 0.5, 1.0, 2.0])
    limits = EditorLimits(t_max_predict_ms=600, clock=lambda: next(clock))
    assert [limits.push([1], "a\n"), limits.push([2], "b"), limits.push([3], "c\n")] == ["a\n", "b", "c\n"]
    assert limits.why == "t_max_predict_ms"  # at 1.0 s, the first new line after 600 ms
    assert limits.push([4], "d") == ""


def test_a_stop_inside_a_batch_of_tokens_ends_the_reply_at_its_token() -> None:
    """The engine hands several tokens at once: those after the one that stopped are not the reply's."""
    limits = EditorLimits(n_indent=1)
    choice = ChoiceText([b"a", b"\n", b"b", b" c"], [], None, None, limits)
    assert choice.push(*(TokenEvent(i) for i in range(4))).text == "a\n"
    assert choice.stopped and limits.ids == [0, 1, 2] and limits.why == "n_indent"
