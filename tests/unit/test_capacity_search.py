"""The capacity search over deterministic step functions with a known capacity."""

from __future__ import annotations

import math

import pytest

from batchpilot.capacity.http import worker_failed_step
from batchpilot.capacity.search import search_capacity, summarise_steps
from batchpilot.models import SLA, StepResult

SLA_100 = SLA(p99_ms=100.0)


class KneeAt:
    """A target whose steps pass exactly up to `capacity` req/s."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.rates: list[float] = []

    async def __call__(self, rate: float) -> StepResult:
        self.rates.append(rate)
        passed = rate <= self.capacity
        p99 = 10.0 + 80.0 * min(rate / self.capacity, 1.0) if passed else 500.0
        return StepResult(
            offered_rps=rate,
            achieved_rps=min(rate, self.capacity),
            p50_ms=p99 / 4,
            p99_ms=p99,
            error_rate=0.0,
            requests=int(rate * 5),
            passed=passed,
            reason="" if passed else "p99 500.0 ms > SLA 100 ms",
            duration_s=5.0,
            source="simulator",
        )


@pytest.mark.parametrize("capacity", [37.0, 100.0, 1000.0, 12345.0])
@pytest.mark.parametrize("precision", [0.1, 0.05, 0.01])
async def test_finds_the_capacity_within_the_precision(capacity: float, precision: float) -> None:
    target = KneeAt(capacity)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, precision=precision)
    assert result.feasible
    assert not result.pruned
    assert capacity * (1 - precision) <= result.effective_rps <= capacity
    assert [s.offered_rps for s in result.steps] == target.rates
    assert result.p99_ms == next(
        s.p99_ms for s in result.steps if s.offered_rps == result.effective_rps
    )


async def test_ramp_is_geometric_then_bisects() -> None:
    target = KneeAt(100.0)
    await search_capacity(target, sla=SLA_100, start_rps=10.0, precision=0.05, growth=2.0)
    assert target.rates[:5] == [10.0, 20.0, 40.0, 80.0, 160.0]
    assert target.rates[5] == 120.0  # midpoint of the last pass and the first fail


async def test_first_step_failing_ramps_down_to_a_passing_rate() -> None:
    target = KneeAt(30.0)
    result = await search_capacity(target, sla=SLA_100, start_rps=200.0, precision=0.05)
    assert target.rates[:4] == [200.0, 100.0, 50.0, 25.0]
    assert 30.0 * 0.95 <= result.effective_rps <= 30.0


async def test_nothing_passing_is_infeasible() -> None:
    target = KneeAt(0.001)
    result = await search_capacity(target, sla=SLA_100, start_rps=64.0, max_ramp_down=3)
    assert not result.feasible
    assert result.effective_rps == 0.0
    assert result.p99_ms is None
    assert target.rates == [64.0, 32.0, 16.0, 8.0]


async def test_the_ramp_down_stops_where_no_step_could_pass_and_says_why() -> None:
    target = KneeAt(0.001)

    def unjudged(rate: float) -> str:
        return "too few requests" if rate < 10.0 else ""

    result = await search_capacity(target, sla=SLA_100, start_rps=64.0, unjudged=unjudged)
    # 8 req/s could not have passed: the last step down is just above the lowest rate
    # that can (5 %: a step there must not fall a request short)
    assert target.rates[:3] == [64.0, 32.0, 16.0]
    assert len(target.rates) == 4
    assert 10.5 <= target.rates[3] <= 10.52
    assert not result.feasible
    assert result.unjudged == "too few requests"


async def test_a_knee_between_the_lowest_rate_that_can_be_judged_and_the_next_is_found() -> None:
    target = KneeAt(12.0)

    def unjudged(rate: float) -> str:
        return "too few requests" if rate < 10.0 else ""

    result = await search_capacity(
        target, sla=SLA_100, start_rps=64.0, precision=0.05, unjudged=unjudged
    )
    assert target.rates[:3] == [64.0, 32.0, 16.0]
    assert 10.5 <= target.rates[3] <= 10.52  # not 8, which cannot be judged; 5 % above 10
    assert result.feasible
    assert 12.0 * 0.95 <= result.effective_rps <= 12.0
    assert result.unjudged == ""


async def test_no_step_at_the_floor_when_it_lies_within_the_precision_of_the_failure() -> None:
    target = KneeAt(0.001)

    def unjudged(rate: float) -> str:
        return "too few requests" if rate < 15.5 else ""

    result = await search_capacity(
        target, sla=SLA_100, start_rps=32.0, precision=0.05, unjudged=unjudged
    )
    # 15.5, 16.3 with its margin, is not below 16 by more than 5 %: nothing new to tell
    assert target.rates == [32.0, 16.0]
    assert result.unjudged == "too few requests"


async def test_a_start_too_low_to_be_judged_goes_up_to_the_first_rate_that_can_be() -> None:
    target = KneeAt(100.0)

    def unjudged(rate: float) -> str:
        return "too few requests" if rate < 10.0 else ""

    result = await search_capacity(
        target, sla=SLA_100, start_rps=3.0, precision=0.2, unjudged=unjudged
    )
    # never 3 or 6 req/s: the first step is 5 % above the lowest rate that can be judged
    assert 10.5 <= target.rates[0] <= 10.52
    assert target.rates[1] == 2 * target.rates[0]
    assert result.feasible
    # a knee below the lowest rate that can be judged: one step, and the reason
    low = KneeAt(5.0)
    result = await search_capacity(low, sla=SLA_100, start_rps=3.0, unjudged=unjudged)
    assert len(low.rates) == 1
    assert 10.5 <= low.rates[0] <= 10.52
    assert not result.feasible
    assert result.unjudged == "too few requests"


async def test_a_rate_that_can_be_judged_is_measured_and_the_result_says_nothing() -> None:
    target = KneeAt(20.0)
    result = await search_capacity(target, sla=SLA_100, start_rps=64.0, unjudged=lambda rate: "")
    assert result.feasible
    assert result.unjudged == ""


async def test_pruned_when_a_step_fails_below_the_rate_to_beat() -> None:
    target = KneeAt(100.0)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, must_beat=200.0)
    # The ramp fails at 160 ≤ 200: this configuration cannot win, so no bisection.
    assert result.pruned
    assert target.rates == [10.0, 20.0, 40.0, 80.0, 160.0]
    assert result.effective_rps == 80.0


async def test_pruned_at_once_when_the_first_step_fails_below_the_rate_to_beat() -> None:
    target = KneeAt(5.0)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, must_beat=50.0)
    assert result.pruned
    assert not result.feasible
    assert target.rates == [10.0]


async def test_pruned_when_the_bisection_upper_bound_drops_below_the_rate_to_beat() -> None:
    target = KneeAt(100.0)
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.01, must_beat=130.0
    )
    # The ramp fails at 160 > 130 so bisection starts; its first midpoint 120 fails,
    # so the upper bound 120 ≤ 130: no rate this configuration can reach beats 130.
    assert result.pruned
    assert target.rates == [10.0, 20.0, 40.0, 80.0, 160.0, 120.0]
    assert result.effective_rps == 80.0


async def test_a_config_that_beats_the_rate_is_searched_to_precision() -> None:
    target = KneeAt(300.0)
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, must_beat=100.0
    )
    assert not result.pruned
    assert 300.0 * 0.95 <= result.effective_rps <= 300.0


async def test_max_rps_caps_the_ramp() -> None:
    target = KneeAt(math.inf)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, max_rps=50.0)
    assert target.rates == [10.0, 20.0, 40.0, 50.0]
    assert result.effective_rps == 50.0


async def test_max_steps_bounds_the_search() -> None:
    target = KneeAt(100.0)
    result = await search_capacity(target, sla=SLA_100, start_rps=1.0, precision=0.001, max_steps=9)
    assert len(result.steps) == 9
    assert result.feasible


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start_rps": 0.0}, "start rate must be > 0"),
        ({"start_rps": 1.0, "precision": 0.0}, "precision must be in"),
        ({"start_rps": 1.0, "precision": 1.5}, "precision must be in"),
        ({"start_rps": 1.0, "growth": 1.0}, "growth must be > 1"),
        ({"start_rps": 1.0, "max_steps": 0}, "max steps must be"),
        ({"start_rps": 1.0, "must_beat": -1.0}, "must_beat must be"),
    ],
)
async def test_bad_arguments_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await search_capacity(KneeAt(10.0), sla=SLA_100, **kwargs)  # type: ignore[arg-type]


async def test_summarise_steps_of_an_interrupted_search() -> None:
    target = KneeAt(100.0)
    steps = [await target(r) for r in (10.0, 20.0, 40.0, 160.0)]
    result = summarise_steps(steps, sla=SLA_100, precision=0.05)
    assert result.effective_rps == 40.0
    assert result.feasible
    assert len(result.steps) == 4
    empty = summarise_steps([], sla=SLA_100, precision=0.05)
    assert not empty.feasible


class Noisy(KneeAt):
    """A knee whose steps at the listed rates fail spuriously, once per listed entry
    (a rate listed twice fails twice in a row): the noise of a shared machine."""

    def __init__(self, capacity: float, noisy: list[float]) -> None:
        super().__init__(capacity)
        self.noisy = list(noisy)

    async def __call__(self, rate: float) -> StepResult:
        step = await super().__call__(rate)
        if rate in self.noisy:
            self.noisy.remove(rate)
            return step.model_copy(update={"passed": False, "p99_ms": 900.0, "reason": "noise"})
        return step


async def test_a_noisy_fail_that_would_end_the_ramp_is_confirmed_and_overruled() -> None:
    target = Noisy(100.0, noisy=[40.0])
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, confirm_failures=True
    )
    # 40 fails, is measured again and passes, a third window settles it (passes): the
    # ramp goes on to the real knee.
    assert target.rates[:6] == [10.0, 20.0, 40.0, 40.0, 40.0, 80.0]
    assert 95.0 <= result.effective_rps <= 100.0


async def test_without_confirmation_one_noisy_fail_ends_the_ramp() -> None:
    target = Noisy(100.0, noisy=[40.0])
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, precision=0.05)
    assert result.effective_rps < 40.0


async def test_a_confirmed_fail_counts() -> None:
    target = Noisy(100.0, noisy=[40.0, 40.0])
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, confirm_failures=True
    )
    assert target.rates[:4] == [10.0, 20.0, 40.0, 40.0]
    assert 20.0 <= result.effective_rps < 40.0
    # monotone: nothing at or above the confirmed failure is measured afterwards
    assert all(r < 40.0 for r in target.rates[4:])


async def test_real_failures_cost_one_confirmation_each_decision() -> None:
    target = KneeAt(100.0)
    await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, confirm_failures=True
    )
    # the fail that ends the ramp is repeated; bisection fails above nothing are not
    assert target.rates[:6] == [10.0, 20.0, 40.0, 80.0, 160.0, 160.0]
    assert len(target.rates) == len(set(target.rates)) + 1


async def test_a_noisy_fail_does_not_prune() -> None:
    target = Noisy(300.0, noisy=[80.0])
    result = await search_capacity(
        target, sla=SLA_100, start_rps=40.0, must_beat=80.0, confirm_failures=True
    )
    assert not result.pruned
    assert result.effective_rps >= 300.0 * 0.95


async def test_a_confirmed_fail_below_the_rate_to_beat_prunes() -> None:
    target = KneeAt(50.0)
    result = await search_capacity(
        target, sla=SLA_100, start_rps=40.0, must_beat=80.0, confirm_failures=True
    )
    assert result.pruned
    assert target.rates == [40.0, 80.0, 80.0]
    assert result.effective_rps == 40.0


async def test_a_noisy_first_step_is_confirmed_before_ramping_down() -> None:
    target = Noisy(100.0, noisy=[10.0])
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, confirm_failures=True
    )
    assert target.rates[:4] == [10.0, 10.0, 10.0, 20.0]
    assert result.effective_rps >= 95.0


async def test_a_noisy_bisection_fail_that_would_prune_is_confirmed() -> None:
    target = Noisy(125.0, noisy=[120.0])
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.01, must_beat=120.0, confirm_failures=True
    )
    # ramp to 160 (fail, confirmed), then the midpoint 120 ≤ 120 fails: that would prune,
    # so it is measured again, passes, a third window agrees, and the bisection goes on
    # above the rate to beat
    assert target.rates[:9] == [10.0, 20.0, 40.0, 80.0, 160.0, 160.0, 120.0, 120.0, 120.0]
    assert not result.pruned
    assert result.effective_rps >= 125.0 * 0.99


async def test_confirmation_respects_max_steps() -> None:
    target = KneeAt(100.0)
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, max_steps=5, confirm_failures=True
    )
    assert len(result.steps) == 5
    assert result.effective_rps == 80.0
    assert result.short_of_precision == "the step limit (5 steps) came first"


class Verdicts(KneeAt):
    """A knee whose steps at one rate give the listed verdicts in turn, then the knee's."""

    def __init__(self, capacity: float, rate: float, verdicts: list[bool]) -> None:
        super().__init__(capacity)
        self.rate = rate
        self.verdicts = list(verdicts)

    async def __call__(self, rate: float) -> StepResult:
        step = await super().__call__(rate)
        if rate == self.rate and self.verdicts:
            return step.model_copy(update={"passed": self.verdicts.pop(0), "reason": "noise"})
        return step


