"""Request + config defaults -> the engine's options, as GEN keys: neutral values are never sent."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata_core.api.sampling_defaults import (
    DEFAULT_PENALTY_LAST_N,
    check_defaults,
    gen_options,
    max_new_tokens,
    resolve_seed,
)
from strata_core.contract.options import GenOptions
from strata_core.ops.config import SamplingConfig
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import (
    PENALTY_LAST_N_ALL,
    BaseRequest,
    ChatRequest,
    CompletionRequest,
    parse_request,
)

NONE = SamplingConfig()


def req(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def sent(r: BaseRequest, defaults: SamplingConfig = NONE, seed: int = 7) -> dict[str, str]:
    return gen_options(r, defaults, seed=seed, max_tokens=max_new_tokens(r, defaults)).encode()


def keys(defaults: SamplingConfig = NONE, seed: int = 7, **fields: Any) -> dict[str, str]:
    return sent(req(**fields), defaults, seed)


@pytest.mark.parametrize("fields", [{}, {"temperature": 0}, {"temperature": None}])
def test_greedy_sends_nothing(fields: dict[str, Any]) -> None:
    assert keys(**fields) == {}


def test_greedy_drops_sampling_only_keys() -> None:
    assert keys(temperature=0, top_p=0.5, top_k=5, min_p=0.1, seed=3) == {}


def test_sampling_with_neutral_top_p_sends_temperature_and_seed() -> None:
    assert keys(temperature=0.8, top_p=1) == {"temperature": "0.8", "seed": "7"}


def test_neutral_values_are_not_sent() -> None:
    got = keys(
        temperature=0.8,
        top_p=1.0,
        top_k=0,
        min_p=0,
        repetition_penalty=1,
        frequency_penalty=0,
        presence_penalty=0,
        penalty_last_n=128,
        logit_bias={},
    )
    assert got == {"temperature": "0.8", "seed": "7"}
    assert keys(temperature=0.8, top_k=-1) == {"temperature": "0.8", "seed": "7"}
    assert keys(logit_bias={"3": 0}) == {}


def test_every_key_when_asked() -> None:
    got = keys(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        penalty_last_n=32,
        max_tokens=16,
        logit_bias={"20": 1, "3": -100},
    )
    assert got == {
        "max_tokens": "16",
        "temperature": "0.7",
        "top_p": "0.9",
        "top_k": "40",
        "min_p": "0.05",
        "penalty_repeat": "1.1",
        "penalty_freq": "0.5",
        "penalty_present": "-0.5",
        "penalty_last_n": "32",
        "seed": "7",
        "bias": "3:-100.0,20:1.0",
    }


@pytest.mark.parametrize(
    ("field", "key"),
    [
        ("repetition_penalty", "penalty_repeat"),
        ("frequency_penalty", "penalty_freq"),
        ("presence_penalty", "penalty_present"),
    ],
)
def test_penalty_without_window_uses_64(field: str, key: str) -> None:
    got = keys(**{field: 1.5})
    assert got == {key: "1.5", "penalty_last_n": str(DEFAULT_PENALTY_LAST_N)}
    assert DEFAULT_PENALTY_LAST_N == 64


def test_penalties_apply_to_greedy_but_window_alone_is_neutral() -> None:
    assert keys(presence_penalty=0.5)["penalty_present"] == "0.5"
    assert keys(penalty_last_n=32) == {}


def test_penalty_window_zero_turns_penalties_off_and_minus_one_is_whole_context() -> None:
    assert keys(repetition_penalty=1.3, penalty_last_n=0) == {}
    got = keys(repetition_penalty=1.3, penalty_last_n=-1)
    assert got["penalty_last_n"] == str(PENALTY_LAST_N_ALL)


def test_seed_only_when_sampling() -> None:
    assert "seed" not in keys(seed=11, repetition_penalty=1.2)
    assert keys(seed=11, temperature=1.0)["seed"] == "11"


def test_the_request_seed_is_the_one_sent() -> None:
    r = req(temperature=1.0, seed=5)
    assert sent(r, seed=resolve_seed(r.seed))["seed"] == "5"


def test_resolve_seed() -> None:
    assert resolve_seed(0) == 0
    assert resolve_seed(2**64 - 1) == 2**64 - 1
    drawn = {resolve_seed(None) for _ in range(8)}
    assert len(drawn) > 1
    assert all(0 <= s < 2**63 for s in drawn)


def test_config_default_used_when_absent_and_when_null() -> None:
    defaults = SamplingConfig(temperature=0.6, top_k=20, repetition_penalty=1.1, max_tokens=100)
    expected = {
        "max_tokens": "100",
        "temperature": "0.6",
        "top_k": "20",
        "penalty_repeat": "1.1",
        "penalty_last_n": "64",
        "seed": "7",
    }
    assert keys(defaults) == expected
    assert keys(defaults, temperature=None, top_k=None, repetition_penalty=None) == expected
    assert keys(defaults, max_tokens=None) == expected


def test_request_wins_over_config() -> None:
    defaults = SamplingConfig(
        temperature=0.6, top_p=0.5, top_k=20, penalty_last_n=256, max_tokens=100
    )
    assert keys(defaults, temperature=0) == {"max_tokens": "100"}
    got = keys(defaults, temperature=1.2, top_p=1, top_k=-1, max_tokens=5)
    assert got == {"max_tokens": "5", "temperature": "1.2", "seed": "7"}
    got = keys(defaults, presence_penalty=0.25, penalty_last_n=8)
    assert got["penalty_last_n"] == "8"
    assert keys(defaults, max_completion_tokens=3)["max_tokens"] == "3"


def test_config_window_used_by_a_request_penalty() -> None:
    got = keys(SamplingConfig(penalty_last_n=256), frequency_penalty=0.1)
    assert got == {"penalty_freq": "0.1", "penalty_last_n": "256"}


def test_completion_requests_map_the_same_way() -> None:
    r = CompletionRequest.model_validate({"prompt": [1, 2], "temperature": 0.5, "max_tokens": 4})
    assert sent(r, seed=1) == {"max_tokens": "4", "temperature": "0.5", "seed": "1"}


@given(st.floats(min_value=0.0, max_value=2.0, exclude_min=True))
def test_floats_round_trip_exactly(t: float) -> None:
    sent = keys(temperature=t)["temperature"]
    assert float(sent) == t
    assert not math.isnan(float(sent))


def test_check_defaults() -> None:
    check_defaults(SamplingConfig())
    check_defaults(SamplingConfig(top_p=0.9, repetition_penalty=1.2, penalty_last_n=32))
    check_defaults(SamplingConfig(penalty_last_n=0))
    check_defaults(SamplingConfig(penalty_last_n=0, repetition_penalty=1.0))
    with pytest.raises(ValueError, match="penalty_last_n.*repetition_penalty"):
        check_defaults(SamplingConfig(penalty_last_n=0, repetition_penalty=1.2))
    with pytest.raises(ValueError, match="presence_penalty"):
        check_defaults(SamplingConfig(penalty_last_n=0, presence_penalty=0.5))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"logprobs": False, "logprobs_mode": "processed"}, {}),
        ({"logprobs": True}, {"logprobs": "0"}),
        ({"logprobs": True, "top_logprobs": 20}, {"logprobs": "20"}),
        ({"logprobs": 3}, {"logprobs": "3"}),
        ({"logprobs": True, "logprobs_mode": "raw"}, {"logprobs": "0"}),
        (
            {"logprobs": True, "top_logprobs": 2, "logprobs_mode": "processed"},
            {"logprobs": "2", "logprobs_mode": "processed"},
        ),
    ],
)
def test_logprobs_keys_only_when_asked(fields: dict[str, Any], expected: dict[str, str]) -> None:
    assert keys(**fields) == expected


def test_allowed_token_ids_are_sent_in_order_without_duplicates() -> None:
    assert keys(allowed_token_ids=[9, 2, 9, 5]) == {"allowed": "9,2,5"}
    r = CompletionRequest.model_validate({"prompt": "x", "logprobs": 5, "allowed_token_ids": [1]})
    assert sent(r, seed=1) == {"allowed": "1", "logprobs": "5"}


def test_llama_server_fields_are_sent_by_their_names_and_decode_back() -> None:
    got = keys(temperature=0.7, seed=3, typical_p=0.9, top_n_sigma=1.5, xtc_probability=0.5, xtc_threshold=0.2,
               dry_multiplier=0.8, dry_base=2.0, dry_allowed_length=3, dry_penalty_last_n=-1,
               dry_sequence_breakers=["\n", "é:"], dynatemp_range=0.3, dynatemp_exponent=2.0, mirostat=2,
               mirostat_tau=4.0, mirostat_eta=0.2, adaptive_target=0.4, adaptive_decay=0.5, min_keep=3,
               samplers=["dry", "Top-K", "typ", "nucleus", "temp", "adaptive_p", "infill"])  # fmt: skip
    s = GenOptions.decode(got).sampling
    assert (s.typical_p, s.top_n_sigma, s.xtc_probability, s.xtc_threshold) == (0.9, 1.5, 0.5, 0.2)
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n) == (0.8, 2.0, 3, -1)
    assert s.dry_sequence_breakers == ("\n", "é:") and " " not in got["dry_sequence_breakers"]
    assert (s.dynatemp_range, s.dynatemp_exponent, s.mirostat, s.mirostat_tau, s.mirostat_eta) == (0.3, 2.0, 2, 4.0, 0.2)
    assert (s.adaptive_target, s.adaptive_decay, s.min_keep, s.samplers) == (0.4, 0.5, 3, "dkyptai")


def test_llama_server_fields_greedy_sends_only_dry_and_defaults_fill_in() -> None:
    assert keys(typical_p=0.5, mirostat=2, xtc_probability=0.5) == {}  # cuts and draws: nothing to greedy
    assert keys(dry_multiplier=0.8) == {"dry_multiplier": "0.8"}
    cfg = SamplingConfig.model_validate({"temperature": 0.5, "mirostat": 2, "samplers": "kt"})
    got = keys(cfg)
    assert got["mirostat"] == "2" and got["samplers"] == "kt"
    assert keys(cfg, mirostat=0).get("mirostat") is None  # the request's own value wins


@pytest.mark.parametrize(("field", "value"), [
    ("dry_base", 0.9), ("typical_p", 1.1), ("mirostat", 3), ("adaptive_decay", 0.995), ("adaptive_target", 1.5),
    ("xtc_threshold", -0.1), ("min_keep", -1), ("dry_penalty_last_n", -2), ("samplers", ["beam"]),
    ("samplers", "kqt"), ("samplers", []), ("samplers", ""), ("dry_sequence_breakers", []), ("dry_sequence_breakers", [""]), ("dry_sequence_breakers", ["x"] * 65),
    ("top_n_sigma", math.inf), ("dynatemp_range", -1.0),
])  # fmt: skip
def test_llama_server_fields_out_of_range_are_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ApiError) as err:
        parse_request(ChatRequest, {"messages": [{"role": "user", "content": "hi"}], field: value})
    assert err.value.status == 400 and err.value.param == field, err.value
