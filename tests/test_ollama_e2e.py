"""The Ollama API end to end: the official ``ollama`` client against ``strata serve``, whose
model is a hub reference pulled at start from a loopback hub (HF_ENDPOINT), with
``[server] catalog = true`` so a model pulled through ``/api/pull`` is served too.

The served model ("smol") is the default model's file carrying a Hermes-style template
that shows it tools, set in the configuration (``chat_template``); the catalog's second
model is a tiny random Llama whose GGUF has no chat template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.fake_hub import FakeHub
from strata_core.testing.harness import Server

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow

SMOL_REPO = "strata/SmolLM2-GGUF"
TINY_REPO = "strata/Tiny-GGUF"
N_CTX = 1024


@pytest.fixture(scope="module")
def served(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, FakeHub]]:
    from test_tools_e2e import TOOLS_TEMPLATE

    from strata_core.testing.models import (
        SHAPES,
        write_random,
        write_tokenizer,
        write_with_template,
    )

    d = tmp_path_factory.mktemp("ollama")
    write_tokenizer(default_model, d / "tok.gguf")
    write_random(d / "tok.gguf", d / "tiny-t.gguf", SHAPES["tiny"], n_ctx=512)
    write_with_template(d / "tiny-t.gguf", d / "tiny.gguf", "")  # a GGUF with no chat template
    (d / "tools.jinja").write_text(TOOLS_TEMPLATE)
    config = d / "strata.toml"
    config.write_text(f"""
[server]
catalog = true
max_loaded = 1

