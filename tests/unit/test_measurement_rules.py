"""The rules that make a step's figures honest: the client's own health decides whether a
step is valid, every non-OK request counts as infinitely slow in the SLA p99, a short
step is judged on its p99's upper confidence bound, and effective throughput is goodput."""

from __future__ import annotations

import math
import random

import pytest
from clienthealth import healthy_client

from batchpilot.capacity.http import MAX_STRETCH, step_warmup_s, step_window_s, unjudged_reason
from batchpilot.capacity.search import search_capacity, summarise_steps
from batchpilot.capacity.steps import (
    bounded_p99_min_requests,
    p99_upper_bound_ms,
    quantile_upper_rank,
    rising_trend,
    step_from_load,
)
from batchpilot.loadgen.histogram import TOP_MS, LatencyHistogram
from batchpilot.loadgen.result import (
    OK,
    TIMEOUT,
    LoadResult,
    TrendBin,
    merge_results,
    summarise,
)
from batchpilot.loadgen.trend import mann_kendall_p, queue_growth_s, theil_sen
from batchpilot.models import SLA, CapacityResult, StepResult
from batchpilot.tuner.outcome import (
    CLIENT_BOUND,
    client_bound_reason,
    client_figures,
    repeated_step_reason,
)

SLA_100 = SLA(p99_ms=100.0, max_error_rate=0.05)


def _load(
    outcomes: list[str],
    latencies_ms: list[float],
    *,
    lags_ms: list[float] | None = None,
    cpu: float = 0.1,
    loop_delays_ms: list[float] | None = None,
) -> LoadResult:
    n = len(outcomes)
    offsets = [i / n for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"],
        arrival="constant",
        seed=0,
        target_rps=float(n),
        window_s=1.0,
        offsets=offsets,
        outcomes=outcomes,
        latencies_ms=latencies_ms,
        lags_ms=lags_ms if lags_ms is not None else [0.0] * n,
        done_at=[o + 0.001 for o in offsets],
        elapsed_s=1.0,
        interrupted=False,
        cpu=cpu,
        loop_delays_ms=loop_delays_ms or (),
    )


# --- client validity ---------------------------------------------------------------------


def test_a_healthy_client_has_no_limit() -> None:
    assert healthy_client().limit_reason(SLA_100) == ""


@pytest.mark.parametrize(
    ("update", "phrase"),
    [
        (
            {"loop_delay_max_ms": 10.1},
            "event-loop stall up to 10.1 ms > 10% of SLA p99 (10 ms)",
        ),
        ({"cpu": 0.9}, "client CPU 90% of a core ≥ 90%"),
    ],
)
def test_each_client_limit_is_named(update: dict[str, float], phrase: str) -> None:
    assert phrase in healthy_client(**update).limit_reason(SLA_100)


def test_a_stall_just_inside_the_bound_is_valid() -> None:
    assert healthy_client(loop_delay_max_ms=10.0, cpu=0.89).limit_reason(SLA_100) == ""


def test_a_few_long_stalls_among_many_short_samples_are_a_client_limit() -> None:
    # three 300 ms stalls in 2,000 10 ms samples: the p99 stays at the sampling tick,
    # yet every request in flight through a stall was held 300 ms by the client
    load = _load([OK] * 100, [20.0] * 100, loop_delays_ms=[0.1] * 1997 + [300.0] * 3)
    assert load.client.loop_delay_p99_ms < 1.0
    assert "event-loop stall up to 300.0 ms" in load.client.limit_reason(SLA_100)


def test_send_lag_and_connection_wait_are_the_servers_backpressure_not_a_client_limit() -> None:
    # A slow server holds its connections: new requests wait for a slot and sends queue
    # behind them. Latency already runs from the schedule, so the server is charged; the
    # client is not blamed while its own loop and CPU are fine.
    slow_server = healthy_client(lag_p99_ms=80.0, lag_max_ms=200.0, conn_wait_p99_ms=160.0)
    assert slow_server.limit_reason(SLA_100) == ""


def test_cpu_bound_is_per_worker_process() -> None:
    two = healthy_client(cpu=1.5, workers=2, cpu_max_worker=0.75)
    assert two.limit_reason(SLA_100) == ""
    # one saturated worker is enough, whatever the others do
    lopsided = healthy_client(cpu=1.2, workers=2, cpu_max_worker=0.92)
    assert "client CPU 92% of a core ≥ 90% (busiest worker)" in lopsided.limit_reason(SLA_100)


