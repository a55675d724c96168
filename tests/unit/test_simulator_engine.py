"""The simulator's queueing core against closed-form results and known behaviour."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.engine import (
    Policy,
    batch_chain,
    form_batches,
    latencies,
    sequential_schedule,
    worker_finish_times,
)

POLICIES = get_args(Policy)


def _poisson(rate: float, n: int, seed: int) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=n))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("rho", [0.3, 0.6, 0.8])
def test_md1_mean_wait_matches_closed_form(policy: Policy, rho: float) -> None:
    # Batch size 1, Poisson arrivals, deterministic service: M/D/1, whose mean waiting
    # time is rho / (2 mu (1 - rho)).
    service_ms = 2.0
    mu = 1000.0 / service_ms
    n = 200_000
    arrivals = _poisson(rho * mu, n, seed=11)
    latency = latencies(
        arrivals,
        np.ones(n, dtype=np.int64),
        max_batch_size=1,
        max_queue_time_s=0.0,
        cost=LinearCost(fixed_ms=service_ms, per_row_ms=0.0),
        policy=policy,
    )
    wait = latency[n // 10 :] - service_ms / 1000.0
    expected = rho / (2 * mu * (1 - rho))
    assert wait.mean() == pytest.approx(expected, rel=0.06)
    assert wait.min() >= -1e-12  # nobody is served before arriving


@pytest.mark.parametrize("policy", POLICIES)
def test_wait_cap_bounds_queueing_delay_at_low_load(policy: Policy) -> None:
    # At a rate far below capacity batches never fill, so each closes on its timer:
    # nobody waits longer than max_queue_time for a batch plus the batch's compute.
    cost = LinearCost(fixed_ms=1.0, per_row_ms=0.05)
    wait_s = 0.020
    n = 20_000
    arrivals = _poisson(5.0, n, seed=3)
    sizes = np.random.default_rng(4).choice([1, 4, 16], size=n)
    latency = latencies(
        arrivals, sizes, max_batch_size=64, max_queue_time_s=wait_s, cost=cost, policy=policy
    )
    worst_batch_s = (1.0 + 0.05 * 64 * 16) / 1000.0
    assert latency.max() <= wait_s + worst_batch_s + 1e-12
    # ...and the cap is what most of them wait: alone in its batch, a request waits it out.
    assert np.median(latency) >= wait_s


def test_batches_close_at_size_cap_when_arrivals_are_fast() -> None:
    arrivals = np.arange(10, dtype=np.float64) * 0.001
    batches = form_batches(arrivals, max_batch_size=3, max_queue_time_s=1.0)
    assert batches.starts.tolist() == [0, 3, 6, 9]
    assert batches.sizes.tolist() == [3, 3, 3, 1]
    # full batches close when their last member arrives, the last one on its timer
    assert batches.close_s.tolist() == pytest.approx([0.002, 0.005, 0.008, 1.009])


def test_batches_close_at_wait_cap_when_arrivals_are_slow() -> None:
    arrivals = np.array([0.0, 0.004, 0.009, 0.030, 0.031])
    batches = form_batches(arrivals, max_batch_size=8, max_queue_time_s=0.005)
    assert batches.sizes.tolist() == [2, 1, 2]
    assert batches.close_s.tolist() == pytest.approx([0.005, 0.014, 0.035])


def test_batch_chain_follows_pointers() -> None:
    nxt = np.array([2, 3, 5, 4, 6, 6, 7, 7], dtype=np.int64)  # n = 7
    assert batch_chain(nxt).tolist() == [0, 2, 5, 6]
    assert batch_chain(np.array([0], dtype=np.int64)).tolist() == []


def test_worker_finish_times_is_lindley_recursion() -> None:
    rng = np.random.default_rng(5)
    close = np.cumsum(rng.exponential(1.0, size=500))
    service = rng.exponential(0.9, size=500)
    expected = []
    free = -np.inf
    for c, s in zip(close, service, strict=True):
        free = max(c, free) + s
        expected.append(free)
    assert worker_finish_times(close, service) == pytest.approx(expected)


def test_sequential_policy_takes_the_backlog_when_the_worker_frees() -> None:
    # One request at t=0 occupies the worker for 10 ms; four arrive meanwhile. With no
    # wait cap, a pipelined batcher would close four singleton batches; the reference
    # server's collector waits for the worker and then takes the four as one batch.
    arrivals = np.array([0.0, 0.001, 0.002, 0.003, 0.004])
    sizes = np.ones(5, dtype=np.int64)
    cost = LinearCost(fixed_ms=10.0, per_row_ms=0.0)
    batch_sizes, finish = sequential_schedule(arrivals, sizes, 4, 0.0, cost)
    assert batch_sizes.tolist() == [1, 4]
    assert finish.tolist() == pytest.approx([0.010, 0.020])
    pipelined = latencies(
        arrivals, sizes, max_batch_size=4, max_queue_time_s=0.0, cost=cost, policy="pipelined"
    )
    assert pipelined.tolist() == pytest.approx([0.010, 0.019, 0.028, 0.037, 0.046])


@pytest.mark.parametrize("policy", POLICIES)
def test_round_robin_replicas_split_evenly_spaced_load_exactly(policy: Policy) -> None:
    # Evenly spaced arrivals dealt round robin to R replicas give each replica the same
    # stream one replica sees at 1/R of the rate.
    cost = LinearCost(fixed_ms=2.0, per_row_ms=0.5)
    n = 3000
    sizes = np.tile(np.array([1, 4, 2], dtype=np.int64), n // 3)
    one = latencies(
        np.arange(n, dtype=np.float64) * 0.003,
        sizes,
        max_batch_size=4,
        max_queue_time_s=0.004,
        cost=cost,
        policy=policy,
    )
    three = latencies(
        np.arange(3 * n, dtype=np.float64) * 0.001,
        np.repeat(sizes, 3),
        max_batch_size=4,
        max_queue_time_s=0.004,
        cost=cost,
        replicas=3,
        policy=policy,
    )
    assert three[::3] == pytest.approx(one)
    assert three[2::3] == pytest.approx(one)


def test_overhead_adds_latency_but_not_worker_time() -> None:
    arrivals = _poisson(200.0, 5000, seed=9)
    sizes = np.ones(5000, dtype=np.int64)
    base = LinearCost(fixed_ms=3.0, per_row_ms=0.0)
    with_overhead = base.model_copy(update={"overhead_ms": 7.0})
    a = latencies(arrivals, sizes, max_batch_size=4, max_queue_time_s=0.002, cost=base)
    b = latencies(arrivals, sizes, max_batch_size=4, max_queue_time_s=0.002, cost=with_overhead)
    assert b - a == pytest.approx(np.full(5000, 0.007))


def test_padded_rows_charge_every_request_as_the_longest() -> None:
    arrivals = np.array([0.0, 0.0, 0.0])
    sizes = np.array([1, 8, 2], dtype=np.int64)
    summed = LinearCost(fixed_ms=0.0, per_row_ms=1.0)
    padded = summed.model_copy(update={"rows_basis": "padded"})
    for policy in POLICIES:
        for cost, expected_s in ((summed, 0.011), (padded, 0.024)):
            latency = latencies(
                arrivals, sizes, max_batch_size=3, max_queue_time_s=0.0, cost=cost, policy=policy
            )
            assert latency.tolist() == pytest.approx([expected_s] * 3)


def test_replicas_must_be_positive() -> None:
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        latencies(
            np.zeros(1),
            np.ones(1, dtype=np.int64),
            max_batch_size=1,
            max_queue_time_s=0.0,
            cost=LinearCost(fixed_ms=1.0, per_row_ms=0.0),
            replicas=0,
        )