[models.smol]
path = "hf:{SMOL_REPO}:Q4_1"
chat_template = "{d / 'tools.jinja'}"
parallel = 2
n_ctx = {N_CTX}
""")
    with FakeHub() as hub:
        hub.add(SMOL_REPO, {"SmolLM2-135M-Instruct-Q4_1.gguf": default_model.read_bytes()})
        hub.add(TINY_REPO, {"tiny-F16.gguf": (d / "tiny.gguf").read_bytes()})
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(d / "hf"), "HF_HUB_OFFLINE": "0"}
        with Server(["--backend", "cpu", "--config", str(config)], d / "server.log", env=env) as srv:
            yield srv, hub


@pytest.fixture(scope="module")
def client(served: tuple[Server, FakeHub]) -> Any:
    return ollama.Client(host=served[0].base, timeout=600)


HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
GREEDY = {"temperature": 0, "num_predict": 12}


def test_pulled_at_start_and_listed(client: Any, served: tuple[Server, FakeHub]) -> None:
    server, hub = served
    assert len(hub.downloads("SmolLM2-135M-Instruct-Q4_1.gguf")) == 1
    names = [m.model for m in client.list().models]
    assert names == ["smol"]  # the cache's copy of the same file is not listed twice
    (m,) = client.list().models
    assert m.details.format == "gguf" and m.details.family == "llama" and m.details.quantization_level == "Q4_1"
    assert m.size > 50_000_000 and m.digest and len(m.digest) == 64
    assert [x.id for x in openai.OpenAI(base_url=f"{server.base}/v1", api_key="x").models.list()] == ["smol"]


def test_chat_counts_and_durations_and_the_same_reply_as_openai(client: Any, served: tuple[Server, FakeHub]) -> None:
    r = client.chat(model="smol", messages=HELLO, options=GREEDY, stream=False)
    assert r.done and r.done_reason == "length" and r.eval_count == 12
    assert r.message.role == "assistant" and r.message.content
    assert r.prompt_eval_count > 5 and r.total_duration >= r.eval_duration > 0
    oa = openai.OpenAI(base_url=f"{served[0].base}/v1", api_key="x")
    same = oa.chat.completions.create(model="smol", messages=HELLO, temperature=0, max_tokens=12)  # type: ignore[arg-type]
    assert same.choices[0].message.content == r.message.content
    assert client.chat(model="smol:latest", messages=HELLO, options=GREEDY).message.content == r.message.content


def test_stream_is_ndjson_with_a_final_chunk(client: Any) -> None:
    whole = client.chat(model="smol", messages=HELLO, options=GREEDY)
    parts = list(client.chat(model="smol", messages=HELLO, options=GREEDY, stream=True))
    assert len(parts) > 3 and not any(p.done for p in parts[:-1])
    last = parts[-1]
    assert last.done and last.done_reason == "length" and last.eval_count == 12 and last.prompt_eval_duration > 0
    assert "".join(p.message.content for p in parts) == whole.message.content


def test_generate_uses_the_template_and_raw_does_not(client: Any) -> None:
    g = client.generate(model="smol", prompt=HELLO[0]["content"], options=GREEDY)
    assert g.done and g.response == client.chat(model="smol", messages=HELLO, options=GREEDY).message.content
    raw = client.generate(model="smol", prompt=HELLO[0]["content"], raw=True, options=GREEDY)
    assert raw.prompt_eval_count < g.prompt_eval_count  # no template around it
    streamed = list(client.generate(model="smol", prompt=HELLO[0]["content"], options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == g.response and streamed[-1].done


def test_embed_and_the_older_embeddings(client: Any) -> None:
    e = client.embed(model="smol", input=["The cat sat.", "Stocks fell today."])
    a, b = (np.array(v) for v in e.embeddings)
    assert a.shape == b.shape and a.shape[0] > 100
    assert abs(np.linalg.norm(a) - 1) < 1e-4 and not np.allclose(a, b)
    assert e.prompt_eval_count > 4
    old = np.array(client.embeddings(model="smol", prompt="The cat sat.").embedding)
    assert abs(float(old @ a) / np.linalg.norm(old) - 1) < 1e-4  # the same direction, not normalised


def test_show_ps_and_version(client: Any, served: tuple[Server, FakeHub]) -> None:
    s = client.show("smol")
    assert s.modelinfo["llama.context_length"] == 8192 and s.modelinfo["general.architecture"] == "llama"
    assert "<tool_call>" in s.template  # the configured template, not the GGUF's
    assert "completion" in s.capabilities and "tools" in s.capabilities
    client.chat(model="smol", messages=HELLO, options=GREEDY)
    (p,) = client.ps().models
    assert p.model == "smol" and p.context_length == N_CTX
    assert httpx.get(f"{served[0].base}/api/version", timeout=60).json()["version"] >= "0.12"
    assert httpx.get(served[0].base, timeout=60).text == "Ollama is running"  # what clients probe


def test_format_json_schema_and_json(client: Any) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
    msgs = [{"role": "user", "content": "Invent a person. Reply in JSON."}]
    r = client.chat(model="smol", messages=msgs, format=schema, options={"temperature": 0, "num_predict": 60})
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.message.content), schema)
    r = client.chat(model="smol", messages=msgs, format="json", options={"temperature": 0, "num_predict": 60})
    assert r.message.content.lstrip().startswith("{")  # a JSON object, cut short or not


CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
AGAIN = [
    {"role": "user", "content": "Repeat exactly: " + CALL_TEXT},
    {"role": "assistant", "content": CALL_TEXT},
    {"role": "user", "content": "Again, exactly."},
]


def test_tools_calls_with_object_arguments_and_a_round_trip(client: Any) -> None:
    from test_tools_e2e import WEATHER

    opts = {"temperature": 0, "num_predict": 60}
    # the fixture: without tools the model writes the call's markup as text
    plain = client.chat(model="smol", messages=AGAIN, options=opts)
    assert plain.message.content.strip() == CALL_TEXT and not plain.message.tool_calls
    r = client.chat(model="smol", messages=AGAIN, tools=[WEATHER], options=opts)
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert r.message.content == "" and r.done_reason == "stop"
    streamed = [p for p in client.chat(model="smol", messages=AGAIN, tools=[WEATHER], options=opts, stream=True)
                if p.message.tool_calls]  # fmt: skip
    assert [c.function.arguments for p in streamed for c in p.message.tool_calls] == [{"city": "Paris"}]
    # the call and its result sent back, as Ollama's clients send them
    turn = [*AGAIN, {"role": "assistant", "content": "", "tool_calls": [call.model_dump(exclude_none=True)]},
            {"role": "tool", "tool_name": "get_weather", "content": "18 C and sunny"}]  # fmt: skip
    back = client.chat(model="smol", messages=turn, tools=[WEATHER], options=opts)
    assert back.done


def test_think_opens_the_templates_reasoning(client: Any) -> None:
    # the configured template opens <think> with enable_thinking: what follows is thinking
    r = client.chat(model="smol", messages=HELLO, think=True, options=GREEDY)
    assert r.message.thinking and r.message.content == "" and "<think>" not in r.message.thinking
    plain = client.chat(model="smol", messages=HELLO, think=False, options=GREEDY)
    assert plain.message.content and not plain.message.thinking
    parts = list(client.chat(model="smol", messages=HELLO, think=True, options=GREEDY, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking


def test_seeded_replay(client: Any) -> None:
    opts = {"temperature": 1.0, "seed": 1234, "num_predict": 16}
    one = client.generate(model="smol", prompt="Once upon a time", options=opts).response
    assert client.generate(model="smol", prompt="Once upon a time", options=opts).response == one
    other = client.generate(model="smol", prompt="Once upon a time", options={**opts, "seed": 99}).response
    assert other != one  # the sampling really draws
    # the options Ollama's clients send for llama.cpp's samplers: Mirostat 2, typical_p
    miro = {**opts, "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2}
    m1 = client.generate(model="smol", prompt="Once upon a time", options=miro).response
    assert client.generate(model="smol", prompt="Once upon a time", options=miro).response == m1 != one
    typical = {**opts, "typical_p": 0.5}
    t1 = client.generate(model="smol", prompt="Once upon a time", options=typical).response
    assert client.generate(model="smol", prompt="Once upon a time", options=typical).response == t1 != one


def test_errors_in_ollamas_shape(client: Any, served: tuple[Server, FakeHub]) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope:7b", messages=HELLO)
    assert e.value.status_code == 404 and "nope:7b" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smol", messages=HELLO, options={"num_ctx": N_CTX * 4})
    assert e.value.status_code == 400 and "options.num_ctx" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smol", messages=HELLO, options={"mirostat": 3})
    assert e.value.status_code == 400 and "options.mirostat" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smol", messages=HELLO, options={"temperature": -1})
    assert e.value.status_code == 400 and "options.temperature" in e.value.error
    r = httpx.post(f"{served[0].base}/api/chat", content=b"{not json", timeout=60)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = httpx.get(f"{served[0].base}/api/nothing", timeout=60)
    assert r.status_code == 404 and isinstance(r.json()["error"], str)


def test_pull_serve_unload_and_delete_a_catalog_model(client: Any, served: tuple[Server, FakeHub]) -> None:
    server, _ = served
    events = list(client.pull(f"hf.co/{TINY_REPO}:latest", stream=True))
    assert events[0].status == "pulling manifest" and events[-1].status == "success"
    got = [e for e in events if e.total]
    assert got and got[-1].completed == got[-1].total and got[-1].digest.startswith("sha256:")
    name = f"{TINY_REPO}:F16"
    assert name in [m.model for m in client.list().models]
    # loaded on first use; max_loaded = 1 unloads the idle "smol"
    r = client.generate(model=TINY_REPO, prompt="abc", raw=True, options={"num_predict": 4, "temperature": 0})
    assert r.done and r.eval_count == 4
    assert [p.model for p in client.ps().models] == [name]
    # its GGUF has no chat template and none is configured: chat is refused, clearly
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=name, messages=HELLO)
    assert e.value.status_code == 400 and "no chat template" in e.value.error
    client.generate(model=name, keep_alive=0)  # unload
    assert client.ps().models == []
    assert client.delete(name).status == "success"
    assert name not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as e:
        client.delete(name)
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("strata/Nothing-GGUF")
    assert e.value.status_code == 404 and "no repository" in e.value.error


def test_pull_and_delete_need_the_catalog(server: Server) -> None:
    """Without [server] catalog the hub's cache, which other tools share, is not the clients' to change."""
    c = ollama.Client(host=server.base, timeout=600)
    for call in (lambda: c.pull("acme/Tiny-GGUF"), lambda: c.delete("acme/Tiny-GGUF:Q4_K_M")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 403 and "[server] catalog" in e.value.error
    assert [m.model for m in c.list().models] == ["smollm2-135m-instruct"]
    r = c.chat(model="default", messages=HELLO, options=GREEDY)  # an alias, as with the other APIs
    named = c.chat(model="smollm2-135m-instruct", messages=HELLO, options=GREEDY)
    # the same reply as by the model's own name (its length is the CPU's numerics': 11 or 12 tokens)
    assert r.done and r.eval_count == named.eval_count > 0 and r.message.content == named.message.content
