"""The trial loop against a fake target and probe, and the summary it ends with."""

from __future__ import annotations

import asyncio
import math

import pytest

from batchpilot.errors import TargetError
from batchpilot.models import SLA, BatchingConfig, CapacityResult, StepResult
from batchpilot.tuner.rules import rule_of_thumb, rules_of_thumb, short_request_rule
from batchpilot.tuner.runner import (
    RoundDone,
    TrialDone,
    TrialStart,
    interleaved_order,
    remeasure_interleaved,
    run_trial,
    run_trials,
)
from batchpilot.tuner.study import PRUNE_MARGIN, SearchSpace, Tuner
from batchpilot.tuner.summary import (
    TuneSummary,
    finalists,
    gain,
    label_of,
    summarize,
    with_verdict,
)
from batchpilot.tuner.verdict import decide

SLA_ = SLA(p99_ms=100.0)
SPACE = SearchSpace.from_bounds(max_batch_size=(1, 64), max_queue_time_ms=(0, 100))
BASELINE = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)


def capacity(config: BatchingConfig, must_beat: float | None) -> CapacityResult:
    """A made-up server: more batch helps up to 32, waiting past 20 ms hurts; the
    capacity search prunes as the real one would, from the true value."""
    b, q = config.max_batch_size, config.max_queue_time_ms
    true = 100.0 * math.log2(min(b, 32) + 1) - max(q - 20.0, 0.0) * 3
    if true <= 0:
        step = StepResult(
            offered_rps=10,
            achieved_rps=10,
            p50_ms=80,
            p99_ms=300,
            error_rate=0,
            requests=10,
            passed=False,
            reason="p99",
            duration_s=1,
        )
        return CapacityResult(
            effective_rps=0, p99_ms=None, sla=SLA_, feasible=False, precision=0.05, steps=[step]
        )
    pruned = must_beat is not None and true <= must_beat
    step = StepResult(
        offered_rps=true,
        achieved_rps=true,
        p50_ms=20,
        p99_ms=60,
        error_rate=0,
        requests=100,
        passed=True,
        duration_s=1,
    )
    return CapacityResult(
        effective_rps=true / 2 if pruned else true,
        p99_ms=60,
        sla=SLA_,
        feasible=True,
        pruned=pruned,
        precision=0.05,
        steps=[step],
    )


class FakeTarget:
    def __init__(self, refuse: frozenset[int] = frozenset()) -> None:
        self.live = BASELINE
        self.applied: list[BatchingConfig] = []
        self.refuse = refuse

    async def current(self) -> BatchingConfig:
        return self.live

    async def apply(self, config: BatchingConfig) -> None:
        if config.max_batch_size in self.refuse:
            raise TargetError(f"refused batch {config.max_batch_size}")
        self.applied.append(config)
        self.live = config


class FakeProbe:
    def __init__(self, target: FakeTarget) -> None:
        self.target = target
        self.calls: list[tuple[BatchingConfig, float | None]] = []

    async def measure(self, config: BatchingConfig, *, must_beat: float | None) -> CapacityResult:
        assert config == self.target.live  # measured what is live
        self.calls.append((config, must_beat))
        return capacity(config, must_beat)


def tuner(rules: list[BatchingConfig]) -> Tuner:
    return Tuner(SPACE, seed=5, baseline=BASELINE, warm_start=rules)


async def test_reference_configs_are_never_pruned_and_the_rest_may_be() -> None:
    rules = rules_of_thumb(SPACE, SLA_)
    t = tuner(rules)
    target = FakeTarget()
    probe = FakeProbe(target)
    starts: list[TrialStart] = []
    done: list[TrialDone] = []
    await run_trials(
        t, target, probe, trials=10, full=rules, on_start=starts.append, on_done=done.append
    )
    assert len(done) == 10
    assert target.applied == [c for c, _ in probe.calls]
    assert [s.full for s in starts[:3]] == [True, True, True]
    assert all(m is None for _, m in probe.calls[:3])
    later = probe.calls[3:]
    assert all(m is not None for _, m in later)
    # must_beat is a lower bound of the best effective rate known when the trial
    # started, not that noisy best score itself
    for (config, must_beat), start in zip(later, starts[3:], strict=True):
        assert start.config == config
        best_so_far = max(
            d.record.effective_rps or 0
            for d in done[: start.number]
            if d.record.state == "Complete"
        )
        assert must_beat == pytest.approx((1.0 - PRUNE_MARGIN) * best_so_far)
    best = t.best()
    assert best is not None
    assert done[-1].best == best


