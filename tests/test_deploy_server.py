"""A server set up as an operator deploys it, through a real ``strata serve``: HTTPS with a
certificate made here, CORS for one origin, the API key from a file, traces exported over
OTLP to a receiver in this process, two LoRA adapters; and the Gateway API Inference
Extension's metrics read against the requests sent (docs/deploy.md)."""

from __future__ import annotations

import http.server
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from strata_core.testing.harness import Server
from strata_core.testing.models import write_lora
from strata_core.testing.tls import self_signed

pytestmark = pytest.mark.slow

ORIGIN = "https://app.example"
KEY = "s3cret-from-a-file"
SLOTS, N_CTX = 2, 2048
#: long enough that the requests in slots are still decoding when the metrics are read
MAX_TOKENS = 1800


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: the spans of every export it was sent."""

    url: str = ""
    spans: list[Any] = field(default_factory=list)

    def handler(self) -> type:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                export = ExportTraceServiceRequest.FromString(body)
                for rs in export.resource_spans:
                    for ss in rs.scope_spans:
                        receiver.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@dataclass
class Deployed:
    base: str
    ca: Path
    receiver: Receiver

    def client(self, key: str | None = KEY) -> httpx.Client:
        return httpx.Client(base_url=self.base, verify=ssl.create_default_context(cafile=self.ca), timeout=120,
                            headers={"Authorization": f"Bearer {key}"} if key else {})  # fmt: skip


@pytest.fixture(scope="module")
def deployed(cpu_engine: Any, default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    d = tmp_path_factory.mktemp("deployed")
    cert, key = self_signed(d)
    (d / "api-key").write_text(KEY + "\n")
    write_lora(default_model, d / "a.gguf", seed=1)
    write_lora(default_model, d / "b.gguf", seed=2)
    receiver = Receiver()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), receiver.handler())
    receiver.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/traces"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    cfg = d / "strata.toml"
    cfg.write_text(f'[server]\napi_key_file = "{d / "api-key"}"\ncors_origins = ["{ORIGIN}"]\n'
                   f'ssl_certfile = "{cert}"\nssl_keyfile = "{key}"\notlp_traces_endpoint = "{receiver.url}"\n'
                   f'[engine]\nbackend = "cpu"\nparallel = {SLOTS}\nn_ctx = {N_CTX}\n'
                   f'lora = [{{path = "{d / "a.gguf"}", name = "a", scale = 0.0}},\n'
                   f'        {{path = "{d / "b.gguf"}", name = "b", scale = 0.0}}]\n')  # fmt: skip
    srv = Server(["--config", str(cfg)], d / "server.log", env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    srv.base = f"https://127.0.0.1:{srv.port}"
    deadline = time.monotonic() + 300
    with ExitStack() as stack:
        stack.callback(httpd.shutdown)
        stack.callback(srv.stop)
        while True:  # the harness's wait speaks plain HTTP: this one, TLS
            assert srv.proc.poll() is None, (d / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{srv.base}/health", verify=ssl.create_default_context(cafile=cert), timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (d / "server.log").read_text()[-3000:]
            time.sleep(0.3)
        yield Deployed(srv.base, cert, receiver)


def test_https_with_the_operators_certificate(deployed: Deployed) -> None:
    with deployed.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{deployed.base}/health", timeout=10)  # the system's CAs do not know it
    with pytest.raises(httpx.HTTPError):  # no plain HTTP on the port
        httpx.get(deployed.base.replace("https:", "http:") + "/health", timeout=10)


def test_the_api_key_comes_from_its_file(deployed: Deployed) -> None:
    with deployed.client(key=None) as c:
        assert c.get("/v1/models").status_code == 401
    with deployed.client(key="wrong") as c:
        assert c.get("/v1/models").status_code == 401
    with deployed.client() as c:
        assert c.get("/v1/models").status_code == 200


def test_a_browser_preflight_from_the_allowed_origin_only(deployed: Deployed) -> None:
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    with deployed.client(key=None) as c:
        ok = c.options("/v1/chat/completions", headers={"Origin": ORIGIN, **ask})
        assert ok.status_code == 200, ok.text
        assert ok.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        other = c.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **ask})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    with deployed.client() as c:  # the request itself, as the browser then sends it
        r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, headers={"Origin": ORIGIN})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def metric_samples(c: httpx.Client) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(c.get("/metrics").text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> tuple[dict[str, str], float]:
    [found] = samples[name]
    return found


def test_the_gateway_reads_waiting_running_kv_and_lora_as_sent(deployed: Deployed) -> None:
    """Two requests under adapter a fill the two slots; two more under b wait: the scrape
    reads 2 running, 2 waiting, a running, b waiting, and the running requests' cells."""
    messages = [{"role": "user", "content": "Count from one to one hundred, in words."}]
    with deployed.client() as c, ExitStack() as streams:
        first = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
        n_prompt = first.json()["usage"]["prompt_tokens"]
        idle = metric_samples(c)
        assert one(idle, "vllm:lora_requests_info")[0] == {"max_lora": "2", "running_lora_adapters": "",
                                                           "waiting_lora_adapters": ""}  # fmt: skip
        body = {"messages": messages, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}

        readers: list[Iterator[str]] = []  # a reader dropped would close its connection: the request cancelled

        def start(adapter: int, wait_for_a_token: bool) -> None:
            lora = [{"id": adapter, "scale": 1.0}]
            resp = streams.enter_context(c.stream("POST", "/v1/chat/completions", json={**body, "lora": lora}))
            assert resp.status_code == 200
            readers.append(resp.iter_lines())
            data = 0
            while wait_for_a_token and data < 2:  # in a slot: the role chunk, then a token's
                data += next(readers[-1]).startswith("data: ")

        start(0, True)
        start(0, True)
        start(1, False)
        start(1, False)
        busy = metric_samples(c)
    labels, stamp = one(busy, "vllm:lora_requests_info")
    assert labels == {"max_lora": "2", "running_lora_adapters": "a", "waiting_lora_adapters": "b"}
    assert abs(stamp - time.time()) < 60
    assert one(busy, "vllm:num_requests_running")[1] == SLOTS
    assert one(busy, "vllm:num_requests_waiting")[1] == 2
    cells = SLOTS * N_CTX
    assert one(busy, "vllm:cache_config_info")[0] == {"block_size": "1", "num_gpu_blocks": str(cells)}
    usage = one(busy, "vllm:kv_cache_usage_perc")[1]
    assert 2 * (n_prompt + 1) / cells <= usage <= 2 * (n_prompt + MAX_TOKENS) / cells, usage
    with deployed.client() as c:  # the streams closed: the server cancels them
        deadline = time.monotonic() + 60
        while one(after := metric_samples(c), "vllm:num_requests_running")[1] and time.monotonic() < deadline:
            time.sleep(0.2)
    assert one(after, "vllm:num_requests_waiting")[1] == 0 and one(after, "vllm:kv_cache_usage_perc")[1] == 0
    assert one(after, "vllm:lora_requests_info")[0]["running_lora_adapters"] == ""


def test_a_span_per_request_over_otlp(deployed: Deployed) -> None:
    with deployed.client() as c:
        body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5, "temperature": 0}
        r = c.post("/v1/chat/completions", json=body).json()
    deadline = time.monotonic() + 30
    while not (spans := [s for s in deployed.receiver.spans if attrs(s).get("gen_ai.request.id") and
                         attrs(s)["gen_ai.usage.completion_tokens"] == r["usage"]["completion_tokens"] and
                         attrs(s)["gen_ai.usage.prompt_tokens"] == r["usage"]["prompt_tokens"]]):  # fmt: skip
        assert time.monotonic() < deadline, [attrs(s) for s in deployed.receiver.spans]
        time.sleep(0.2)
    span = spans[-1]
    a = attrs(span)
    assert span.name == "llm_request"
    assert a["gen_ai.response.model"] == "smollm2-135m-instruct"
    assert a["gen_ai.response.finish_reasons"] == [r["choices"][0]["finish_reason"]]
    e2e = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"] <= e2e
    assert a["gen_ai.latency.e2e"] == pytest.approx(e2e, abs=1e-3)


def attrs(span: Any) -> dict[str, Any]:
    """A protobuf span's attributes as Python values."""
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out
