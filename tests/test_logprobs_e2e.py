"""Logprobs end to end: the official client, the HTTP server, the real engine.

Each check first makes sure its fixture can see what it checks: replies that really hold
characters split across tokens, a top_k cut that really removes alternatives, labels the
model would not pick on its own. Then it asserts what the issue asks: entries spell the
content exactly (streamed and not), shapes per top_logprobs, legacy arrays, allowed ids
renormalised, the processed distribution, echo, and 400s naming the parameter.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import openai
import pytest
from reference_sampler import adjusted, kept

from strata_core.contract.options import SamplingParams
from strata_core.engine.sampler import processed_logprobs, top_logprobs
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

TIMEOUT = 600  # a small shared box: allow a slow reply rather than flake
N_VOCAB = 49_152  # SmolLM2
LABELS = {49: "A", 50: "B", 51: "C", 52: "D", 53: "E"}  # SmolLM2's single-letter tokens
LABEL_PROMPT = (
    "Question: Which planet is known as the Red Planet?\n"
    "A) Mars B) Venus C) Jupiter D) Saturn E) Mercury\nAnswer:"
)


@pytest.fixture(scope="module")
def api(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def again(text: str) -> list[dict[str, str]]:
    """A conversation in which the model already repeated ``text`` once: greedy, it writes
    it again (by a margin of nats, not a hair, so other CPU numerics write the same)."""
    return [
        {"role": "user", "content": "Repeat exactly: " + text},
        {"role": "assistant", "content": text},
        {"role": "user", "content": "Again, exactly."},
    ]


def chat_entries(api: openai.OpenAI, stream: bool = False, **kw: Any) -> tuple[str, list[dict[str, Any]]]:
    """(content, entries as plain dicts), streamed or not."""
    kw.setdefault("model", "default")
    if not stream:
        r = api.chat.completions.create(**kw)
        c = r.choices[0]
        assert c.logprobs is not None and c.logprobs.content is not None, r
        return c.message.content or "", [e.model_dump() for e in c.logprobs.content]
    text, entries = "", []
    for ch in api.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        text += ch.choices[0].delta.content or ""
        lp = ch.choices[0].logprobs
        if lp is not None and lp.content:
            entries += [e.model_dump() for e in lp.content]
    return text, entries


def completion_logprobs(api: openai.OpenAI, stream: bool = False, **kw: Any) -> tuple[str, dict[str, list[Any]]]:
    """(text, legacy logprobs with the four arrays), streamed or not."""
    kw.setdefault("model", "default")
    if not stream:
        c = api.completions.create(**kw).choices[0]
        assert c.logprobs is not None
        return c.text, c.logprobs.model_dump()
    text = ""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for ch in api.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        text += ch.choices[0].text
        lp = ch.choices[0].logprobs
        if lp is not None:
            for key in out:
                out[key] += getattr(lp, key) or []
    return text, out


def spelled(entries: list[dict[str, Any]]) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8")


def split_chars(entries: list[dict[str, Any]]) -> int:
    """Entries whose token completes no character: a character split across tokens."""
    return sum(1 for e in entries if e["token"] == "" and e["bytes"])


# ---- entries spell the content ---------------------------------------------------------

# 👌 is three tokens (F0 9F, 91, 8C): 39 tokens end on the 13th whole 👌, 40 cut the 14th
OKS = again("👌" * 20)

# (prompt or messages, max_tokens that end on a whole character, what the reply must hold,
# whether a character in it is split across tokens)
CHAT_CASES: dict[str, tuple[str | list[dict[str, str]], int, list[str], bool]] = {
    "cjk": ("Repeat exactly: 東京 café €5 😀", 30, ["東京"], True),
    "accents-euro-emoji": (again("I paid €5 at the café 😀"), 40, ["café", "€5", "😀"], False),
    "emoji": (OKS, 39, ["👌"], True),
    "code": ("Write a Python function that adds two numbers.", 40, ["```python", "def ", "return"], False),
}


@pytest.mark.parametrize("case", CHAT_CASES)
def test_chat_entries_spell_the_content_streamed_and_not(api: openai.OpenAI, case: str) -> None:
    prompt, max_tokens, must, split = CHAT_CASES[case]
    messages = user(prompt) if isinstance(prompt, str) else prompt
    kw = {"messages": messages, "max_tokens": max_tokens, "logprobs": True, "top_logprobs": 3}
    content, entries = chat_entries(api, **kw)
    for s in must:  # the fixture: the reply really holds what this case is about
        assert s in content, f"the model did not produce {s!r}: {content!r}"
    assert "\ufffd" not in content
    assert (split_chars(entries) > 0) == split
    if not split:  # then each multi-byte character is one token's bytes
        assert all(e["token"] for e in entries)
    assert spelled(entries) == content
    assert "".join(e["token"] for e in entries) == content
    s_content, s_entries = chat_entries(api, stream=True, **kw)
    assert s_content == content
    assert s_entries == entries  # temperature 0: the very same entries, value for value
    for e in entries:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["bytes"] == e["bytes"]  # greedy takes the head
        assert e["top_logprobs"][0]["logprob"] == e["logprob"]


def test_a_character_cut_by_max_tokens_reads_as_the_content_does(api: openai.OpenAI) -> None:
    kw = {"messages": OKS, "max_tokens": 40, "logprobs": True}
    content, entries = chat_entries(api, **kw)
    assert content.endswith("👌\ufffd"), content  # the fixture: the last 👌 is cut
    assert b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace") == content
    assert "".join(e["token"] for e in entries) == content
    assert chat_entries(api, stream=True, **kw) == (content, entries)


COMPLETION_CASES = {
    "accents-euro-emoji": ("東京 café €5 😀 東京 café €5 😀 東京", ["café", "€5", "😀"], False),
    # the pattern goes on, " マス, 東京 マス", a character split across tokens in each word
    "cjk": ("東京 マス, " * 5 + "東京", ["京", "マス"], True),
}


@pytest.mark.parametrize("case", COMPLETION_CASES)
def test_completion_entries_spell_the_text_streamed_and_not(api: openai.OpenAI, case: str) -> None:
    prompt, must, split = COMPLETION_CASES[case]
    kw = {"prompt": prompt, "max_tokens": 16, "logprobs": 3}
    text, lp = completion_logprobs(api, **kw)
    for s in must:
        assert s in text, f"the model did not produce {s!r}: {text!r}"
    assert ("" in lp["tokens"]) == split
    check_legacy(text, lp, 3)
    s_text, s_lp = completion_logprobs(api, stream=True, **kw)
    assert s_text == text and s_lp == lp  # offsets stay absolute across chunks


def check_legacy(text: str, lp: dict[str, list[Any]], k: int, offset0: int = 0) -> None:
    n = len(lp["tokens"])
    assert n > 0
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == text[offset0:]
    at = offset0
    for tok, off in zip(lp["tokens"], lp["text_offset"], strict=True):
        assert off == at
        at += len(tok)
    assert lp["text_offset"] == sorted(lp["text_offset"])
    for v, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert v <= 0
        assert len(top) <= k and (k == 0 or len(top) >= 1)
        assert all(x <= 0 for x in top.values())


# ---- shapes ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_top_logprobs_shapes(api: openai.OpenAI, k: int) -> None:
    content, entries = chat_entries(
        api, messages=user("Name three colours."), max_tokens=12, logprobs=True, top_logprobs=k
    )
    assert entries and spelled(entries) == content
    for e in entries:
        tops = e["top_logprobs"]
        assert len(tops) == k
        values = [t["logprob"] for t in tops]
        assert values == sorted(values, reverse=True)
        assert len({bytes(t["bytes"]) for t in tops}) == k  # distinct tokens
        if k:
            assert tops[0]["logprob"] == e["logprob"] and tops[0]["bytes"] == e["bytes"]


def test_chat_logprobs_int_is_top_logprobs(api: openai.OpenAI) -> None:
    r = api.chat.completions.create(
        model="default", messages=user("Say hello."), max_tokens=4, logprobs=4  # type: ignore[arg-type]
    )
    entries = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries and all(len(e.top_logprobs) == 4 for e in entries)


def test_no_logprobs_unless_asked(api: openai.OpenAI) -> None:
    r = api.chat.completions.create(model="default", messages=user("Say hello."), max_tokens=4)
    assert r.choices[0].logprobs is None
    c = api.completions.create(model="default", prompt="Hello", max_tokens=4)
    assert c.choices[0].logprobs is None


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_legacy_shapes(api: openai.OpenAI, k: int) -> None:
    text, lp = completion_logprobs(api, prompt="The capital of France is", max_tokens=10, logprobs=k)
    assert "Paris" in text
    check_legacy(text, lp, k)
    if k >= 1:  # greedy: the token is its own best alternative
        for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
            assert top[tok] == v


# ---- stop strings, n > 1, concurrent slots ----------------------------------------------


@pytest.mark.parametrize(
    ("stop", "content"),
    [(["京"], "Repeat exactly: 東"), (["xact"], "Repeat e")],  # the second cuts inside " exactly"
)
def test_stop_strings_cut_the_entries_with_the_content(
    api: openai.OpenAI, stop: list[str], content: str
) -> None:
    kw = {"messages": user("Repeat exactly: 東京 café €5 😀"), "max_tokens": 30, "logprobs": True,
          "top_logprobs": 2, "stop": stop}  # fmt: skip
    got, entries = chat_entries(api, **kw)
    assert got == content
    assert spelled(entries) == content and "".join(e["token"] for e in entries) == content
    assert chat_entries(api, stream=True, **kw) == (got, entries)


def test_every_choice_gets_its_own_logprobs(api: openai.OpenAI) -> None:
    r = api.chat.completions.create(
        model="default", messages=user("Tell me a fact about cats."), max_tokens=16, n=3,
        temperature=1.0, seed=5, logprobs=True, top_logprobs=2,
    )  # fmt: skip
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1, "the choices are all the same: the fixture cannot tell them apart"
    for c in r.choices:
        entries = [e.model_dump() for e in c.logprobs.content]  # type: ignore[union-attr]
        assert spelled(entries) == c.message.content


def test_concurrent_requests_all_return_logprobs(server: Server, api: openai.OpenAI) -> None:
    prompts = ["Describe the sea.", "Describe a forest.", "Describe a city.", "Describe the sky."]
    results: dict[int, tuple[str, list[dict[str, Any]]]] = {}

    def run(i: int) -> None:
        results[i] = chat_entries(api, messages=user(prompts[i]), max_tokens=24, logprobs=True, top_logprobs=2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(len(prompts)))
    for content, entries in results.values():
        assert len(entries) >= 20 and spelled(entries) == content
        assert all(len(e["top_logprobs"]) == 2 for e in entries)


# ---- allowed_token_ids ----------------------------------------------------------------


def test_allowed_token_ids_completions(api: openai.OpenAI) -> None:
    _, free = completion_logprobs(api, prompt=LABEL_PROMPT, max_tokens=3, logprobs=0)
    # the fixture: left alone the model ends at once or writes something else
    assert not (free["tokens"] and set(free["tokens"]) <= set(LABELS.values())), free
    text, lp = completion_logprobs(
        api, prompt=LABEL_PROMPT, max_tokens=3, logprobs=5, extra_body={"allowed_token_ids": list(LABELS)}
    )
    assert len(lp["tokens"]) == 3 and set(lp["tokens"]) <= set(LABELS.values())
    assert text == "".join(lp["tokens"])
    for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert set(top) == set(LABELS.values())
        assert math.isclose(sum(math.exp(x) for x in top.values()), 1.0, abs_tol=1e-4)
        assert top[tok] == v


def test_allowed_token_ids_chat(api: openai.OpenAI) -> None:
    messages = user(LABEL_PROMPT)
    free, _ = chat_entries(api, messages=messages, max_tokens=4, logprobs=True)
    assert not set(free) <= set(LABELS.values()), "the model picks labels anyway"
    content, entries = chat_entries(
        api, messages=messages, max_tokens=4, logprobs=True, top_logprobs=5,
        extra_body={"allowed_token_ids": list(LABELS)},
    )  # fmt: skip
    assert len(entries) == 4 and spelled(entries) == content and set(content) <= set(LABELS.values())
    for e in entries:
        assert {t["token"] for t in e["top_logprobs"]} == set(LABELS.values())
        assert math.isclose(sum(math.exp(t["logprob"]) for t in e["top_logprobs"]), 1.0, abs_tol=1e-4)


# ---- logprobs_mode ---------------------------------------------------------------------


def test_logprobs_mode_processed_is_the_sampled_distribution(api: openai.OpenAI) -> None:
    temperature, top_k, k = 0.7, 3, 5
    kw = {"messages": user("Write a short poem about the sea."), "max_tokens": 16, "logprobs": True,
          "top_logprobs": k, "temperature": temperature, "seed": 11}  # fmt: skip
    raw_text, raw = chat_entries(api, extra_body={"top_k": top_k}, **kw)
    text, processed = chat_entries(api, extra_body={"top_k": top_k, "logprobs_mode": "processed"}, **kw)
    assert text == raw_text  # the mode changes what is reported, never what is sampled
    assert len(processed) == len(raw) > 0
    # the fixture: raw lists k alternatives, so the top_k=3 cut is visible in every entry
    assert all(len(e["top_logprobs"]) == k for e in raw)
    assert [e["logprob"] for e in processed] != [e["logprob"] for e in raw]
    for r, p in zip(raw, processed, strict=True):
        assert r["bytes"] == p["bytes"]
        survivors = r["top_logprobs"][:top_k]
        scaled = [t["logprob"] / temperature for t in survivors]
        norm = max(scaled) + math.log(sum(math.exp(v - max(scaled)) for v in scaled))
        assert [t["bytes"] for t in p["top_logprobs"]] == [t["bytes"] for t in survivors]
        for t, v in zip(p["top_logprobs"], scaled, strict=True):
            assert t["logprob"] == pytest.approx(v - norm, abs=1e-4)
        assert math.isclose(sum(math.exp(t["logprob"]) for t in p["top_logprobs"]), 1.0, abs_tol=1e-4)
        # the sampled token survived the cut, and its own logprob is the processed one
        mine = [t["logprob"] for t in p["top_logprobs"] if t["bytes"] == p["bytes"]]
        assert mine and p["logprob"] == pytest.approx(mine[0], abs=1e-6)


def test_logprobs_mode_processed_greedy_without_adjustments_is_raw(api: openai.OpenAI) -> None:
    kw = {"messages": user("Name three colours."), "max_tokens": 8, "logprobs": True, "top_logprobs": 3}
    raw = chat_entries(api, **kw)
    assert chat_entries(api, extra_body={"logprobs_mode": "processed"}, **kw) == raw


def test_logprobs_mode_processed_sees_the_bias(api: openai.OpenAI) -> None:
    paris, bias = 7042, -2.0  # " Paris"
    kw = {"prompt": "The capital of France is", "max_tokens": 1, "logprobs": 2}
    _, raw = completion_logprobs(api, **kw)
    _, raw_biased = completion_logprobs(api, extra_body={"logit_bias": {str(paris): bias}}, **kw)
    _, proc = completion_logprobs(
        api, extra_body={"logit_bias": {str(paris): bias}, "logprobs_mode": "processed"}, **kw
    )
    assert raw["tokens"] == raw_biased["tokens"] == proc["tokens"] == [" Paris"]  # still the pick
    assert raw_biased["token_logprobs"] == raw["token_logprobs"]  # raw ignores the bias
    p = math.exp(raw["token_logprobs"][0])
    expected = math.log(p * math.exp(bias) / (1 - p + p * math.exp(bias)))
    assert proc["token_logprobs"][0] == pytest.approx(expected, abs=1e-4)
    assert proc["token_logprobs"][0] < raw["token_logprobs"][0] - 0.5


# ---- echo -------------------------------------------------------------------------------


def test_echo(api: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    plain = api.completions.create(model="default", prompt=prompt, max_tokens=6).choices[0].text
    assert plain
    r = api.completions.create(model="default", prompt=prompt, max_tokens=6, echo=True)
    assert r.choices[0].text == prompt + plain
    streamed = "".join(
        c.choices[0].text
        for c in api.completions.create(model="default", prompt=prompt, max_tokens=6, echo=True, stream=True)
        if c.choices
    )
    assert streamed == prompt + plain
    two = api.completions.create(model="default", prompt=[prompt, "Hello"], max_tokens=3, echo=True, n=2)
    assert [c.text[: len(p)] for c, p in zip(two.choices, [prompt, prompt, "Hello", "Hello"], strict=True)] == [
        prompt, prompt, "Hello", "Hello"]  # fmt: skip


def test_echo_of_token_ids_is_their_text(api: openai.OpenAI) -> None:
    ids = [504, 3575, 282, 4649, 314]  # SmolLM2: "The capital of France is"
    r = api.completions.create(model="default", prompt=ids, max_tokens=4, echo=True)
    plain = api.completions.create(model="default", prompt=ids, max_tokens=4).choices[0].text
    assert plain and r.choices[0].text == "The capital of France is" + plain


# ---- bad inputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": 21}, "logprobs"),
        ("chat", {"allowed_token_ids": [N_VOCAB]}, "allowed_token_ids"),
        ("chat", {"allowed_token_ids": []}, "allowed_token_ids"),
        ("chat", {"logprobs": True, "logprobs_mode": "sampled"}, "logprobs_mode"),
        ("completions", {"logprobs": 21}, "logprobs"),
        ("completions", {"logprobs": 1, "echo": True}, "echo"),
        ("completions", {"allowed_token_ids": [1, -1]}, "allowed_token_ids"),
        ("completions", {"allowed_token_ids": [5, 10**9]}, "allowed_token_ids"),
    ],
)
def test_bad_inputs_are_400_naming_the_parameter(
    api: openai.OpenAI, endpoint: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "chat":
            api.chat.completions.create(model="default", messages=user("hi"), max_tokens=2, extra_body=body)
        else:
            api.completions.create(model="default", prompt="hi", max_tokens=2, extra_body=body)
    assert info.value.status_code == 400
    assert info.value.param == param, info.value.message
    assert param in info.value.message


# ---- the processed distribution, against the scalar reference -------------------------


ROW = np.random.default_rng(9).normal(0.0, 2.0, 4096).astype(np.float32)
HISTORY = [int(i) for i in np.random.default_rng(10).integers(0, 4096, 64)]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=5, seed=1),
        SamplingParams(temperature=1.3, top_p=0.5, seed=1),
        SamplingParams(temperature=0.9, min_p=0.2, bias={3: 4.0}, seed=1),
        SamplingParams(temperature=1.0, allowed=(1, 2, 3, 4, 5, 6, 7), penalty_repeat=1.3, penalty_last_n=64, seed=1),
        SamplingParams(penalty_present=2.0, penalty_last_n=64, bias={7: 3.0}),  # greedy
    ],
)
def test_processed_logprobs_match_the_reference_chain(params: SamplingParams) -> None:
    lp, top = processed_logprobs(ROW, 20, params, HISTORY)
    raw, _ = top_logprobs(ROW, 20)
    x = adjusted(ROW.tolist(), params, HISTORY)
    survivors = list(range(len(x))) if params.greedy else kept(x, params)
    survivors = [i for i in survivors if x[i] > -math.inf]
    t = params.temperature or 1.0
    head = max(x[i] for i in survivors)
    norm = math.log(sum(math.exp((x[i] - head) / t) for i in survivors))
    expected = {i: (x[i] - head) / t - norm for i in survivors}
    assert not np.allclose(lp[survivors], raw[survivors], atol=1e-3), "the chain changes nothing here"
    assert set(np.flatnonzero(lp > -np.inf).tolist()) == set(survivors)
    for i in survivors:
        assert lp[i] == pytest.approx(expected[i], abs=1e-4)
    best = sorted(survivors, key=lambda i: (-expected[i], i))[:20]
    assert [i for i, _ in top] == best
