"""``POST /v1/rerank`` and ``/rerank`` on a reranker (a small Qwen3 with a rank head,
written with gguf), checked against llama.cpp's own llama-server on the same GGUF: equal
scores and the same order; the shapes llama-server, Jina and Cohere share; refusals."""

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
from strata_core.testing.models import write_reranker

pytestmark = pytest.mark.slow

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "The mitochondria is the powerhouse of the cell.",
    "Berlin is the capital of Germany.",
    "France is a country in Western Europe; its capital is Paris.",
    "Bananas are rich in potassium.",
]


@pytest.fixture(scope="module")
def reranker(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reranker") / "reranker.gguf"
    write_reranker(default_model, path)
    return path


@pytest.fixture(scope="module")
def ours(cpu_engine: EngineBuild, reranker: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("rerank-server") / "server.log"
    with Server(["--backend", "cpu", "--model", str(reranker), "--parallel", "1", "--n-ctx", "512"], log) as srv:
        yield srv.base


@pytest.fixture(scope="module")
def theirs(cpu_engine: EngineBuild, reranker: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary(cpu_engine)
    if binary is None:
        pytest.skip("no llama-server in the engine's build tree (python -m bench.peers builds it)")
    log_path = tmp_path_factory.mktemp("llama-server-rerank") / "llama-server.log"
    args = ["-m", str(reranker), "--reranking", "-fa", FLASH, "-c", "512", "-np", "1", "-t", "2"]
    with run_llama_server(binary, args, log_path) as base:
        yield base


def rank(base: str, path: str = "/v1/rerank", **body: Any) -> httpx.Response:
    return httpx.post(f"{base}{path}", json={"query": QUERY, "documents": DOCUMENTS, **body}, timeout=120)


def test_equal_to_llama_servers_rerank(ours: str, theirs: str) -> None:
    mine, ref = rank(ours).json(), rank(theirs).json()
    assert [r["index"] for r in mine["results"]] == [r["index"] for r in ref["results"]]
    diff = max(abs(a["relevance_score"] - b["relevance_score"]) for a, b in zip(mine["results"], ref["results"], strict=True))
    print(f"max |score difference| against llama-server: {diff:.3g}")
    assert diff <= 1e-4
    assert mine["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
    scores = [r["relevance_score"] for r in mine["results"]]
    assert len(set(scores)) == len(scores), "the fixture: the scores must tell the documents apart"


def test_the_shapes_top_n_and_return_documents(ours: str) -> None:
    whole = rank(ours).json()
    assert whole["object"] == "list" and len(whole["results"]) == len(DOCUMENTS)
    scores = [r["relevance_score"] for r in whole["results"]]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    assert sorted(r["index"] for r in whole["results"]) == list(range(len(DOCUMENTS)))
    assert all("document" not in r for r in whole["results"])
    top = rank(ours, "/rerank", top_n=2, return_documents=True).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in whole["results"][:2]]
    assert [r["document"]["text"] for r in top["results"]] == [DOCUMENTS[r["index"]] for r in top["results"]]
    objects = rank(ours, documents=[{"text": d} for d in DOCUMENTS]).json()  # Cohere / Jina objects
    assert objects["results"] == whole["results"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"query": ""}, "query"),
        ({"documents": []}, "documents"),
        ({"documents": ["a", ""]}, "documents"),
        ({"documents": "a"}, "documents"),
        ({"top_n": 0}, "top_n"),
        ({"max_tokens_per_doc": 10}, "max_tokens_per_doc"),
        ({"documents": ["word " * 600]}, "documents.0"),
    ],
)  # fmt: skip
def test_bad_requests_are_400s_naming_the_parameter(ours: str, body: dict[str, Any], param: str) -> None:
    r = rank(ours, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_a_model_without_a_rank_head_is_refused_naming_it(server: Server) -> None:
    r = rank(server.base)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == "model" and "has no rank head" in e["message"], e
