"""The load budget: the capacity search never offers more than the ceiling, failing
steps stay within the overload time, and strategy InPlace cannot run without a budget."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from batchpilot.capacity.http import OverloadBudget
from batchpilot.capacity.search import search_capacity
from batchpilot.loadgen.warmup import closed_loop_rate
from batchpilot.models import SLA, RequestMix, StepResult
from batchpilot.operator import decisions
from batchpilot.operator.spec import explain_validation_error, parse_spec

SLA_100 = SLA(p99_ms=100.0)
WINDOW_S = 5.0


class Knee:
    """Steps pass up to `capacity` req/s; each lasts WINDOW_S."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.steps: list[StepResult] = []

    async def __call__(self, rate: float) -> StepResult:
        passed = rate <= self.capacity
        step = StepResult(
            offered_rps=rate,
            achieved_rps=min(rate, self.capacity),
            p50_ms=10.0,
            p99_ms=50.0 if passed else 500.0,
            error_rate=0.0,
            requests=int(rate * WINDOW_S),
            passed=passed,
            reason="" if passed else "p99 500.0 ms > SLA 100 ms",
            duration_s=WINDOW_S,
        )
        self.steps.append(step)
        return step


async def budgeted_search(target: Knee, budget_s: float | None, **kw: Any) -> OverloadBudget:
    """The search as measure_capacity wires it: every step recorded, a step started only
    while its window fits in what is left."""
    budget = OverloadBudget(budget_s)

    async def measure(rate: float) -> StepResult:
        step = await target(rate)
        budget.record(step, WINDOW_S)
        return step

    await search_capacity(
        measure,
        sla=SLA_100,
        start_rps=10.0,
        precision=0.01,
        may_measure=lambda rate: budget.fits(WINDOW_S),
        **kw,
    )
    return budget


def overloaded_s(target: Knee) -> float:
    return sum(s.duration_s for s in target.steps if not s.passed)


async def test_without_a_budget_failing_steps_are_not_limited() -> None:
    target = Knee(100.0)
    await budgeted_search(target, None, confirm_failures=True)
    assert overloaded_s(target) > 3 * WINDOW_S


@pytest.mark.parametrize("budget_s", [5.0, 12.0, 20.0])
@pytest.mark.parametrize("confirm", [True, False])
async def test_failing_steps_stay_within_the_overload_budget(
    budget_s: float, confirm: bool
) -> None:
    target = Knee(100.0)
    budget = await budgeted_search(target, budget_s, confirm_failures=confirm)
    assert overloaded_s(target) <= budget_s
    assert budget.spent_s == overloaded_s(target)
    # the search still found a passing rate below the knee
    assert any(s.passed for s in target.steps)


async def test_a_spent_budget_keeps_the_best_pass_so_far() -> None:
    target = Knee(100.0)
    await budgeted_search(target, 5.0, confirm_failures=False)
    fails = [s for s in target.steps if not s.passed]
    assert len(fails) == 1  # the first breach spends it: no bisection above the knee
    assert target.steps[-1] is fails[0]


async def test_a_budget_smaller_than_a_step_measures_nothing() -> None:
    target = Knee(100.0)
    await budgeted_search(target, 4.0)
    assert target.steps == []


async def test_the_search_never_offers_above_the_ceiling() -> None:
    target = Knee(10_000.0)
    ceiling = decisions.load_ceiling(30.0, 3)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, max_rps=ceiling)
    assert ceiling == 90.0
    assert max(s.offered_rps for s in target.steps) == 90.0
    assert result.effective_rps == 90.0


def test_the_ceiling_is_per_pod_and_uncapped_without_a_budget() -> None:
    assert decisions.load_ceiling(50.0, 4) == 200.0
    assert decisions.load_ceiling(50.0, 0) == 50.0  # never below one pod's share
    assert decisions.load_ceiling(None, 4) == decisions.UNCAPPED_RPS


def test_budget_records_only_failures() -> None:
    budget = OverloadBudget(10.0)
    passed = StepResult(
        offered_rps=1, achieved_rps=1, p50_ms=1, p99_ms=1, error_rate=0, requests=5,
        passed=True, duration_s=6.0,
    )  # fmt: skip
    budget.record(passed, 6.0)
    assert budget.spent_s == 0.0
    budget.record(passed.model_copy(update={"passed": False, "duration_s": 6.5}), 6.0)
    assert budget.spent_s == 6.5
    assert not budget.fits(4.0)
    assert budget.fits(3.5)


BASE: dict[str, Any] = {
    "target": {"name": "resnet"},
    "sla": {"p99LatencyMs": 300},
    "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
}


def test_in_place_requires_a_load_budget() -> None:
    with pytest.raises(ValidationError) as caught:
        parse_spec({**BASE, "tuning": {"strategy": "InPlace"}})
    message = explain_validation_error(caught.value)
    assert "load.maxRps" in message
    assert "InPlace" in message
    load = {**BASE["load"], "maxRps": 40, "maxOverloadSeconds": 20}
    spec = parse_spec({**BASE, "load": load, "tuning": {"strategy": "InPlace"}})
    assert (spec.load.max_rps, spec.load.max_overload_seconds) == (40.0, 20.0)
    assert parse_spec(BASE).load.max_rps is None  # Canary needs none


@pytest.mark.parametrize(
    ("load", "phrase"),
    [({"maxRps": 0}, "greater than 0"), ({"maxOverloadSeconds": 0.5}, "greater than or equal")],
)
def test_budget_bounds_are_checked(load: dict[str, Any], phrase: str) -> None:
    with pytest.raises(ValidationError, match=phrase):
        parse_spec({**BASE, "load": {**BASE["load"], **load}})


@pytest.fixture
async def instant_server() -> AsyncIterator[tuple[list[float], str]]:
    """A loopback HTTP server answering every request at once; the arrival times."""
    arrivals: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        arrivals.append(asyncio.get_running_loop().time())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield arrivals, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_the_warm_up_keeps_to_the_budget(instant_server: tuple[list[float], str]) -> None:
    arrivals, url = instant_server
    await closed_loop_rate(url, concurrency=16, duration_s=0.5, mix=RequestMix.uniform(1))
    unpaced = len(arrivals)
    arrivals.clear()
    await closed_loop_rate(
        url, concurrency=16, duration_s=0.5, mix=RequestMix.uniform(1), max_rps=40.0
    )
    # paced: one send per 1/40 s slot that starts before the deadline
    assert len(arrivals) <= 21
    assert unpaced > 21  # without the cap the same warm-up sends more