def test_a_lagging_server_leaves_the_step_valid_and_charges_the_lag() -> None:
    # The sends lag 50 ms (a slow server's backpressure) and the latency, measured from
    # the schedule, includes it: the step fails on p99, it is not invalid.
    n = 200
    lags = [0.0] * 190 + [50.0] * 10
    latencies = [10.0] * 190 + [150.0] * 10
    step = step_from_load(_load([OK] * n, latencies, lags_ms=lags), SLA_100)
    assert step.valid
    assert not step.passed
    assert step.reason.startswith("p99 150.")
    assert step.client is not None
    assert step.client.lag_p99_ms == 50.0


def test_a_stalled_client_that_explains_the_failure_makes_the_step_invalid() -> None:
    # p99 120 ms > 100 ms, but the loop stalled 30 ms at p99: from the send, less the
    # worst stall, the server answered within 90 ms.
    load = _load([OK] * 100, [120.0] * 100, loop_delays_ms=[30.0] * 100)
    step = step_from_load(load, SLA_100)
    assert not step.valid
    assert not step.passed
    assert step.reason.startswith("invalid, client-bound: client event-loop stall up to 30.0 ms")


def test_a_stalled_client_cannot_excuse_a_server_far_past_its_sla() -> None:
    load = _load([OK] * 100, [400.0] * 100, loop_delays_ms=[30.0] * 100)
    step = step_from_load(load, SLA_100)
    assert step.valid
    assert not step.passed
    assert "(the client was over its limits too: client event-loop stall" in step.reason


def test_errors_are_never_excused_by_the_client() -> None:
    load = _load([OK] * 95 + ["503"] * 5, [50.0] * 100, loop_delays_ms=[30.0] * 100)
    step = step_from_load(load, SLA_100)
    assert step.valid
    assert not step.passed


def test_too_few_requests_to_bound_the_p99_are_never_excused_by_the_client() -> None:
    # 100 requests cannot bound a p99 at 95 %: the step fails on that, stalls or not
    load = _load([OK] * 100, [20.0] * 100, loop_delays_ms=[30.0] * 100)
    step = step_from_load(load, SLA_100, min_requests=2000)
    assert step.valid
    assert not step.passed
    assert "upper 95% bound of p99 from 100 requests" in step.reason


@pytest.mark.parametrize(("late_ms", "excused"), [(900.0, True), (0.0, False)])
def test_timeouts_are_excused_only_when_the_client_alone_reached_the_timeout(
    late_ms: float, excused: bool
) -> None:
    # 5 % timeouts (1 s deadline) with the loop stalling 200 ms: the client's own delay
    # reaches the deadline only when its sends were also 900 ms late.
    n = 100
    offsets = [i / n for i in range(n)]
    load = summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=100.0,
        window_s=1.0, offsets=offsets, outcomes=[OK] * 95 + [TIMEOUT] * 5,
        latencies_ms=[50.0] * 95 + [1000.0] * 5, lags_ms=[0.0] * 95 + [late_ms] * 5,
        done_at=[o + 0.05 for o in offsets], elapsed_s=1.0, interrupted=False,
        loop_delays_ms=[200.0] * 10, cpu=0.3, timeout_s=1.0,
    )  # fmt: skip
    step = step_from_load(load, SLA_100)
    assert not step.passed
    assert step.valid is not excused


def test_a_window_whose_every_request_timed_out_by_the_client_is_invalid() -> None:
    # The loop stalled 900 ms and the sends were 300 ms late, past the 1 s deadline:
    # the client alone could have made every request time out, with none answered.
    n = 50
    offsets = [i / n for i in range(n)]
    load = summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=50.0,
        window_s=1.0, offsets=offsets, outcomes=[TIMEOUT] * n, latencies_ms=[1000.0] * n,
        lags_ms=[300.0] * n, done_at=[o + 1.0 for o in offsets], elapsed_s=2.0,
        interrupted=False, loop_delays_ms=[900.0], cpu=0.3, timeout_s=1.0,
    )  # fmt: skip
    step = step_from_load(load, SLA_100)
    assert not step.valid
    assert step.reason.startswith("invalid, client-bound: ")


