"""/metrics: Strata's ``strata_*`` series, and under the names vLLM uses (``vllm:*``, with a
``model_name`` label) the ones dashboards and routers written for vLLM read, the
Gateway API Inference Extension's model-server protocol among them (docs/deploy.md).
One collector per app, in the app's own registry, renders them through prometheus_client."""

from __future__ import annotations

import bisect
import collections
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class Counter:
    """A count the server keeps (``inc``), or one read from where it is kept (``read``)."""

    def __init__(self, name: str, help: str, read: Callable[[], int] | None = None) -> None:
        self.name, self.help, self.value, self.read = name, help, 0, read

    def inc(self, n: int = 1) -> None:
        self.value += n

    def get(self) -> int:
        return int(self.read()) if self.read else self.value


class Histogram:
    def __init__(self, name: str, help: str, bounds: Sequence[float]) -> None:
        self.name, self.help = name, help
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative counts by upper bound, ``+Inf`` last."""
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        return list(zip(les, itertools.accumulate(self.counts), strict=True))


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

KV_USAGE_HELP = (
    "Fraction (0..1) of the engine's KV cache cells held by the requests in its slots: their "
    "prompt and generated tokens over n_ctx x slots (the prefixes idle slots keep for reuse are "
    "free cells: a new request may take them)"
)
LORA_HELP = (
    "LoRA adapters (labels): max_lora, how many are loaded; running_lora_adapters and "
    "waiting_lora_adapters, those the requests in slots and waiting use. The value: when this was read"
)
CACHE_HELP = "The KV cache's layout: block_size, tokens a block (a llama.cpp cell: 1); num_gpu_blocks, the cells"

COUNT_GAUGES = frozenset(
    {"strata_queue_depth", "strata_busy_slots", "vllm:num_requests_running", "vllm:num_requests_waiting"}
)
"""The gauges that count things (requests), written as integers like the counters."""


class Metrics:
    """What the server counts, and the registry that renders it (``render``)."""

    def __init__(
        self,
        queue_depth: Callable[[], float],
        busy_slots: Callable[[], float],
        cancelled: Callable[[], float],
        kv_usage: Callable[[], float] = lambda: 0.0,
        model_name: str = "",
        kv_cells: Callable[[], int] = lambda: 0,
        lora_names: Callable[[], dict[int, str]] = dict,
        lora_in_flight: Callable[[], tuple[set[int], set[int]]] = lambda: (set(), set()),
    ) -> None:
        self.requests = Counter("strata_requests_total", "Completion requests received")
        self.cancelled = Counter(
            "strata_requests_cancelled_total", "Engine requests that ended cancelled", lambda: int(cancelled())
        )
        self.errors = Counter("strata_request_errors_total", "Requests that ended in an error")
        self.internal_errors = Counter(
            "strata_internal_errors_total", "Requests answered 500 internal_error: bugs (tracebacks in the log)"
        )
        self.refused = Counter("strata_requests_refused_total", "Requests refused with 429: the queue was full")
        self.embedded_inputs = Counter("strata_embedding_inputs_total", "Inputs embedded (/v1/embeddings)")
        self.prompt_tokens = Counter("strata_prompt_tokens_total", "Prompt tokens processed (embedded inputs' too)")
        self.cached_tokens = Counter("strata_cached_prompt_tokens_total", "Prompt tokens reused")
        self.gen_tokens = Counter("strata_generation_tokens_total", "Tokens generated")
        self.spec_drafted = Counter("strata_spec_drafted_tokens_total", "Speculative tokens proposed")
        self.spec_accepted = Counter("strata_spec_accepted_tokens_total", "Speculative tokens accepted")
        self.ttft = Histogram("strata_time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.itl = Histogram("strata_inter_token_latency_seconds", "Time between tokens", LATENCY_BUCKETS)
        self.success: collections.Counter[str] = collections.Counter({"stop": 0, "length": 0})
        self.queue_depth, self.busy_slots, self.kv_usage = queue_depth, busy_slots, kv_usage
        self.model_name, self.kv_cells = model_name, kv_cells
        self.lora_names, self.lora_in_flight = lora_names, lora_in_flight  # adapters by id, as they are now
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def finished(self, reason: str) -> None:
        """One choice ended normally: ``stop`` (a stop token or string, a tool call) or ``length``."""
        self.success["length" if reason == "length" else "stop"] += 1

    def render(self) -> str:
        return integral_counts(generate_latest(self.registry).decode(), COUNT_GAUGES)


class _Collector(Collector):
    """One scrape's families, read from a Metrics at scrape time."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        m = self.m
        for c in vars(m).values():
            if isinstance(c, Counter):
                yield _counter(c.name, c.help, c.get())
        yield _gauge("strata_queue_depth", "Requests waiting for a slot", m.queue_depth())
        yield _gauge("strata_busy_slots", "Slots holding a request", m.busy_slots())
        for h in (m.ttft, m.itl):
            yield _histogram(h.name, h.help, h)
        # The same counts under vLLM's names, for dashboards and routers written for vLLM.
        model = {"model_name": m.model_name}
        yield _gauge("vllm:num_requests_running", "Requests in the engine's slots", m.busy_slots(), model)
        yield _gauge("vllm:num_requests_waiting", "Requests waiting for a slot", m.queue_depth(), model)
        yield _gauge("vllm:kv_cache_usage_perc", KV_USAGE_HELP, m.kv_usage(), model)
        cache = {"block_size": "1", "num_gpu_blocks": str(m.kv_cells())}
        # these two carry vLLM's labels only, as the inference gateway reads them
        yield _gauge("vllm:cache_config_info", CACHE_HELP, 1, cache)
        yield _gauge("vllm:lora_requests_info", LORA_HELP, time.time(), lora_labels(m))
        yield _counter("vllm:prompt_tokens_total", m.prompt_tokens.help, m.prompt_tokens.get(), model)
        yield _counter("vllm:generation_tokens_total", m.gen_tokens.help, m.gen_tokens.get(), model)
        success = CounterMetricFamily(
            "vllm:request_success_total",
            "Choices that ended normally, by finish reason (stop, length)",
            labels=["model_name", "finished_reason"],
        )
        for reason, n in sorted(m.success.items()):
            success.add_metric([m.model_name, reason], n)
        yield success
        yield _histogram("vllm:time_to_first_token_seconds", m.ttft.help, m.ttft, model)
        yield _histogram("vllm:inter_token_latency_seconds", m.itl.help, m.itl, model)


