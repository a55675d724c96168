"""The simulator's model of the reference server's batcher: full batches handed over
ahead, batch-time jitter and the queue limit (503), on hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from batchpilot.models import SLA, BatchingConfig, RequestMix
from batchpilot.server.app import ServerOptions
from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.engine import (
    ServerModel,
    latencies,
    sequential_schedule,
    server_schedule,
)
from batchpilot.simulator.scenario import (
    REFERENCE_AHEAD,
    REFERENCE_QUEUE_LIMIT,
    Scenario,
    Traffic,
    simulate_step,
)

ONES = np.ones(64, dtype=np.int64)


def _cost(fixed_ms: float, handover_ms: float = 0.0, per_row_ms: float = 0.0) -> LinearCost:
    return LinearCost(fixed_ms=fixed_ms, per_row_ms=per_row_ms, handover_ms=handover_ms)


def _finish_ms(
    arrivals_ms: list[float], batch: int, wait_ms: float, cost: LinearCost, server: ServerModel,
    jitter: list[float] | None = None,
) -> tuple[list[int], list[float]]:  # fmt: skip
    arrivals = np.asarray(arrivals_ms) / 1e3
    batch_of, finish = server_schedule(
        arrivals, ONES[: arrivals.size], batch, wait_ms / 1e3, cost, server,
        None if jitter is None else np.asarray(jitter),
    )  # fmt: skip
    return batch_of.tolist(), [round(f * 1e3, 9) for f in finish]


def test_without_its_extras_the_server_loop_is_the_sequential_batcher() -> None:
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(1 / 900.0, size=5000))
    sizes = rng.choice([1, 4, 16], size=5000)
    cost = LinearCost(fixed_ms=2.0, per_row_ms=0.05, per_request_ms=0.1)
    for batch, wait_s in ((1, 0.0), (8, 0.004), (32, 0.02)):
        plain_sizes, plain_finish = sequential_schedule(arrivals, sizes, batch, wait_s, cost)
        batch_of, finish = server_schedule(arrivals, sizes, batch, wait_s, cost, ServerModel())
        assert np.bincount(batch_of).tolist() == plain_sizes.tolist()
        assert finish == pytest.approx(plain_finish, abs=1e-12)


def test_full_batches_handed_over_ahead_hide_the_hand_over() -> None:
    # Four requests at once, batch size 1, 2 ms a batch of which 1 ms is the round trip
    # to the model process. One at a time: replies at 2, 4, 6, 8 ms. With one batch
    # ahead the model runs them back to back (1 ms each): replies at 2, 3, 4, 5 ms.
    cost = _cost(2.0, handover_ms=1.0)
    assert _finish_ms([0, 0, 0, 0], 1, 0.0, cost, ServerModel(ahead=0))[1] == [2, 4, 6, 8]
    assert _finish_ms([0, 0, 0, 0], 1, 0.0, cost, ServerModel(ahead=1))[1] == [2, 3, 4, 5]


def test_a_batch_that_is_not_full_waits_for_the_model_to_be_free() -> None:
    # Batch size 4, wait 1 ms: the first request's batch closes on its timer at 1 ms and
    # computes until 3 ms. Two requests that arrive at 1.5 ms are not a full batch: they
    # are not handed over ahead but collected when the model is back (3 ms), done at 5.
    cost = _cost(2.0, handover_ms=1.0)
    batches, finish = _finish_ms([0, 1.5, 1.5], 4, 1.0, cost, ServerModel(ahead=1))
    assert batches == [0, 1, 1]
    assert finish == [3, 5]
    # Four arriving at 1.5 ms are full: handed over at once, run when the first ends
    # (2 ms of model time) and back 1 ms after, at 4 ms.
    batches, finish = _finish_ms([0, 1.5, 1.5, 1.5, 1.5], 4, 1.0, cost, ServerModel(ahead=1))
    assert finish == [3, 4]


def test_at_most_ahead_batches_are_in_flight() -> None:
    # Batch size 1, 4 ms batches of which 1 ms hand-over, six requests at once. With one
    # ahead, the third batch is handed over only when the first is back (4 ms).
    cost = _cost(4.0, handover_ms=1.0)
    assert _finish_ms([0] * 6, 1, 0.0, cost, ServerModel(ahead=1))[1] == [4, 7, 10, 13, 16, 19]
    # With two ahead the model never waits for a hand-over after the first: the same.
    assert _finish_ms([0] * 6, 1, 0.0, cost, ServerModel(ahead=2))[1] == [4, 7, 10, 13, 16, 19]


def test_jitter_scales_each_batch_in_order() -> None:
    cost = _cost(2.0)
    finish = _finish_ms([0, 0, 0], 1, 0.0, cost, ServerModel(), jitter=[1.5, 0.5, 1.0])[1]
    assert finish == [3, 4, 6]


def test_requests_beyond_the_queue_limit_are_refused() -> None:
    # Ten requests at once, at most three may wait: seven are refused (503) at once.
    cost = _cost(1.0)
    batches, finish = _finish_ms([0] * 10, 1, 0.0, cost, ServerModel(queue_limit=3))
    assert batches == [0, 1, 2] + [-1] * 7
    assert finish == [1, 2, 3]
    # Later arrivals find room again once the queue has drained: the one at 1.5 ms finds
    # one request waiting (the third, started at 2 ms) and is served after it.
    batches, _ = _finish_ms([0, 0, 0, 0, 1.5], 1, 0.0, cost, ServerModel(queue_limit=3))
    assert batches == [0, 1, 2, -1, 3]
    latency = latencies(
        np.zeros(10), ONES[:10], max_batch_size=1, max_queue_time_s=0.0, cost=cost,
        server=ServerModel(queue_limit=3),
    )  # fmt: skip
    assert np.isinf(latency[3:]).all()
    assert latency[:3] == pytest.approx([0.001, 0.002, 0.003])


def test_refused_requests_are_errors_of_the_step() -> None:
    cost = LinearCost(fixed_ms=1.0, per_row_ms=0.0)
    scenario = Scenario(
        cost=cost, mix=RequestMix.uniform(1), requests=4000, queue_limit=16, timeout_ms=5000
    )
    sla = SLA(p99_ms=100.0)
    overloaded = simulate_step(
        Traffic(scenario), BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0), sla, 2000.0
    )
    # Twice the server's 1,000 req/s: about half is refused, nothing waits long.
    assert overloaded.error_rate == pytest.approx(0.5, abs=0.05)
    assert not overloaded.passed
    light = simulate_step(
        Traffic(scenario), BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0), sla, 300.0
    )
    assert light.error_rate == 0.0


def test_traffic_jitter_has_mean_one_and_the_asked_spread() -> None:
    cost = LinearCost(fixed_ms=1.0, per_row_ms=0.0)
    traffic = Traffic(Scenario(cost=cost, requests=200_000, jitter=0.3))
    assert traffic.jitter is not None
    assert traffic.jitter.mean() == pytest.approx(1.0, abs=0.01)
    assert traffic.jitter.std() / traffic.jitter.mean() == pytest.approx(0.3, rel=0.03)
    assert Traffic(Scenario(cost=cost)).jitter is None


def test_the_reference_server_settings_are_the_servers_own() -> None:
    options = ServerOptions(batching=BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0))
    assert options.queue_limit == REFERENCE_QUEUE_LIMIT
    scenario = Scenario(cost=_cost(1.0), ahead=REFERENCE_AHEAD, queue_limit=REFERENCE_QUEUE_LIMIT)
    assert scenario.server() == ServerModel(ahead=1, queue_limit=1024)
