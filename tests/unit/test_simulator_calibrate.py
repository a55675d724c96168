"""Calibrating a profile-fitted cost model against measured capacities, in both directions."""

from __future__ import annotations

import pytest

from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.simulator.calibrate import Point, calibrate_cost
from batchpilot.simulator.capacity import simulate_capacity
from batchpilot.simulator.cost import LinearCost, TableCost
from batchpilot.simulator.scenario import Scenario

SLA_100 = SLA(p99_ms=100.0)
CALIBRATION = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)
# What the server really costs: the forward pass plus Python work per request, and
# latency outside the worker. The profile only sees the forward pass.
TRUE = LinearCost(fixed_ms=2.0, per_row_ms=0.1, per_request_ms=0.6, overhead_ms=3.0)
PROFILED = LinearCost(fixed_ms=2.0, per_row_ms=0.1)


def _calibrate_linear(
    scenario: Scenario,
    config: BatchingConfig,
    measured: CapacityResult,
    sla: SLA,
    *,
    more: list[Point] | None = None,
) -> LinearCost:
    fitted = calibrate_cost(scenario, config, measured, sla, more=more or [])
    assert isinstance(fitted, LinearCost)  # a linear model stays linear
    return fitted


def _scenario(cost: LinearCost | TableCost) -> Scenario:
    return Scenario(cost=cost, mix=RequestMix.default(), requests=4000)


def _measured(config: BatchingConfig) -> CapacityResult:
    # "Measured" on other traffic than the calibration simulates, as a real run would be.
    world = _scenario(TRUE).model_copy(update={"seed": 7})
    return simulate_capacity(world, config, SLA_100, precision=0.01)


def test_recovers_the_hidden_per_request_cost_and_overhead() -> None:
    fitted = _calibrate_linear(_scenario(PROFILED), CALIBRATION, _measured(CALIBRATION), SLA_100)
    assert fitted.fixed_ms == PROFILED.fixed_ms
    assert fitted.per_row_ms == PROFILED.per_row_ms
    assert fitted.per_request_ms == pytest.approx(0.6, abs=0.1)
    assert fitted.overhead_ms == pytest.approx(3.0, abs=1.0)


def test_calibrated_model_predicts_other_configurations() -> None:
    fitted = _calibrate_linear(_scenario(PROFILED), CALIBRATION, _measured(CALIBRATION), SLA_100)
    for config in (
        BatchingConfig(max_batch_size=4, max_queue_time_ms=1.0),
        BatchingConfig(max_batch_size=12, max_queue_time_ms=5.0),
    ):
        truth = _measured(config).effective_rps
        calibrated = simulate_capacity(_scenario(fitted), config, SLA_100, precision=0.01)
        uncalibrated = simulate_capacity(_scenario(PROFILED), config, SLA_100, precision=0.01)
        assert calibrated.effective_rps == pytest.approx(truth, rel=0.1)
        # ...where the forward pass alone overpredicts
        assert uncalibrated.effective_rps > 1.2 * truth


def test_a_model_that_already_undershoots_gets_no_per_request_cost() -> None:
    slow = LinearCost(fixed_ms=4.0, per_row_ms=0.6)  # slower than the truth already
    fitted = _calibrate_linear(_scenario(slow), CALIBRATION, _measured(CALIBRATION), SLA_100)
    assert fitted.per_request_ms == 0.0


def test_a_table_model_is_calibrated_like_a_linear_one() -> None:
    # the profiled forward pass as measured points instead of a line
    rows = (2.0, 8.0, 32.0, 128.0)
    table = TableCost(rows=rows, compute_ms=tuple(2.0 + 0.1 * r for r in rows))
    fitted = calibrate_cost(_scenario(table), CALIBRATION, _measured(CALIBRATION), SLA_100)
    assert isinstance(fitted, TableCost)
    assert fitted.compute_ms == table.compute_ms
    assert fitted.per_request_ms == pytest.approx(0.6, abs=0.1)
    config = BatchingConfig(max_batch_size=12, max_queue_time_ms=5.0)
    predicted = simulate_capacity(_scenario(fitted), config, SLA_100, precision=0.01)
    assert predicted.effective_rps == pytest.approx(_measured(config).effective_rps, rel=0.1)