@dataclass(frozen=True)
class ModelCounts:
    """One served model's state and how many times it loaded and failed to."""

    name: str
    state: str
    loads: int
    failures: int


class ModelStates(Collector):
    """The pool's series, whatever is loaded: how many models are in each state, each
    model's state (1 on its state's row), its loads and failed loads."""

    def __init__(self, read: Callable[[], Sequence[ModelCounts]], states: Sequence[str]) -> None:
        self.read, self.states = read, states
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> str:
        return integral_counts(generate_latest(self.registry).decode(), frozenset({"strata_models", "strata_model_state"}))

    def collect(self) -> Iterator[Metric]:
        models = self.read()
        count = GaugeMetricFamily("strata_models", "Served models in each state (failed: its last load failed)",
                                  labels=["state"])  # fmt: skip
        one = GaugeMetricFamily("strata_model_state", "1 on the model's state's row", labels=["model", "state"])
        loads = CounterMetricFamily("strata_model_loads", "Times the model's engine came up (a wake from sleep counts)",
                                    labels=["model"])  # fmt: skip
        failures = CounterMetricFamily("strata_model_load_failures", "Loads of the model that failed", labels=["model"])
        for state in self.states:
            count.add_metric([state], sum(m.state == state for m in models))
        for m in models:
            for state in self.states:
                one.add_metric([m.name, state], int(m.state == state))
            loads.add_metric([m.name], m.loads)
            failures.add_metric([m.name], m.failures)
        yield from (count, one, loads, failures)


def lora_labels(m: Metrics) -> dict[str, str]:
    """vLLM's labels of lora_requests_info: adapters by name, comma-separated."""
    running, waiting = m.lora_in_flight()
    loaded = m.lora_names()

    def names(ids: set[int]) -> str:
        return ",".join(loaded.get(i, str(i)) for i in sorted(ids))

    return {"max_lora": str(len(loaded)), "running_lora_adapters": names(running),
            "waiting_lora_adapters": names(waiting)}  # fmt: skip


def _counter(name: str, help: str, value: int, labels: dict[str, str] | None = None) -> Metric:
    family = CounterMetricFamily(name, help, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _gauge(name: str, help: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, help, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _histogram(name: str, help: str, h: Histogram, labels: dict[str, str] | None = None) -> Metric:
    family = HistogramMetricFamily(name, help, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), h.buckets(), sum_value=h.sum)
    return family


def integral_counts(text: str, count_gauges: frozenset[str] = frozenset()) -> str:
    """The exposition ``text`` with what counts things written as integers: counters,
    histograms' buckets and counts, and the gauges in ``count_gauges``. prometheus_client
    writes every value as a float (``3.0``, ``1e+07``)."""
    out: list[str] = []
    kind = family = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family, kind = line.split(" ")[2:4]
        elif line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            counts = kind == "counter" or family in count_gauges
            counts |= kind == "histogram" and not name.endswith("_sum")
            head, value = line.rsplit(" ", 1)
            number = float(value)
            if counts and number.is_integer():
                line = f"{head} {int(number)}"
        out.append(line)
    return "\n".join(out) + "\n"