async def test_a_refused_configuration_fails_the_trial_and_the_run_goes_on() -> None:
    t = tuner([])
    target = FakeTarget(refuse=frozenset({8}))
    done = await run_trial(t, target, FakeProbe(target))
    assert done.record.state == "Failed"
    assert done.record.reason == "refused batch 8"
    assert done.result is None
    await run_trials(t, target, FakeProbe(target), trials=3)
    assert t.measured_count() == 3


async def test_cancelling_leaves_the_trial_running_for_a_resume() -> None:
    t = tuner([])
    target = FakeTarget()

    class SlowProbe(FakeProbe):
        async def measure(
            self, config: BatchingConfig, *, must_beat: float | None
        ) -> CapacityResult:
            await asyncio.Event().wait()  # never finishes on its own
            raise AssertionError

    task = asyncio.ensure_future(run_trials(t, target, SlowProbe(target), trials=2))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r.state for r in t.records()] == ["Running"]
    resumed = Tuner(SPACE, seed=5, baseline=BASELINE, history=t.records())
    assert resumed.ask()[1] == BASELINE  # retried


def test_rules_of_thumb_follow_the_seed_within_the_space_and_the_sla() -> None:
    assert rule_of_thumb(SPACE, SLA_) == BatchingConfig(max_batch_size=32, max_queue_time_ms=10)
    assert short_request_rule(SPACE, SLA_) == BatchingConfig(
        max_batch_size=12, max_queue_time_ms=20
    )
    # a tight SLA caps the wait at a quarter of it; a small space caps the batch
    tight = SLA(p99_ms=20.0)
    small = SearchSpace.from_bounds(max_batch_size=(1, 6), max_queue_time_ms=(0, 100))
    assert rule_of_thumb(small, tight) == BatchingConfig(max_batch_size=2, max_queue_time_ms=5)
    assert short_request_rule(small, tight) == BatchingConfig(max_batch_size=6, max_queue_time_ms=5)
    one = SearchSpace.from_bounds(max_batch_size=(4, 4), max_queue_time_ms=(10, 10))
    assert rules_of_thumb(one, SLA_) == [BatchingConfig(max_batch_size=4, max_queue_time_ms=10)]


async def test_summary_quotes_gains_measured_in_the_same_run() -> None:
    rules = rules_of_thumb(SPACE, SLA_)
    t = tuner(rules)
    target = FakeTarget()
    await run_trials(t, target, FakeProbe(target), trials=8, full=rules)
    summary = _summary_of(t, rules)
    assert summary.baseline is not None
    assert summary.rule_of_thumb is not None
    assert summary.best is not None
    assert summary.baseline.trial == 0
    assert (summary.rule_of_thumb.max_batch_size, summary.rule_of_thumb.max_queue_time_ms) == (
        32,
        10.0,
    )
    assert summary.baseline.effective_rps is not None
    assert summary.best.effective_rps is not None
    assert summary.gain_over_baseline == pytest.approx(
        summary.best.effective_rps / summary.baseline.effective_rps - 1
    )
    assert summary.gain_over_baseline is not None
    assert summary.gain_over_baseline > 0  # the made-up server rewards bigger batches
    assert set(summary.measurements) == {"best", "baseline", "rule_of_thumb"}
    assert [tr.label for tr in summary.trials[:3]] == ["baseline", "rule of thumb", "rule of thumb"]
    # the label follows the record's source (refinement takes over once the sampler stalls)
    assert [tr.label for tr in summary.trials[3:]] == [
        "refine" if r.source == "refine" else "sampler" for r in t.records()[3:]
    ]
    assert {tr.label for tr in summary.trials[3:]} <= {"sampler", "refine"}
    dumped = summary.model_dump(mode="json")
    for key in ("max_batch_size", "max_queue_time_ms", "effective_rps", "p99_ms"):
        assert key in dumped["best"]
        assert key in dumped["baseline"]