def test_needs_a_feasible_measurement() -> None:
    infeasible = CapacityResult(
        effective_rps=0.0, p99_ms=None, sla=SLA_100, feasible=False, precision=0.05, steps=[]
    )
    with pytest.raises(ValueError, match="feasible measurement"):
        _calibrate_linear(_scenario(PROFILED), CALIBRATION, infeasible, SLA_100)


# The reference server's batcher: one full batch handed over ahead. Of each batch's 2 ms
# fixed time 1 ms is the round trip to the model process, which back-to-back full
# batches hide; the profile charges it to every batch.
AHEAD_TRUE = LinearCost(fixed_ms=2.0, per_row_ms=0.1, handover_ms=1.0, per_request_ms=0.3)
AHEAD_PROFILED = LinearCost(fixed_ms=2.0, per_row_ms=0.1)


def _ahead(cost: LinearCost) -> Scenario:
    return Scenario(cost=cost, mix=RequestMix.uniform(1), requests=2000, ahead=1)


def _measured_ahead(truth: LinearCost, config: BatchingConfig) -> CapacityResult:
    world = _ahead(truth).model_copy(update={"seed": 7})
    return simulate_capacity(world, config, SLA_100, precision=0.01)


def test_one_underpredicted_point_raises_the_prediction_by_the_hidden_hand_over() -> None:
    truth = AHEAD_TRUE.model_copy(update={"per_request_ms": 0.0})
    one = BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0)
    measured = _measured_ahead(truth, one)
    profiled = simulate_capacity(_ahead(AHEAD_PROFILED), one, SLA_100, precision=0.01)
    assert profiled.effective_rps < 0.8 * measured.effective_rps  # today's underprediction
    fitted = _calibrate_linear(_ahead(AHEAD_PROFILED), one, measured, SLA_100)
    assert fitted.per_request_ms == 0.0
    assert fitted.handover_ms == pytest.approx(1.0, abs=0.15)
    raised = simulate_capacity(_ahead(fitted), one, SLA_100, precision=0.01)
    assert raised.effective_rps == pytest.approx(measured.effective_rps, rel=0.03)


def test_two_points_fit_both_directions_and_predict_a_third() -> None:
    big = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)
    small = BatchingConfig(max_batch_size=2, max_queue_time_ms=0.0)
    fitted = _calibrate_linear(
        _ahead(AHEAD_PROFILED),
        big,
        _measured_ahead(AHEAD_TRUE, big),
        SLA_100,
        more=[(small, _measured_ahead(AHEAD_TRUE, small))],
    )
    assert fitted.handover_ms == pytest.approx(1.0, abs=0.3)
    assert fitted.per_request_ms == pytest.approx(0.3, abs=0.1)
    for config in (
        BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0),
        BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0),
    ):
        truth = _measured_ahead(AHEAD_TRUE, config).effective_rps
        predicted = simulate_capacity(_ahead(fitted), config, SLA_100, precision=0.01)
        assert predicted.effective_rps == pytest.approx(truth, rel=0.1)
    # one point alone (the big batches) cannot tell the two apart: it misses batch 1
    single = _calibrate_linear(
        _ahead(AHEAD_PROFILED), big, _measured_ahead(AHEAD_TRUE, big), SLA_100
    )
    one = BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0)
    truth_one = _measured_ahead(AHEAD_TRUE, one).effective_rps
    predicted_one = simulate_capacity(_ahead(single), one, SLA_100, precision=0.01)
    assert predicted_one.effective_rps < 0.85 * truth_one


def test_every_point_must_be_feasible() -> None:
    big = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)
    infeasible = CapacityResult(
        effective_rps=0.0, p99_ms=None, sla=SLA_100, feasible=False, precision=0.05, steps=[]
    )
    with pytest.raises(ValueError, match="has none"):
        _calibrate_linear(
            _ahead(AHEAD_PROFILED), big, _measured_ahead(AHEAD_TRUE, big), SLA_100,
            more=[(BatchingConfig(max_batch_size=2, max_queue_time_ms=0.0), infeasible)],
        )  # fmt: skip
