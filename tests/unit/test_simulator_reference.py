"""The fast engine against a plain event-by-event simulation of the same batcher."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.engine import Policy, latencies
from batchpilot.simulator.reference import reference_latencies

CASES = [
    # (rate req/s, max_batch_size, max_queue_time_ms): light, near capacity, overloaded
    (50.0, 8, 5.0),
    (400.0, 8, 2.0),
    (900.0, 16, 10.0),
    (3000.0, 4, 0.0),
    (700.0, 1, 3.0),
    (2000.0, 32, 50.0),
]


@pytest.mark.parametrize("policy", get_args(Policy))
@pytest.mark.parametrize(("rate", "batch", "wait_ms"), CASES)
def test_engine_matches_event_simulation(
    policy: Policy, rate: float, batch: int, wait_ms: float
) -> None:
    rng = np.random.default_rng(int(rate) + batch)
    n = 3000
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
    sizes = rng.choice(np.array([1, 4, 16], dtype=np.int64), size=n, p=[0.8, 0.15, 0.05])
    for cost in (
        LinearCost(fixed_ms=1.0, per_row_ms=0.08, per_request_ms=0.01, overhead_ms=0.3),
        TableCost(rows=(1.0, 16.0, 128.0), compute_ms=(1.2, 2.0, 9.0), rows_basis="padded"),
    ):
        fast = latencies(
            arrivals,
            sizes,
            max_batch_size=batch,
            max_queue_time_s=wait_ms / 1e3,
            cost=cost,
            policy=policy,
        )
        slow = reference_latencies(
            arrivals,
            sizes,
            max_batch_size=batch,
            max_queue_time_s=wait_ms / 1e3,
            cost=cost,
            policy=policy,
        )
        assert fast == pytest.approx(slow, abs=1e-9)
