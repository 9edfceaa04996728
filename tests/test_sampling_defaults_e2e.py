"""A model's sampling defaults, lowest to highest: Strata's (greedy), its GGUF's
``general.sampling.*``, the configuration's ([sampling], [models.NAME.sampling]), the
request. A random tiny model carrying temp / top_k / top_p is served twice: ``maker`` as
its GGUF says, ``tuned`` with a temperature of its own in the configuration."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata_core.api.sampling_defaults import layer_defaults
from strata_core.ops.build import EngineBuild
from strata_core.ops.config import SamplingConfig, load_config
from strata_core.testing.harness import Server
from strata_core.testing.models import SHAPES, write_random, write_tokenizer

pytestmark = pytest.mark.slow

MAKER = {"temp": 1.5, "top_k": 40, "top_p": 0.9, "xtc_probability": 0.5, "xtc_threshold": 0.1, "mirostat": 7}
SAMPLED = {"temperature": 1.5, "top_k": 40, "top_p": 0.9, "xtc_probability": 0.5, "xtc_threshold": 0.1}  # what the GGUF's keys mean to a request


@pytest.fixture(scope="module")
def config(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sampling-defaults")
    write_tokenizer(default_model, d / "tok.gguf")
    write_random(d / "tok.gguf", d / "maker.gguf", SHAPES["tiny"], n_ctx=512, sampling=MAKER)
    cfg = d / "strata.toml"
    cfg.write_text(f'[engine]\nbackend = "cpu"\nparallel = 1\nn_ctx = 256\n\n[sampling]\nmin_p = 0.01\n\n'
                   f'[models.maker]\npath = "{d / "maker.gguf"}"\n\n'
                   f'[models.tuned]\npath = "{d / "maker.gguf"}"\n[models.tuned.sampling]\ntemperature = 0.7\n')  # fmt: skip
    return cfg


@pytest.fixture(scope="module")
def srv(cpu_engine: EngineBuild, config: Path) -> Iterator[Server]:
    with Server(["--config", str(config)], config.with_name("server.log")) as s:
        yield s


def reply(srv: Server, model: str, **fields: Any) -> str:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 8, "seed": 7, **fields}
    r = httpx.post(f"{srv.base}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_a_request_without_sampling_gets_the_gguf_defaults(srv: Server) -> None:
    greedy = reply(srv, "maker", temperature=0)
    asked = reply(srv, "maker", **SAMPLED, min_p=0.01)
    assert asked != greedy  # the fixture: the GGUF's temperature samples another reply
    assert reply(srv, "maker") == asked
    assert reply(srv, "maker", seed=8) != asked  # sampled, not greedy: the seed matters


def test_the_configuration_overrides_the_gguf_and_the_request_both(srv: Server) -> None:
    tuned = reply(srv, "tuned")
    assert tuned == reply(srv, "maker", **{**SAMPLED, "temperature": 0.7}, min_p=0.01)
    assert tuned != reply(srv, "maker")
    assert reply(srv, "tuned", temperature=1.5) == reply(srv, "maker")  # the request over the config
    assert reply(srv, "tuned", temperature=0) == reply(srv, "maker", temperature=0)


def test_models_lists_each_default_and_where_it_came_from(srv: Server) -> None:
    cards = {m["id"]: m["strata"]["sampling_defaults"] for m in httpx.get(f"{srv.base}/v1/models").json()["data"]}
    assert cards["maker"]["temperature"] == {"value": 1.5, "source": "gguf"}
    assert cards["tuned"]["temperature"] == {"value": 0.7, "source": "config"}
    for card in cards.values():
        assert card["top_k"] == {"value": 40, "source": "gguf"}
        assert card["min_p"] == {"value": 0.01, "source": "config"}
        assert card["presence_penalty"] == {"value": 0.0, "source": "strata"}
    show = httpx.post(f"{srv.base}/api/show", json={"model": "tuned"}).json()["parameters"].splitlines()
    assert {"temperature 0.7", "top_k 40", "top_p 0.9", "min_p 0.01"} <= set(show) and "presence_penalty 0.0" not in show


def test_doctor_shows_the_defaults(cpu_engine: EngineBuild, config: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "doctor", "--config", str(config)],
                         capture_output=True, text=True, timeout=300).stdout  # fmt: skip
    assert "model tuned:" in out and "temperature=0.7 (config)" in out, out
    assert "temperature=1.5 (gguf)" in out and "top_k=40 (gguf)" in out, out
    assert "not applied from the GGUF: mirostat=7" in out, out  # out of range


def test_layers_key_by_key(tmp_path: Path) -> None:
    gguf = {"temp": 0.6, "top_k": 20, "penalty_repeat": 1.1, "top_p": 7.0, "sequence": "top_k;temperature"}
    d = layer_defaults(gguf, SamplingConfig(top_k=5))
    assert (d.sampling.temperature, d.sampling.top_k, d.sampling.repetition_penalty) == (0.6, 5, 1.1)
    assert d.sampling.samplers == "kt" and d.sources["samplers"] == "gguf"  # llama.cpp's names, as letters
    assert d.sources["temperature"] == "gguf" and d.sources["top_k"] == "config" and d.sources["top_p"] == "strata"
    assert d.ignored == {"top_p": 7.0}  # out of range: left to the layer below
    cfg = tmp_path / "strata.toml"
    cfg.write_text('[sampling]\ntemperature = 0.2\ntop_p = 0.5\n[models.m]\npath = "default"\n'
                   '[models.m.sampling]\ntemperature = 0.9\n')  # fmt: skip
    sampling = load_config(cfg, env={}).for_model("m").sampling
    assert (sampling.temperature, sampling.top_p) == (0.9, 0.5)