def test_gain_is_undefined_against_an_infeasible_reference() -> None:
    t = tuner([])
    n, _, _ = t.ask()
    bad = t.tell(n, capacity(BatchingConfig(max_batch_size=1, max_queue_time_ms=100), None))
    n, _, _ = t.ask()
    good = t.tell(n, capacity(BASELINE, None))
    assert bad.state == "Infeasible"
    assert gain(good, bad) is None
    assert gain(None, good) is None
    assert gain(good, good) == 0.0


def test_labels_say_where_a_configuration_came_from() -> None:
    rules = [BatchingConfig(max_batch_size=32, max_queue_time_ms=10)]
    t = Tuner(
        SPACE,
        baseline=BASELINE,
        warm_start=[*rules, BatchingConfig(max_batch_size=4, max_queue_time_ms=1)],
    )
    for _ in range(4):
        n, _, _ = t.ask()
        t.tell_failed(n, "x")
    assert [label_of(r, rules) for r in t.records()] == [
        "baseline",
        "rule of thumb",
        "simulator",
        "sampler",
    ]


def _summary_of(t: Tuner, rules: list[BatchingConfig]) -> TuneSummary:
    records = t.records()
    results = {r.number: res for r in records if (res := t.result(r.number)) is not None}
    return summarize(
        records,
        best=t.best(),
        rules=rules,
        results=results,
        sla=SLA_,
        sampler="TPE",
        seed=5,
        space=SPACE.describe(),
        interrupted=False,
        duration_s=1.0,
    )


A = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)
B = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.0)
C = BatchingConfig(max_batch_size=64, max_queue_time_ms=0.0)


def test_the_interleaved_order_is_finalists_then_incumbent_round_after_round() -> None:
    order = interleaved_order([A, B, BASELINE, A, C], BASELINE, 3)
    assert order == [(r, c) for r in range(3) for c in (A, B, C, BASELINE)]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleaved_order([A], BASELINE, 0)


async def test_rounds_are_applied_then_measured_interleaved_with_one_seed_per_round() -> None:
    target = FakeTarget()
    measured: list[tuple[BatchingConfig, int, BatchingConfig]] = []
    seen: list[RoundDone] = []

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        measured.append((config, round_index, target.live))
        # the same offered schedule for all of a round: the seed is the round's
        return capacity(config, None).model_copy(
            update={"effective_rps": capacity(config, None).effective_rps + round_index}
        )

    out = await remeasure_interleaved(
        target, measure, [A, B, C], BASELINE, rounds=3, on_done=seen.append
    )
    assert [(c, r) for c, r, _ in measured] == [
        (c, r) for r in range(3) for c in (A, B, C, BASELINE)
    ]
    assert all(config == live for config, _, live in measured)  # applied before measured
    assert target.applied == [c for c, _, _ in measured]
    assert [(e.round, e.config) for e in seen] == [(r, c) for c, r, _ in measured]
    rounds = out.rounds()
    assert list(rounds) == [A, B, C, BASELINE]
    base = capacity(A, None).effective_rps
    assert rounds[A] == [base, base + 1, base + 2]
    assert out.refused == {}


async def test_a_refused_finalist_is_dropped_from_every_round() -> None:
    target = FakeTarget(refuse=frozenset({16}))
    calls: list[tuple[BatchingConfig, int]] = []

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        calls.append((config, round_index))
        return capacity(config, None)

    out = await remeasure_interleaved(target, measure, [A, B], BASELINE, rounds=3)
    assert out.refused == {B: "refused batch 16"}
    assert set(out.rounds()) == {A, BASELINE}
    assert [c for c, _ in calls] == [A, BASELINE] * 3