async def test_a_pass_between_two_failures_does_not_overrule_them() -> None:
    # fail, pass, fail at 40: the better of two windows would have credited 40 and
    # ramped on; two out of three fail, so the ramp ends there
    target = Verdicts(100.0, 40.0, [False, True, False])
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, confirm_failures=True
    )
    assert target.rates[:5] == [10.0, 20.0, 40.0, 40.0, 40.0]
    assert all(r < 40.0 for r in target.rates[5:])
    assert 20.0 <= result.effective_rps < 40.0


async def test_a_search_ended_by_the_load_budget_says_so() -> None:
    target = KneeAt(1000.0)
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, may_measure=lambda r: r <= 100.0
    )
    assert result.effective_rps == 80.0
    assert result.short_of_precision == "the load budget did not allow a step at 160.0 req/s"


async def test_a_search_ended_by_the_rate_cap_says_so() -> None:
    result = await search_capacity(
        KneeAt(1000.0), sla=SLA_100, start_rps=10.0, precision=0.05, max_rps=50.0
    )
    assert result.effective_rps == 50.0
    assert result.short_of_precision.startswith("the rate cap 50 req/s passed")


async def test_a_search_whose_bracket_closed_is_not_short() -> None:
    result = await search_capacity(KneeAt(100.0), sla=SLA_100, start_rps=10.0, precision=0.05)
    assert result.short_of_precision == ""


