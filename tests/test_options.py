"""The engine contract (strata_core/contract/options.py): GEN keys to typed options and back."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_core.contract import protocol as proto
from strata_core.contract.options import MAX_ALTERNATIVES, GenOptions, OptionError, SamplingParams

N_VOCAB = 49152


def decode(keys: dict[str, str]) -> GenOptions:
    opts = GenOptions.decode(keys)
    opts.check(N_VOCAB)
    return opts


def test_decode_reads_every_key() -> None:
    keys = {
        "temperature": "0.7", "top_p": "0.9", "top_k": "40", "min_p": "0.05",
        "penalty_repeat": "1.1", "penalty_freq": "0.5", "penalty_present": "0.25",
        "penalty_last_n": "64", "seed": str(2**64 - 1), "allowed": "1,2,3",
        "bias": "5:-1.5,7:2,9:-inf", "max_tokens": "10", "logprobs": "3", "logprobs_mode": "processed",
        "stop_ids": "4,5", "grammar": "json_object", "spec": "ngram", "isolate": "1",
    }  # fmt: skip
    assert decode(keys) == GenOptions(
        max_tokens=10, logprobs=3, logprobs_mode="processed", stop_ids=(4, 5), grammar="json_object",
        spec="ngram", isolate=True,
        sampling=SamplingParams(
            temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, penalty_repeat=1.1, penalty_freq=0.5,
            penalty_present=0.25, penalty_last_n=64, seed=2**64 - 1, allowed=(1, 2, 3),
            bias={5: -1.5, 7: 2.0, 9: -math.inf},
        ),
    )  # fmt: skip


def test_defaults_are_not_sent() -> None:
    """A plain request is an empty GEN: the engine reads nothing and takes one argmax."""
    assert GenOptions().encode() == {}
    assert GenOptions(max_tokens=5, sampling=SamplingParams(top_p=1.0)).encode() == {"max_tokens": "5"}
    assert GenOptions.decode({}).sampling.plain


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", "-0.1"), ("temperature", "nan"), ("temperature", "hot"),
        ("top_p", "1.5"), ("top_p", "-0.1"), ("top_k", "-1"), ("top_k", "4.5"),
        ("min_p", "1.01"), ("penalty_repeat", "0"), ("penalty_freq", "inf"),
        ("penalty_present", "nan"), ("penalty_last_n", "-1"), ("seed", "-1"),
        ("seed", str(2**64)), ("allowed", f"1,{N_VOCAB}"), ("allowed", "1,x"), ("allowed", ""),
        ("bias", f"{N_VOCAB}:1"), ("bias", "3"), ("bias", "3:inf"), ("bias", "3:nan"),
        ("bias", "-1:2"), ("stop_ids", f"{N_VOCAB + 5}"), ("max_tokens", "0"), ("logprobs", "21"),
        ("logprobs", "-1"), ("logprobs_mode", "cooked"), ("spec", "eagle"), ("isolate", "yes"),
    ],
)  # fmt: skip
def test_errors_name_the_key_and_what_was_wrong(key: str, value: str) -> None:
    with pytest.raises(OptionError, match=rf"^{key}=.*expected") as err:
        decode({key: value})
    assert err.value.key == key
    shown = str(err.value).split(" is ")[0].split("=", 1)[1].strip("'")
    # it shows what was wrong: the value (as parsed) or the bad part of a list
    assert shown in value or float(shown) == float(value)


def test_unknown_keys_are_listed_not_read() -> None:
    assert GenOptions.unknown(["temperature", "cache", "max_tokens", "frobnicate"]) == ["cache", "frobnicate"]
    assert GenOptions.decode({"frobnicate": "1"}) == GenOptions()


def test_the_alternatives_cap_is_the_contracts() -> None:
    assert GenOptions(logprobs=MAX_ALTERNATIVES).logprobs == 20
    with pytest.raises(OptionError):
        GenOptions(logprobs=MAX_ALTERNATIVES + 1)


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
token = st.integers(0, N_VOCAB - 1)
options = st.builds(
    GenOptions,
    max_tokens=st.none() | st.integers(1, 10**6),
    sampling=st.builds(
        SamplingParams,
        temperature=st.floats(0, 5), top_k=st.integers(0, 1000), top_p=st.floats(0, 1), min_p=st.floats(0, 1),
        penalty_repeat=st.floats(0.01, 10), penalty_freq=finite, penalty_present=finite,
        penalty_last_n=st.integers(0, 1 << 20), seed=st.integers(0, 2**64 - 1),
        bias=st.dictionaries(token, finite | st.just(-math.inf), max_size=4),
        allowed=st.none() | st.lists(token, min_size=1, max_size=4).map(tuple),
    ),
    stop_ids=st.lists(token, max_size=3).map(tuple),
    logprobs=st.none() | st.integers(0, MAX_ALTERNATIVES),
    logprobs_mode=st.sampled_from(["raw", "processed"]),
    grammar=st.none() | st.sampled_from(["json_object", proto.encode_grammar("regex", "[ab]+")]),
    spec=st.sampled_from(["off", "ngram", "draft"]),
    isolate=st.booleans(),
)  # fmt: skip


@settings(deadline=None)  # a loaded 2-core machine must not fail a pure function
@given(options)
def test_what_is_encoded_decodes_to_the_same_options(opts: GenOptions) -> None:
    keys = opts.encode()
    assert decode(keys) == opts
    # and the keys travel in a GEN line unchanged
    gen = proto.parse_command(proto.encode_command(proto.Gen("r1", keys, (1, 2))))
    assert isinstance(gen, proto.Gen) and GenOptions.decode(gen.keys) == opts


@pytest.mark.parametrize("further", [
    {"typical_p": 0.9}, {"top_n_sigma": 1.0}, {"xtc_probability": 0.5}, {"dynatemp_range": 0.5},
    {"mirostat": 2}, {"min_keep": 3}, {"samplers": "kt"}, {"dry_multiplier": 0.8},
    {"adaptive_target": 0.5, "samplers": "kta"},
])  # fmt: skip
def test_a_further_stage_turns_windows_off_and_leaves_the_plain_path(further: dict[str, object]) -> None:
    """Speculation's verifier knows the plain chain only: a request with any of llama.cpp's
    further stages gets no windows; one without them keeps the plain path (nothing to pay)."""
    plain = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=1)
    assert not plain.windowless and not plain.extended and not plain.dry
    p = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=1, **further)  # type: ignore[arg-type]
    assert p.windowless and (p.extended or p.dry)
    assert p.stateful == ("mirostat" in further or "adaptive_target" in further)
    greedy = SamplingParams(**further)  # type: ignore[arg-type]
    assert greedy.windowless == ("dry_multiplier" in further)  # a greedy pick runs DRY alone
    assert greedy.plain == ("dry_multiplier" not in further)
