"""/metrics through prometheus_client: counts written as integers, one registry per app,
and the vLLM names dashboards and routers read, moving with Strata's own series."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from strata_core.api.metrics import Metrics, integral_counts

VLLM = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by prometheus_client, by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert isinstance(s, Sample)
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def count_lines(text: str) -> list[str]:
    """The sample lines of the counter families, and of histograms' buckets and counts."""
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    lines = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        base = re.sub(r"_(total|bucket|count)$", "", name)
        if kinds.get(base) in ("counter", "histogram") and not name.endswith("_sum"):
            lines.append(line)
    return lines


def busy_metrics() -> Metrics:
    m = Metrics(lambda: 2, lambda: 4, lambda: 3, kv_usage=lambda: 0.375, model_name="m")
    m.requests.inc(5)
    m.prompt_tokens.inc(12)
    m.gen_tokens.inc(10_000_000)
    m.ttft.observe(0.02)
    m.itl.observe(0.004)
    m.itl.observe(0.0)
    m.finished("length")
    m.finished("stop")
    m.finished("tool_calls")
    return m


def test_counts_are_written_as_integers() -> None:
    m = busy_metrics()
    # the fixture: prometheus_client on its own writes counts as floats
    raw = generate_latest(m.registry).decode()
    assert "strata_requests_total 5.0" in raw and "strata_generation_tokens_total 1e+07" in raw
    text = m.render()
    assert "strata_requests_total 5\n" in text
    assert "strata_generation_tokens_total 10000000\n" in text
    assert "strata_requests_cancelled_total 3\n" in text
    assert "strata_busy_slots 4\n" in text and "strata_queue_depth 2\n" in text
    lines = count_lines(text)
    assert len(lines) > 40
    for line in lines:
        assert re.fullmatch(r"\d+", line.rsplit(" ", 1)[1]), line
    # what is not a count keeps its fraction
    assert 'vllm:kv_cache_usage_perc{model_name="m"} 0.375' in text
    assert "strata_inter_token_latency_seconds_sum 0.004" in text


def test_the_exposition_parses_and_the_vllm_names_are_strata_counts() -> None:
    text = busy_metrics().render()
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name, kind in VLLM.items():
        assert kinds.get(name) == kind, name
    s = samples(text)
    m = (("model_name", "m"),)
    assert s[("vllm:num_requests_running", m)] == s[("strata_busy_slots", ())] == 4
    assert s[("vllm:num_requests_waiting", m)] == s[("strata_queue_depth", ())] == 2
    assert s[("vllm:prompt_tokens_total", m)] == s[("strata_prompt_tokens_total", ())] == 12
    assert s[("vllm:generation_tokens_total", m)] == s[("strata_generation_tokens_total", ())]
    assert s[("vllm:kv_cache_usage_perc", m)] == 0.375
    assert s[("vllm:request_success_total", (("finished_reason", "length"), *m))] == 1
    assert s[("vllm:request_success_total", (("finished_reason", "stop"), *m))] == 2  # tool_calls stop
    for h in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        assert s[(f"vllm:{h}_count", m)] == s[(f"strata_{h}_count", ())]
        assert s[(f"vllm:{h}_bucket", (("le", "0.005"), *m))] == s[(f"strata_{h}_bucket", (("le", "0.005"),))]
    assert s[("strata_inter_token_latency_seconds_bucket", (("le", "0.001"),))] == 1  # the 0.0
    assert s[("strata_inter_token_latency_seconds_bucket", (("le", "0.005"),))] == 2


def test_each_app_counts_in_its_own_registry() -> None:
    a, b = busy_metrics(), Metrics(lambda: 0, lambda: 0, lambda: 0)
    assert value(b.render(), "strata_requests_total") == 0
    b.requests.inc()
    assert value(a.render(), "strata_requests_total") == 5
    assert value(b.render(), "strata_requests_total") == 1
    assert "strata_requests_total" not in generate_latest(REGISTRY).decode()


