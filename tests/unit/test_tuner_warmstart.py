"""The simulator warm start's cost model: the profile's fit calibrated against the
baseline's measured capacity, so proposals rest on what the server really serves."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.simulator.capacity import simulate_capacity
from batchpilot.simulator.cost import LinearCost, TableCost, fit_cost_model
from batchpilot.simulator.propose import propose_configs
from batchpilot.simulator.scenario import Scenario
from batchpilot.tuner.config import TuneConfig
from batchpilot.tuner.localmode import LocalRun, SimulatorWarmStart
from batchpilot.tuner.space import SearchSpace
from batchpilot.tuner.study import Tuner
from batchpilot.tuner.warmstart import calibrated_cost

SLA_100 = SLA(p99_ms=100.0)
MIX = RequestMix.default()
BASELINE = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
# The server as it is: forward pass plus per-request work the profile cannot see.
TRUE = LinearCost(fixed_ms=1.85, per_row_ms=0.28, per_request_ms=1.5, overhead_ms=2.0)
PROFILED = LinearCost(fixed_ms=1.85, per_row_ms=0.28)
BOUNDS = ((1, 64), (0.0, 100.0))


def _capacity(cost: LinearCost, config: BatchingConfig, seed: int) -> CapacityResult:
    scenario = Scenario(cost=cost, mix=MIX, requests=4000, seed=seed)
    return simulate_capacity(scenario, config, SLA_100, precision=0.02)


def test_the_calibrated_model_predicts_the_measured_baseline() -> None:
    measured = _capacity(TRUE, BASELINE, seed=7)  # "measured" on other traffic
    cost, note = calibrated_cost(
        PROFILED, mix=MIX, sla=SLA_100, baseline=BASELINE, measured=measured
    )
    assert isinstance(cost, LinearCost)
    assert note.startswith("calibrated")
    assert cost.per_request_ms > 0.5
    predicted = _capacity(cost, BASELINE, seed=0).effective_rps
    uncalibrated = _capacity(PROFILED, BASELINE, seed=0).effective_rps
    assert abs(predicted - measured.effective_rps) < abs(uncalibrated - measured.effective_rps)
    assert abs(predicted / measured.effective_rps - 1) < 0.1


def test_the_calibrated_model_predicts_its_own_proposals() -> None:
    # The profile-only model overrates every batched configuration (about 3x here), so
    # it ranks them on a fiction; calibrated, its predictions hold on the true server.
    measured = _capacity(TRUE, BASELINE, seed=7)
    cost, _ = calibrated_cost(PROFILED, mix=MIX, sla=SLA_100, baseline=BASELINE, measured=measured)
    assert isinstance(cost, LinearCost)
    for model, lo, hi in ((cost, 0.9, 1.1), (PROFILED, 1.5, 10.0)):
        for config in propose_configs(model, MIX, SLA_100, BOUNDS, 2, seed=0):
            ratio = (
                _capacity(model, config, 0).effective_rps / _capacity(TRUE, config, 3).effective_rps
            )
            assert lo <= ratio <= hi, (model, config, ratio)


def test_nothing_to_calibrate_against_leaves_the_fit_as_it_is() -> None:
    infeasible = CapacityResult(
        effective_rps=0.0, p99_ms=None, sla=SLA_100, feasible=False, precision=0.05, steps=[]
    )
    cost, note = calibrated_cost(
        PROFILED, mix=MIX, sla=SLA_100, baseline=BASELINE, measured=infeasible
    )
    assert cost == PROFILED
    assert "no feasible measurement" in note
    pruned = _capacity(TRUE, BASELINE, seed=7).model_copy(update={"pruned": True})
    cost, note = calibrated_cost(PROFILED, mix=MIX, sla=SLA_100, baseline=BASELINE, measured=pruned)
    assert cost == PROFILED
    assert "cut short" in note


def test_a_table_model_is_calibrated_too() -> None:
    table = TableCost(rows=(1.0, 8.0, 64.0), compute_ms=(2.13, 4.09, 19.77))  # TRUE's rows
    measured = _capacity(TRUE, BASELINE, seed=7)
    cost, note = calibrated_cost(table, mix=MIX, sla=SLA_100, baseline=BASELINE, measured=measured)
    assert isinstance(cost, TableCost)
    assert cost.compute_ms == table.compute_ms
    assert cost.per_request_ms > 0.5  # the work the profile does not see
    assert note.startswith("calibrated to the baseline's")


class ProfiledServer:
    """The forward-pass profile a server running TRUE would report."""

    def __init__(self) -> None:
        self.calls = 0

    async def profile(self) -> dict[str, Any]:
        self.calls += 1
        return {
            "batches": [
                {
                    "batch_size": b,
                    "count": 50,
                    "mean_compute_ms": PROFILED.fixed_ms + PROFILED.per_row_ms * b * 1.6,
                    "mean_rows": b * 1.6,
                }
                for b in (1, 2, 4, 8)
            ]
        }


async def test_tune_local_warm_start_proposes_from_the_calibrated_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = TuneConfig(sla=SLA_100)
    space = SearchSpace.from_bounds(max_batch_size=BOUNDS[0], max_queue_time_ms=BOUNDS[1])
    tuner = Tuner(space, baseline=BASELINE)
    run = LocalRun(config=config, space=space, mix=MIX)
    server = ProfiledServer()
    warm = SimulatorWarmStart(tuner, server, run, rules=[])
    assert await warm.maybe() == []  # nothing measured yet: no profile to trust
    number, config_asked, _ = tuner.ask()
    assert config_asked == BASELINE
    tuner.tell(number, _capacity(TRUE, BASELINE, seed=7))
    with caplog.at_level(logging.INFO, logger="batchpilot.tuner.localmode"):
        proposed = await warm.maybe()
    assert server.calls == 1
    assert proposed
    assert "calibrated to the baseline's" in caplog.text
    expected_cost, _ = calibrated_cost(
        fit_cost_model(await server.profile()),
        mix=MIX,
        sla=SLA_100,
        baseline=BASELINE,
        measured=_capacity(TRUE, BASELINE, seed=7),
    )
    expected = propose_configs(expected_cost, MIX, SLA_100, space, 2, seed=0)
    assert proposed == [c for c in expected if c != BASELINE]
    assert await warm.maybe() == []  # once only


def test_more_configurations_calibrate_the_reference_batcher_both_ways() -> None:
    # The reference server hands full batches over ahead and hides 1 ms of each batch's
    # round trip, yet spends per-request work the profile cannot see.
    truth = LinearCost(fixed_ms=2.0, per_row_ms=0.1, per_request_ms=0.3, handover_ms=1.0)
    profiled = LinearCost(fixed_ms=2.0, per_row_ms=0.1)
    rule = BatchingConfig(max_batch_size=2, max_queue_time_ms=0.0)
    pruned_config = BatchingConfig(max_batch_size=40, max_queue_time_ms=1.0)

    def measure(config: BatchingConfig) -> CapacityResult:
        world = Scenario(cost=truth, mix=MIX, requests=2000, seed=7, ahead=1)
        return simulate_capacity(world, config, SLA_100, precision=0.02)

    big = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)
    cut = measure(pruned_config).model_copy(update={"pruned": True})
    cost, note = calibrated_cost(
        profiled, mix=MIX, sla=SLA_100, baseline=big, measured=measure(big),
        more=[(rule, measure(rule)), (pruned_config, cut)], ahead=1,
    )  # fmt: skip
    assert isinstance(cost, LinearCost)
    assert "b=2" in note or rule.label() in note
    assert pruned_config.label() not in note  # a pruned figure is only a lower bound
    assert cost.handover_ms > 0.3
    assert cost.per_request_ms > 0.1