def test_latency_spread_alone_does_not_lower_the_achieved_rate() -> None:
    # A server that keeps up, with a wide spread of latencies (long batching waits):
    # its last responses complete 250 ms after the window, every request within the
    # SLA. The goodput is the window's: no configuration pays for its spread.
    n = 400
    offsets = [i / 100 for i in range(n)]  # 4 s at 100 req/s
    latencies = [10.0 if i % 2 else 250.0 for i in range(n)]
    load = summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=100.0,
        window_s=4.0, offsets=offsets, outcomes=[OK] * n, latencies_ms=latencies,
        lags_ms=[0.0] * n,
        done_at=[o + lat / 1000 for o, lat in zip(offsets, latencies, strict=True)],
        elapsed_s=4.25, interrupted=False,
    )  # fmt: skip
    assert load.achieved_rps == pytest.approx(100.0)
    step = step_from_load(load, SLA(p99_ms=300.0))
    assert step.passed, step.reason


def test_a_queue_growing_over_the_window_lowers_the_achieved_rate() -> None:
    # 5 % above capacity: the median latency grows by 5 % of the window, so the
    # window's requests take 5 % longer to answer; goodput is the capacity
    n = 400
    offsets = [2.0 * i / n for i in range(n)]  # 2 s at 200 req/s, 1 s of warm-up
    latencies = [20.0 + 50.0 * o for o in offsets]
    load = summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=200.0,
        window_s=2.0, offsets=offsets, outcomes=[OK] * n, latencies_ms=latencies,
        lags_ms=[0.0] * n,
        done_at=[o + lat / 1000 for o, lat in zip(offsets, latencies, strict=True)],
        elapsed_s=2.2, interrupted=False, warmup_s=1.0,
    )  # fmt: skip
    assert load.achieved_rps == pytest.approx(200.0 / 1.05, rel=0.01)
    step = step_from_load(load, SLA(p99_ms=1000.0))
    assert not step.passed
    assert "achieved" in step.reason


def test_queue_growth_is_the_rise_of_the_median_line() -> None:
    rising = [(t / 4, 10.0 + 30.0 * t / 4) for t in range(8)]  # 30 ms/s over 2 s
    assert queue_growth_s(rising, 2.0) == pytest.approx(0.06)
    assert queue_growth_s([(t, -y) for t, y in rising], 2.0) == 0.0  # draining
    # a chance rise among noisy medians is not a trend
    assert queue_growth_s([(0.0, 10.0), (1.0, 40.0), (2.0, 70.0)], 2.0) == 0.0
    noisy = [20.0, 24.0, 19.0, 23.0, 21.0, 25.0, 20.0, 22.0]
    assert queue_growth_s([(t / 4, y) for t, y in enumerate(noisy)], 2.0) == 0.0


def _steady_load(lags_ms: list[float], *, conn_wait_ms: float = 0.0) -> LoadResult:
    n = len(lags_ms)
    offsets = [4.0 * i / n for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=n / 4.0,
        window_s=4.0, offsets=offsets, outcomes=[OK] * n, latencies_ms=[30.0 + x for x in lags_ms],
        lags_ms=lags_ms, done_at=[o + 0.03 for o in offsets], elapsed_s=4.2,
        interrupted=False, conn_waits_ms=[conn_wait_ms] * n,
    )  # fmt: skip


def test_a_pass_whose_sends_fell_behind_for_good_is_invalid() -> None:
    # the client's sends fell 200 ms further behind over a 4 s window: the server was
    # offered 95 % of the rate, so a pass there says nothing about the rate asked
    lags = [200.0 * i / 400 for i in range(400)]
    load = _steady_load(lags)
    assert load.client.send_rate_share == pytest.approx(4.0 / 4.2, abs=0.01)
    # (the 200 ms rise of the latency, from the schedule, is within a 5 s SLA's bounds)
    step = step_from_load(load, SLA(p99_ms=5000.0))
    assert not step.passed
    assert not step.valid
    assert "client sent at 95% of the scheduled rate" in step.reason


def test_sends_held_back_by_connections_the_server_held_fail_the_step() -> None:
    lags = [200.0 * i / 400 for i in range(400)]
    step = step_from_load(_steady_load(lags, conn_wait_ms=50.0), SLA(p99_ms=5000.0))
    assert step.valid
    assert not step.passed
    # the wait shows in the latency from the schedule: the queue grew by 200 ms
    assert "achieved 95.2 req/s < 97% of offered" in step.reason


def test_one_late_send_does_not_count_as_falling_behind() -> None:
    load = _steady_load([0.0] * 399 + [300.0])  # one stall at the very end
    assert load.client.send_rate_share == 1.0
    assert step_from_load(load, SLA(p99_ms=1000.0)).passed