def test_the_gateway_protocol_series_are_always_there() -> None:
    """The Gateway API Inference Extension's model-server protocol: waiting, running, KV
    cache usage and layout, LoRA adapters; present before any request and any adapter."""
    idle = samples(Metrics(lambda: 0, lambda: 0, lambda: 0).render())
    assert idle[("vllm:num_requests_waiting", (("model_name", ""),))] == 0
    assert idle[("vllm:num_requests_running", (("model_name", ""),))] == 0
    assert idle[("vllm:kv_cache_usage_perc", (("model_name", ""),))] == 0
    assert idle[("vllm:cache_config_info", (("block_size", "1"), ("num_gpu_blocks", "0")))] == 1
    [(labels, stamp)] = [(k[1], v) for k, v in idle.items() if k[0] == "vllm:lora_requests_info"]
    assert dict(labels) == {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert abs(stamp - time.time()) < 60  # vLLM's value: when it was read


def test_lora_info_names_the_adapters_in_slots_and_waiting() -> None:
    m = Metrics(lambda: 1, lambda: 2, lambda: 0, kv_cells=lambda: 2048, lora_names=lambda: {0: "pirate", 1: "b", 2: "c"},
                lora_in_flight=lambda: ({2, 0}, {1}))  # fmt: skip
    s = samples(m.render())
    [labels] = [dict(k[1]) for k in s if k[0] == "vllm:lora_requests_info"]
    assert labels == {"max_lora": "3", "running_lora_adapters": "pirate,c", "waiting_lora_adapters": "b"}
    assert ("vllm:cache_config_info", (("block_size", "1"), ("num_gpu_blocks", "2048"))) in s


def test_integral_counts_rewrites_only_count_samples() -> None:
    text = (
        "# HELP a_total x\n# TYPE a_total counter\na_total{k=\"v w\"} 3.0\n"
        "# HELP g x\n# TYPE g gauge\ng 2.0\n"
        "# HELP n x\n# TYPE n gauge\nn 7.0\n"
        "# HELP h x\n# TYPE h histogram\n"
        'h_bucket{le="1.0"} 1.0\nh_bucket{le="+Inf"} 2.0\nh_count 2.0\nh_sum 3.0\n'
    )
    out = integral_counts(text, frozenset({"n"}))
    assert 'a_total{k="v w"} 3\n' in out
    assert "g 2.0\n" in out and "n 7\n" in out
    assert 'h_bucket{le="1.0"} 1\n' in out and 'h_bucket{le="+Inf"} 2\n' in out
    assert "h_count 2\n" in out and "h_sum 3.0\n" in out


# ---- through a real server ------------------------------------------------------------------


def scrape(base: str) -> str:
    r = httpx.get(f"{base}/metrics", timeout=30)
    assert r.status_code == 200
    return r.text


@pytest.mark.slow
def test_metrics_move_with_a_request(server, client) -> None:  # type: ignore[no-untyped-def]
    model = (("model_name", "smollm2-135m-instruct"),)
    before = samples(scrape(server.base))
    r = client.completions.create(model="default", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.usage is not None
    text = scrape(server.base)
    after = samples(text)

    def moved(name: str, labels: tuple[tuple[str, str], ...] = model) -> float:
        return after[(name, labels)] - before[(name, labels)]

    assert moved("vllm:prompt_tokens_total") == r.usage.prompt_tokens > 0
    assert moved("vllm:generation_tokens_total") == r.usage.completion_tokens > 0
    assert moved("strata_prompt_tokens_total", ()) == r.usage.prompt_tokens
    reason = r.choices[0].finish_reason
    assert moved("vllm:request_success_total", (("finished_reason", reason), *model)) == 1
    assert moved("vllm:time_to_first_token_seconds_count") == 1
    assert moved("vllm:inter_token_latency_seconds_count") == r.usage.completion_tokens - 1
    assert after[("vllm:num_requests_running", model)] == 0
    assert after[("vllm:kv_cache_usage_perc", model)] == 0
    for line in count_lines(text):
        assert re.fullmatch(r"\d+", line.rsplit(" ", 1)[1]), line


@pytest.mark.slow
def test_kv_usage_and_running_while_a_request_decodes(server) -> None:  # type: ignore[no-untyped-def]
    """The server's fixture runs 4 slots of 1024 tokens: one streaming request holds its
    prompt and the tokens so far, a few hundredths of the cache."""
    model = (("model_name", "smollm2-135m-instruct"),)
    body = {"model": "default", "prompt": "List the numbers from 1 to 200:", "max_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=120) as resp:
        got = 0
        for line in resp.iter_lines():
            got += line.startswith("data: ")
            if got == 5:
                during = samples(scrape(server.base))
                break
    assert during[("vllm:num_requests_running", model)] == 1
    assert during[("vllm:num_requests_waiting", model)] == 0
    usage = during[("vllm:kv_cache_usage_perc", model)]
    assert 5 / 4096 < usage <= (20 + 200) / 4096, usage
