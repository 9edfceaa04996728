"""Ollama's requests turned into the shared path's (strata_core/api/ollama_input.py)."""

from __future__ import annotations

import json

import pytest

from strata_core.api.ollama_input import OllamaChat, OllamaGenerate, OllamaModelName
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import parse_request


def chat(**body: object) -> OllamaChat:
    return parse_request(OllamaChat, {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})


def test_options_map_onto_strata_sampling() -> None:
    opts = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "num_predict": 32, "seed": 7,
            "stop": ["\n\n"], "repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0.5,
            "frequency_penalty": 0.25, "num_ctx": 2048, "mirostat": 0, "typical_p": 1.0}  # fmt: skip
    req = chat(options=opts).chat_request()
    assert (req.temperature, req.top_p, req.top_k, req.min_p, req.max_tokens, req.seed) == (0.7, 0.9, 40, 0.05, 32, 7)
    assert (req.repetition_penalty, req.penalty_last_n, req.presence_penalty, req.frequency_penalty) == (1.1, 64, 0.5, 0.25)
    assert req.stop_list() == ["\n\n"]
    unlimited = chat(options={"num_predict": -1, "top_k": 0}).chat_request()
    assert unlimited.max_tokens is None and unlimited.top_k is None


@pytest.mark.parametrize(("options", "param"), [
    ({"mirostat": 3}, "options.mirostat"), ({"num_gpu": 10}, "options.num_gpu"),
    ({"tfs_z": 0.5}, "options.tfs_z"), ({"typical_p": 1.5}, "options.typical_p"),
    ({"samplers": ["top_k", "beam"]}, "options.samplers"),
    ({"temperature": -1}, "options.temperature"), ({"repeat_penalty": 0}, "options.repeat_penalty"),
    ({"num_predict": -3}, "options.num_predict"), ({"bogus": 1}, "options.bogus"),
])  # fmt: skip
def test_bad_options_are_400s_naming_them(options: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as e:
        chat(options=options).chat_request()
    assert e.value.status == 400 and e.value.param == param and param in e.value.message


def test_llama_servers_sampling_options_pass_through() -> None:
    req = chat(options={"mirostat": 2, "mirostat_tau": 4.0, "typical_p": 0.9, "samplers": "kt"}).chat_request()
    assert (req.mirostat, req.mirostat_tau, req.typical_p, req.samplers) == (2, 4.0, 0.9, "kt")


def test_format_think_and_keep_alive() -> None:
    assert chat(format="json").chat_request().response_format.type == "json_object"  # type: ignore[union-attr]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = chat(format=schema).chat_request().response_format
    assert rf is not None and rf.type == "json_schema"
    assert chat(think=False).chat_request().chat_template_kwargs == {"enable_thinking": False}
    assert chat(think="high").chat_request().chat_template_kwargs == {"enable_thinking": True}
    assert [chat(keep_alive=k).unload_after() for k in (0, "0", "0s", "5m", "1h30m", -1, None)] == [
        True, True, True, False, False, False, False]  # fmt: skip
    for bad in ("soon", "", "5 m", "m"):
        with pytest.raises(ApiError) as e:
            chat(keep_alive=bad)
        assert e.value.status == 400 and e.value.param == "keep_alive"


def test_tool_calls_and_results_in_ollamas_shape() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_name": "get_weather", "content": "rain"},
    ]  # fmt: skip
    req = parse_request(OllamaChat, {"model": "m", "messages": messages}).chat_request()
    calls = req.messages[1].tool_calls
    assert calls is not None and [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert [m.tool_call_id for m in req.messages[2:]] == [calls[0].id, calls[1].id]
    lone = [{"role": "user", "content": "x"}, {"role": "tool", "tool_name": "f", "content": "y"}]
    with pytest.raises(ApiError, match="no tool call before it"):
        parse_request(OllamaChat, {"model": "m", "messages": lone}).chat_request()


def test_generate_and_refusals() -> None:
    g = parse_request(OllamaGenerate, {"model": "m", "prompt": "hi", "system": "be brief"})
    assert [m.role for m in g.chat_request().messages] == ["system", "user"]
    assert g.completion_request().prompt == "hi"
    for body, param in [({"images": ["aGk="]}, "images"), ({"context": [1, 2]}, "context")]:
        with pytest.raises(ApiError) as e:
            parse_request(OllamaGenerate, {"model": "m", "prompt": "hi", **body})
        assert e.value.status == 400 and e.value.param == param
    with pytest.raises(ApiError, match="images"):
        chat(messages=[{"role": "user", "content": "x", "images": ["aGk="]}])
    assert parse_request(OllamaModelName, {"name": "a/b"}).model_name == "a/b"
    with pytest.raises(ApiError):
        parse_request(OllamaModelName, {})


def test_openapi_component_names_do_not_collide() -> None:
    """/openapi.json puts every body's nested models among its components by class name: a
    model of Ollama's named like another family's (Anthropic's Message) would overwrite it."""
    import strata_core.api.app  # noqa: F401  (every family's routes register their bodies)
    from strata_core.api.openapi import _BODIES, REF

    def components(model: type) -> dict[str, object]:
        schema = model.model_json_schema(ref_template=REF)  # type: ignore[attr-defined]
        return {**schema.pop("$defs", {}), model.__name__: schema}

    ours = [m for m in _BODIES if m.__module__.endswith("ollama_input")]
    assert len(ours) == 5
    others = {name for m in _BODIES if m not in ours for name in components(m)}
    clash = {name for m in ours for name in components(m)} & others
    assert not clash