def test_a_step_that_passed_with_a_stalled_client_stays_a_pass() -> None:
    # the stall only added latency to requests timed from their schedule
    load = _load([OK] * 100, [40.0] * 100, loop_delays_ms=[30.0] * 100, cpu=0.95)
    step = step_from_load(load, SLA_100)
    assert step.valid
    assert step.passed


def test_a_busy_client_makes_a_step_it_could_have_failed_invalid() -> None:
    load = _load([OK] * 100, [105.0] * 100, lags_ms=[10.0] * 100, cpu=0.95)
    step = step_from_load(load, SLA_100)
    assert not step.valid
    assert "client CPU 95%" in step.reason


def test_client_health_is_carried_and_merged() -> None:
    a = _load([OK] * 100, [10.0] * 100, lags_ms=[1.0] * 100, cpu=0.4)
    b = _load([OK] * 100, [10.0] * 100, lags_ms=[3.0] * 100, cpu=0.3)
    assert a.client.lag_p99_ms == 1.0
    merged = merge_results([a, b])
    assert merged.client.lag_p99_ms == 3.0  # the worst generator decides
    assert merged.client.cpu == pytest.approx(0.7)  # CPU adds up
    assert merged.client.workers == 2
    assert merged.client.cpu_max_worker == pytest.approx(0.4)  # the busiest process


# --- non-OK requests count as infinitely slow ---------------------------------------------


def test_shedding_cannot_buy_a_p99() -> None:
    # 2 % fast 503s: within a 5 % error budget, but the slowest 1 % are the rejections.
    outcomes = [OK] * 98 + ["503"] * 2
    load = _load(outcomes, [10.0] * 100)
    assert load.latency.p99_ms == pytest.approx(10.0, rel=0.01)  # OK-only view
    assert load.sla_p99_ms == pytest.approx(TOP_MS, rel=0.01)
    step = step_from_load(load, SLA_100)
    assert not step.passed
    assert step.ok_p99_ms == pytest.approx(10.0, rel=0.01)
    assert step.p99_ms == pytest.approx(TOP_MS, rel=0.01)


def test_non_ok_below_one_percent_leaves_the_p99_to_the_ok_requests() -> None:
    outcomes = [OK] * 999 + [TIMEOUT]
    load = _load(outcomes, [10.0] * 999 + [1000.0])
    assert load.sla_p99_ms == pytest.approx(10.0, rel=0.01)


def test_not_sent_requests_count_too() -> None:
    load = _load([OK] * 97 + ["client_overload"] * 3, [10.0] * 97 + [0.0] * 3)
    assert load.sla_p99_ms == pytest.approx(TOP_MS, rel=0.01)


def test_sla_histogram_merges_exactly() -> None:
    a = _load([OK] * 100, [10.0] * 100)
    b = _load([OK] * 95 + ["503"] * 5, [20.0] * 100)
    merged = merge_results([a, b])
    assert merged.sla_p99_ms == pytest.approx(TOP_MS, rel=0.01)  # 2.5 % non-OK overall


# --- upper confidence bound of p99 --------------------------------------------------------


def _binomial_cdf(k: int, n: int, p: float) -> float:
    return math.fsum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k + 1))


@pytest.mark.parametrize("n", [1, 50, 100, 298, 299, 500, 1000])
def test_upper_rank_is_the_smallest_with_the_level(n: int) -> None:
    k = quantile_upper_rank(n)
    if k <= n:
        assert _binomial_cdf(k - 1, n, 0.99) >= 0.95
    if k >= 2:
        assert _binomial_cdf(k - 2, n, 0.99) < 0.95


def test_fewer_than_299_samples_cannot_bound_a_p99() -> None:
    # 0.99^n ≥ 0.05 up to n = 298: even the largest sample bounds p99 with < 95 %.
    assert quantile_upper_rank(298) == 299
    assert quantile_upper_rank(299) == 299


def test_upper_rank_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="0 < q < 1"):
        quantile_upper_rank(10, q=1.0)


def test_ucb_covers_the_true_p99_at_the_level() -> None:
    # Exponential latencies: true p99 = ln(100) * mean. Over many small samples the bound
    # is below the truth in at most ~5 % of them.
    rng = random.Random(7)
    true_p99 = math.log(100.0) * 10.0
    misses = 0
    trials = 300
    for _ in range(trials):
        h = LatencyHistogram()
        for _ in range(500):
            h.record_ms(rng.expovariate(0.1))
        if p99_upper_bound_ms(h) < true_p99 * 0.999:
            misses += 1
    assert misses / trials <= 0.09


