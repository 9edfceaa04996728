"""The sampling chain end to end: the official client, the HTTP server, the real engine.

The acceptance criteria of the sampling issue, each checked on SmolLM2-135M over HTTP.
Every comparison first shows that the feature is visible on its prompt (a loop that the
penalties must break, a spread of first tokens that min_p must narrow, a pick that a bias
must move), so a sampler that ignored the setting fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

# The box running these is small and shared: allow a slow reply rather than flake.
TIMEOUT = 600
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]
POEM_TOKENS = 40
LOOP_PROMPT = "The cat sat on the mat. " * 6
SERVER_ARGS = ["--backend", "cpu", "--parallel", "4", "--n-ctx", "1024"]


def make_client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def api(server: Server) -> openai.OpenAI:
    return make_client(server.base)


def chat(client: openai.OpenAI, messages: list[dict[str, str]] = POEM, **kw: Any) -> str:
    kw.setdefault("max_tokens", POEM_TOKENS)
    r = client.chat.completions.create(model="default", messages=messages, **kw)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.completion_tokens == kw["max_tokens"], r
    return r.choices[0].message.content or ""


def complete(client: openai.OpenAI, prompt: str, **kw: Any) -> str:
    r = client.completions.create(model="default", prompt=prompt, **kw)
    return r.choices[0].text


def streamed_pieces(client: openai.OpenAI, prompt: str, **kw: Any) -> list[str]:
    """One text piece per generated token (the server streams each token as it decodes)."""
    stream = client.completions.create(model="default", prompt=prompt, stream=True, **kw)
    return [c.choices[0].text for c in stream if c.choices and c.choices[0].text]


@pytest.fixture(scope="module")
def engine_info(server: Server) -> dict[str, Any]:
    info: dict[str, Any] = httpx.get(f"{server.base}/v1/strata/backend").json()["engine"]
    return info


@pytest.fixture(scope="module")
def n_vocab(engine_info: dict[str, Any]) -> int:
    return int(engine_info["n_vocab"])


@pytest.fixture(scope="module")
def greedy(api: openai.OpenAI) -> str:
    """The poem under greedy decoding, temperature left out: the reference most tests use."""
    text = chat(api)
    assert len(text) > 80, text
    return text


# ---- greedy and sampled ----------------------------------------------------------------


def test_temperature_zero_and_absent_agree(api: openai.OpenAI, greedy: str) -> None:
    assert chat(api, temperature=0) == greedy
    # A seed cannot change an argmax.
    assert chat(api, temperature=0, seed=5) == greedy


def test_sampled_differs_from_greedy(api: openai.OpenAI, greedy: str) -> None:
    sampled = chat(api, temperature=0.8, seed=1234)
    assert sampled != greedy
    assert chat(api, temperature=0.8, seed=1234) == sampled


def test_top_k_one_is_greedy_and_top_k_zero_is_no_cut(
    api: openai.OpenAI, greedy: str, n_vocab: int
) -> None:
    assert chat(api, temperature=1.0, seed=3, extra_body={"top_k": 1}) == greedy
    no_cut = chat(api, temperature=1.0, seed=3, extra_body={"top_k": 0})
    assert no_cut != greedy
    # top_k = the whole vocabulary keeps every token, so it must draw what top_k 0 draws.
    assert chat(api, temperature=1.0, seed=3, extra_body={"top_k": n_vocab}) == no_cut


# ---- seeds -------------------------------------------------------------------------------


def _timed_stream(
    client: openai.OpenAI,
    messages: list[dict[str, str]],
    started: threading.Event | None = None,
    **kw: Any,
) -> tuple[str, float, float]:
    """Text of a streamed chat reply and the times of its first and last token."""
    parts: list[str] = []
    first = last = 0.0
    stream = client.chat.completions.create(model="default", messages=messages, stream=True, **kw)  # type: ignore[arg-type]
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.monotonic()
            first = first or last
            parts.append(chunk.choices[0].delta.content)
            if started is not None:
                started.set()
    return "".join(parts), first, last


#: llama-server's further samplers at once: XTC's draw, adaptive-p's running average and
#: DRY's history must replay as the plain chain's do (Mirostat's mu: below, and in
#: test_ollama_e2e and test_speculative_e2e).
FURTHER = {
    "dry_multiplier": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.05, "typical_p": 0.9, "top_n_sigma": 2.0,
    "dynatemp_range": 0.5, "adaptive_target": 0.3, "min_keep": 2,
    "samplers": ["dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature", "adaptive_p"],
}  # fmt: skip


@pytest.mark.parametrize("further", [{}, FURTHER], ids=["plain", "further"])
def test_same_seed_same_text_alone_and_beside_other_requests(
    api: openai.OpenAI, engine_info: dict[str, Any], further: dict[str, Any]
) -> None:
    seeded: dict[str, Any] = {"temperature": 0.8, "seed": 99, "max_tokens": 32}
    if further:
        seeded["extra_body"] = further
    alone, _, _ = _timed_stream(api, POEM, **seeded)
    assert chat(api, **seeded) == alone

    others = [
        ("Tell me about volcanoes.", 64),
        ("Describe a busy market in the morning.", 64),
        ("What is a prime number?", 6),
        ("Name three colours.", 6),
    ]
    # The others are unseeded; banning the end tokens keeps a long one from stopping early.
    no_end = {str(engine_info[k]): -100 for k in ("eos", "eot") if engine_info.get(k) is not None}
    with ThreadPoolExecutor(len(others) + 1) as pool:
        running = []
        for question, n in others:
            started = threading.Event()
            msgs = [{"role": "user", "content": question}]
            running.append(
                pool.submit(
                    _timed_stream,
                    api,
                    msgs,
                    started,
                    temperature=0.9,
                    max_tokens=n,
                    logit_bias=no_end,
                )
            )
            assert started.wait(TIMEOUT), "a background request produced no token"
        # All four slots are busy: the seeded request joins when a short one finishes and
        # then decodes in the same batches as the two long ones.
        beside, first, last = pool.submit(_timed_stream, api, POEM, **seeded).result()
        spans = [f.result()[1:] for f in running]
    overlapping = [s for s in spans if s[0] < last and s[1] > first]
    assert len(overlapping) >= 2, (first, last, spans)
    assert beside == alone


def test_unseeded_request_gets_a_seed_that_replays(api: openai.OpenAI) -> None:
    def unseeded() -> tuple[int, str]:
        raw = api.chat.completions.with_raw_response.create(
            model="default",
            messages=POEM,
            max_tokens=24,
            temperature=0.8,
        )
        body = raw.parse()
        seed = (body.model_extra or {})["seed"]
        assert isinstance(seed, int) and seed >= 0
        assert raw.headers["x-strata-seed"] == str(seed)
        return seed, body.choices[0].message.content or ""

    (seed_a, text_a), (seed_b, _) = unseeded(), unseeded()
    assert seed_a != seed_b
    assert chat(api, max_tokens=24, temperature=0.8, seed=seed_a) == text_a


# ---- penalties, min_p, logit bias --------------------------------------------------------


def test_penalties_break_a_greedy_loop(api: openai.OpenAI) -> None:
    loop = streamed_pieces(api, LOOP_PROMPT, max_tokens=24)
    # The fixture must loop, or the penalties have nothing to show: the sentence's eight
    # tokens, and a newline, over and over.
    assert len(loop) >= 20 and len(set(loop)) <= 10, loop
    assert "".join(loop).count("The cat sat on the mat.") >= 2, loop

    penalties = {"repetition_penalty": 1.5, "presence_penalty": 0.5}
    broken = streamed_pieces(api, LOOP_PROMPT, max_tokens=24, extra_body=penalties)
    assert len(set(broken)) >= 18, broken
    assert "The cat sat on the mat." not in "".join(broken), broken
    # penalty_last_n = 0 is llama.cpp's "no window": the same keys then change nothing.
    off = streamed_pieces(
        api, LOOP_PROMPT, max_tokens=24, extra_body={**penalties, "penalty_last_n": 0}
    )
    assert off == loop


def test_dry_breaks_a_greedy_loop_and_bad_values_are_400s(api: openai.OpenAI) -> None:
    loop = streamed_pieces(api, LOOP_PROMPT, max_tokens=24)
    assert "".join(loop).count("The cat sat on the mat.") >= 2, loop  # the fixture loops
    dry = streamed_pieces(api, LOOP_PROMPT, max_tokens=24, extra_body={"dry_multiplier": 2.0, "dry_base": 2.0})
    assert "The cat sat on the mat." not in "".join(dry), dry
    seeded = {"temperature": 0.8, "seed": 7, "max_tokens": 24, "extra_body": {"mirostat": 2, "mirostat_tau": 3.0}}
    mirostat = chat(api, **seeded)
    assert chat(api, **seeded) == mirostat != chat(api, **{**seeded, "extra_body": {}})
    for field, value in (("dry_base", 0.5), ("mirostat", 3), ("typical_p", 2.0), ("samplers", ["beam"]),
                         ("adaptive_decay", 1.0), ("dry_sequence_breakers", [])):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            complete(api, "Hi", max_tokens=1, temperature=1.0, extra_body={field: value})
        assert err.value.status_code == 400 and field in str(err.value), (field, err.value)


def test_min_p_narrows_the_pick(api: openai.OpenAI) -> None:
    prompt = "My favourite word is"
    greedy_first = complete(api, prompt, max_tokens=1)

    def first_tokens(min_p: float) -> list[str]:
        # n=8 with one seed: eight derived seeds, so eight reproducible draws.
        r = api.completions.create(
            model="default", prompt=prompt, max_tokens=1, n=8, temperature=1.0, seed=5,
            extra_body={"min_p": min_p},
        )  # fmt: skip
        return [c.text for c in r.choices]

    spread = first_tokens(0.0)
    assert len(set(spread)) >= 3, spread  # the prompt leaves room for min_p to cut
    narrowed = first_tokens(0.9)
    assert narrowed != spread
    assert set(narrowed) == {greedy_first}, (narrowed, greedy_first)


def test_logit_bias_bans_and_forces_a_token(api: openai.OpenAI, n_vocab: int) -> None:
    prompt = "The capital of France is"

    def pick(bias: dict[int, float] | None = None, max_tokens: int = 1) -> str:
        lb = {str(t): b for t, b in (bias or {}).items()}
        return complete(api, prompt, max_tokens=max_tokens, logit_bias=lb)  # type: ignore[arg-type]

    first = pick()
    assert first.strip(), first
    # Find the greedy token's id over HTTP: banning a range moves the pick iff it holds it.
    lo, hi = 0, n_vocab
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pick(dict.fromkeys(range(lo, mid), -100.0)) != first:
            hi = mid
        else:
            lo = mid
    assert pick({lo: 100.0}) == first  # the id we found is that token
    banned = pick({lo: -100.0}, max_tokens=8)
    assert not banned.startswith(first), banned

    rare = 40000  # " neoliberal": not what this prompt continues with
    plain = pick(max_tokens=6)
    forced_piece = pick({rare: 100.0})
    assert forced_piece.strip() and forced_piece not in plain, (forced_piece, plain)
    assert pick({rare: 100.0}, max_tokens=6) == forced_piece * 6


# ---- the operator's [sampling] defaults --------------------------------------------------


@pytest.fixture(scope="module")
def sampled_by_default(
    tmp_path_factory: pytest.TempPathFactory, cpu_engine: Any
) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("sampling_defaults")
    (d / "strata.toml").write_text("[sampling]\ntemperature = 0.8\n")
    srv = Server([*SERVER_ARGS, "--config", str(d / "strata.toml")], d / "server.log")
    try:
        srv.wait_ready(timeout=TIMEOUT)
        yield srv
    finally:
        srv.stop()


def test_config_temperature_is_the_default(sampled_by_default: Server, greedy: str) -> None:
    api = make_client(sampled_by_default.base)
    left_out = [chat(api, seed=s) for s in (1, 2, 3)]
    assert all(t != greedy for t in left_out), left_out
    assert len(set(left_out)) == 3, left_out

    raw = api.chat.completions.with_raw_response.create(
        model="default", messages=POEM, max_tokens=POEM_TOKENS, seed=1,  # type: ignore[arg-type]
        extra_body={"temperature": None},
    )  # fmt: skip
    assert b'"temperature":null' in raw.http_request.content
    assert raw.parse().choices[0].message.content == left_out[0]

    assert chat(api, temperature=0, seed=1) == greedy


def test_config_default_the_engine_cannot_honour_refuses_to_start(
    tmp_path: Path, cpu_engine: Any
) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text("[sampling]\npenalty_last_n = 0\nrepetition_penalty = 1.5\n")
    srv = Server([*SERVER_ARGS, "--config", str(cfg)], tmp_path / "server.log")
    try:
        rc = srv.proc.wait(TIMEOUT)
    finally:
        srv.stop()
    log = srv.log.read_text()
    assert rc != 0, log
    assert "repetition_penalty" in log and "penalty_last_n" in log, log
    assert "Strata serving" not in log


def test_ignore_eos_runs_the_reply_to_its_token_limit(api: openai.OpenAI) -> None:
    """A short answer ends at the model's end-of-generation token; with ``ignore_eos``
    (llama-server's and vLLM's extension) that token is never sampled, so the reply runs
    to max_tokens, and up to where it ended before it is the same greedy text."""
    kw: dict[str, Any] = {"model": "default", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 48}
    short = api.chat.completions.create(**kw)
    assert short.usage is not None and short.usage.completion_tokens < 48
    assert short.choices[0].finish_reason == "stop", short  # the model did end on its own
    full = api.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    assert full.usage is not None and full.usage.completion_tokens == 48, full
    assert full.choices[0].finish_reason == "length"
    assert (full.choices[0].message.content or "").startswith((short.choices[0].message.content or "").rstrip())
