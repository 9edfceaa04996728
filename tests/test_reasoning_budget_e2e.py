"""Reasoning budgets on a template that thinks (the tools server's template opens
``<think>`` with ``enable_thinking``): chat's ``reasoning_budget``, Anthropic's
``thinking.budget_tokens`` and Responses' ``reasoning.effort`` end the reasoning with
``</think>`` once spent, the answer follows, and usage counts the reasoning tokens."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from strata_core.schema.requests import EFFORT_BUDGETS
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

THINK = {"enable_thinking": True}
ASK = [{"role": "user", "content": "Explain in detail why the sky is blue."}]


def chat(server: Server, **fields: Any) -> dict[str, Any]:
    body = {"messages": ASK, "max_tokens": 80, "chat_template_kwargs": THINK, **fields}
    r = httpx.post(f"{server.base}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_budget_ends_the_reasoning_and_the_answer_follows(tools_server: Server) -> None:
    free = chat(tools_server)
    reasoning = free["choices"][0]["message"].get("reasoning_content") or ""
    # the fixture: left alone, the model reasons for more than the budget below
    assert free["usage"]["completion_tokens_details"]["reasoning_tokens"] > 12, free
    assert len(reasoning) > 20
    bounded = chat(tools_server, reasoning_budget=8)
    m = bounded["choices"][0]["message"]
    used = bounded["usage"]["completion_tokens_details"]["reasoning_tokens"]
    # the 8 tokens and the closing marker's ("\n</think>\n\n"), counted as they are pushed
    assert 8 < used <= 8 + 8, bounded
    assert m["reasoning_content"] and reasoning.startswith(m["reasoning_content"].rstrip()[:10])
    assert m["content"], bounded  # the answer follows the closed reasoning
    assert "</think>" not in m["content"]
    assert bounded["usage"]["completion_tokens"] > used


def test_a_budget_of_zero_answers_at_once_and_streams_the_same(tools_server: Server) -> None:
    whole = chat(tools_server, reasoning_budget=0, max_tokens=20)
    m = whole["choices"][0]["message"]
    assert not (m.get("reasoning_content") or "").strip() and m["content"], whole
    body = {"messages": ASK, "max_tokens": 20, "chat_template_kwargs": THINK, "reasoning_budget": 0, "stream": True}
    r = httpx.post(f"{tools_server.base}/v1/chat/completions", json=body, timeout=300)
    import json

    content = "".join(
        (json.loads(ln[6:])["choices"] or [{"delta": {}}])[0]["delta"].get("content") or ""
        for ln in r.text.splitlines() if ln.startswith("data: {")
    )  # fmt: skip
    assert content == m["content"]


def test_responses_effort_maps_to_a_budget(tools_server: Server) -> None:
    assert EFFORT_BUDGETS["minimal"] < EFFORT_BUDGETS["low"] < EFFORT_BUDGETS["medium"] < EFFORT_BUDGETS["high"]
    body = {"model": "default", "input": ASK[0]["content"], "max_output_tokens": 300, "reasoning": {"effort": "minimal"}}
    r = httpx.post(f"{tools_server.base}/v1/responses", json=body, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens_details"]["reasoning_tokens"] <= EFFORT_BUDGETS["minimal"] + 8


def test_a_negative_budget_is_refused_and_minus_one_is_no_limit(tools_server: Server) -> None:
    r = httpx.post(f"{tools_server.base}/v1/chat/completions", json={"messages": ASK, "reasoning_budget": -2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_budget", r.text
    assert chat(tools_server, reasoning_budget=-1, max_tokens=4)["usage"]["completion_tokens"] == 4
