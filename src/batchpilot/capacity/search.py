"""The capacity search over an abstract step function.

It knows nothing of HTTP: the load generator, Prometheus and the queueing simulator all
supply steps, so one search decides for all of them."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence

from batchpilot.capacity.lightload import LightLoad, probe_light_load
from batchpilot.models import SLA, CapacityResult, StepResult

MeasureStep = Callable[[float], Awaitable[StepResult]]
# Whether a step at this rate may still be measured (a load budget); False ends the search
# as the step limit does, with the answer so far.
MayMeasure = Callable[[float], bool]
# Why a step at this rate could not pass whatever the server did (empty when it could).
Unjudged = Callable[[float], str]


async def search_capacity(
    measure_step: MeasureStep,
    *,
    sla: SLA,
    start_rps: float,
    precision: float = 0.05,
    growth: float = 2.0,
    max_rps: float = 1e6,
    max_steps: int = 40,
    must_beat: float | None = None,
    max_ramp_down: int = 6,
    confirm_failures: bool = False,
    may_measure: MayMeasure | None = None,
    light_load: LightLoad | None = None,
    unjudged: Unjudged | None = None,
) -> CapacityResult:
    """The capacity by `search_above` and, with `light_load`, the low rates below it
    measured by the same steps (`lightload.probe_light_load`): a rate there that breaks
    the SLA caps the answer. The low rates are not offered to `may_measure` nor counted
    against `max_steps`: they lie below a step that passed, so they stay inside any load
    ceiling that step fitted, and their number is bounded by `light_load` itself."""
    found = await search_above(
        measure_step,
        sla=sla,
        start_rps=start_rps,
        precision=precision,
        growth=growth,
        max_rps=max_rps,
        max_steps=max_steps,
        must_beat=must_beat,
        max_ramp_down=max_ramp_down,
        confirm_failures=confirm_failures,
        may_measure=may_measure,
        unjudged=unjudged,
    )
    if light_load is None:
        return found
    return await probe_light_load(
        measure_step, found, light_load, confirm_failures=confirm_failures
    )


async def search_above(
    measure_step: MeasureStep,
    *,
    sla: SLA,
    start_rps: float,
    precision: float = 0.05,
    growth: float = 2.0,
    max_rps: float = 1e6,
    max_steps: int = 40,
    must_beat: float | None = None,
    max_ramp_down: int = 6,
    confirm_failures: bool = False,
    may_measure: MayMeasure | None = None,
    unjudged: Unjudged | None = None,
) -> CapacityResult:
    """Ramp the offered rate geometrically from `start_rps` until a step fails, then
    bisect between the last pass and the first fail until (hi - lo) / lo ≤ precision.

    If the first step fails, ramp down (÷ growth, at most `max_ramp_down` times) to find a
    passing rate; none passing means infeasible. With `must_beat` (the best effective
    rate so far) the search stops with `pruned=True` as soon as this configuration
    provably cannot exceed it: a step fails at a rate ≤ must_beat, or the bisection's
    upper bound drops to ≤ must_beat. Every step is returned, in order.

    With `confirm_failures`, a failing step that would decide the outcome is measured
    once more at the same rate: a second failure confirms it, and a pass there is
    settled by a third window (two out of three). Decisive failures are those that end
    the ramp (the first step and every ramp-up step) and those that prune (a fail at a
    rate ≤ must_beat). Bisection fails
    above must_beat are not repeated: they move the answer by less than the bracket.
    The answer stays monotone: it is the highest passing rate below the lowest
    (confirmed) failure, since no step is ever measured above a counted failure.
    Measured steps need this, on a shared machine one noisy window is common; the
    simulator's deterministic steps do not, so it is off by default.

    With `may_measure`, every step is first offered to it: False ends the search as
    `max_steps` does (a load budget spent), with the highest pass so far. Either, or a
    pass at `max_rps`, ends it short of its precision, which the result says
    (`short_of_precision`).

    With `unjudged`, no step is measured at a rate no step could pass whatever the
    server did (too few requests in it to bound a p99): a start that low moves up to the
    lowest rate that can be judged, and the ramp down takes that rate as its last step,
    the result saying why when it fails too (`CapacityResult.unjudged`).

    An invalid step (the client could not keep its schedule) is neither: the search
    stops ramping there and the result is `client_bound`, a lower bound on capacity.
    Only before any pass does it keep ramping down past one. An invalid step marked
    `repeat` (a load worker died in it) is measured once more at the same rate first;
    only a second invalid window counts, and ends the search: lower rates cannot mend a
    fleet that failed twice running. The effective rate is the
    goodput of the highest passing step."""
    _validate(start_rps, precision, growth, max_rps, max_steps, max_ramp_down, must_beat)
    steps: list[StepResult] = []
    passed: dict[float, StepResult] = {}
    client_bound = False

    short = ""

    def result(lo: float, *, pruned: bool = False) -> CapacityResult:
        found = _capacity(passed.get(lo), steps, sla, precision, pruned, client_bound)
        if short and not pruned and not client_bound:
            return found.model_copy(update={"short_of_precision": short})
        return found

    def spent(rate: float) -> bool:
        nonlocal short
        if len(steps) >= max_steps:
            short = f"the step limit ({max_steps} steps) came first"
        elif may_measure is not None and not may_measure(rate):
            short = f"the load budget did not allow a step at {rate:.1f} req/s"
        else:
            return False
        return True

    def cannot_win(failed_at: float) -> bool:
        return must_beat is not None and failed_at <= must_beat

    async def once(rate: float) -> bool | None:
        step = await measure_step(rate)
        steps.append(step)
        if step.repeat and not spent(rate):
            # a window a load worker's death spoiled tells nothing of the server nor of
            # the client: the same rate once more, before it counts as invalid
            step = await measure_step(rate)
            steps.append(step)
        if not step.valid:
            return None
        if step.passed:
            passed[rate] = step
        return step.passed

    async def measure(rate: float, *, decisive: bool) -> bool | None:
        verdict = await once(rate)
        if verdict is not False:
            return verdict
        if not (confirm_failures and decisive) or spent(rate):
            return False
        # A second failure confirms. A pass there only disputes the first: taking it
        # would credit a configuration the better of two noisy windows, so a third
        # window decides, two out of three. A window that could not tell (invalid), or
        # no budget left for the third, leaves the valid failure standing.
        confirmed = await once(rate)
        if not confirmed or spent(rate):
            return False
        return await once(rate) is True

    rate = min(start_rps, max_rps)
    if unjudged is not None and unjudged(rate) and not unjudged(max_rps):
        # a start too low for its step to tell anything: the first step is the lowest
        # rate that can be judged
        rate = min(lowest_judged(unjudged, rate, max_rps) * (1.0 + FLOOR_MARGIN), max_rps)
    lo = 0.0
    hi = math.inf
    if spent(rate):
        return result(0.0)
    first = await measure(rate, decisive=True)
    client_bound = first is None
    if first:
        lo = rate
    elif first is None and steps[-1].repeat:
        return result(0.0)  # the fleet failed twice running: a lower rate cannot help
    else:
        # Ramping down also past an invalid step: a lower rate may be one the client keeps.
        hi = rate
        if first is False and cannot_win(rate):
            return result(0.0, pruned=True)
        for _ in range(max_ramp_down):
            above, rate = rate, rate / growth
            why = unjudged(rate) if unjudged is not None else ""
            if why:
                assert unjudged is not None
                # the lowest rate that can be judged, when it lies below the failed one:
                # the last step down
                floor = lowest_judged(unjudged, rate, above) * (1.0 + FLOOR_MARGIN)
                if floor >= above * (1.0 - precision):
                    return result(0.0).model_copy(update={"unjudged": why})
                rate = floor
                why = unjudged(floor / (1.0 + FLOOR_MARGIN) * (1.0 - 2e-3)) or why
            if spent(rate):
                return result(0.0)
            verdict = await measure(rate, decisive=cannot_win(rate))
            client_bound = client_bound or verdict is None
            if verdict is None and steps[-1].repeat:
                return result(0.0)
            if verdict:
                lo = rate
                if client_bound:  # nothing above the client's ceiling can be measured
                    return result(lo)
                break
            hi = rate
            if verdict is False and cannot_win(rate):
                return result(0.0, pruned=True)
            if why:  # the floor failed too: nothing lower can be judged
                return result(0.0).model_copy(update={"unjudged": why})
        else:
            return result(0.0)

    while hi == math.inf:  # ramp up until a step fails
        if lo >= max_rps:
            short = f"the rate cap {max_rps:g} req/s passed: the capacity may lie above it"
            return result(lo)
        rate = min(lo * growth, max_rps)
        if spent(rate):
            return result(lo)
        verdict = await measure(rate, decisive=True)
        if verdict is None:
            client_bound = True  # the client's ceiling: nothing above it can be measured
            return result(lo)
        if verdict:
            lo = rate
        else:
            hi = rate
            if cannot_win(rate):
                return result(lo, pruned=True)

    while (hi - lo) / lo > precision:  # bisect
        if must_beat is not None and hi <= must_beat:
            return result(lo, pruned=True)
        rate = (lo + hi) / 2.0
        if spent(rate):
            break
        verdict = await measure(rate, decisive=cannot_win(rate))
        if verdict is None:
            client_bound = True
            return result(lo)
        if verdict:
            lo = rate
        else:
            hi = rate
    return result(lo)


# A step at the lowest rate that can be judged holds its minimum of requests only on
# average: one a request or two short is judged on its p99's bound, infinite under 299
# requests. The search steps this far above that rate instead.
FLOOR_MARGIN = 0.05


def lowest_judged(unjudged: Unjudged, low: float, high: float) -> float:
    """The lowest rate in (`low`, `high`] that can be judged, within 0.1 %, given that
    `low` cannot and `high` can (whether a rate can be judged only grows with it)."""
    while high - low > high * 1e-3:
        middle = (low + high) / 2.0
        if unjudged(middle):
            low = middle
        else:
            high = middle
    return high


def _capacity(
    best: StepResult | None,
    steps: Sequence[StepResult],
    sla: SLA,
    precision: float,
    pruned: bool,
    client_bound: bool,
) -> CapacityResult:
    """The result at the highest passing step `best`: its goodput (successful requests
    per second actually achieved; in a token-stream window those that met every TTFT
    and TPOT target) is the effective throughput, not the rate offered."""
    effective = 0.0
    if best is not None and best.goodput_rps is not None:
        effective = best.goodput_rps
    elif best is not None:
        effective = best.achieved_rps if best.achieved_rps > 0 else best.offered_rps
    return CapacityResult(
        effective_rps=effective,
        p99_ms=best.p99_ms if best is not None else None,
        ttft_p99_ms=best.ttft_p99_ms if best is not None else None,
        tpot_p99_ms=best.tpot_p99_ms if best is not None else None,
        output_tokens_per_s=best.output_tokens_per_s if best is not None else None,
        sla=sla,
        feasible=effective > 0,
        pruned=pruned,
        precision=precision,
        steps=list(steps),
        client_bound=client_bound,
        client_ceiling_rps=(best.offered_rps if best is not None else 0.0)
        if client_bound
        else None,
    )


def summarise_steps(steps: Sequence[StepResult], *, sla: SLA, precision: float) -> CapacityResult:
    """A CapacityResult from the steps of a search that was interrupted, by the search's
    own rule: a rate's verdict is its latest step (a confirmation overrides the step it
    repeats), and the effective rate so far is the highest passing rate below the lowest
    failing one, so a pass above a failure never raises the answer."""
    latest = {s.offered_rps: s for s in steps if s.valid}
    lowest_fail = min((r for r, s in latest.items() if not s.passed), default=math.inf)
    best = max(
        (s for r, s in latest.items() if s.passed and r < lowest_fail),
        key=lambda s: s.offered_rps,
        default=None,
    )
    # Client-bound when an invalid step, not a failure, is what stopped the search.
    client_bound = any(not s.valid and s.offered_rps < lowest_fail for s in steps)
    return _capacity(best, steps, sla, precision, False, client_bound)


def _validate(
    start_rps: float,
    precision: float,
    growth: float,
    max_rps: float,
    max_steps: int,
    max_ramp_down: int,
    must_beat: float | None,
) -> None:
    if not (math.isfinite(start_rps) and start_rps > 0):
        raise ValueError(f"start rate must be > 0 req/s, got {start_rps:g}")
    if not (0 < precision < 1):
        raise ValueError(f"precision must be in (0, 1), got {precision:g}")
    if not (math.isfinite(growth) and growth > 1):
        raise ValueError(f"growth must be > 1, got {growth:g}")
    if not (max_rps > 0):
        raise ValueError(f"max rate must be > 0 req/s, got {max_rps:g}")
    if max_steps < 1:
        raise ValueError(f"max steps must be ≥ 1, got {max_steps}")
    if max_ramp_down < 0:
        raise ValueError(f"max ramp-down steps must be ≥ 0, got {max_ramp_down}")
    if must_beat is not None and not (must_beat >= 0):
        raise ValueError(f"must_beat must be ≥ 0 req/s, got {must_beat:g}")
