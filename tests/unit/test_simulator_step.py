"""One simulated step: the measured step's rule applied to simulated latencies."""

from __future__ import annotations

import pytest

from batchpilot.capacity.http import default_timeout_s
from batchpilot.models import SLA, BatchingConfig, RequestMix
from batchpilot.simulator.arrivals import MMPP
from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.scenario import Scenario, Traffic, measured_from, simulate_step

COST = LinearCost(fixed_ms=2.0, per_row_ms=0.25)
CONFIG = BatchingConfig(max_batch_size=16, max_queue_time_ms=5.0)
SLA_100 = SLA(p99_ms=100.0)


def _scenario(**changes: object) -> Scenario:
    return Scenario.model_validate({"cost": COST, "requests": 5000, **changes})


def test_same_seed_same_step_other_seed_other_step() -> None:
    one = simulate_step(Traffic(_scenario(seed=1)), CONFIG, SLA_100, 800.0)
    again = simulate_step(Traffic(_scenario(seed=1)), CONFIG, SLA_100, 800.0)
    other = simulate_step(Traffic(_scenario(seed=2)), CONFIG, SLA_100, 800.0)
    assert one == again
    assert one.p99_ms != other.p99_ms
    assert one.source == "simulator"


def test_light_load_passes_and_delivers_the_offered_rate() -> None:
    step = simulate_step(Traffic(_scenario()), CONFIG, SLA_100, 200.0)
    assert step.passed, step.reason
    assert step.error_rate == 0.0
    assert step.achieved_rps == pytest.approx(200.0, rel=0.01)
    assert step.requests == 5000 - measured_from(5000)
    # the window is the measured requests' span at the offered rate
    assert step.duration_s == pytest.approx((step.requests - 1) / 200.0)


def test_overload_fails_on_throughput_and_latency() -> None:
    # Full batches of 16 mean-size requests take 2 + 0.25 * 16 * 1.8 ms: about 2,000 req/s
    # at most. Offer twice that.
    step = simulate_step(Traffic(_scenario()), CONFIG, SLA_100, 4000.0)
    assert not step.passed
    assert step.achieved_rps < 0.97 * 4000.0
    assert "achieved" in step.reason
    assert "p99" in step.reason


def test_timeouts_count_as_errors_and_as_the_timeout() -> None:
    scenario = _scenario(timeout_ms=50.0)
    step = simulate_step(Traffic(scenario), CONFIG, SLA(p99_ms=1000.0), 4000.0)
    assert step.error_rate > 0.5
    assert step.p99_ms == pytest.approx(50.0)
    assert "error rate" in step.reason


def test_default_timeout_is_the_measured_searchs() -> None:
    for p99_ms in (20.0, 300.0, 5000.0):
        sla = SLA(p99_ms=p99_ms)
        assert _scenario().timeout_for(sla) == default_timeout_s(sla) * 1000.0
    assert _scenario(timeout_ms=70.0).timeout_for(SLA(p99_ms=20.0)) == 70.0


def test_offered_rate_is_exact_over_the_window_for_every_arrival_process() -> None:
    for arrival in (None, MMPP()):
        scenario = _scenario() if arrival is None else _scenario(arrival=arrival)
        times = Traffic(scenario).arrivals(321.0)
        first = measured_from(times.size)
        assert (times.size - 1 - first) / (times[-1] - times[first]) == pytest.approx(321.0)


def test_service_bound_is_full_batches_back_to_back() -> None:
    scenario = Scenario(cost=COST, mix=RequestMix.uniform(2), replicas=3)
    # 3 replicas x 8 requests per (2 + 0.25 * 16) ms
    assert scenario.service_bound_rps(8) == pytest.approx(3 * 8 * 1000.0 / 6.0)
