"""Light load (capacity.lightload): which low rates are measured below a capacity, how a
failing one caps the answer, and the reproduction of issue 22, item 1 on the simulator:
batch 64 / wait 85 ms scores thousands of req/s from a high start, yet breaks a 100 ms
p99 at a few hundred, and is never written back."""

from __future__ import annotations

import asyncio
import math

import pytest

from batchpilot.capacity.lightload import (
    LIGHT_LOAD,
    LightLoad,
    light_load_rates,
    probe_light_load,
    wait_needs_light_load,
)
from batchpilot.capacity.search import search_capacity
from batchpilot.loadgen.arrivals import Poisson
from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix, StepResult
from batchpilot.simulator.cost import LinearCost
from batchpilot.simulator.scenario import (
    REFERENCE_AHEAD,
    REFERENCE_QUEUE_LIMIT,
    Scenario,
    Traffic,
    simulate_step,
)
from batchpilot.tuner.config import TuneConfig
from batchpilot.tuner.confirm import BRACKET_START, confirm_study, probes_light_load
from batchpilot.tuner.local import start_rate
from batchpilot.tuner.runner import Remeasured, run_trials
from batchpilot.tuner.simulated import SimulatedProbe, SimulatedRun, SimulatedTarget
from batchpilot.tuner.space import SearchSpace
from batchpilot.tuner.study import TrialRecord, Tuner
from batchpilot.tuner.summary import TuneSummary, with_verdict
from batchpilot.tuner.verdict import decide

SLA_100 = SLA(p99_ms=100.0)
SPACE = SearchSpace.from_bounds(max_batch_size=(1, 64), max_queue_time_ms=(0.0, 100.0))

# -- which rates -----------------------------------------------------------------------


def test_the_default_rates_are_ten_thirty_and_sixty_percent_lowest_first() -> None:
    rates = light_load_rates(3000.0, LightLoad())
    assert [round(r.rate) for r in rates] == [300, 900, 1800]
    assert rates[0].label == "10 % of 3,000 req/s"


def test_a_production_rate_below_the_capacity_joins_in_order() -> None:
    rates = light_load_rates(3000.0, LightLoad(production_rps=500.0))
    assert [round(r.rate) for r in rates] == [300, 500, 900, 1800]
    assert rates[1].label == "the production rate"


def test_a_production_rate_at_or_above_the_capacity_is_not_light_load() -> None:
    assert len(light_load_rates(3000.0, LightLoad(production_rps=3000.0))) == 3


def test_a_rate_next_to_a_lower_one_is_measured_once() -> None:
    rates = light_load_rates(3000.0, LightLoad(production_rps=310.0))
    assert [round(r.rate) for r in rates] == [300, 900, 1800]


def test_no_capacity_no_rates() -> None:
    assert light_load_rates(0.0, LightLoad()) == []


@pytest.mark.parametrize(
    "light",
    [
        {"fractions": (0.0, 0.5)},
        {"fractions": (1.0,)},
        {"production_rps": 0.0},
        {"production_rps": math.inf},
    ],
)
def test_bad_light_load_is_refused(light: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"light-load fractions|production rate"):
        LightLoad(**light)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("batch", "wait", "probed"),
    [(64, 50.0, True), (64, 85.0, True), (64, 49.9, False), (1, 90.0, False), (2, 50.0, True)],
)
def test_the_study_probes_a_wait_of_half_the_sla_or_more(
    batch: int, wait: float, probed: bool
) -> None:
    config = BatchingConfig(max_batch_size=batch, max_queue_time_ms=wait)
    assert wait_needs_light_load(config, SLA_100) is probed


def test_the_confirmation_probes_each_finalist_once_and_never_the_incumbent() -> None:
    inc = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
    fin = BatchingConfig(max_batch_size=64, max_queue_time_ms=10.0)
    assert probes_light_load(fin, inc, 0)
    assert not probes_light_load(fin, inc, 1)
    assert not probes_light_load(inc, inc, 0)


# -- how a failing rate caps the answer ------------------------------------------------


