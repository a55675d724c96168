"""Effective throughput of a live HTTP endpoint: warm up, then search with steps from
the open-loop generator, decided on the client's percentiles or on Prometheus's."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from batchpilot.capacity.lightload import LightLoad
from batchpilot.capacity.search import search_capacity
from batchpilot.capacity.steps import (
    bounded_p99_min_requests,
    breach_stopped_step,
    step_from_load,
)
from batchpilot.loadgen.arrivals import ArrivalKind, as_arrival
from batchpilot.loadgen.breach import BreachRule
from batchpilot.loadgen.endpoints import check_reachable, normalise_urls
from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.lengths import long_output_tokens
from batchpilot.loadgen.protocols import STREAM_PROTOCOLS, RequestProtocol, in_force, speaking
from batchpilot.loadgen.result import LoadResult
from batchpilot.loadgen.serve_worker import ShareSender
from batchpilot.loadgen.tokens import TokenSla
from batchpilot.loadgen.warmup import closed_loop_rate
from batchpilot.loadgen.workers import (
    ShareSpec,
    WorkerError,
    check_workers,
    forwarded_protocol,
    run_load_workers,
)
from batchpilot.models import (
    DEFAULT_MIN_REQUESTS,
    MAX_CONNECTIONS,
    SLA,
    CapacityResult,
    RequestMix,
    StepResult,
)

# The warm-up keeps this many requests in flight per target; its rate, halved, is where
# the search starts when no start rate is given (the ramp doubles from there).
WARMUP_CONCURRENCY = 16
FALLBACK_START_RPS = 10.0
# No ceiling: the search's own default.
DEFAULT_MAX_RPS = 1e6
# After a load worker failed a step: the node notices a dead container and marks its pod
# unready within a couple of seconds, and the next step waits for the fleet to be ready.
WORKER_SETTLE_S = 3.0


class StepSource(Protocol):
    """Decides a step from somewhere other than the client's own measurement."""

    async def step_result(
        self,
        *,
        load: LoadResult,
        start_unix: float,
        end_unix: float,
        sla: SLA,
        min_requests: int = 0,
    ) -> StepResult:
        """The step decision for the window [start_unix, end_unix] during which `load`
        was offered (its schedule, then its drain), by the client's rules: fewer than
        `min_requests` requests are judged on the p99's upper confidence bound."""
        ...


# Each step drops its warm-up from the figures: requests scheduled in its first
# STEP_WARMUP_SHARE of the window, at least STEP_WARMUP_MIN_S (connections opening, the
# batcher settling at the new rate, the previous step's backlog draining), at most half
# the window. 0.5 s of a default 5 s step; 3 s of a stretched 30 s one.
STEP_WARMUP_SHARE = 0.10
STEP_WARMUP_MIN_S = 0.5


def step_warmup_s(window_s: float) -> float:
    """The warm-up dropped from the front of a step window of `window_s` seconds."""
    return min(max(STEP_WARMUP_SHARE * window_s, STEP_WARMUP_MIN_S), window_s / 2.0)


def step_window_s(rate: float, step_duration_s: float, min_requests: int) -> float:
    """How long a step at `rate` runs: `step_duration_s`, stretched (at most
    `MAX_STRETCH`-fold) so that after its warm-up it holds `min_requests` requests and
    its p99 rests on enough samples. Where the cap comes first, the step is judged on its
    p99's upper confidence bound (see step_from_load)."""
    measured = min_requests / rate
    needed = max(measured / (1.0 - STEP_WARMUP_SHARE), measured + STEP_WARMUP_MIN_S)
    if min_requests == 0:
        needed = 0.0
    return max(step_duration_s, min(needed, MAX_STRETCH * step_duration_s))


def judged_min_requests(rate: float, window_s: float, min_requests: int) -> int:
    """The count below which a step of `window_s` at `rate` is judged on its p99's upper
    bound: `min_requests` where the window could not be stretched to hold them, else
    what random arrivals may leave it short of them. A window stretched to hold
    `min_requests` holds them on average; under Poisson arrivals about half the windows
    come a few short, and judging those on a bound (infinite under 299 requests) would
    fail a step on the arrival process's noise, not on what the server did. Three
    standard deviations of the count below its mean leave about one window in a
    thousand short by chance."""
    designed = rate * (window_s - step_warmup_s(window_s))
    if designed < min_requests * (1.0 - 1e-9):
        return min_requests
    return min(min_requests, math.floor(designed - 3.0 * math.sqrt(designed)))


