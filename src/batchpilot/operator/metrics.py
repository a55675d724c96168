"""The operator's own Prometheus metrics, served on --metrics-port."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram, start_http_server

TRIALS = Counter(
    "batchpilot_operator_trials",
    "Trials finished, by resource and final state.",
    ["namespace", "name", "state"],
)
TRIAL_SECONDS = Histogram(
    "batchpilot_operator_trial_duration_seconds",
    "Wall time of one trial: apply, rollout and measurement.",
    buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
)
BEST_RPS = Gauge(
    "batchpilot_operator_best_effective_rps",
    "Effective req/s of the best configuration found, by resource.",
    ["namespace", "name"],
)
WAITING = Gauge(
    "batchpilot_operator_waiting_for_measurement_slot",
    "Studies waiting for the measurement slot (one trial is measured at a time).",
)


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics from a background thread (prometheus-client's own server)."""
    start_http_server(port, addr=address)


def forget(namespace: str, name: str) -> None:
    """Drop a deleted resource's series so the gauge does not report it forever."""
    with contextlib.suppress(KeyError):
        BEST_RPS.remove(namespace, name)