def test_a_short_step_is_judged_on_the_upper_bound() -> None:
    # 500 requests, the slowest 1 % at 150 ms: the p99 (the 495th) is within the SLA but
    # its upper bound (the 499th) is not, so the step fails and says why.
    latencies = [10.0] * 495 + [150.0] * 5
    load = _load([OK] * 500, latencies)
    assert step_from_load(load, SLA_100).passed  # without a minimum it would pass on luck
    step = step_from_load(load, SLA_100, min_requests=2000)
    assert not step.passed
    assert "upper 95% bound of p99 from 500 requests, fewer than 2000" in step.reason
    assert step_from_load(load, SLA_100, min_requests=500).passed  # enough: the estimate
    assert step.failed_on_bound_only  # the measured p99 holds the SLA


def test_a_short_step_over_the_sla_on_its_measured_p99_is_not_a_failure_on_the_bound() -> None:
    latencies = [10.0] * 480 + [150.0] * 20
    step = step_from_load(_load([OK] * 500, latencies), SLA_100, min_requests=2000)
    assert not step.passed
    assert not step.failed_on_bound_only


# --- the search: goodput and client-bound ---------------------------------------------------


class Target:
    """Passes up to `capacity`; the client cannot drive beyond `client_limit`; goodput is
    `goodput_share` of the offered rate."""

    def __init__(self, capacity: float, client_limit: float, goodput_share: float = 0.98):
        self.capacity = capacity
        self.client_limit = client_limit
        self.share = goodput_share
        self.rates: list[float] = []

    async def __call__(self, rate: float) -> StepResult:
        self.rates.append(rate)
        valid = rate <= self.client_limit
        passed = valid and rate <= self.capacity
        return StepResult(
            offered_rps=rate,
            achieved_rps=rate * self.share,
            p50_ms=5.0,
            p99_ms=20.0 if passed else 500.0,
            error_rate=0.0,
            requests=int(rate * 5),
            passed=passed,
            reason="" if passed else ("invalid, client-bound: lag" if not valid else "p99"),
            duration_s=5.0,
            valid=valid,
        )


async def test_effective_throughput_is_the_goodput_of_the_best_step() -> None:
    result = await search_capacity(Target(100.0, 1e9), sla=SLA_100, start_rps=10.0)
    best = max((s for s in result.steps if s.passed), key=lambda s: s.offered_rps)
    assert result.effective_rps == best.achieved_rps == best.offered_rps * 0.98
    assert not result.client_bound
    assert result.client_ceiling_rps is None


async def test_an_invalid_step_stops_the_ramp_and_marks_the_result_client_bound() -> None:
    target = Target(capacity=1000.0, client_limit=50.0)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, confirm_failures=True)
    assert target.rates == [10.0, 20.0, 40.0, 80.0]  # no bisection past the client's limit
    assert result.client_bound
    assert result.feasible
    assert not result.pruned
    assert result.client_ceiling_rps == 40.0
    assert result.effective_rps == pytest.approx(40.0 * 0.98)
    assert result.capacity_label() == "≥ 39.2 req/s, client-bound"


async def test_an_invalid_step_is_never_read_as_the_server_failing() -> None:
    # must_beat above the client's limit: a failing step there would prune; an invalid
    # one must not, and must not be repeated as a confirmation either.
    target = Target(capacity=1000.0, client_limit=50.0)
    result = await search_capacity(
        target, sla=SLA_100, start_rps=80.0, must_beat=500.0, confirm_failures=True
    )
    assert not result.pruned
    assert result.client_bound
    assert target.rates == [80.0, 40.0]  # down to a rate the client keeps, then stop
    assert result.effective_rps == pytest.approx(40.0 * 0.98)


async def test_an_invalid_step_in_the_bisection_ends_the_search() -> None:
    target = Target(capacity=100.0, client_limit=110.0)
    result = await search_capacity(target, sla=SLA_100, start_rps=10.0, precision=0.01)
    assert result.client_bound
    assert all(r <= 160.0 for r in target.rates)
    assert 80.0 * 0.98 <= result.effective_rps <= 100.0