async def test_summarise_steps_keeps_the_answer_monotone() -> None:
    target = KneeAt(100.0)
    steps = [await target(r) for r in (10.0, 20.0, 40.0, 80.0)]
    fail = steps[3].model_copy(update={"offered_rps": 60.0, "passed": False})
    confirmed = [*steps[:3], fail, fail, steps[3]]
    # 60 failed twice; the pass at 80 above it must not raise the answer
    assert summarise_steps(confirmed, sla=SLA_100, precision=0.05).effective_rps == 40.0
    overruled = [
        *steps[:3],
        fail,
        steps[2].model_copy(update={"offered_rps": 60.0, "achieved_rps": 60.0}),
    ]
    # the latest window at a rate is its verdict: the one that settled a disputed failure
    assert summarise_steps(overruled, sla=SLA_100, precision=0.05).effective_rps == 60.0


class WorkerDiesAt:
    """KneeAt, except that a load worker dies in the first `deaths` windows at `rate`."""

    def __init__(self, capacity: float, rate: float, deaths: int) -> None:
        self.knee = KneeAt(capacity)
        self.rate = rate
        self.deaths = deaths

    async def __call__(self, rate: float) -> StepResult:
        if rate == self.rate and self.deaths > 0:
            self.deaths -= 1
            self.knee.rates.append(rate)
            return worker_failed_step(rate, 5.0, "load worker 1: connection reset")
        return await self.knee(rate)


