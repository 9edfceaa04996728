"""``POST /v1/embeddings`` on the real engine and the default model, through the openai
SDK: meaning (paraphrases closer than unrelated sentences), both encodings, batches of
strings and of token ids, usage, refusals, and equality with llama.cpp's own llama-server
embedding the same input."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from strata_core.backends.cpu import CpuBackend
from strata_core.ops.build import EngineBuild
from strata_core.testing.harness import Server, llama_server_binary
from strata_core.testing.harness import llama_server as run_llama_server

pytestmark = pytest.mark.slow

PARAPHRASES = [
    ("The cat sat on the mat.", "A cat was sitting on the rug."),
    ("How do I bake bread at home?", "What is a good way to make bread in my kitchen?"),
]
UNRELATED = "Interest rates rose sharply in the third quarter."


def vectors(client: openai.OpenAI, inputs: Any, **kw: Any) -> np.ndarray:
    r = client.embeddings.create(model="default", input=inputs, **kw)
    assert [d.index for d in r.data] == list(range(len(r.data)))
    return np.array([d.embedding for d in r.data], dtype=np.float64)


def post(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base}/v1/embeddings", json=body, timeout=120)


def test_paraphrases_are_closer_than_unrelated_sentences(client: openai.OpenAI) -> None:
    for a, b in PARAPHRASES:
        va, vb, vu = vectors(client, [a, b, UNRELATED])
        assert va @ vb > va @ vu + 0.05 and va @ vb > vb @ vu + 0.05, (va @ vb, va @ vu, vb @ vu)


def test_unit_vectors_in_both_encodings(client: openai.OpenAI, server: Server) -> None:
    text = PARAPHRASES[0][0]
    floats = vectors(client, text, encoding_format="float")
    sdk_default = vectors(client, text)  # the SDK asks for base64 and decodes it itself
    b64 = post(server, {"input": text, "encoding_format": "base64"}).json()["data"][0]["embedding"]
    raw = np.frombuffer(base64.b64decode(b64), dtype="<f4")
    info = httpx.get(f"{server.base}/v1/strata/backend").json()["engine"]
    assert floats.shape == (1, info["n_embd"])
    assert np.array_equal(floats[0], raw) and np.array_equal(floats, sdk_default)  # float32 both ways, exactly
    assert abs(np.linalg.norm(floats[0]) - 1) < 1e-5


def test_batches_of_strings_and_token_ids_and_usage(client: openai.OpenAI, server: Server) -> None:
    texts = [a for a, _ in PARAPHRASES]
    batch = vectors(client, texts, encoding_format="float")
    alone = np.vstack([vectors(client, t, encoding_format="float") for t in texts])
    assert np.array_equal(batch, alone)  # each input embedded by itself
    ids = [httpx.post(f"{server.base}/tokenize", json={"content": t, "add_special": True}).json()["tokens"]
           for t in texts]  # fmt: skip
    assert np.array_equal(vectors(client, ids, encoding_format="float"), batch)
    assert np.array_equal(vectors(client, ids[0], encoding_format="float"), batch[:1])
    r = client.embeddings.create(model="default", input=texts)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    assert r.model and r.object == "list"


def test_embedding_beside_generation_changes_neither(client: openai.OpenAI) -> None:
    """The embeddings context shares the engine's weights and main thread, not its slots."""
    def reply() -> str:
        r = client.completions.create(model="default", prompt="Once upon a time", max_tokens=48, temperature=0)
        return r.choices[0].text

    alone_text, alone_vec = reply(), vectors(client, UNRELATED, encoding_format="float")
    with ThreadPoolExecutor(2) as pool:
        text = pool.submit(reply)
        vecs = [vectors(client, UNRELATED, encoding_format="float") for _ in range(4)]
        assert text.result() == alone_text
    assert all(np.array_equal(v, alone_vec) for v in vecs)


def counted(server: Server, name: str) -> int:
    line = next(x for x in httpx.get(f"{server.base}/metrics").text.splitlines() if x.startswith(name + " "))
    return int(line.split()[1])


def test_counted_in_metrics(client: openai.OpenAI, server: Server) -> None:
    inputs, tokens = counted(server, "strata_embedding_inputs_total"), counted(server, "strata_prompt_tokens_total")
    r = client.embeddings.create(model="default", input=["one", "two", "three"])
    assert counted(server, "strata_embedding_inputs_total") == inputs + 3
    assert counted(server, "strata_prompt_tokens_total") >= tokens + r.usage.prompt_tokens


def test_dimensions_only_the_models_own(server: Server) -> None:
    n_embd = httpx.get(f"{server.base}/v1/strata/backend").json()["engine"]["n_embd"]
    assert len(post(server, {"input": "hi", "dimensions": n_embd}).json()["data"][0]["embedding"]) == n_embd
    r = post(server, {"input": "hi", "dimensions": 64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions", r.json()


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "pooling": "cls"}, "pooling"),  # not implemented: named, never ignored
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[]]}, "input"),
    ({"input": ["a", ""]}, "input"), ({"input": [1, -1]}, "input"), ({"input": [10**9]}, "input"),
    ({"input": "word " * 2000}, "input"),  # longer than an input may be
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({"input": "x", "dimensions": 0}, "dimensions"),
    ({}, "input"),
])  # fmt: skip
def test_bad_requests_are_400(server: Server, body: dict[str, Any], param: str) -> None:
    r = post(server, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()


def test_documented_in_openapi(server: Server) -> None:
    doc = httpx.get(f"{server.base}/openapi.json").json()
    op = doc["paths"]["/v1/embeddings"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/EmbeddingRequest")
    assert "input" in doc["components"]["schemas"]["EmbeddingRequest"]["properties"]
    assert {"200", "400"} <= set(op["responses"])


# ---- the same input through llama.cpp's own llama-server ------------------------------------


#: The engine's attention kernel for llama-server's -fa: flash attention alone moves this
#: model's vectors by 1e-2.
FLASH = {True: "on", False: "off", None: "auto"}[CpuBackend().engine_defaults().flash_attn]


@pytest.fixture(scope="module")
def llama_server(cpu_engine: EngineBuild, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary(cpu_engine)
    if binary is None:
        pytest.skip("no llama-server in the engine's build tree (python -m bench.peers builds it)")
    log_path = tmp_path_factory.mktemp("llama-server") / "llama-server.log"
    args = ["-m", str(default_model), "--embedding", "--pooling", "mean", "-fa", FLASH, "-c", "1024", "-np", "1",
            "-t", "2"]  # fmt: skip
    with run_llama_server(binary, args, log_path) as base:
        yield base


def test_equal_to_llama_servers_embedding(client: openai.OpenAI, llama_server: str) -> None:
    texts = [PARAPHRASES[0][0], UNRELATED, "Hello <|im_start|> wörld"]
    ours = vectors(client, texts, encoding_format="float")
    r = httpx.post(f"{llama_server}/v1/embeddings", json={"input": texts, "encoding_format": "float"}, timeout=120)
    theirs = np.array([d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])])
    assert ours.shape == theirs.shape
    diff = float(np.abs(ours - theirs).max())
    print(f"max abs diff against llama-server: {diff:.3g}")
    assert diff <= 1e-4
