"""The server's Prometheus metrics. Their names are a contract: the Prometheus probe
and the dashboards query them by name.

Each server gets its own registry, so several can live in one process (tests)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from batchpilot.models import BatchingConfig

OUTCOMES = ("ok", "rejected", "bad_request", "error", "cancelled")


def geometric_buckets(low: float, high: float, factor: float) -> tuple[float, ...]:
    """Bucket bounds from `low` growing by `factor` until past `high`, rounded to keep
    the exposition readable. A 10 % step resolves a p99 to within about 10 %."""
    if not 0 < low < high or factor <= 1:
        raise ValueError("need 0 < low < high and factor > 1")
    bounds: list[float] = []
    value = low
    while value < high * factor:
        rounded = float(f"{value:.3g}")
        if not bounds or rounded > bounds[-1]:
            bounds.append(rounded)
        value *= factor
    return tuple(bounds)


# 0.5 ms to about 10 s in 10 % steps: a p99 anywhere between 1 ms and 5 s is resolved.
LATENCY_BUCKETS = geometric_buckets(0.0005, 10.0, 1.1)
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256,
                      384, 512, 1024, 2048, 4096)  # fmt: skip


class ServerMetrics:
    def __init__(self, queue_depth: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_latency = Histogram(
            "batchpilot_request_latency_seconds",
            "End-to-end time in the server of successful predict requests",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "batchpilot_queue_wait_seconds",
            "Time a request waited in the queue before its batch started",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "batchpilot_batch_size",
            "Requests per batch",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_compute = Histogram(
            "batchpilot_batch_compute_seconds",
            "Time to run one batch through the model",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "batchpilot_queue_depth", "Requests waiting for a batch", registry=r
        )
        self.queue_depth.set_function(queue_depth)
        self.requests = Counter(
            "batchpilot_requests",
            "Predict requests by outcome: ok, rejected (queue full), bad_request, error "
            "(failed batch), cancelled (client gone)",
            ["outcome"],
            registry=r,
        )
        # Children are looked up once: labels() costs more than the increment, per request.
        # Creating them also exports every outcome at 0, so rates exist from the start.
        self._by_outcome = {o: self.requests.labels(outcome=o) for o in OUTCOMES}
        self.max_batch_size = Gauge(
            "batchpilot_max_batch_size", "Batching configuration in force", registry=r
        )
        self.max_queue_time = Gauge(
            "batchpilot_max_queue_time_seconds", "Batching configuration in force", registry=r
        )
        self.config_changes = Counter(
            "batchpilot_config_changes",
            "Live batching configuration changes applied",
            registry=r,
        )

    def show_config(self, config: BatchingConfig) -> None:
        self.max_batch_size.set(config.max_batch_size)
        self.max_queue_time.set(config.max_queue_time_ms / 1000.0)

    def count(self, outcome: str) -> None:
        self._by_outcome[outcome].inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
