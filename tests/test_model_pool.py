"""Issue 16, item 4: several models in one server, each its own engine; the request's
``model`` picks one. Real engines, a real server, the official client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Name three colours."}]


def backend(server: Server, model: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{server.base}/v1/strata/backend", params={"model": model}, timeout=10).json()  # type: ignore[no-any-return]


def client_of(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def serve(tmp: Path, toml: str) -> Server:
    (tmp / "strata.toml").write_text(toml)
    return Server(["--config", str(tmp / "strata.toml")], tmp / "server.log")


@pytest.fixture(scope="module")
def two_models(cpu_engine: EngineBuild, default_model: Path, draft_model: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # fmt: skip
    """``small``: the default model, 512 tokens a slot; ``cut``: its first 28 layers,
    1024 tokens a slot, on the cpu backend named per model."""
    toml = f"""
[engine]
backend = "cpu"
parallel = 2

[models.small]
path = "{default_model}"
n_ctx = 512

[models.cut]
path = "{draft_model}"
backend = "cpu"
n_ctx = 1024
"""
    with serve(tmp_path_factory.mktemp("pool"), toml) as srv:
        yield srv


def test_models_lists_every_model(two_models: Server) -> None:
    assert [m.id for m in client_of(two_models).models.list()] == ["small", "cut"]


def test_model_field_picks_the_engine(two_models: Server) -> None:
    small, cut = backend(two_models, "small"), backend(two_models, "cut")
    assert small["engine"]["pid"] != cut["engine"]["pid"]
    assert (small["engine"]["n_ctx"], cut["engine"]["n_ctx"]) == (512, 1024)
    assert small["model_file"] != cut["model_file"]
    client = client_of(two_models)
    for name in ("small", "cut"):
        r = client.chat.completions.create(model=name, messages=CHAT, max_tokens=8)
        assert r.model == name and r.usage.completion_tokens == 8
        s = list(client.chat.completions.create(model=name, messages=CHAT, max_tokens=8, stream=True))
        assert {c.model for c in s} == {name}
        assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == r.choices[0].message.content
    # Each model's own context: 700 tokens fit "cut" (1024) but not "small" (512).
    long = "one two three " * 230
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="small", prompt=long, max_tokens=1)
    assert exc.value.code == "context_length_exceeded"
    r = client.completions.create(model="cut", prompt=long, max_tokens=1)
    assert 512 < r.usage.prompt_tokens < 1024


def test_unknown_model_is_a_404_naming_it(two_models: Server) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client_of(two_models).chat.completions.create(model="gpt-9", messages=CHAT, max_tokens=2)
    err = exc.value.body
    assert exc.value.code == "model_not_found" and err["param"] == "model"  # type: ignore[index]
    assert "'gpt-9'" in err["message"] and "'small'" in err["message"]  # type: ignore[index]


@pytest.fixture(scope="module")
def one_at_a_time(cpu_engine: EngineBuild, default_model: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # fmt: skip
    """The same file under two names, at most one engine running, idle ones stopped after 3 s."""
    toml = f"""
[server]
max_loaded = 1
idle_ttl_s = 3

[engine]
backend = "cpu"
parallel = 2
n_ctx = 512

[models.a]
path = "{default_model}"

[models.b]
path = "{default_model}"
preload = false
"""
    with serve(tmp_path_factory.mktemp("lazy"), toml) as srv:
        yield srv


def loaded(server: Server) -> dict[str, bool]:
    return {k: v["loaded"] for k, v in backend(server, "a")["models"].items()}


def test_load_on_first_use_and_max_loaded(one_at_a_time: Server) -> None:
    client = client_of(one_at_a_time)
    client.chat.completions.create(model="a", messages=CHAT, max_tokens=2)
    assert loaded(one_at_a_time) == {"a": True, "b": False}
    r = client.chat.completions.create(model="b", messages=CHAT, max_tokens=4)
    assert r.model == "b" and r.usage.completion_tokens == 4
    assert loaded(one_at_a_time) == {"a": False, "b": True}  # max_loaded = 1 stopped "a"


def test_idle_model_is_unloaded_then_reloads(one_at_a_time: Server) -> None:
    client = client_of(one_at_a_time)
    client.chat.completions.create(model="b", messages=CHAT, max_tokens=2)
    deadline = time.monotonic() + 30
    while loaded(one_at_a_time)["b"]:
        assert time.monotonic() < deadline, "the idle model was never unloaded"
        time.sleep(0.5)
    r = client.chat.completions.create(model="b", messages=CHAT, max_tokens=3)
    assert r.usage.completion_tokens == 3


def test_one_model_served_by_path_answers_to_the_aliases(cpu_engine: EngineBuild, default_model: Path,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """With one model, clients' usual names for it ("default") still name it whatever its
    file; only another name is a 404."""
    with Server(["--backend", "cpu", "--model", str(default_model), "--parallel", "1", "--n-ctx", "512"],
                tmp_path / "server.log") as srv:  # fmt: skip
        c = client_of(srv)
        r = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
        assert r.choices[0].finish_reason in {"length", "stop"}
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
