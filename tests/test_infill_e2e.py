"""Code infill on the real engine: llama-server's /infill on a random model whose vocabulary
names FIM tokens, token for token against llama-server's own /infill on the same GGUF;
OpenAI's and Ollama's ``suffix`` make the same prompt; a model without FIM tokens is a 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_embeddings_e2e import FLASH

from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server, llama_server_binary
from strata_core.testing.harness import llama_server as run_llama_server
from strata_core.testing.models import SHAPES, write_random

pytestmark = pytest.mark.slow

#: tokens of SmolLM2's vocabulary named as the FIM markers (<issue_start>, ..., <repo_name>, <file_sep>)
FIM = {"pre": 8, "suf": 9, "mid": 10, "rep": 3, "sep": 5}
N_CTX = 1024
PREFIX = "def fib(n):\n    if n < 2:\n        return n\n"
SUFFIX = "\n\nprint(fib(10))\n"
EXTRA = [{"filename": "util.py", "text": "def add(a, b):\n    return a + b\n"}, {"text": "x = 1\n"}]
GREEDY = {"temperature": 0, "n_predict": 12}


@pytest.fixture(scope="module")
def fim_model(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fim") / "fim.gguf"
    write_random(default_model, path, SHAPES["tiny"], seed=3, fim=FIM)
    return path


@pytest.fixture(scope="module")
def ours(cpu_engine: EngineBuild, fim_model: Path) -> Iterator[Server]:
    args = ["--backend", "cpu", "--model", str(fim_model), "--parallel", "1", "--n-ctx", str(N_CTX)]
    with Server(args, fim_model.with_name("server.log")) as srv:
        yield srv


@pytest.fixture(scope="module")
def theirs(cpu_engine: EngineBuild, fim_model: Path, ours: Server) -> Iterator[str]:
    binary = llama_server_binary(cpu_engine)
    if binary is None:
        pytest.skip("no llama-server in the engine's build tree (python -m bench.peers builds it)")
    n_batch = httpx.get(f"{ours.base}/v1/strata/backend", timeout=30).json()["engine"]["n_batch"]
    args = ["-m", str(fim_model), "-fa", FLASH, "-c", str(N_CTX), "-np", "1", "-b", str(n_batch), "-t", "2"]
    with run_llama_server(binary, args, fim_model.with_name("llama-server.log")) as base:
        yield base


def infill(base: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{base}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, **GREEDY, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("body", [{}, {"input_extra": EXTRA, "prompt": "    return"}], ids=["plain", "extra-files"])
def test_equal_to_llama_servers_infill(ours: Server, theirs: str, body: dict[str, Any]) -> None:
    mine, ref = infill(ours.base, **body), infill(theirs, **body)
    print(f"prompt {ref['tokens_evaluated']} tokens; llama-server {ref['content']!r}, ours {mine['content']!r}")
    assert mine["tokens_evaluated"] == ref["tokens_evaluated"]  # the same prompt layout
    assert (mine["content"], mine["tokens_predicted"], mine["stop_type"]) == (
        ref["content"], ref["tokens_predicted"], ref["stop_type"])  # fmt: skip
    assert mine["tokens_predicted"] > 0 and mine["stop"] is True


def test_the_suffix_is_read(ours: Server) -> None:
    """The fixture: another suffix, another prompt and (this model) another middle."""
    a, b = infill(ours.base), infill(ours.base, input_suffix="\nreturn None\n" * 3)
    assert a["tokens_evaluated"] != b["tokens_evaluated"] and a["content"] != b["content"]


def test_openai_and_ollama_suffix_make_the_infill_prompt(ours: Server) -> None:
    ref = infill(ours.base)
    r = httpx.post(f"{ours.base}/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 12,
                                                        "temperature": 0}, timeout=120).json()  # fmt: skip
    assert r["choices"][0]["text"] == ref["content"]
    assert r["usage"]["prompt_tokens"] == ref["tokens_evaluated"]
    model = httpx.get(f"{ours.base}/v1/models", timeout=30).json()["data"][0]["id"]
    o = httpx.post(f"{ours.base}/api/generate", json={"model": model, "prompt": PREFIX, "suffix": SUFFIX, "stream": False,
                                                      "options": {"temperature": 0, "num_predict": 12}}, timeout=120)  # fmt: skip
    assert o.status_code == 200, o.text
    assert o.json()["response"] == ref["content"] and o.json()["prompt_eval_count"] == ref["tokens_evaluated"]
    show = httpx.post(f"{ours.base}/api/show", json={"model": model}, timeout=30).json()
    assert "insert" in show["capabilities"]  # what tells Ollama's clients the model takes a suffix


def test_streamed_infill_is_the_same_text(ours: Server) -> None:
    whole = infill(ours.base)
    events = []
    with httpx.stream("POST", f"{ours.base}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, **GREEDY,
                                                           "stream": True}, timeout=120) as r:  # fmt: skip
        events = [httpx.Response(200, content=line[6:]).json() for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/infill", {"input_prefix": "a", "input_suffix": "b"}, "input_suffix"),
    ("/v1/completions", {"prompt": "a", "suffix": "b"}, "suffix"),
])  # fmt: skip
def test_a_model_without_fim_tokens_is_400(server: Server, path: str, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{server.base}{path}", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_ollama_suffix_without_fim_tokens_is_400(server: Server) -> None:
    model = httpx.get(f"{server.base}/v1/models", timeout=30).json()["data"][0]["id"]
    r = httpx.post(f"{server.base}/api/generate", json={"model": model, "prompt": "a", "suffix": "b"}, timeout=60)
    assert r.status_code == 400 and "suffix" in r.json()["error"], r.text
    assert "insert" not in httpx.post(f"{server.base}/api/show", json={"model": model}, timeout=30).json()["capabilities"]


def test_bad_infill_requests_are_400(ours: Server) -> None:
    r = httpx.post(f"{ours.base}/infill", json={"input_prefix": "a"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_suffix"
    r = httpx.post(f"{ours.base}/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": "x"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict", r.text
