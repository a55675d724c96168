"""The tuner's ask/tell contract: trial order, scoring, infeasible and pruned trials,
rebuilding from records, and retrying interrupted trials. The "measurement" is a
deterministic function of the configuration, so no server is involved."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from optuna.trial import TrialState as OptunaState

from batchpilot.models import SLA, BatchingConfig, CapacityResult, StepResult
from batchpilot.tuner.space import ParameterSpec
from batchpilot.tuner.study import (
    PRUNE_MARGIN,
    SearchSpace,
    TrialRecord,
    Tuner,
    open_storage,
    replay_queue,
)

SLA_ = SLA(p99_ms=100.0)
BASELINE = BatchingConfig(max_batch_size=32, max_queue_time_ms=50.0)
RULES = [
    BatchingConfig(max_batch_size=8, max_queue_time_ms=10.0),
    BatchingConfig(max_batch_size=16, max_queue_time_ms=20.0),
]
SPACE = SearchSpace.from_bounds(max_batch_size=(1, 128), max_queue_time_ms=(0, 100))


def _step(rps: float, passed: bool, p99: float = 50.0) -> StepResult:
    return StepResult(
        offered_rps=rps,
        achieved_rps=rps,
        p50_ms=p99 / 2,
        p99_ms=p99,
        error_rate=0.0,
        requests=int(rps),
        passed=passed,
        reason="" if passed else f"p99 {p99:.1f} ms > SLA 100 ms",
        duration_s=1.0,
    )


def measured(rps: float, *, pruned: bool = False) -> CapacityResult:
    steps = [_step(rps, True, 60.0), _step(rps * 1.1, False, 150.0)] if rps else []
    return CapacityResult(
        effective_rps=rps,
        p99_ms=60.0 if rps else None,
        sla=SLA_,
        feasible=rps > 0,
        pruned=pruned,
        precision=0.05,
        steps=steps,
    )


def infeasible() -> CapacityResult:
    return CapacityResult(
        effective_rps=0.0,
        p99_ms=None,
        sla=SLA_,
        feasible=False,
        precision=0.05,
        steps=[_step(5.0, False, 400.0)],
    )


def landscape(config: BatchingConfig) -> CapacityResult:
    """A made-up response surface with an optimum inside the space, an infeasible
    corner (huge batches with long waits) and a pruned band."""
    b, q = config.max_batch_size, config.max_queue_time_ms
    if b >= 96 and q >= 60:
        return infeasible()
    rps = 100.0 * math.log2(b + 1) - (q - 20.0) ** 2 / 10.0
    if rps <= 0:
        return infeasible()
    if rps < 150:
        return measured(rps, pruned=True)
    return measured(rps)


def make(history: list[TrialRecord] | None = None, **kwargs: object) -> Tuner:
    options: dict[str, object] = {"seed": 11, "baseline": BASELINE, "warm_start": RULES}
    options.update(kwargs)
    return Tuner(SPACE, history=history or (), **options)  # type: ignore[arg-type]


def run(tuner: Tuner, n: int) -> list[dict[str, float | int]]:
    asked = []
    for _ in range(n):
        number, config, params = tuner.ask()
        asked.append(params)
        tuner.tell(number, landscape(config))
    return asked


def test_baseline_first_then_warm_starts_then_the_sampler() -> None:
    # duplicates are dropped; refinement off, which would take trial 4 (see below)
    tuner = make(warm_start=[*RULES, BASELINE, RULES[0]], refine=False)
    run(tuner, 5)
    records = tuner.records()
    assert [r.source for r in records] == [
        "baseline",
        "warm-start",
        "warm-start",
        "sampler",
        "sampler",
    ]
    assert [r.config() for r in records[:3]] == [BASELINE, *RULES]
    assert [r.number for r in records] == [0, 1, 2, 3, 4]
    assert all(SPACE.contains(r.config()) for r in records[3:])


def test_ask_returns_the_config_and_all_parameters_including_extras() -> None:
    space = SearchSpace.from_bounds(
        max_batch_size=(1, 16),
        max_queue_time_ms=(0, 10),
        extra=[ParameterSpec("max_num_seqs", "int", 8, 64, log=True)],
    )
    tuner = Tuner(space, baseline=BASELINE)
    number, config, params = tuner.ask()
    # the baseline's knobs are fixed (even outside the bounds); the extra is sampled
    assert (number, config) == (0, BASELINE)
    assert params["max_batch_size"] == 32
    assert 8 <= params["max_num_seqs"] <= 64
    tuner.tell(number, measured(100.0))
    number, config, params = tuner.ask()
    assert set(params) == {"max_batch_size", "max_queue_time_ms", "max_num_seqs"}
    assert config == SearchSpace.config_of(params)


def test_an_infeasible_trial_whose_lower_rates_could_not_be_judged_says_so() -> None:
    tuner = make(warm_start=[])
    number, _, _ = tuner.ask()
    result = infeasible().model_copy(update={"unjudged": "below 8.50 req/s too few"})
    rec = tuner.tell(number, result)
    assert rec.state == "Infeasible"
    assert rec.reason.startswith("no rate shown to meet the SLA (at the lowest rate measured: ")
    assert rec.reason.endswith("; below 8.50 req/s too few")


def test_infeasible_trials_are_constrained_and_never_best() -> None:
    tuner = make(warm_start=[])
    number, _, _ = tuner.ask()
    rec = tuner.tell(number, infeasible())
    assert rec.state == "Infeasible"
    assert "lowest rate" in rec.reason
    assert rec.p99_ms == 400.0  # how badly it broke the SLA at its easiest
    assert tuner.best() is None
    assert tuner.must_beat() is None
    number, _, _ = tuner.ask()
    tuner.tell(number, measured(42.0))
    frozen = tuner.study.trials
    assert frozen[0].constraints == {"sla": 1.0}
    assert frozen[1].constraints == {"sla": 0.0}
    assert tuner.study.best_trial.number == 1
    best = tuner.best()
    assert best is not None
    assert best.number == 1


def test_pruned_trials_are_recorded_as_pruned_and_never_best() -> None:
    tuner = make(warm_start=[])
    n0, _, _ = tuner.ask()
    tuner.tell(n0, measured(100.0))
    # a lower bound of the best: its score is the highest of noisy windows
    assert tuner.must_beat() == pytest.approx(100.0 * (1 - PRUNE_MARGIN))
    n1, _, _ = tuner.ask()
    rec = tuner.tell(n1, measured(80.0, pruned=True))
    assert rec.state == "Pruned"
    assert rec.reason.startswith("stopped early")
    assert tuner.study.trials[1].state == OptunaState.PRUNED
    assert tuner.must_beat() == pytest.approx(100.0 * (1 - PRUNE_MARGIN))


def test_best_is_the_highest_effective_rate_and_earliest_on_ties() -> None:
    tuner = make(warm_start=[])
    for rps in (50.0, 80.0, 80.0, 70.0):
        number, _, _ = tuner.ask()
        tuner.tell(number, measured(rps))
    best = tuner.best()
    assert best is not None
    assert (best.number, best.effective_rps) == (1, 80.0)


def test_failed_trials_keep_their_reason() -> None:
    tuner = make()
    number, _, _ = tuner.ask()
    rec = tuner.tell_failed(number, "server refused max_batch_size=32")
    assert (rec.state, rec.reason) == ("Failed", "server refused max_batch_size=32")
    assert tuner.study.trials[0].state == OptunaState.FAIL


def test_telling_a_trial_that_is_not_running_is_an_error() -> None:
    tuner = make()
    number, _, _ = tuner.ask()
    tuner.tell(number, measured(10.0))
    with pytest.raises(ValueError, match="not running"):
        tuner.tell(number, measured(10.0))
    with pytest.raises(ValueError, match="not running"):
        tuner.tell_failed(99, "x")


def test_records_round_trip_through_json() -> None:
    tuner = make()
    run(tuner, 4)
    for rec in tuner.records():
        again = TrialRecord.model_validate(rec.model_dump(mode="json"))
        assert again == rec


@pytest.mark.parametrize(
    ("sampler", "cut", "total"),
    # GP refits its model every trial (about a second each here): one short run for it,
    # long enough that its model, not its start-up sampling, makes the last suggestions
    # long enough for refinement trials (4, 5, ...) and an infeasible one on both sides
    # of some cut
    [*((s, c, 20) for s in ("TPE", "Random") for c in (1, 4, 5, 10, 17)), ("GP", 6, 9)],
)
def test_rebuilt_study_suggests_what_an_uninterrupted_one_would(
    sampler: str, cut: int, total: int
) -> None:
    uninterrupted = make(sampler=sampler)
    expected = run(uninterrupted, total)
    history = [
        TrialRecord.model_validate_json(r.model_dump_json()) for r in uninterrupted.records()[:cut]
    ]
    rebuilt = make(history, sampler=sampler)
    assert run(rebuilt, total - cut) == expected[cut:]
    assert [r.state for r in rebuilt.records()] == [r.state for r in uninterrupted.records()]


@pytest.mark.parametrize("sampler", ["TPE", "Random"])
def test_the_landscape_produces_every_outcome(sampler: str) -> None:
    # guards the rebuild test above: it only proves something if every state and every
    # source occurs, refinement included
    tuner = make(sampler=sampler)
    run(tuner, 20)
    assert {"Complete", "Pruned", "Infeasible"} <= {r.state for r in tuner.records()}
    assert {"baseline", "warm-start", "sampler", "refine"} <= {r.source for r in tuner.records()}


def test_rebuild_with_a_failed_trial_in_history() -> None:
    uninterrupted = make()
    run(uninterrupted, 4)
    number, _, _ = uninterrupted.ask()
    uninterrupted.tell_failed(number, "rollout timed out")
    expected = run(uninterrupted, 4)
    rebuilt = make(uninterrupted.records()[:5])
    assert run(rebuilt, 4) == expected


def test_a_different_seed_suggests_differently() -> None:
    assert run(make(seed=1, warm_start=[]), 8) != run(make(seed=2, warm_start=[]), 8)


def test_interrupted_trial_is_failed_and_retried_once() -> None:
    first = make()
    run(first, 4)  # baseline, two warm starts, one sampler trial
    number, _, lost_params = first.ask()  # the process dies during this trial
    history = first.records()
    assert history[-1].state == "Running"

    resumed = make(history)
    interrupted = resumed.records()[number]
    assert (interrupted.state, interrupted.reason) == ("Failed", "interrupted")
    assert resumed.measured_count() == 4
    retry_number, _, retry_params = resumed.ask()
    assert retry_number == number + 1
    assert retry_params == lost_params
    assert resumed.records()[retry_number].source == history[-1].source
    resumed.tell(retry_number, measured(77.0))
    assert resumed.measured_count() == 5

    # rebuilt again later: the retry happened, so it is not queued a second time
    again = make(resumed.records())
    assert again.pending_fixed() == 0
    number, _, _ = again.ask()
    assert again.records()[number].source in ("sampler", "refine")
    assert number == retry_number + 1


def test_an_interrupted_warm_start_is_retried_before_the_rest_of_the_queue() -> None:
    first = make()
    first.tell(first.ask()[0], measured(10.0))  # baseline
    first.ask()  # first rule of thumb, interrupted
    resumed = make(first.records())
    configs = [resumed.ask()[1] for _ in range(2)]
    assert configs == RULES


def test_history_with_gaps_is_rejected() -> None:
    tuner = make()
    run(tuner, 3)
    records = tuner.records()
    with pytest.raises(ValueError, match="expected trial 1, got 2"):
        make([records[0], records[2]])


def test_replay_queue_consumes_fixed_configs_in_ask_order() -> None:
    base = SearchSpace.params_of(BASELINE)
    rule = SearchSpace.params_of(RULES[0])
    when = datetime(2026, 1, 1, tzinfo=UTC)
    done = TrialRecord(number=0, params=base, source="baseline", state="Complete", started_at=when)
    assert list(replay_queue([(base, "baseline"), (rule, "warm-start")], [done])) == [
        (rule, "warm-start")
    ]


def test_storage_resumes_and_recovers_a_running_trial(tmp_path: Path) -> None:
    journal = str(tmp_path / "study.journal")
    uninterrupted = make()
    expected = run(uninterrupted, 8)

    first = make(storage=open_storage(journal))
    run(first, 4)
    first.ask()  # left Running in storage: the process "dies" here
    del first

    resumed = make(storage=open_storage(journal))
    records = resumed.records()
    assert len(records) == 5
    assert (records[4].state, records[4].reason) == ("Failed", "interrupted")
    # the retry repeats trial 4's configuration, then the sampler carries on; it sees the
    # same finished trials as the uninterrupted run did, one number later
    retried = run(resumed, 1)
    assert retried == expected[4:5]
    assert resumed.study.trials[4].state == OptunaState.FAIL


def test_clock_is_injected() -> None:
    when = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    tuner = make(clock=lambda: when)
    number, _, _ = tuner.ask()
    rec = tuner.tell(number, measured(5.0))
    assert rec.started_at == rec.finished_at == when


def test_results_are_kept_with_their_trials(tmp_path: Path) -> None:
    journal = str(tmp_path / "study.journal")
    tuner = make(storage=open_storage(journal))
    number, _, _ = tuner.ask()
    result = measured(123.0)
    tuner.tell(number, result)
    failed, _, _ = tuner.ask()
    tuner.tell_failed(failed, "boom")
    assert tuner.result(number) == result
    assert tuner.result(failed) is None
    assert tuner.result(99) is None
    assert make(storage=open_storage(journal)).result(number) == result


def test_late_warm_starts_are_queued_before_the_sampler_without_duplicates() -> None:
    tuner = make(warm_start=[])
    tuner.tell(tuner.ask()[0], measured(10.0))  # the baseline
    proposals = [BASELINE, RULES[1], RULES[1], RULES[0]]
    assert tuner.add_warm_starts(proposals) == [RULES[1], RULES[0]]
    asked = [tuner.ask() for _ in range(3)]
    assert [a[1] for a in asked[:2]] == [RULES[1], RULES[0]]
    sources = [tuner.records()[a[0]].source for a in asked]
    assert sources == ["warm-start", "warm-start", "sampler"]


def test_a_client_bound_trial_is_complete_with_a_lower_bound_and_flagged() -> None:
    tuner = make(warm_start=[])
    number, _, _ = tuner.ask()
    bound = measured(80.0).model_copy(
        update={
            "client_bound": True,
            "client_ceiling_rps": 80.0,
            "steps": [
                _step(80.0, True, 60.0),
                _step(160.0, False, 60.0).model_copy(
                    update={"valid": False, "reason": "invalid, client-bound: client CPU 95%"}
                ),
            ],
        }
    )
    rec = tuner.tell(number, bound)
    assert rec.state == "Complete"
    assert rec.client_bound
    assert rec.effective_rps == 80.0
    assert rec.reason.startswith("ClientBound: capacity ≥ 80.0 req/s, client-bound")
    assert tuner.study.trials[0].state == OptunaState.COMPLETE
    assert TrialRecord.model_validate_json(rec.model_dump_json()) == rec


def _client_limited(rps: float) -> StepResult:
    stall = "invalid, client-bound: client event-loop stall up to 80.0 ms > 10% of SLA p99"
    return _step(rps, False, 120.0).model_copy(update={"valid": False, "reason": stall})


def test_a_trial_the_client_limited_at_every_step_is_failed_not_infeasible() -> None:
    """A search whose every step the client's own delays could explain showed nothing
    of the configuration: it is neither scored nor told to the sampler as breaking the
    SLA. One valid failing step among them is a verdict, and stays Infeasible."""
    tuner = make(warm_start=[])
    unmeasured = measured(0.0).model_copy(
        update={"client_bound": True, "steps": [_client_limited(r) for r in (40.0, 20.0, 10.5)]}
    )
    number, _, _ = tuner.ask()
    rec = tuner.tell(number, unmeasured)
    assert rec.state == "Failed"
    assert rec.reason.startswith(
        "ClientBound: no step could be judged, the client limited all 3 (10.5-40.0 req/s): "
        "invalid, client-bound: client event-loop stall"
    )
    assert tuner.study.trials[0].state == OptunaState.FAIL
    assert tuner.study.trials[0].user_attrs["batchpilot.result"]["steps"][0]["valid"] is False

    judged = unmeasured.model_copy(
        update={"steps": [_step(40.0, False, 150.0), _client_limited(20.0)]}
    )
    number, _, _ = tuner.ask()
    assert tuner.tell(number, judged).state == "Infeasible"


def test_a_trial_whose_search_ended_short_of_its_precision_says_so() -> None:
    tuner = make(warm_start=[])
    number, _, _ = tuner.ask()
    short = measured(80.0).model_copy(
        update={"short_of_precision": "the step limit (5 steps) came first"}
    )
    rec = tuner.tell(number, short)
    assert rec.state == "Complete"
    assert rec.effective_rps == 80.0
    assert rec.reason == "ShortOfPrecision: a lower bound, the step limit (5 steps) came first"


def test_a_wait_at_or_above_the_sla_p99_is_infeasible_at_light_load() -> None:
    """Heavy load fills batches at once, so a long wait can score well in the capacity
    search; a lone request at night waits all of it. Such a trial never becomes the best
    (nor a finalist), whatever it measured; a batch cap of 1 never waits."""
    long_wait = BatchingConfig(max_batch_size=16, max_queue_time_ms=100.0)
    no_batching = BatchingConfig(max_batch_size=1, max_queue_time_ms=100.0)
    just_below = BatchingConfig(max_batch_size=16, max_queue_time_ms=99.0)
    tuner = Tuner(SPACE, seed=1, baseline=RULES[0], warm_start=[long_wait, no_batching, just_below])
    told = []
    for rps in (100.0, 900.0, 150.0, 120.0):
        number, _, _ = tuner.ask()
        told.append(tuner.tell(number, measured(rps)))
    assert [r.state for r in told] == ["Complete", "Infeasible", "Complete", "Complete"]
    assert told[1].reason == (
        "breaks the SLA at light load: a lone request waits the whole 100 ms "
        "max_queue_time, at or above the 100 ms p99"
    )
    assert told[1].effective_rps == 900.0  # what heavy load measured, kept for the record
    best = tuner.best()
    assert best is not None
    assert best.config() == no_batching
    # a rebuilt study (the operator's path) agrees
    rebuilt = Tuner(SPACE, seed=1, history=tuner.records())
    assert rebuilt.best() == best
