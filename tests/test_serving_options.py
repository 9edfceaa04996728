"""The [server] settings an operator deploys with, without an engine: the API key from a
file, TLS's pair, CORS off unless asked, and traces (the OpenTelemetry SDK not imported
without an endpoint; with one, the span's attributes). Through a real server:
tests/test_deploy_server.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from strata_core.api import tracing
from strata_core.api.cors import add_cors
from strata_core.api.tls import tls_options
from strata_core.contract.events import Usage
from strata_core.ops.cli import _config, build_parser
from strata_core.ops.config import ConfigError, ServerConfig, load_config
from strata_core.testing.tls import self_signed


def test_the_api_key_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("k-123\nignored\n")
    assert ServerConfig(api_key_file=str(f)).key() == "k-123"
    assert ServerConfig(api_key="inline").key() == "inline" and ServerConfig().key() is None
    with pytest.raises(ConfigError, match="api_key and api_key_file are both set"):
        load_config(env={"STRATA_SERVER_API_KEY": "a", "STRATA_SERVER_API_KEY_FILE": str(f)})
    with pytest.raises(ConfigError, match="api_key_file = '.*missing': cannot read it"):
        ServerConfig(api_key_file=str(tmp_path / "missing")).key()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty: write the key on its first line"):
        ServerConfig(api_key_file=str(tmp_path / "empty")).key()


def test_tls_needs_a_loadable_pair(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    assert tls_options(ServerConfig()) == {}
    assert tls_options(ServerConfig(ssl_certfile=str(cert), ssl_keyfile=str(key))) == {
        "ssl_certfile": str(cert), "ssl_keyfile": str(key)}  # fmt: skip
    with pytest.raises(ConfigError, match="both ssl_certfile and ssl_keyfile"):
        load_config(env={"STRATA_SERVER_SSL_CERTFILE": str(cert)})
    with pytest.raises(ConfigError, match="cannot load them as a PEM certificate chain"):
        tls_options(ServerConfig(ssl_certfile=str(key), ssl_keyfile=str(cert)))


def preflight(app: FastAPI, origin: str) -> Any:
    ask = {"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    return TestClient(app).options("/v1/chat/completions", headers=ask)


def test_cors_is_off_unless_origins_are_named() -> None:
    def app(origins: list[str]) -> FastAPI:
        a = FastAPI()
        a.post("/v1/chat/completions")(lambda: {})
        add_cors(a, ServerConfig(cors_origins=origins).cors_origins)
        return a

    off = preflight(app([]), "https://app.example")
    assert off.status_code == 405 and "access-control-allow-origin" not in off.headers
    on = preflight(app(["https://app.example"]), "https://app.example")
    assert on.status_code == 200 and on.headers["access-control-allow-origin"] == "https://app.example"
    anyone = preflight(app(["*"]), "https://elsewhere.example")
    assert anyone.headers["access-control-allow-origin"] == "*"
    assert load_config(env={"STRATA_SERVER_CORS_ORIGINS": "https://a.example,https://b.example"}).server.cors_origins == [
        "https://a.example", "https://b.example"]  # fmt: skip


def test_without_an_endpoint_the_otel_sdk_is_not_imported() -> None:
    """FastAPI imports OpenTelemetry's API itself (its no-op tracer when nothing is
    configured); the SDK and the exporter are Strata's, imported only for an endpoint."""
    script = (
        "import sys\n"
        "import strata_core.ops.cli, strata_core.api.app, strata_core.api.service\n"
        "from strata_core.api import tracing\n"
        "from strata_core.contract.events import Usage\n"
        "tracing.start_tracing(None)\n"
        "tracing.trace_request('m', 'r1', 0.0, 'stop', Usage(), {})\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # the fixture: the same check sees the SDK once an endpoint is set
    script = script.replace("start_tracing(None)", "start_tracing('http://127.0.0.1:9/v1/traces')")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "opentelemetry.sdk.trace" in out


def test_a_span_carries_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    t0 = time.perf_counter() - 0.5
    tracing.trace_request("m", "cmpl-1", t0, "length", Usage(prompt=12, completion=7, cached=4),
                          {"queue_ms": "30.00", "ttft_ms": "120.50"})  # fmt: skip
    [span] = exported.get_finished_spans()
    assert span.name == "llm_request"
    assert dict(span.attributes or {}) == {
        "gen_ai.request.id": "cmpl-1", "gen_ai.response.model": "m", "gen_ai.usage.prompt_tokens": 12,
        "gen_ai.usage.completion_tokens": 7, "gen_ai.usage.cached_tokens": 4,
        "gen_ai.response.finish_reasons": ("length",), "gen_ai.latency.time_in_queue": 0.03,
        "gen_ai.latency.time_to_first_token": 0.1205,
        "gen_ai.latency.e2e": pytest.approx(0.5, abs=0.2)}  # fmt: skip
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(0.5, abs=0.2)


def test_the_command_line_sets_the_endpoint() -> None:
    args = build_parser().parse_args(["serve", "--otlp-traces-endpoint", "http://c:4318/v1/traces"])
    assert _config(args).server.otlp_traces_endpoint == "http://c:4318/v1/traces"