async def test_a_refused_incumbent_is_the_targets_fault() -> None:
    target = FakeTarget(refuse=frozenset({BASELINE.max_batch_size}))

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        return capacity(config, None)

    with pytest.raises(TargetError, match="refused batch 8"):
        await remeasure_interleaved(target, measure, [A], BASELINE, rounds=3)


def test_finalists_are_the_top_distinct_complete_configurations_but_the_incumbent() -> None:
    t = tuner([])
    figures = {BASELINE: 900.0, A: 500.0, B: 700.0, C: 300.0}
    for config in (BASELINE, A, B, C, A):
        t.add_warm_starts([config])
    while t.measured_count() < 4:
        number, asked, _ = t.ask()
        t.tell(number, capacity(asked, None).model_copy(update={"effective_rps": figures[asked]}))
    assert finalists(t.records(), BASELINE, 2) == [B, A]
    assert finalists(t.records(), BASELINE, 5) == [B, A, C]


def test_a_pruned_trial_near_the_best_may_still_be_a_finalist() -> None:
    # B was pruned by one unlucky window at 650 req/s of a best 700: it re-enters the
    # confirmation; C, pruned far below, does not
    t = tuner([])
    figures = {BASELINE: 600.0, A: 700.0, B: 650.0, C: 300.0}
    for config in (BASELINE, A, B, C):
        t.add_warm_starts([config])
    while t.measured_count() < 4:
        number, asked, _ = t.ask()
        result = capacity(asked, None).model_copy(
            update={"effective_rps": figures[asked], "pruned": asked in (B, C)}
        )
        assert t.tell(number, result).state == ("Pruned" if asked in (B, C) else "Complete")
    assert finalists(t.records(), BASELINE, 5) == [A, B]


def test_the_summary_recommends_by_the_verdict() -> None:
    t = tuner([])
    n, _, _ = t.ask()
    t.tell(n, capacity(BASELINE, None))
    summary = _summary_of(t, [])
    assert summary.recommended == BASELINE
    assert "not re-measured" in summary.recommendation
    clear = decide({A: [130.0, 131.0, 129.0], BASELINE: [100.0, 101.0, 99.0]}, BASELINE)
    proven = with_verdict(summary, clear)
    assert proven.recommended == A
    assert proven.verdict == clear
    assert "lower bound" in proven.recommendation
    unclear = decide({A: [104.0, 90.0, 115.0], BASELINE: [100.0, 101.0, 99.0]}, BASELINE)
    kept = with_verdict(summary, unclear)
    assert kept.recommended == BASELINE
    assert kept.recommendation.startswith("keep the incumbent. NoSignificantGain: ")
    assert "NoSignificantGain" in kept.recommendation
    assert TuneSummary.model_validate_json(kept.model_dump_json()) == kept


async def test_no_trial_starts_once_the_time_budget_is_spent() -> None:
    t = tuner([])
    target = FakeTarget()
    checks = iter([False, False, True])
    await run_trials(t, target, FakeProbe(target), trials=10, out_of_time=lambda: next(checks))
    assert t.measured_count() == 2


def test_the_table_shows_estimates_intervals_gains_and_the_choice() -> None:
    from rich.console import Console

    from batchpilot.tuner.progress import render_summary

    t = tuner([])
    n, _, _ = t.ask()
    t.tell(n, capacity(BASELINE, None))
    summary = _summary_of(t, [])
    verdict = decide(
        {A: [104.0, 90.0, 115.0], B: [60.0, 0.0, 61.0], BASELINE: [100.0, 101.0, 99.0]},
        BASELINE,
    )
    console = Console(record=True, width=200)
    render_summary(console, with_verdict(summary, verdict))
    text = console.export_text()
    assert "Re-measured interleaved, 3 rounds" in text
    assert "req/s [95%]" in text
    assert "104 90 115" in text
    assert "8/5ms now" in text
    assert "kept" in text
    assert "low < 5%" in text
    assert "missed SLA" in text
    assert "Recommendation: max_batch_size=8 max_queue_time_ms=5: keep the incumbent." in text
    assert "NoSignificantGain" in text