def test_summarise_steps_ignores_invalid_steps_but_flags_them() -> None:
    def step(rate: float, *, passed: bool, valid: bool = True) -> StepResult:
        return StepResult(
            offered_rps=rate,
            achieved_rps=rate,
            p50_ms=1.0,
            p99_ms=10.0,
            error_rate=0.0,
            requests=100,
            passed=passed,
            duration_s=1.0,
            valid=valid,
        )

    steps = [step(10, passed=True), step(20, passed=False, valid=False), step(15, passed=True)]
    result = summarise_steps(steps, sla=SLA_100, precision=0.05)
    assert result.effective_rps == 15.0
    assert result.client_bound


# --- the trial outcome ----------------------------------------------------------------------


def test_a_client_bound_capacity_gets_the_client_bound_reason() -> None:
    health = healthy_client(lag_p99_ms=7.25, cpu=0.95)
    steps = [
        StepResult(
            offered_rps=40.0,
            achieved_rps=39.0,
            p50_ms=1.0,
            p99_ms=10.0,
            error_rate=0.0,
            requests=100,
            passed=True,
            duration_s=1.0,
            client=healthy_client(),
        ),
        StepResult(
            offered_rps=80.0,
            achieved_rps=70.0,
            p50_ms=1.0,
            p99_ms=10.0,
            error_rate=0.0,
            requests=100,
            passed=False,
            reason="invalid, client-bound: client CPU 95% of a core",
            duration_s=1.0,
            valid=False,
            client=health,
        ),
    ]
    result = CapacityResult(
        effective_rps=39.0,
        p99_ms=10.0,
        sla=SLA_100,
        feasible=True,
        precision=0.05,
        steps=steps,
        client_bound=True,
        client_ceiling_rps=40.0,
    )
    reason = client_bound_reason(result)
    assert reason.startswith(f"{CLIENT_BOUND}: capacity ≥ 39.0 req/s, client-bound")
    assert "client CPU 95%" in reason
    assert client_figures(result) == (7.25, 0.95)


# --- sustained, not survived ----------------------------------------------------------------


def _bins(p50s: list[float], window_s: float, warmup_s: float = 0.0) -> list[TrendBin]:
    width = (window_s - warmup_s) / len(p50s)
    return [
        TrendBin(t_s=warmup_s + (k + 0.5) * width, answered=50, p50_ms=p50)
        for k, p50 in enumerate(p50s)
    ]


def test_theil_sen_ignores_an_outlier() -> None:
    points = [(0.0, 1.0), (1.0, 2.0), (2.0, 30.0), (3.0, 4.0), (4.0, 5.0)]
    slope, intercept = theil_sen(points)
    assert slope == pytest.approx(1.0)
    assert intercept == pytest.approx(1.0)


def test_a_flat_window_is_sustained() -> None:
    trend = _bins([20.0 + (k % 2) for k in range(8)], 10.0)
    assert rising_trend(trend, 10.0, 0.0, 100.0) == ""


def test_a_climbing_median_fails_before_it_breaches() -> None:
    # flat, then 10 ms/s over the second half: one more 10 s window reaches ~165 ms
    centres = [b.t_s for b in _bins([0.0] * 8, 10.0)]
    p50s = [20.0 if t < 5 else 20.0 + 10.0 * (t - 5) for t in centres]
    reason = rising_trend(_bins(p50s, 10.0), 10.0, 0.0, 100.0)
    assert reason.startswith("not sustained: median latency rising 10.0 ms/s")
    assert rising_trend(_bins(p50s, 10.0), 10.0, 0.0, 1000.0) == ""  # far below the SLA
    # a rise of a quarter of the SLA over the window is a queue that grows, however far
    # from the SLA one window on
    assert "rose steadily by 50 ms" in rising_trend(_bins(p50s, 10.0), 10.0, 0.0, 200.0)


@pytest.mark.parametrize(("window_s", "warmup_s"), [(1.2, 0.5), (4.0, 0.5)])
def test_short_windows_show_a_trend(window_s: float, warmup_s: float) -> None:
    # a --quick step (1.2 s) and tune's default (4 s): latency doubling over the second
    # half of the window; one second-long point per second could never show it
    p50s = [10.0] * 4 + [10.0, 20.0, 40.0, 80.0]
    reason = rising_trend(_bins(p50s, window_s, warmup_s), window_s, warmup_s, 100.0)
    assert reason.startswith("not sustained: median latency rising")