def unjudged_reason(rate: float, step_duration_s: float, min_requests: int) -> str:
    """Why a step at `rate` could not pass whatever the server did (empty when it could):
    even stretched, its window holds fewer requests than it asks for and fewer than the
    smallest count that bounds a p99, so it is judged on an infinite bound. The count
    only falls as the rate falls, so no lower rate could pass either."""
    needed = min(min_requests, bounded_p99_min_requests())
    window_s = step_window_s(rate, step_duration_s, min_requests)
    expected = rate * (window_s - step_warmup_s(window_s))
    # a stretched window holds exactly `min_requests` by construction: the rounding of
    # its length must not make it one short
    if expected >= needed * (1.0 - 1e-9):
        return ""
    return (
        f"below {rate:.2f} req/s a step holds about {expected:.0f} measured requests, too "
        f"few to bound its p99 (it takes {needed}): lengthen the step or lower the minimum "
        "of requests per step to measure lower rates"
    )


# Caps a step at 6 x its duration (30 s at the default 5 s): 2,000 measured requests then
# need at least ~75 req/s; slower services are judged on the bound rather than waited for.
MAX_STRETCH = 6.0


def default_timeout_s(sla: SLA, output_tokens: float = 1.0) -> float:
    """Well above the SLA, so a timeout marks a request that failed, not a slow pass: for
    token targets alone, above an answer of `output_tokens` (a long one) within them."""
    return max(5.0 * sla.scale_ms(output_tokens) / 1000.0, 1.0)


def judged_protocol(sla: SLA) -> RequestProtocol | None:
    """The request protocol in force, a token stream's goodput counted against the SLA's
    TTFT and TPOT targets (None: no protocol in force). ValueError when the SLA has token
    targets and the requests are not token streams."""
    protocol = in_force()
    stream = protocol.stream if protocol is not None else None
    if stream is None:
        if sla.token_targets:
            raise ValueError(
                "TTFT and TPOT p99 targets are judged on token streams: the load must use "
                f"a token-stream protocol ({' or '.join(STREAM_PROTOCOLS)})"
            )
        return protocol
    assert protocol is not None
    targets = TokenSla(ttft_ms=sla.ttft_p99_ms, tpot_ms=sla.tpot_p99_ms)
    return dataclasses.replace(protocol, stream=stream.model_copy(update={"sla": targets}))


