"""OpenTelemetry traces of requests, as vLLM writes them (``--otlp-traces-endpoint``,
``[server] otlp_traces_endpoint``): one ``llm_request`` span per engine request with its
model, token counts, queue time, time to first token and finish reason, exported over
OTLP/HTTP (``pip install 'strata[otel]'``). With no endpoint nothing of OpenTelemetry is
imported, and a request's end costs one test of ``_tracer``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from strata_core.contract.events import Usage
from strata_core.ops.config import ConfigError

#: the SDK's tracer once an endpoint is configured (one a process, as OpenTelemetry's)
_tracer: Any = None
_provider: Any = None


def start_tracing(endpoint: str | None) -> None:
    """Export spans to ``endpoint`` (``http://collector:4318/v1/traces``); None: none."""
    global _tracer, _provider
    if not endpoint:
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(f"[server] otlp_traces_endpoint = {endpoint!r} needs OpenTelemetry: "
                          "pip install 'strata[otel]'") from None  # fmt: skip
    _provider = TracerProvider(resource=Resource.create({"service.name": "strata"}))
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _tracer = _provider.get_tracer("strata")


def stop_tracing() -> None:
    """Send the spans still held, and export no more."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def trace_request(model: str, rid: str, t0: float, finish: str, usage: Usage, stats: Mapping[str, str]) -> None:
    """One ended engine request's span: from ``t0`` (``time.perf_counter`` when its GEN
    was sent) to now; queue time and TTFT as the engine measured them (DONE's stats)."""
    if _tracer is None:
        return
    now_ns, waited_ns = time.time_ns(), int((time.perf_counter() - t0) * 1e9)
    attributes: dict[str, Any] = {
        "gen_ai.request.id": rid,
        "gen_ai.response.model": model,
        "gen_ai.usage.prompt_tokens": usage.prompt,
        "gen_ai.usage.completion_tokens": usage.completion,
        "gen_ai.usage.cached_tokens": usage.cached,
        "gen_ai.response.finish_reasons": [finish],
        "gen_ai.latency.e2e": waited_ns / 1e9,
    }
    for key, stat in (("gen_ai.latency.time_in_queue", "queue_ms"), ("gen_ai.latency.time_to_first_token", "ttft_ms")):
        if stat in stats:
            attributes[key] = float(stats[stat]) / 1e3
    from opentelemetry.trace import SpanKind  # imported already: the SDK is loaded

    span = _tracer.start_span("llm_request", kind=SpanKind.SERVER, attributes=attributes, start_time=now_ns - waited_ns)
    span.end(end_time=now_ns)