def test_a_steady_rise_is_a_growing_queue_even_under_a_generous_sla() -> None:
    # 3 % over capacity adds ~30 ms of queueing per second: 105 ms over 3.5 s, far below
    # a 1 s SLA one window on, yet a queue without bound
    p50s = [20.0 + 30.0 * (0.5 + (k + 0.5) * 3.5 / 8) for k in range(8)]
    reason = rising_trend(_bins(p50s, 4.0, 0.5), 4.0, 0.5, 1000.0)
    assert reason.startswith("not sustained: median latency rose steadily by 105 ms")
    assert "about 3.0 % of the offered rate" in reason
    # noise around a flat line is not a rise
    noisy = [20.0, 24.0, 19.0, 23.0, 21.0, 25.0, 20.0, 22.0]
    assert rising_trend(_bins(noisy, 4.0, 0.5), 4.0, 0.5, 40.0) == ""


def test_mann_kendall_p_is_small_only_for_a_monotone_rise() -> None:
    assert mann_kendall_p([1, 2, 3, 4, 5, 6, 7, 8]) < 0.001
    assert mann_kendall_p([8, 7, 6, 5, 4, 3, 2, 1]) == 1.0
    assert mann_kendall_p([1, 3, 2, 4, 3, 5, 4, 3]) > 0.01
    assert mann_kendall_p([1, 2]) == 1.0


def test_too_few_answered_slices_cannot_show_a_trend() -> None:
    trend = _bins([10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0], 4.0)
    sparse = [b if k < 6 else b.model_copy(update={"answered": 0}) for k, b in enumerate(trend)]
    # only two answered slices left in the second half, and no steady rise is claimed
    # from six points rising by less than the bound
    assert rising_trend(sparse, 4.0, 0.0, 100_000.0) == ""


def test_a_climbing_step_fails_with_the_trend_as_reason() -> None:
    n = 1000
    offsets = [i / 100 for i in range(n)]  # 10 s at 100 req/s
    latencies = [20.0 if o < 5 else 20.0 + 10.0 * (o - 5) for o in offsets]
    load = summarise(
        urls=["http://127.0.0.1:1"],
        arrival="constant",
        seed=0,
        target_rps=100.0,
        window_s=10.0,
        offsets=offsets,
        outcomes=[OK] * n,
        latencies_ms=latencies,
        lags_ms=[0.0] * n,
        done_at=[o + 0.02 for o in offsets],
        elapsed_s=10.0,
        interrupted=False,
    )
    step = step_from_load(load, SLA(p99_ms=100.0))
    assert load.sla_p99_ms < 100.0  # the window itself kept the SLA
    assert not step.passed
    assert step.valid
    assert "not sustained" in step.reason


async def test_an_invalid_confirmation_leaves_the_valid_failure_standing() -> None:
    # The server fails at 80 req/s; repeating that failure, the client lags (a loaded
    # host at overload): the confirmation cannot tell, so the failure counts and the
    # result is not client-bound.
    class Flaky(Target):
        async def __call__(self, rate: float) -> StepResult:
            step = await super().__call__(rate)
            if rate == 80.0 and self.rates.count(80.0) == 2:
                return step.model_copy(update={"valid": False, "reason": "invalid, client"})
            return step

    target = Flaky(capacity=50.0, client_limit=1e9, goodput_share=1.0)
    result = await search_capacity(
        target, sla=SLA_100, start_rps=10.0, precision=0.05, confirm_failures=True
    )
    assert target.rates[:5] == [10.0, 20.0, 40.0, 80.0, 80.0]
    assert not result.client_bound
    assert 40.0 <= result.effective_rps <= 50.0
    assert not summarise_steps(result.steps, sla=SLA_100, precision=0.05).client_bound


# --- the per-step warm-up ---------------------------------------------------------------


def test_the_warm_up_is_a_tenth_of_the_window_at_least_half_a_second() -> None:
    assert step_warmup_s(5.0) == 0.5
    assert step_warmup_s(30.0) == pytest.approx(3.0)
    assert step_warmup_s(0.6) == 0.3  # never more than half the window


@pytest.mark.parametrize("rate", [20.0, 67.0, 150.0, 400.0, 5000.0])
def test_a_stretched_step_holds_min_requests_after_its_warm_up(rate: float) -> None:
    window = step_window_s(rate, 5.0, 2000)
    if window < MAX_STRETCH * 5.0:
        assert (window - step_warmup_s(window)) * rate >= 2000 - 1e-6


def test_the_fewest_requests_that_bound_a_p99_is_where_the_bound_turns_finite() -> None:
    n = bounded_p99_min_requests()
    assert n == 299
    assert quantile_upper_rank(n) <= n
    assert quantile_upper_rank(n - 1) > n - 1


