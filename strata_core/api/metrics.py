"""Prometheus metrics in the text exposition format, without a client library."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence


class Counter:
    def __init__(self, name: str, help: str, read: Callable[[], float] | None = None) -> None:
        self.name, self.help, self.value, self.read = name, help, 0.0, read

    def inc(self, n: float = 1.0) -> None:
        self.value += n

    def render(self) -> str:
        value = self.read() if self.read else self.value
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} counter\n{self.name} {value}\n"


class Gauge:
    def __init__(self, name: str, help: str, read: Callable[[], float]) -> None:
        self.name, self.help, self.read = name, help, read

    def render(self) -> str:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} gauge\n{self.name} {self.read()}\n"


class Histogram:
    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        self.name, self.help = name, help
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        acc = 0
        for bound, c in zip([*self.bounds, float("inf")], self.counts, strict=True):
            acc += c
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{self.name}_bucket{{le="{le}"}} {acc}')
        lines += [f"{self.name}_sum {self.sum}", f"{self.name}_count {acc}"]
        return "\n".join(lines) + "\n"


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(
        self,
        queue_depth: Callable[[], float],
        busy_slots: Callable[[], float],
        cancelled: Callable[[], float],
    ) -> None:
        self.requests = Counter("strata_requests_total", "Completion requests received")
        self.cancelled = Counter(
            "strata_requests_cancelled_total", "Engine requests that ended cancelled", cancelled
        )
        self.errors = Counter("strata_request_errors_total", "Requests that ended in an error")
        self.prompt_tokens = Counter("strata_prompt_tokens_total", "Prompt tokens processed")
        self.cached_tokens = Counter("strata_cached_prompt_tokens_total", "Prompt tokens reused")
        self.gen_tokens = Counter("strata_generation_tokens_total", "Tokens generated")
        self.spec_drafted = Counter("strata_spec_drafted_tokens_total", "Speculative tokens proposed")
        self.spec_accepted = Counter("strata_spec_accepted_tokens_total", "Speculative tokens accepted")
        self.ttft = Histogram("strata_time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.itl = Histogram("strata_inter_token_latency_seconds", "Time between tokens", LATENCY_BUCKETS)
        self.queue = Gauge("strata_queue_depth", "Requests waiting for a slot", queue_depth)
        self.busy = Gauge("strata_busy_slots", "Slots holding a request", busy_slots)

    def render(self) -> str:
        return "".join(m.render() for m in vars(self).values())