class Bump:
    """Passes up to `capacity` except inside the band [`low`, `high`], where its p99 is
    over the SLA: a batcher whose batches close on the timer at moderate rates."""

    def __init__(
        self, capacity: float, low: float, high: float, *, flaky: set[float] | None = None
    ) -> None:
        self.capacity, self.low, self.high = capacity, low, high
        self.flaky = set() if flaky is None else flaky  # fail once, then pass
        self.rates: list[float] = []

    async def __call__(self, rate: float) -> StepResult:
        self.rates.append(rate)
        in_bump = self.low <= rate <= self.high
        if rate in self.flaky:
            self.flaky.discard(rate)
            in_bump = True
        passed = rate <= self.capacity and not in_bump
        p99 = 60.0 if passed else 103.0
        return StepResult(
            offered_rps=rate,
            achieved_rps=min(rate, self.capacity),
            p50_ms=30.0,
            p99_ms=p99,
            error_rate=0.0,
            requests=2000,
            passed=passed,
            reason="" if passed else f"p99 {p99:.1f} ms > SLA 100 ms",
            duration_s=5.0,
            source="simulator",
        )


def found(rps: float, *, pruned: bool = False) -> CapacityResult:
    return CapacityResult(
        effective_rps=rps,
        p99_ms=60.0 if rps else None,
        sla=SLA_100,
        feasible=rps > 0,
        pruned=pruned,
        precision=0.05,
        steps=[],
    )


def test_a_configuration_that_holds_the_sla_keeps_its_figure_with_the_low_steps() -> None:
    target = Bump(3000.0, 5000.0, 6000.0)
    out = asyncio.run(probe_light_load(target, found(3000.0), LightLoad()))
    assert out.effective_rps == 3000.0
    assert out.light_load == ""
    assert target.rates == [300.0, 900.0, 1800.0]
    assert [s.offered_rps for s in out.steps] == target.rates


def test_a_failing_low_rate_caps_the_answer_below_it_and_says_why() -> None:
    target = Bump(3000.0, 800.0, 1000.0)
    out = asyncio.run(probe_light_load(target, found(3000.0), LightLoad()))
    assert target.rates == [300.0, 900.0]  # the first failure decides
    assert out.effective_rps == 300.0
    assert out.feasible
    assert out.light_load.startswith(f"{LIGHT_LOAD}: at 900.0 req/s (30 % of 3,000 req/s)")
    assert "p99 103.0 ms" in out.light_load
    assert "capped at 300.0 req/s" in out.light_load


class Drifting(Bump):
    """A real client's steps: the offered rate is what was scheduled, a little off the
    rate asked for."""

    async def __call__(self, rate: float) -> StepResult:
        step = await super().__call__(rate)
        return step.model_copy(update={"offered_rps": rate * 0.997})


def test_a_step_whose_offered_rate_is_off_the_asked_one_still_caps() -> None:
    out = asyncio.run(probe_light_load(Drifting(3000.0, 800.0, 1000.0), found(3000.0), LightLoad()))
    assert out.light_load.startswith(f"{LIGHT_LOAD}: at 897.3 req/s (30 % of 3,000 req/s)")
    assert out.effective_rps == 300.0  # the 10 % step's goodput


class ShortWindows(Bump):
    """Low rates whose windows hold too few requests: the step rule fails them on the
    p99's upper bound alone while the measured p99 holds the SLA."""

    async def __call__(self, rate: float) -> StepResult:
        step = await super().__call__(rate)
        if step.passed and rate < self.capacity:
            return step.model_copy(
                update={"passed": False, "p99_ms": 140.0, "failed_on_bound_only": True}
            )
        return step


def test_a_low_rate_failed_only_on_the_bound_of_a_short_window_does_not_cap() -> None:
    target = ShortWindows(3000.0, 5000.0, 6000.0)
    out = asyncio.run(probe_light_load(target, found(3000.0), LightLoad(), confirm_failures=True))
    assert target.rates == [300.0, 900.0, 1800.0]  # none confirmed: none counted
    assert out.effective_rps == 3000.0
    assert out.light_load == ""


