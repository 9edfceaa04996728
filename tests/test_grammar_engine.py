"""The engine's ``grammar`` key on the real engine: masks before sampling, the end of a
request once the grammar is complete, refused grammars, lark with embedded JSON schemas,
logprobs raw and processed, and n-gram speculation under a grammar."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.contract import protocol as proto
from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import EngineProcess
from strata_core.text.grammars import json_schema_grammar

pytestmark = pytest.mark.slow

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(cpu_engine: EngineBuild, default_model: Path):  # type: ignore[no-untyped-def]
    e = EngineProcess(CpuBackend(), cpu_engine, default_model, parallel=2, spec_adaptive=False)
    yield e
    e.close()


@pytest.fixture(scope="module")
def pieces(engine: EngineProcess) -> tuple[bytes, ...]:
    engine.send(proto.VocabRequest("vocab"))
    return engine.expect(proto.Vocab).pieces


def tokenize(engine: EngineProcess, text: str) -> list[int]:
    engine.send(proto.Tokenize("tk", text, True))
    return list(engine.expect(proto.Tokens).ids)


def generate(engine: EngineProcess, rid: str, prompt: list[int], pieces: tuple[bytes, ...], **keys: object):  # type: ignore[no-untyped-def]
    events = engine.run(rid, prompt, **keys)
    done = events[-1]
    assert isinstance(done, proto.Done)
    ids = [e.id for e in events if isinstance(e, proto.Token)]
    return b"".join(pieces[i] for i in ids).decode("utf-8"), ids, done, events


def test_the_engine_advertises_grammar(engine: EngineProcess) -> None:
    assert "grammar" in engine.ready.info["capabilities"]


def test_json_schema_constrains_and_ends_when_complete(engine: EngineProcess, pieces: tuple[bytes, ...]) -> None:
    prompt = tokenize(engine, "Tell me a story about a dragon.")
    free, _, _, _ = generate(engine, "free", prompt, pieces, max_tokens=40)
    with pytest.raises(ValueError):  # the fixture: left alone, the model does not write JSON
        json.loads(free)
    value = proto.encode_grammar("llguidance", json_schema_grammar(CITY))
    text, _, done, _ = generate(engine, "js", prompt, pieces, max_tokens=120, grammar=value)
    jsonschema.validate(json.loads(text), CITY)
    assert done.reason == "stop"  # ended by the grammar, not by max_tokens


def test_json_object_and_json_schema_kinds(engine: EngineProcess, pieces: tuple[bytes, ...]) -> None:
    prompt = tokenize(engine, "Describe a cat.")
    text, _, _, _ = generate(engine, "jo", prompt, pieces, max_tokens=200, grammar="json_object")
    assert isinstance(json.loads(text), dict)
    # Items of bounded length: an unbounded integer lets the model spell digits until
    # max_tokens on some CPUs' numerics, and a cut-off answer tests nothing of the grammar.
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 3}
    value = proto.encode_grammar("json_schema", json.dumps(schema))
    text, _, done, _ = generate(engine, "ja", prompt, pieces, max_tokens=60, grammar=value)
    jsonschema.validate(json.loads(text), schema)
    assert done.reason == "stop"


def test_a_bad_grammar_is_an_error_and_the_engine_serves_on(engine: EngineProcess, pieces: tuple[bytes, ...]) -> None:
    prompt = tokenize(engine, "Hello")
    for rid, value in [("bad1", proto.encode_grammar("lark", "start: foo(")), ("bad2", "gbnf:eA==")]:
        events = engine.run(rid, prompt, max_tokens=4, grammar=value)
        assert isinstance(events[0], proto.Error) and "grammar" in events[0].message, events
        assert isinstance(events[-1], proto.Done) and events[-1].reason == "error"
    _, ids, done, _ = generate(engine, "after", prompt, pieces, max_tokens=4)
    assert len(ids) == 4 and done.reason == "length"


def test_lark_with_an_embedded_json_schema(engine: EngineProcess, pieces: tuple[bytes, ...]) -> None:
    """What tool_choice enforcement sends: lark around a %json schema."""
    args = {"type": "object", "properties": {"location": {"type": "string", "maxLength": 16}},
            "required": ["location"], "additionalProperties": False}  # fmt: skip
    lark = f'start: "<call>get_weather " args "</call>"\nargs: %json{json.dumps(args)}\n'
    prompt = tokenize(engine, "What is the weather in Paris?")
    text, _, done, _ = generate(engine, "lark", prompt, pieces, max_tokens=80,
                                grammar=proto.encode_grammar("lark", lark))  # fmt: skip
    assert text.startswith("<call>get_weather ") and text.endswith("</call>"), text
    jsonschema.validate(json.loads(text[len("<call>get_weather ") : -len("</call>")]), args)
    assert done.reason == "stop"


def test_logprobs_raw_before_the_mask_processed_after(engine: EngineProcess, pieces: tuple[bytes, ...]) -> None:
    prompt = tokenize(engine, "Tell me a story about a dragon.")
    value = proto.encode_grammar("llguidance", json_schema_grammar(CITY))
    _, raw_ids, _, raw = generate(engine, "raw", prompt, pieces, max_tokens=3, grammar=value, logprobs=5)
    _, ids, _, proc = generate(engine, "proc", prompt, pieces, max_tokens=3, grammar=value, logprobs=5,
                               logprobs_mode="processed")  # fmt: skip
    assert ids == raw_ids
    first_raw = next(e for e in raw if isinstance(e, proto.Logprob))
    first_proc = next(e for e in proc if isinstance(e, proto.Logprob))
    # The first token is forced ('{"'): the model's own distribution prefers others ...
    assert len(first_raw.top) == 5 and first_raw.top[0][0] != raw_ids[0]
    assert first_raw.logprob < -0.5
    # ... and the sampled-from distribution is the mask's single survivor.
    assert [t for t, _ in first_proc.top] == [ids[0]] and math.isclose(first_proc.logprob, 0.0, abs_tol=1e-6)


def test_speculation_under_a_grammar_keeps_the_output(engine: EngineProcess, pieces: tuple[bytes, ...]) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    listing = json.dumps(words * 2)
    prompt = tokenize(engine, f"Copy this JSON list exactly: {listing}\nCopy: {listing}\nCopy: ")
    schema = {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 12}
    value = proto.encode_grammar("llguidance", json_schema_grammar(schema))
    off, _, off_done, _ = generate(engine, "off", prompt, pieces, max_tokens=60, grammar=value)
    on, _, on_done, _ = generate(engine, "on", prompt, pieces, max_tokens=60, grammar=value, spec="ngram")
    assert int(on_done.stats["drafted"]) > 0 and int(on_done.stats["accepted"]) > 0, on_done.stats
    assert on == off and on_done.reason == off_done.reason
    jsonschema.validate(json.loads(on), schema)


def test_a_grammar_that_permits_nothing_fails_only_its_request(engine: EngineProcess, pieces: tuple[bytes, ...]) -> None:
    prompt = tokenize(engine, "Hello")
    brace = tokenize(engine, "{")
    other = next(t for t in range(100, 200) if pieces[t] and not pieces[t].startswith(b"{"))
    assert brace and other not in brace
    # json_object must start with '{': with only `other` allowed, nothing is permitted.
    events = engine.run("none", prompt, max_tokens=4, grammar="json_object", allowed=str(other))
    assert isinstance(events[0], proto.Error) and "permitted" in events[0].message, events
    assert isinstance(events[-1], proto.Done) and events[-1].reason == "error"
    _, ids, done, _ = generate(engine, "next", prompt, pieces, max_tokens=3)
    assert len(ids) == 3 and done.reason == "length"
