"""Simulated capacity searches and the simulator's proposals for warm starts."""

from __future__ import annotations

import pytest

from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.simulator.capacity import StepCache, simulate_capacity
from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.propose import KnobBounds, batch_grid, grid_configs, propose_configs
from batchpilot.simulator.scenario import Scenario, Traffic
from batchpilot.tuner.study import SearchSpace

FIXED_HEAVY = LinearCost(fixed_ms=2.0, per_row_ms=0.05)  # batching pays off a lot
LOOSE = SLA(p99_ms=1000.0)


def _scenario(**changes: object) -> Scenario:
    return Scenario.model_validate(
        {"cost": FIXED_HEAVY, "mix": RequestMix.uniform(1), "requests": 4000, **changes}
    )


def _capacity(config: BatchingConfig, sla: SLA = LOOSE, **changes: object) -> CapacityResult:
    return simulate_capacity(_scenario(**changes), config, sla)


def test_same_seed_same_result_in_the_capacity_json_shape() -> None:
    config = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
    one = _capacity(config, seed=3)
    assert one == _capacity(config, seed=3)
    assert one.feasible
    assert one.steps
    assert all(s.source == "simulator" for s in one.steps)
    # the effective rate is the goodput of the fastest passing step, whose offered rate
    # is within the search's precision of the lowest failing one
    fastest = max((s for s in one.steps if s.passed), key=lambda s: s.offered_rps)
    failing = [s.offered_rps for s in one.steps if not s.passed]
    assert one.effective_rps == fastest.achieved_rps
    assert min(f for f in failing if f > fastest.offered_rps) <= fastest.offered_rps * 1.05 + 1e-9
    assert set(one.model_dump(mode="json")) >= {"effective_rps", "p99_ms", "sla", "steps"}


def test_unbatched_capacity_approaches_the_service_rate_under_a_loose_sla() -> None:
    # Batch size 1 with 2.05 ms of service: at most ~488 req/s; with a loose SLA the
    # search should get close to that and never past it.
    result = _capacity(BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0))
    mu = 1000.0 / 2.05
    assert 0.85 * mu <= result.effective_rps <= mu


def test_batching_multiplies_capacity_when_the_fixed_cost_dominates() -> None:
    one = _capacity(BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0))
    sixteen = _capacity(BatchingConfig(max_batch_size=16, max_queue_time_ms=5.0))
    assert sixteen.effective_rps > 3 * one.effective_rps


def test_replicas_add_capacity() -> None:
    config = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)
    one = _capacity(config)
    three = _capacity(config, replicas=3)
    assert three.effective_rps == pytest.approx(3 * one.effective_rps, rel=0.15)


def test_an_sla_below_the_service_time_is_infeasible() -> None:
    result = _capacity(BatchingConfig(max_batch_size=8, max_queue_time_ms=0.0), SLA(p99_ms=1.0))
    assert not result.feasible
    assert result.effective_rps == 0.0


def test_must_beat_above_reach_prunes_the_ramp() -> None:
    config = BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0)
    full = _capacity(config)
    pruned = simulate_capacity(_scenario(), config, LOOSE, must_beat=10 * full.effective_rps)
    assert pruned.pruned
    assert len(pruned.steps) < len(full.steps)


def test_step_cache_replays_steps_without_changing_the_answer() -> None:
    traffic = Traffic(_scenario())
    cache: StepCache = {}
    config = BatchingConfig(max_batch_size=8, max_queue_time_ms=1.0)
    first = simulate_capacity(traffic, config, LOOSE, step_cache=cache)
    cached = len(cache)
    assert cached == len(first.steps)
    assert simulate_capacity(traffic, config, LOOSE, step_cache=cache) == first
    assert len(cache) == cached


async def test_runs_from_inside_an_event_loop() -> None:
    # The tuner's warm start may call the synchronous API from async code.
    result = _capacity(BatchingConfig(max_batch_size=2, max_queue_time_ms=1.0))
    assert result.feasible


def test_grid_spans_the_bounds() -> None:
    assert batch_grid(1, 64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert batch_grid(5, 20) == [5, 6, 8, 12, 16, 20]
    configs = grid_configs(((2, 8), (0.0, 15.0)))
    assert {c.max_batch_size for c in configs} == {2, 3, 4, 6, 8}
    assert {c.max_queue_time_ms for c in configs} == {0.0, 1.0, 2.0, 5.0, 10.0, 15.0}


def test_proposals_are_distinct_feasible_in_bounds_and_best_first() -> None:
    sla = SLA(p99_ms=50.0)
    mix = RequestMix.default()
    bounds = KnobBounds(max_batch_size=(1, 32), max_queue_time_ms=(0.0, 20.0))
    proposals = propose_configs(FIXED_HEAVY, mix, sla, bounds, 3)
    assert len(proposals) == 3
    assert len({p.max_batch_size for p in proposals}) == 3
    for p in proposals:
        assert 1 <= p.max_batch_size <= 32
        assert 0.0 <= p.max_queue_time_ms <= 20.0
    scenario = Scenario(cost=FIXED_HEAVY, mix=mix, requests=4000)
    rates = [simulate_capacity(scenario, p, sla).effective_rps for p in proposals]
    assert rates == sorted(rates, reverse=True)
    assert all(r > 0 for r in rates)
    # batching pays here, so nothing unbatched is proposed
    assert all(p.max_batch_size > 1 for p in proposals)


def test_proposals_accept_the_tuners_search_space_and_plain_tuples() -> None:
    sla = SLA(p99_ms=50.0)
    space = SearchSpace.from_bounds(max_batch_size=(1, 16), max_queue_time_ms=(0.0, 10.0))
    from_space = propose_configs(FIXED_HEAVY, RequestMix.default(), sla, space, 2)
    from_tuple = propose_configs(FIXED_HEAVY, RequestMix.default(), sla, ((1, 16), (0.0, 10.0)), 2)
    assert from_space == from_tuple
    assert all(space.contains(c) for c in from_space)


def test_nothing_is_proposed_when_nothing_is_feasible() -> None:
    assert (
        propose_configs(FIXED_HEAVY, RequestMix.default(), SLA(p99_ms=0.5), ((1, 8), (0, 5)), 3)
        == []
    )
    with pytest.raises(ValueError, match="n must be >= 1"):
        propose_configs(FIXED_HEAVY, RequestMix.default(), LOOSE, ((1, 8), (0, 5)), 0)