def test_failing_the_lowest_rate_makes_the_configuration_infeasible() -> None:
    out = asyncio.run(probe_light_load(Bump(3000.0, 200.0, 800.0), found(3000.0), LightLoad()))
    assert out.effective_rps == 0.0
    assert not out.feasible
    assert "no lower rate held the SLA" in out.light_load


def test_a_failure_the_confirmation_does_not_repeat_does_not_count() -> None:
    target = Bump(3000.0, 5000.0, 6000.0, flaky={900.0})
    out = asyncio.run(probe_light_load(target, found(3000.0), LightLoad(), confirm_failures=True))
    assert target.rates == [300.0, 900.0, 900.0, 1800.0]
    assert out.effective_rps == 3000.0
    assert out.light_load == ""


def test_pruned_and_infeasible_results_are_not_probed() -> None:
    target = Bump(3000.0, 0.0, 3000.0)
    for result in (found(0.0), found(2000.0, pruned=True)):
        assert asyncio.run(probe_light_load(target, result, LightLoad())) == result
    assert target.rates == []


def test_the_search_measures_light_load_only_when_asked() -> None:
    plain = asyncio.run(search_capacity(Bump(3000.0, 300.0, 800.0), sla=SLA_100, start_rps=1500.0))
    assert plain.effective_rps > 2800.0
    target = Bump(3000.0, 300.0, 800.0)
    capped = asyncio.run(
        search_capacity(target, sla=SLA_100, start_rps=1500.0, light_load=LightLoad())
    )
    assert capped.effective_rps == 0.0
    assert capped.light_load
    assert capped.steps[-1].offered_rps < 0.11 * plain.effective_rps


# -- the reproduction of issue 22, item 1 ----------------------------------------------

COST = LinearCost(fixed_ms=10.0, per_row_ms=0.05, overhead_ms=2.0)
LONG_WAIT = BatchingConfig(max_batch_size=64, max_queue_time_ms=85.0)
INCUMBENT = BatchingConfig(max_batch_size=16, max_queue_time_ms=10.0)
STRONG = BatchingConfig(max_batch_size=32, max_queue_time_ms=20.0)


def scenario(seed: int = 0) -> Scenario:
    return Scenario(
        cost=COST,
        ahead=REFERENCE_AHEAD,
        queue_limit=REFERENCE_QUEUE_LIMIT,
        requests=4000,
        seed=seed,
    )


def simulated_run() -> SimulatedRun:
    return SimulatedRun(
        config=TuneConfig(sla=SLA_100),
        space=SPACE,
        mix=RequestMix.default(),
        cost=COST,
        arrival=Poisson(),
    )


def test_the_long_wait_breaks_the_sla_at_moderate_rates_and_holds_it_at_heavy_ones() -> None:
    traffic = Traffic(scenario())
    moderate = [simulate_step(traffic, LONG_WAIT, SLA_100, r) for r in (300, 400, 600, 800)]
    assert all(not s.passed and 100.0 < s.p99_ms < 105.0 for s in moderate)
    assert simulate_step(traffic, LONG_WAIT, SLA_100, 1500).passed


class StartsNearTheRateToBeat:
    """The simulated probe, started where a measured trial starts (`local.start_rate`):
    at half the best so far, above the band where the long wait breaks the SLA."""

    def __init__(self) -> None:
        self.inner = SimulatedProbe(Traffic(scenario()), simulated_run())

    async def measure(self, config: BatchingConfig, *, must_beat: float | None) -> CapacityResult:
        return await self.inner.measure(
            config, must_beat=must_beat, start_rps=start_rate(must_beat)
        )


def test_the_study_caps_the_long_wait_at_the_rate_below_its_failing_light_load() -> None:
    tuner = Tuner(SPACE, baseline=STRONG, warm_start=[LONG_WAIT], refine=False, seed=0)
    asyncio.run(run_trials(tuner, SimulatedTarget(STRONG), StartsNearTheRateToBeat(), trials=2))
    strong, long_wait = tuner.records()
    assert long_wait.config() == LONG_WAIT
    assert long_wait.reason.startswith(f"{LIGHT_LOAD}: at ")
    assert "p99 10" in long_wait.reason
    assert (long_wait.effective_rps or 0.0) < 0.2 * (strong.effective_rps or 0.0)
    best = tuner.best()
    assert best is not None
    assert best.config() == STRONG


