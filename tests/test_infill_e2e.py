"""Code infill on the real engine: llama-server's /infill on a random model whose vocabulary
names FIM tokens, token for token against llama-server's own /infill on the same GGUF;
OpenAI's and Ollama's ``suffix`` make the same prompt; a model without FIM tokens is a 400."""

from __future__ import annotations

import json
import re
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
from strata_core.text.infill import under_indented

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


@pytest.mark.parametrize("body", [{}, {"n_predict": 64, "logit_bias": {"198": 3.5}, "n_indent": 1, "return_tokens": True}],
                         ids=["plain", "n_indent"])  # fmt: skip
def test_streamed_infill_is_the_same_text(ours: Server, body: dict[str, Any]) -> None:
    whole = infill(ours.base, **body)
    events = []
    with httpx.stream("POST", f"{ours.base}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, **GREEDY,
                                                           **body, "stream": True}, timeout=120) as r:  # fmt: skip
        events = [httpx.Response(200, content=line[6:]).json() for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert [t for e in events for t in e["tokens"]] == whole["tokens"]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    assert events[-1]["stop_type"] == whole["stop_type"]


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


#: the bodies the editors build (llama.vim's autoload/llama.vim, llama.vscode's src/llama-server.ts)
VIM_RING = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": [{**EXTRA[0], "time": 1733600000.5}],
            "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}  # fmt: skip
VIM_FIM = {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": VIM_RING["input_extra"],
           "prompt": "    ", "n_predict": 128, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
           "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
           "t_max_predict_ms": 1000, "response_fields": [
               "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
               "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
               "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]}  # fmt: skip
VSCODE_FIM = {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": VIM_RING["input_extra"],
              "prompt": "", "n_predict": 128, "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False,
              "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
              "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}  # fmt: skip
#: what the comparisons with llama-server change of them: greedy (their seeded draws differ)
EQUAL = {"temperature": 0, "samplers": None}


def post(base: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/infill", json={k: v for k, v in body.items() if v is not None}, timeout=120)


def test_llama_vims_context_request_is_answered_as_llama_server_answers(ours: Server, theirs: str) -> None:
    """llama.vim's ring update, byte for byte: n_predict 0 puts the project into the cache."""
    mine, ref = post(ours.base, VIM_RING), post(theirs, VIM_RING)
    assert mine.status_code == ref.status_code == 200, mine.text
    assert mine.json() == ref.json() == {}  # response_fields [""]: no field
    whole = {**VIM_RING, "response_fields": None, "samplers": None}  # llama-server samples the one token unfiltered by []
    mine, ref = post(ours.base, whole).json(), post(theirs, whole).json()
    keys = ("content", "tokens_predicted", "tokens_evaluated", "tokens_cached", "stop_type")
    assert [mine[k] for k in keys] == [ref[k] for k in keys]  # llama-server, asked for 0 tokens, makes 1


def test_llama_vims_completion_request(ours: Server, theirs: str) -> None:
    r = post(ours.base, VIM_FIM)  # its samplers end with llama.cpp's infill sampler
    assert r.status_code == 200 and isinstance(r.json()["content"], str), r.text
    raw = post(ours.base, {**VIM_FIM, **EQUAL}).text
    assert re.search(r'^\s*\{.*"content"\s*:"', raw, re.DOTALL), raw  # llama.vim's test before it decodes a reply
    mine, ref = json.loads(raw), post(theirs, {**VIM_FIM, **EQUAL}).json()
    print(f"llama-server {ref}\nours {mine}")
    assert set(mine) == set(ref) == set(VIM_FIM["response_fields"])  # the slashed paths as the keys
    assert mine["content"] == ref["content"] and mine["truncated"] is False
    assert mine["timings/predicted_n"] == ref["timings/predicted_n"] > 0
    assert mine["timings/prompt_ms"] > 0 and mine["timings/predicted_per_second"] > 0


def test_infill_sampler_as_llama_servers(ours: Server, theirs: str) -> None:
    """The editors' chain (top_k, top_p, infill) sampled: top_k 1 leaves one candidate, so
    both servers write the same middle; at top_k 40 this random model has no text token
    likely enough, and the infill stage ends the middle at once in both."""
    one = {**VIM_FIM, "temperature": 1.0, "top_k": 1, "t_max_predict_ms": None}
    mine, ref = post(ours.base, one).json(), post(theirs, one).json()
    assert mine["content"] == ref["content"] and mine["timings/predicted_n"] == ref["timings/predicted_n"] > 1
    wide = {**VIM_FIM, "temperature": 1.0, "seed": 7, "t_max_predict_ms": None}
    mine, ref = post(ours.base, wide).json(), post(theirs, wide).json()
    plain = post(ours.base, {**wide, "samplers": ["top_k", "top_p"]}).json()
    print(f"llama-server {ref}\nours {mine}\nwithout infill {plain}")
    assert mine["content"] == ref["content"] == ""  # (llama-server counts the end token it picked as predicted)
    assert plain["content"] != ""  # the fixture: without the stage this reply has text


def test_llama_vscodes_completion_request(ours: Server) -> None:
    r = post(ours.base, VSCODE_FIM)
    assert r.status_code == 200 and len(r.json()) == 3, r.text
    r = post(ours.base, {**VSCODE_FIM, **EQUAL, "t_max_predict_ms": None})  # the same middles whatever the timing
    assert r.status_code == 200, r.text
    replies = r.json()  # n_cmpl 3: an array, as llama-server answers
    assert [x["index"] for x in replies] == [0, 1, 2] and len({x["content"] for x in replies}) == 1, replies


#: a random model writes no new line of its own: this bias on SmolLM2's "\n" makes it write lines
LINES = {"n_predict": 64, "logit_bias": {"198": 3.5}}


def test_n_indent_ends_at_a_line_indented_less(ours: Server, theirs: str) -> None:
    whole = infill(ours.base, **LINES)["content"]
    print(f"whole {whole!r}")
    cut = under_indented(whole, 0, 1)
    assert cut is not None, f"the fixture: this model writes no second line in {whole!r}"
    mine, ref = infill(ours.base, **LINES, n_indent=1), infill(theirs, **LINES, n_indent=1)
    print(f"whole {whole!r}\nllama-server {ref['content']!r}, ours {mine['content']!r}")
    assert mine["content"] == whole[:cut] == ref["content"]
    assert mine["stop_type"] == ref["stop_type"] == "limit"


def test_a_tiny_time_limit_ends_at_the_next_new_line(ours: Server) -> None:
    whole = infill(ours.base, **LINES)
    assert "\n" in whole["content"][1:], "the fixture: this model writes no new line"
    r = infill(ours.base, **LINES, t_max_predict_ms=1)
    print(f"whole {whole['content']!r}\ntimed {r['content']!r}")
    assert whole["content"].startswith(r["content"]) and len(r["content"]) < len(whole["content"])
    assert "\n" in r["content"] and r["stop_type"] == "limit" and r["tokens_predicted"] < whole["tokens_predicted"]


def test_return_tokens_gives_the_generated_ids(ours: Server, theirs: str) -> None:
    mine, ref = infill(ours.base, return_tokens=True), infill(theirs, return_tokens=True)
    assert mine["tokens"] == ref["tokens"] and len(mine["tokens"]) == mine["tokens_predicted"]
    assert infill(ours.base)["tokens"] == []


def test_editor_fields_asking_for_nothing_are_accepted(ours: Server) -> None:
    nothing = {"n_indent": None, "t_max_predict_ms": None, "t_max_prompt_ms": None, "id_slot": None, "samplers": [],
               "return_tokens": None, "response_fields": None, "cache_prompt": None, "n_cmpl": None}  # fmt: skip
    r = httpx.post(f"{ours.base}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, **GREEDY, **nothing},
                   timeout=120)  # fmt: skip
    assert r.status_code == 200 and r.json()["content"] == infill(ours.base)["content"], r.text


@pytest.mark.parametrize(("body", "param"), [
    ({"samplers": ["top_k", "beam"]}, "samplers"), ({"id_slot": 1}, "id_slot"), ({"n_indent": -1}, "n_indent"),
    ({"t_max_predict_ms": "x"}, "t_max_predict_ms"), ({"response_fields": "content"}, "response_fields"),
    ({"n_cmpl": 2, "stream": True}, "n_cmpl"),
])  # fmt: skip
def test_bad_or_unsupported_editor_fields_are_400(ours: Server, body: dict[str, Any], param: str) -> None:
    r = post(ours.base, {"input_prefix": PREFIX, "input_suffix": SUFFIX, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