class OverloadBudget:
    """Time the failing steps of one search may take together (None: no limit). A step
    that did not pass ran above the SLA, or could not tell: both count in full."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self.spent_s = 0.0

    def record(self, step: StepResult, window_s: float) -> None:
        if not step.passed:
            self.spent_s += max(step.duration_s, window_s)

    def fits(self, window_s: float) -> bool:
        return self.limit_s is None or self.spent_s + window_s <= self.limit_s


async def measure_step(
    urls: Sequence[str],
    *,
    rate: float,
    sla: SLA,
    mix: RequestMix,
    duration_s: float,
    timeout_s: float,
    seed: int,
    arrival: ArrivalKind | str = "poisson",
    source: StepSource | None = None,
    path: str = "/v1/predict",
    min_requests: int = 0,
    workers: int = 1,
    sender: ShareSender | None = None,
    max_connections: int | None = None,
    stop_on_breach: bool = False,
) -> tuple[StepResult, LoadResult]:
    """One window at `rate`: the step decision and the client's full measurement, sent
    by one generator process, split over `workers` of them, or handed to `sender`
    (remote load workers; its WorkerError passes through). With `stop_on_breach`, a
    window sent by this process ends as soon as its p99 is certain to break the SLA's
    (`loadgen.breach`), and fails on that whatever a Prometheus source would say of the
    part that ran. Not under `max_connections`: the requests over the bound may be
    waiting for one of the client's own connections (its limit, not the server's), and
    the cap already keeps the excess in the client, off the pods."""
    breach = (
        BreachRule(sla.p99_ms)
        if stop_on_breach
        and sla.p99_ms is not None
        and sender is None
        and workers == 1
        and max_connections is None
        else None
    )
    start_unix = time.time()
    if sender is not None:
        load = await sender(
            share_spec(urls, rate, duration_s, mix, arrival, timeout_s, seed, path, max_connections)
        )
    elif workers == 1:
        load = await run_load(
            urls, rate=rate, duration_s=duration_s, mix=mix, arrival=arrival,
            timeout_s=timeout_s, seed=seed, path=path, warmup_s=step_warmup_s(duration_s),
            max_connections=max_connections, breach=breach,
        )  # fmt: skip
    else:
        load = await run_load_workers(
            urls, workers=workers, rate=rate, duration_s=duration_s, mix=mix, arrival=arrival,
            timeout_s=timeout_s, seed=seed, path=path, warmup_s=step_warmup_s(duration_s),
            max_connections=max_connections,
        )  # fmt: skip
    end_unix = time.time()
    if load.breach_stop is not None:
        return breach_stopped_step(load, sla), load
    judged_min = judged_min_requests(rate, duration_s, min_requests)
    if source is None:
        return step_from_load(load, sla, min_requests=judged_min), load
    step = await source.step_result(
        load=load, start_unix=start_unix, end_unix=end_unix, sla=sla, min_requests=judged_min
    )
    return step, load


def share_spec(
    urls: Sequence[str],
    rate: float,
    duration_s: float,
    mix: RequestMix,
    arrival: ArrivalKind | str,
    timeout_s: float,
    seed: int,
    path: str,
    max_connections: int | None = None,
) -> ShareSpec:
    """The whole schedule of one step, as remote workers rebuild it, with the request
    protocol in force carried along, its CA bundle as PEM text, and the client's
    connection cap (split over the workers)."""
    spec = ShareSpec(
        urls=list(urls), rate=rate, duration_s=duration_s, mix=mix, arrival=as_arrival(arrival),
        timeout_s=timeout_s, seed=seed, path=path, warmup_s=step_warmup_s(duration_s),
        max_connections=max_connections,
    )  # fmt: skip
    protocol = in_force()
    if protocol is None:
        return spec
    return spec.model_copy(update=forwarded_protocol(protocol, spec))


def worker_failed_step(rate: float, duration_s: float, why: str) -> StepResult:
    """The step of a window whose remote workers did not all deliver: invalid."""
    return StepResult(
        offered_rps=rate,
        achieved_rps=0.0,
        p50_ms=0.0,
        p99_ms=0.0,
        error_rate=0.0,
        requests=0,
        passed=False,
        reason=f"invalid, load worker failed: {why}"[:500],
        duration_s=duration_s,
        valid=False,
        repeat=True,
    )


async def measure_capacity(
    urls: str | Sequence[str],
    *,
    sla: SLA,
    mix: RequestMix,
    precision: float = 0.05,
    step_duration_s: float = 5.0,
    warmup_s: float = 2.0,
    start_rps: float | None = None,
    must_beat: float | None = None,
    timeout_s: float | None = None,
    seed: int = 0,
    source: StepSource | None = None,
    arrival: ArrivalKind | str = "poisson",
    max_rps: float = DEFAULT_MAX_RPS,
    path: str = "/v1/predict",
    on_step: Callable[[StepResult, LoadResult], None] | None = None,
    cooldown_s: float | None = None,
    min_requests: int = DEFAULT_MIN_REQUESTS,
    confirm_failures: bool = True,
    workers: int = 1,
    max_overload_s: float | None = None,
    sender: ShareSender | None = None,
    max_connections: int | None = None,
    light_load: LightLoad | None = None,
    stop_on_breach: bool = False,
) -> CapacityResult:
    """Warm up, then search for the effective throughput (see search_capacity).
    `on_step` sees every step as it completes (progress display, partial results).
    After a failing step the search pauses `cooldown_s` (default: the request timeout)
    so the backlog that step left in the server does not spill into the next window.
    A step lasts long enough for `min_requests` requests (up to 6 x `step_duration_s`):
    a p99 from a hundred samples is little more than the second-largest one; a step
    that still falls short is judged on the upper 95 % bound of its p99.
    With `confirm_failures` (the default) a failing step that would end the ramp or
    prune is measured again after the cool-down and only a second failure counts: on a
    shared machine one noisy window otherwise decides the whole search.
    With `workers` above 1 each step is sent by that many generator processes sharing
    its one schedule (see run_load_workers); the warm-up stays in this process.
    With `sender`, each step is handed to remote load workers instead (see
    loadgen.serve_worker); one that fails to deliver makes that step invalid.
    `max_connections` caps the connections (requests in flight) of the whole client, the
    warm-up's included: a step that needs more in flight waits for slots, and that wait
    is the client's limit (a client-bound step), not the server's failure.
    `max_rps` caps every offered rate, the warm-up's included (a load budget).
    `max_overload_s` bounds the time the steps that failed (ran above the SLA) take
    together: a step starts only while the time left covers its whole window, so the
    bound holds however the step ends.
    With `light_load`, the rates it names below the capacity found are measured by the
    same steps, and one that breaks the SLA caps the answer (`capacity.lightload`).
    With `stop_on_breach` (load on production), a step sent from this process stops as
    soon as its p99 is certain to break the SLA, so a failing step loads the pods only
    until its verdict is known (`loadgen.breach`); load workers and a client under
    `max_connections` send whole windows.
    Raises ValueError for bad arguments and UnreachableError when a target does not
    answer at all."""
    bases = normalise_urls(urls)
    if not (math.isfinite(step_duration_s) and step_duration_s > 0):
        raise ValueError(f"step duration must be > 0 s, got {step_duration_s:g}")
    if not (math.isfinite(warmup_s) and warmup_s >= 0):
        raise ValueError(f"warm-up must be ≥ 0 s, got {warmup_s:g}")
    if min_requests < 0:
        raise ValueError(f"min requests per step must be ≥ 0, got {min_requests}")
    check_workers(workers)
    if max_connections is not None and max_connections < 1:
        raise ValueError(f"max connections must be ≥ 1, got {max_connections}")
    if start_rps is not None and not (math.isfinite(start_rps) and start_rps > 0):
        raise ValueError(f"start rate must be > 0 req/s, got {start_rps:g}")
    if max_overload_s is not None and not (math.isfinite(max_overload_s) and max_overload_s > 0):
        raise ValueError(f"overload budget must be > 0 s, got {max_overload_s:g}")
    # a token stream's goodput counts against the SLA's own targets, wherever it is sent
    protocol = judged_protocol(sla)
    stream = protocol.stream if protocol is not None else None
    with speaking(protocol):
        # Parsed once: a trace file is read before the first request, not at every step.
        process = as_arrival(arrival)
        long_answer = long_output_tokens(stream.lengths) if stream is not None else 1
        timeout = timeout_s if timeout_s is not None else default_timeout_s(sla, long_answer)
        cooldown = timeout if cooldown_s is None else cooldown_s
        await check_reachable(bases)
        estimate = 0.0
        if warmup_s > 0:
            estimate = await closed_loop_rate(
                bases,
                concurrency=min(
                    WARMUP_CONCURRENCY * len(bases), max_connections or MAX_CONNECTIONS
                ),
                duration_s=warmup_s,
                mix=mix,
                timeout_s=timeout,
                path=path,
                seed=seed,
                # a load budget holds for the warm-up too
                max_rps=max_rps if max_rps < DEFAULT_MAX_RPS else None,
            )
        if start_rps is None:
            start_rps = max(1.0, estimate / 2.0) if estimate > 0 else FALLBACK_START_RPS
        step_seeds = itertools.count(seed + 1)
        overload = OverloadBudget(max_overload_s)

        def window(rate: float) -> float:
            return step_window_s(rate, step_duration_s, min_requests)

        async def measure(rate: float) -> StepResult:
            try:
                step, load = await measure_step(
                    bases,
                    rate=rate,
                    sla=sla,
                    mix=mix,
                    duration_s=window(rate),
                    timeout_s=timeout,
                    seed=next(step_seeds),
                    arrival=process,
                    source=source,
                    path=path,
                    min_requests=min_requests,
                    workers=workers,
                    sender=sender,
                    max_connections=max_connections,
                    stop_on_breach=stop_on_breach,
                )
            except WorkerError as exc:
                if sender is None:
                    raise
                # a remote share not sent, or not reported in time: never a pass
                step = worker_failed_step(rate, window(rate), str(exc))
                overload.record(step, window(rate))
                # a worker that just died may still be listed ready: the fleet gets a
                # moment to say so before the search repeats the step
                await asyncio.sleep(WORKER_SETTLE_S)
                return step
            if on_step is not None:
                on_step(step, load)
            overload.record(step, window(rate))
            if not step.passed and cooldown > 0:
                await asyncio.sleep(cooldown)
            return step

        return await search_capacity(
            measure,
            sla=sla,
            start_rps=start_rps,
            precision=precision,
            must_beat=must_beat,
            max_rps=max_rps,
            confirm_failures=confirm_failures,
            may_measure=lambda rate: overload.fits(window(rate)),
            light_load=light_load,
            unjudged=lambda rate: unjudged_reason(rate, step_duration_s, min_requests),
        )