def test_the_confirmation_never_writes_back_the_long_wait() -> None:
    """A study figure of about 3,000 req/s for 64 / 85 ms (its search started high and
    never saw light load) against the incumbent's 1,371: re-measured from 80 % of that
    figure it scores well above the incumbent every round, yet it breaks the SLA at
    a few hundred req/s; the finalist's first round measures that and it cannot win."""
    records = [
        TrialRecord(
            number=0, params=SearchSpace.params_of(INCUMBENT), source="baseline",
            state="Complete", effective_rps=1371.0,
        ),
        TrialRecord(
            number=1, params=SearchSpace.params_of(LONG_WAIT), source="warm-start",
            state="Complete", effective_rps=2900.0,
        ),
    ]  # fmt: skip
    figures = {INCUMBENT: 1371.0, LONG_WAIT: 2900.0}
    probes = [SimulatedProbe(Traffic(scenario(seed=r + 1)), simulated_run()) for r in range(3)]

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        return await probes[round_index].measure(
            config,
            must_beat=None,
            start_rps=BRACKET_START * figures[config],
            light_load=probes_light_load(config, INCUMBENT, round_index),
        )

    confirmed = asyncio.run(
        confirm_study(
            records,
            INCUMBENT,
            SimulatedTarget(INCUMBENT),
            measure,
            finalists_wanted=3,
            rounds=3,
            min_gain_percent=5.0,
        )
    )
    assert confirmed is not None
    heavy = confirmed.remeasured.results[LONG_WAIT]
    # what the search alone saw: far above the incumbent in the later rounds
    assert min(r.effective_rps for r in heavy[1:]) > 1.5 * 1371.0
    assert confirmed.verdict.chosen == INCUMBENT
    assert not confirmed.verdict.significant
    why = confirmed.remeasured.light_load()[LONG_WAIT]
    assert why.startswith(f"{LIGHT_LOAD}: at ")
    assert "p99 10" in why


# -- what the confirmation and the summary make of it ----------------------------------


def test_a_round_that_broke_the_sla_at_light_load_scores_nothing_and_says_why() -> None:
    capped = found(300.0).model_copy(update={"light_load": f"{LIGHT_LOAD}: at 900.0 req/s"})
    remeasured = Remeasured(
        results={LONG_WAIT: [capped, found(3000.0)], INCUMBENT: [found(1400.0), found(1371.0)]},
        refused={},
    )
    assert remeasured.rounds() == {LONG_WAIT: [0.0, 3000.0], INCUMBENT: [1400.0, 1371.0]}
    assert remeasured.light_load() == {LONG_WAIT: f"{LIGHT_LOAD}: at 900.0 req/s"}


def test_the_summary_names_the_finalists_left_out_at_light_load() -> None:
    rounds = {LONG_WAIT: [0.0, 3000.0, 2900.0], INCUMBENT: [1400.0, 1371.0, 1390.0]}
    verdict = decide(rounds, INCUMBENT)
    summary = TuneSummary(
        sla=SLA_100, sampler="TPE", seed=0, space="", best=None, baseline=None,
        rule_of_thumb=None, gain_over_baseline=None, gain_over_rule_of_thumb=None,
        interrupted=False, duration_s=0.0, trials=[], measurements={},
    )  # fmt: skip
    why = f"{LIGHT_LOAD}: at 290.0 req/s (10 % of 2,900 req/s) p99 100.7 ms"
    out = with_verdict(summary, verdict, {LONG_WAIT: why})
    assert out.recommended == INCUMBENT
    assert out.light_load == {LONG_WAIT.label(): why}
    assert why in out.recommendation
    assert TuneSummary.model_validate_json(out.model_dump_json()).light_load == out.light_load