async def test_a_step_a_load_worker_spoiled_is_measured_again_and_the_search_goes_on() -> None:
    target = WorkerDiesAt(100.0, rate=10.0, deaths=1)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, precision=0.05)
    # the first rate twice, then the ramp as if nothing happened
    assert target.knee.rates[:4] == [10.0, 10.0, 20.0, 40.0]
    assert result.feasible
    assert not result.client_bound
    assert 95.0 <= result.effective_rps <= 100.0
    assert [s.valid for s in result.steps[:2]] == [False, True]


async def test_a_second_spoiled_window_counts_as_an_invalid_step() -> None:
    target = WorkerDiesAt(100.0, rate=40.0, deaths=2)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, precision=0.05)
    assert target.knee.rates == [10.0, 20.0, 40.0, 40.0]
    # as a client-bound step: the ramp stops there, the score is a lower bound
    assert result.client_bound
    assert result.effective_rps == 20.0


async def test_no_repeat_when_the_step_limit_is_spent() -> None:
    target = WorkerDiesAt(100.0, rate=10.0, deaths=1)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, precision=0.05, max_steps=1)
    assert target.knee.rates == [10.0]
    assert not result.feasible


async def test_a_fleet_that_fails_twice_at_the_first_rate_ends_the_search() -> None:
    target = WorkerDiesAt(100.0, rate=40.0, deaths=2)
    result = await search_capacity(target, sla=SLA_100, start_rps=40.0, precision=0.05)
    # no ramp down: lower rates cannot mend the fleet
    assert target.knee.rates == [40.0, 40.0]
    assert not result.feasible
    assert result.client_bound