@pytest.mark.parametrize(
    ("rate", "step_s", "min_requests", "judged"),
    [
        (17.0, 1.0, 2000, False),  # 6 s at most: about 92 requests, a bound needs 299
        (60.0, 1.0, 2000, True),  # about 324 requests: the bound is finite
        (17.0, 5.0, 2000, True),  # 30 s: about 459
        (10.0, 1.0, 40, True),  # 40 asked: judged on its own p99 once it holds them
        (5.0, 1.0, 40, False),
        (0.01, 1.0, 0, True),  # no minimum asked: every step is judged on its p99
    ],
)
def test_a_step_too_short_to_bound_its_p99_is_named_with_what_to_change(
    rate: float, step_s: float, min_requests: int, judged: bool
) -> None:
    why = unjudged_reason(rate, step_s, min_requests)
    assert (why == "") is judged
    window = step_window_s(rate, step_s, min_requests)
    held = rate * (window - step_warmup_s(window))
    assert judged is (held >= min(min_requests, 299))
    if not judged:
        assert "too few to bound its p99" in why
        assert "lengthen the step or lower the minimum" in why


def test_a_stretched_step_is_judged_whatever_the_rounding_of_its_length() -> None:
    # 297.94... req/s ramped down from an e2e trial's 595.9: its window stretched to hold
    # exactly 200 requests, and the rounding of its length once called it one short
    floor = 200 / (MAX_STRETCH * (1 - 0.1))  # below it even the longest window is short
    rates = [floor * 1.01 + k * 0.0137 for k in range(20_000)]
    assert [r for r in rates if unjudged_reason(r, 1.0, 200)] == []


def test_requests_scheduled_in_the_warm_up_are_left_out_of_the_figures() -> None:
    # 100 requests over 1 s; the first 20 (the warm-up) are slow and one failed.
    n = 100
    offsets = [i / n for i in range(n)]
    outcomes = ["503"] + [OK] * (n - 1)
    latencies = [500.0] * 20 + [10.0] * 80
    load = summarise(
        urls=["http://127.0.0.1:1"],
        arrival="constant",
        seed=0,
        target_rps=100.0,
        window_s=1.0,
        offsets=offsets,
        outcomes=outcomes,
        latencies_ms=latencies,
        lags_ms=[0.0] * n,
        done_at=[o + 0.001 for o in offsets],
        elapsed_s=1.0,
        interrupted=False,
        warmup_s=0.2,
    )
    assert load.warmup_s == 0.2
    assert load.requests == 80
    assert load.ok == 80
    assert load.error_rate == 0.0
    assert load.latency.max_ms == pytest.approx(10.0, rel=0.01)
    assert load.sla_p99_ms == pytest.approx(10.0, rel=0.01)
    assert load.offered_rps == pytest.approx(100.0)  # 80 requests over 0.8 s
    assert load.achieved_rps == pytest.approx(100.0)
    # the timeline still shows the whole run
    assert sum(s.scheduled for s in load.timeline) == n
    assert load.timeline[0].errors == 1


def test_a_warm_up_outside_the_run_is_refused() -> None:
    with pytest.raises(ValueError, match="warm-up must be"):
        summarise(
            urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=1.0,
            window_s=1.0, offsets=[0.0], outcomes=[OK], latencies_ms=[1.0], lags_ms=[0.0],
            done_at=[0.1], elapsed_s=1.0, interrupted=False, warmup_s=-1.0,
        )  # fmt: skip


def test_a_complete_trial_with_a_repeated_step_says_so_in_its_reason() -> None:
    def step(rate: float, *, valid: bool) -> StepResult:
        return StepResult(
            offered_rps=rate,
            achieved_rps=rate if valid else 0.0,
            p50_ms=1.0 if valid else 0.0,
            p99_ms=10.0 if valid else 0.0,
            error_rate=0.0,
            requests=100 if valid else 0,
            passed=valid,
            reason="" if valid else "invalid, load worker failed: load worker 1: reset",
            duration_s=1.0,
            valid=valid,
            repeat=not valid,
        )

    steps = [step(40.0, valid=False), step(40.0, valid=True)]
    result = CapacityResult(
        effective_rps=40.0, p99_ms=10.0, sla=SLA_100, feasible=True, precision=0.05, steps=steps
    )
    assert repeated_step_reason(result) == (
        "StepRepeated at 40.0 req/s: invalid, load worker failed: load worker 1: reset"
    )
    clean = result.model_copy(update={"steps": steps[1:]})
    assert repeated_step_reason(clean) == ""
