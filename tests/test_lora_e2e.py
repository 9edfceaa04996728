"""LoRA adapters for the default model, written with gguf: loaded with the model
(``[engine] lora``), listed (``GET /lora-adapters``, ``/v1/models``), applied per request
(``lora: [{id, scale}]``, llama-server's shape; a request without it gets the configured
scales), each request with its own adapters even when several decode together, and no
prefix cache shared across adapter sets."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata_core.ops.config import ConfigError, load_config
from strata_core.testing.harness import Server
from strata_core.testing.models import write_lora

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
N = 12


@pytest.fixture(scope="module")
def adapters(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("lora")
    a, b = d / "a.gguf", d / "b.gguf"
    write_lora(default_model, a, seed=1)
    write_lora(default_model, b, seed=2)
    return a, b


@pytest.fixture(scope="module")
def lora_server(cpu_engine: Any, adapters: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("lora-server")
    cfg = d / "strata.toml"
    cfg.write_text(f'[engine]\nbackend = "cpu"\nparallel = 4\nn_ctx = 1024\n'
                   f'lora = [{{path = "{adapters[0]}", name = "pirate", scale = 1.0}},\n'
                   f'        {{path = "{adapters[1]}", scale = 0.0}}]\n')  # fmt: skip
    with Server(["--config", str(cfg)], d / "server.log") as srv:
        yield srv


def complete(base: str, **fields: Any) -> str:
    r = httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": N, **fields}, timeout=300)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def scales(a: float, b: float) -> list[dict[str, float]]:
    return [{"id": 0, "scale": a}, {"id": 1, "scale": b}]


def test_the_adapters_are_listed(lora_server: Server, adapters: tuple[Path, Path]) -> None:
    listed = httpx.get(f"{lora_server.base}/lora-adapters", timeout=30).json()
    assert listed == [{"id": 0, "name": "pirate", "path": str(adapters[0]), "scale": 1.0},
                      {"id": 1, "name": "b", "path": str(adapters[1]), "scale": 0.0}]  # fmt: skip
    card = httpx.get(f"{lora_server.base}/v1/models", timeout=30).json()["data"][0]
    assert [a["name"] for a in card["lora_adapters"]] == ["pirate", "b"]


def test_scale_zero_is_the_base_model_and_scale_one_is_not(lora_server: Server, server: Server) -> None:
    base = complete(server.base)  # a server without adapters
    assert complete(lora_server.base, lora=scales(0.0, 0.0)) == base
    assert complete(lora_server.base, lora=[{"id": 0, "scale": 0.0}]) == base  # left out: 0
    a = complete(lora_server.base, lora=scales(1.0, 0.0))
    b = complete(lora_server.base, lora=scales(0.0, 1.0))
    assert a != base and b != base and a != b
    # no lora: the configured scales (pirate at 1, b at 0)
    assert complete(lora_server.base) == a


def test_requests_with_different_adapters_decoding_together_each_get_their_own(lora_server: Server) -> None:
    kinds = [scales(1.0, 0.0), scales(0.0, 1.0), scales(0.0, 0.0), scales(0.5, 0.5)]
    alone = [complete(lora_server.base, lora=k) for k in kinds]
    assert len(set(alone)) == len(alone), alone  # the fixture: four different replies
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda k: complete(lora_server.base, lora=k), kinds * 2))
    assert together == alone * 2


def test_a_cached_prefix_is_not_shared_across_adapters(lora_server: Server) -> None:
    long = "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 3
    first = complete(lora_server.base, prompt=long, lora=scales(0.0, 1.0))
    base = complete(lora_server.base, prompt=long, lora=scales(0.0, 0.0))
    again = complete(lora_server.base, prompt=long, lora=scales(0.0, 1.0))
    assert first == again and base != first
    r = httpx.post(f"{lora_server.base}/v1/completions", json={"prompt": long, "max_tokens": 1}, timeout=120)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no cache left by the others


@pytest.mark.parametrize("lora,says", [([{"id": 2, "scale": 1.0}], "has 2"), ([{"id": 0}], "scale"),
                                       ([{"id": 0, "scale": "x"}], "scale"), ({"id": 0}, "lora")])  # fmt: skip
def test_bad_lora_is_a_400_naming_it(lora_server: Server, lora: Any, says: str) -> None:
    r = httpx.post(f"{lora_server.base}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "lora": lora})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"].startswith("lora") and says in (e["message"] + e["param"]), e


def test_adapter_names_must_be_unique(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text('[engine]\nlora = [{path = "x/a.gguf"}, {path = "y/a.gguf", scale = 0.5}]\n')
    with pytest.raises(ConfigError, match="'a' appears more than once"):
        load_config(cfg, env={})
    cfg.write_text('[models.m]\npath = "default"\nlora = [{path = "x/a.gguf", name = "one"}]\n')
    assert [a.label() for a in load_config(cfg, env={}).for_model("m").engine.lora] == ["one"]
