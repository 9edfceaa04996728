"""engine/budget.py on a toy vocabulary: reasoning ended after its budget with the closing
marker's ids, and left alone where the reply does not reason or closes in time."""

from __future__ import annotations

from strata_core.api.messages_input import MessagesRequest
from strata_core.api.responses_input import ResponsesRequest
from strata_core.engine.budget import ThinkBudget
from strata_core.schema.requests import EFFORT_BUDGETS, parse_request

VOCAB = [b"<think>", b"</think>", b"\n", b" a", b" b", b"Answer", b"<", b"think>", b"</", b" "]
OPEN, CLOSE, NL, A, B, ANSWER, LT, THINK_GT, SLASH, SPACE = range(len(VOCAB))


def run(budget: int, sampled: list[int], opened: bool, close: tuple[int, ...] = (CLOSE, NL)) -> tuple[list[int], int]:
    b = ThinkBudget(budget, close, VOCAB.__getitem__, opened)
    return [b.next(t) for t in sampled], b.spent


def test_an_open_prompt_is_closed_after_the_budget() -> None:
    out, spent = run(3, [A, B, A, B, A, B, ANSWER], opened=True)
    assert out == [A, B, A, CLOSE, NL, B, ANSWER] and spent == 3


def test_a_budget_of_zero_closes_at_once() -> None:
    out, _ = run(0, [A, B, ANSWER], opened=True)
    assert out == [CLOSE, NL, ANSWER]


def test_a_reply_that_opens_its_own_think_block_counts_from_there() -> None:
    out, spent = run(2, [SPACE, LT, THINK_GT, A, B, A, ANSWER], opened=False)  # "<think>" in two tokens
    assert out == [SPACE, LT, THINK_GT, A, B, CLOSE, NL] and spent == 2


def test_reasoning_closed_within_the_budget_is_left_alone() -> None:
    sampled = [A, SLASH, THINK_GT, NL, ANSWER, A, B, A]  # "</think>" in two tokens
    out, spent = run(4, sampled, opened=True)
    assert out == sampled and spent == 3


def test_a_reply_that_does_not_reason_is_left_alone() -> None:
    sampled = [ANSWER, A, B, A, B, A]
    assert run(1, sampled, opened=False)[0] == sampled


def test_the_api_families_budgets_become_the_chats_reasoning_budget() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    m = parse_request(MessagesRequest, {"model": "m", "max_tokens": 2000, "messages": msgs,
                                        "thinking": {"type": "enabled", "budget_tokens": 1500}})  # fmt: skip
    assert m.chat_request().reasoning_budget == 1500
    m = parse_request(MessagesRequest, {"model": "m", "max_tokens": 20, "messages": msgs})
    assert m.chat_request().reasoning_budget is None
    for effort, budget in [*EFFORT_BUDGETS.items(), ("xhigh", None), ("none", None)]:
        r = parse_request(ResponsesRequest, {"input": "hi", "reasoning": {"effort": effort}})
        assert r.chat_request(msgs).reasoning_budget == budget, effort
