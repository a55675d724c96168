"""The operator's pure decisions: next step, conditions, canary, rollout, pods."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from batchpilot.models import SLA
from batchpilot.operator import decisions
from batchpilot.operator.kubeworkload import ScheduleTimeout
from batchpilot.operator.spec import InferenceServiceSpec, explain_validation_error, parse_spec
from batchpilot.operator.status import (
    TRIALS_KEPT,
    Condition,
    Confirmation,
    InferenceServiceStatus,
    OriginalConfig,
    RoundMeasurement,
    TrialEntry,
)
from batchpilot.operator.world import TargetProblem
from batchpilot.tuner.runner import round_order

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def spec(**tuning: Any) -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
            "tuning": {"maxTrials": 4, **tuning},
        }
    )


def trial(number: int, state: str = "Complete", rps: float | None = 100.0, **kw: Any) -> TrialEntry:
    return TrialEntry(
        number=number,
        params={"max_batch_size": 8, "max_queue_time_ms": 10.0},
        source=kw.pop("source", "baseline" if number == 0 else "sampler"),
        state=state,  # type: ignore[arg-type]
        effective_rps=rps if state == "Complete" else None,
        **kw,
    )


def status(*trials: TrialEntry, **kw: Any) -> InferenceServiceStatus:
    kw.setdefault("observed_generation", 1)
    kw.setdefault("phase", "Tuning")
    kw.setdefault(
        "original", OriginalConfig(params={"max_batch_size": 32, "max_queue_time_ms": 50})
    )
    return InferenceServiceStatus(trials=list(trials), **kw)


class TestPlan:
    def test_new_generation_starts_a_study(self) -> None:
        assert decisions.plan(spec(), status(), 2).kind == "new-study"
        assert decisions.plan(spec(), InferenceServiceStatus(), 1).kind == "new-study"

    def test_finished_studies_idle(self) -> None:
        for phase in ("Converged", "Failed"):
            assert decisions.plan(spec(), status(phase=phase), 1).kind == "idle"

    def test_records_the_original_first(self) -> None:
        assert decisions.plan(spec(), status(original=None), 1).kind == "record-original"

    def test_runs_trials_until_max_trials_measured(self) -> None:
        three = [trial(i) for i in range(3)]
        assert decisions.plan(spec(), status(*three), 1).kind == "trial"
        interrupted = trial(3, "Interrupted", reason="interrupted: restarted")
        assert decisions.plan(spec(), status(*three, interrupted), 1).kind == "trial"
        assert decisions.plan(spec(), status(*three, trial(3, "Pruned")), 1).kind == "finish"

    def test_fails_after_max_failures_in_a_row(self) -> None:
        failures = [trial(i, "Failed", reason="x") for i in range(1, 4)]
        assert decisions.plan(spec(maxFailures=3), status(trial(0), *failures), 1).kind == "fail"
        assert decisions.plan(spec(maxFailures=4), status(trial(0), *failures), 1).kind == "trial"

    def test_patience_converges_early(self) -> None:
        history = [trial(0, rps=100), trial(1, rps=200), trial(2, rps=150), trial(3, rps=180)]
        plan = decisions.plan(spec(maxTrials=10, patience=2), status(*history), 1)
        assert plan.kind == "finish"
        assert "2 trials" in plan.reason
        assert decisions.plan(spec(maxTrials=10, patience=3), status(*history), 1).kind == "trial"

    def test_a_full_history_ends_the_study(self) -> None:
        history = [
            trial(i, "Failed", reason="x") if i % 2 else trial(i) for i in range(TRIALS_KEPT)
        ]
        plan = decisions.plan(spec(maxTrials=100, maxFailures=50), status(*history), 1)
        assert plan.kind == "finish"


def test_interrupted_trials_never_count_toward_max_failures() -> None:
    # failures around interruptions: the streak is the failures only
    trials = [
        trial(0),
        trial(1, "Failed", reason="x"),
        trial(2, "Interrupted"),
        trial(3, "Failed", reason="x"),
        trial(4, "Interrupted"),
    ]
    assert decisions.consecutive_failures(trials) == 2
    assert decisions.plan(spec(maxFailures=3), status(*trials), 1).kind == "trial"
    restarts = [trial(0)] + [trial(i, "Interrupted") for i in range(1, 8)]
    assert decisions.plan(spec(maxFailures=2, maxTrials=10), status(*restarts), 1).kind == "trial"


def test_a_problem_a_measurement_recorded_fails_the_study_before_anything_else() -> None:
    stopping = "Unschedulable: pod p cannot be scheduled (for 300 s)"
    trials = [trial(0), trial(1, "Failed", reason=stopping)]
    planned = decisions.plan(spec(), status(*trials, stopping=stopping), 1)
    assert planned == decisions.Plan("fail", stopping)
    assert decisions.plan(spec(), status(*trials), 1).kind == "trial"
    # a failed study stays failed: nothing is undone twice
    done = status(*trials, stopping=stopping, phase="Failed")
    assert decisions.plan(spec(), done, 1).kind == "idle"


def test_consecutive_failures_ignore_a_running_trial() -> None:
    trials = [trial(0), trial(1, "Failed"), trial(2, "Failed"), trial(3, "Running")]
    assert decisions.consecutive_failures(trials) == 2
    assert decisions.consecutive_failures([trial(0), trial(1, "Failed"), trial(2)]) == 0


def test_a_disturbed_trial_is_measured_again_only_a_few_times_a_study() -> None:
    disturbed = "invalid: ScaledDuringTrial: Deployment resnet went from 1 to 2 replicas"
    others = ["", "interrupted", "Crashed: exit 137", "trial deadline of 60 s passed"]
    limit = decisions.MAX_DISTURBED_TRIALS
    assert decisions.disturbed_trial_is_retried(others)
    assert decisions.disturbed_trial_is_retried([*others, *[disturbed] * (limit - 1)])
    assert not decisions.disturbed_trial_is_retried([disturbed] * limit)
    # counted over the whole study, not in a row: an HPA that scales every other trial
    assert not decisions.disturbed_trial_is_retried([disturbed, "", disturbed, "", disturbed])
    # the failure it then counts as is a failure, not another disturbance
    failure = decisions.disturbed_trial_failure("went from 1 to 2 replicas")
    assert not failure.startswith("invalid: ")
    assert (
        decisions.consecutive_failures(
            [trial(0), trial(1, "Failed", reason=disturbed), trial(2, "Failed", reason=failure)]
        )
        == 1
    )


def test_phase_is_baseline_until_the_baseline_has_a_result() -> None:
    assert decisions.phase_for([]) == "Baseline"
    assert decisions.phase_for([trial(0, "Running")]) == "Baseline"
    assert decisions.phase_for([trial(0), trial(1, "Running")]) == "Tuning"


def test_set_condition_keeps_transition_time_unless_status_changes() -> None:
    first = decisions.set_condition(
        [], type="Ready", status="False", reason="A", message="a", generation=1, now=NOW
    )
    later = NOW + timedelta(minutes=5)
    same = decisions.set_condition(
        first, type="Ready", status="False", reason="B", message="b", generation=2, now=later
    )
    assert same[0].last_transition_time == NOW
    assert (same[0].reason, same[0].observed_generation) == ("B", 2)
    flipped = decisions.set_condition(
        same, type="Ready", status="True", reason="C", message="c", generation=2, now=later
    )
    assert flipped[0].last_transition_time == later
    both = decisions.set_condition(
        flipped, type="Measuring", status="True", reason="M", message="", generation=2, now=later
    )
    assert [c.type for c in both] == ["Measuring", "Ready"]


def test_bound_trials_folds_the_oldest_into_the_summary() -> None:
    trials = [trial(i, "Failed" if i == 1 else "Complete") for i in range(TRIALS_KEPT + 3)]
    kept, summary = decisions.bound_trials(trials, None)
    assert len(kept) == TRIALS_KEPT
    assert kept[0].number == 3
    assert summary is not None
    assert (summary.count, summary.complete, summary.failed, summary.last_number) == (3, 2, 1, 2)
    assert decisions.bound_trials(trials[:5], None) == (trials[:5], None)


def test_best_and_baseline() -> None:
    trials = [trial(0, rps=50), trial(1, rps=90), trial(2, "Pruned"), trial(3, rps=90)]
    best = decisions.best_trial(trials)
    assert best is not None
    assert best.number == 1  # the first of equals
    baseline = decisions.baseline_trial(trials)
    assert baseline is not None
    assert baseline.number == 0
    assert decisions.best_trial([trial(0, "Infeasible")]) is None
    result = decisions.result_of(best, 3)
    assert (result.max_batch_size, result.trial, result.generation) == (8, 1, 3)


def test_trial_messages_read_like_the_design() -> None:
    sla = SLA(p99_ms=300)
    done = TrialEntry(
        number=7,
        params={"max_batch_size": 8, "max_queue_time_ms": 30.0},
        source="sampler",
        state="Complete",
        effective_rps=620.2,
        p99_ms=287.4,
    )
    assert decisions.trial_message(done, sla) == (
        "Trial 7: batch=8 wait=30ms → 620 req/s, p99 287 ms ≤ 300 ms"
    )
    failed = done.model_copy(update={"state": "Failed", "reason": "CrashLoopBackOff: x"})
    assert decisions.trial_message(failed, sla).endswith("→ failed: CrashLoopBackOff: x")
    extra = done.model_copy(update={"params": {**done.params, "max_num_seqs": 64}})
    assert "max_num_seqs=64" in decisions.trial_message(extra, sla)


def test_backoff_grows_is_capped_and_jittered() -> None:
    rng = random.Random(1)
    delays = [decisions.backoff_delay(a, base=1.0, cap=10.0, rng=rng) for a in range(20)]
    assert all(0.0 <= d <= 10.0 for d in delays)
    assert len(set(delays)) == len(delays)
    assert max(decisions.backoff_delay(0, base=1.0, cap=10.0, rng=rng) for _ in range(50)) <= 1.0


def test_clamp_and_rule_of_thumb_stay_in_the_space() -> None:
    s = spec()
    clamped = decisions.clamp_params({"max_batch_size": 500, "max_queue_time_ms": -1}, s)
    assert clamped == {"max_batch_size": 64, "max_queue_time_ms": 0.0}
    assert decisions.rule_of_thumb(s) == {"max_batch_size": 43, "max_queue_time_ms": 20.0}


def test_needs_cleanup() -> None:
    running = status(phase="Tuning", canary="resnet-bp-canary")
    assert decisions.needs_cleanup(running, "Canary") == (True, False)
    assert decisions.needs_cleanup(status(phase="Tuning"), "InPlace") == (False, True)
    assert decisions.needs_cleanup(status(phase="Converged"), "InPlace") == (False, False)
    assert decisions.needs_cleanup(status(phase="Tuning", restored=True), "InPlace") == (
        False,
        False,
    )


@pytest.mark.parametrize("strategy", ["Canary", "InPlace"])
def test_a_rollback_under_way_is_finished_by_a_cleanup_whatever_the_strategy(
    strategy: str,
) -> None:
    broke = Condition(type="Degraded", status="True", reason="RollingBack", message="x")
    midway = status(phase="Confirming", applied=True, conditions=[broke])
    assert decisions.rolling_back(midway)
    assert decisions.needs_cleanup(midway, strategy) == (False, True)
    left = decisions.cleanup_left(midway, spec())
    assert "still runs the written-back configuration that broke it" in left
    done = midway.model_copy(update={"phase": "RolledBack"})
    assert not decisions.rolling_back(done)
    assert decisions.needs_cleanup(done, strategy) == (False, False)


# --- the observed world -----------------------------------------------------------


def deployment(**status_fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "resnet",
            "namespace": "ns",
            "generation": 3,
            "annotations": {"deployment.kubernetes.io/revision": "3", "team": "ml"},
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "resnet"}},
            "template": {
                "metadata": {"labels": {"app": "resnet", "tier": "gpu"}},
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "x"},
                        {
                            "name": "server",
                            "image": "y",
                            "env": [
                                {"name": "MAX_BATCH_SIZE", "value": "32"},
                                {"name": "MAX_QUEUE_TIME_MS", "value": "12.5"},
                                {"name": "OTHER", "valueFrom": {"fieldRef": {}}},
                            ],
                        },
                    ]
                },
            },
        },
        "status": status_fields,
    }


def test_original_config_reads_the_named_container() -> None:
    original = decisions.original_config(deployment(), spec(), NOW)
    assert original.params == {"max_batch_size": 32, "max_queue_time_ms": 12.5}
    assert original.env == {"MAX_BATCH_SIZE": "32", "MAX_QUEUE_TIME_MS": "12.5"}
    assert decisions.find_container(deployment(), None) == {"name": "sidecar", "image": "x"}
    assert decisions.find_container(deployment(), "nope") is None


def test_unset_knobs_give_no_baseline() -> None:
    env = {"MAX_BATCH_SIZE": None, "MAX_QUEUE_TIME_MS": "5"}
    names = spec().env_names()
    assert decisions.params_from_env(env, names) is None
    assert (
        decisions.params_from_env({"MAX_BATCH_SIZE": "x", "MAX_QUEUE_TIME_MS": "5"}, names) is None
    )


def test_env_patch_sets_values_and_leaves_out_released_ones() -> None:
    patch = decisions.env_apply_patch(
        deployment(), "server", {"MAX_BATCH_SIZE": "8", "MAX_QUEUE_TIME_MS": None}
    )
    assert patch["metadata"] == {"name": "resnet", "namespace": "ns"}
    containers = patch["spec"]["template"]["spec"]["containers"]
    assert containers == [{"name": "server", "env": [{"name": "MAX_BATCH_SIZE", "value": "8"}]}]
    env = decisions.env_for_params(
        {"max_batch_size": 8, "max_queue_time_ms": 12.0, "unknown": 1}, spec().env_names()
    )
    assert env == {"MAX_BATCH_SIZE": "8", "MAX_QUEUE_TIME_MS": "12"}


@pytest.mark.parametrize(
    ("fields", "done"),
    [
        ({"observedGeneration": 2, "updatedReplicas": 2, "readyReplicas": 2, "replicas": 2}, False),
        ({"observedGeneration": 3, "updatedReplicas": 1, "readyReplicas": 2, "replicas": 2}, False),
        ({"observedGeneration": 3, "updatedReplicas": 2, "readyReplicas": 2, "replicas": 3}, False),
        ({"observedGeneration": 3, "updatedReplicas": 2, "readyReplicas": 1, "replicas": 2}, False),
        (
            {
                "observedGeneration": 3,
                "updatedReplicas": 2,
                "readyReplicas": 2,
                "replicas": 2,
                "availableReplicas": 1,
            },
            False,
        ),
        (
            {
                "observedGeneration": 3,
                "updatedReplicas": 2,
                "readyReplicas": 2,
                "replicas": 2,
                "availableReplicas": 2,
            },
            True,
        ),
    ],
)
def test_rollout_status(fields: dict[str, Any], done: bool) -> None:
    assert decisions.rollout_status(deployment(**fields)).done is done


def pod(name: str, **status_fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status_fields}


def test_the_schedule_timeout_counts_from_the_pods_own_condition_when_earlier() -> None:
    now = [NOW]
    timeout = ScheduleTimeout(60.0, clock=lambda: now[0])

    def problem(since: datetime | None) -> decisions.PodProblem:
        return decisions.PodProblem("Unschedulable", "pod p cannot be scheduled", False, since)

    # stamped in the future by a skewed clock: the wait is counted from here
    timeout.check(problem(NOW + timedelta(minutes=5)))
    now[0] = NOW + timedelta(seconds=59)
    timeout.check(problem(NOW + timedelta(minutes=5)))
    # scheduled meanwhile: the wait starts over
    timeout.check(None)
    now[0] = NOW + timedelta(seconds=200)
    timeout.check(problem(None))
    now[0] = NOW + timedelta(seconds=259)
    timeout.check(problem(None))
    now[0] = NOW + timedelta(seconds=260)
    with pytest.raises(TargetProblem, match=r"tuning\.scheduleTimeoutSeconds"):
        timeout.check(problem(None))
    # a fresh watcher (a restarted operator) reads how long the pod has waited
    restarted = ScheduleTimeout(60.0, clock=lambda: now[0])
    with pytest.raises(TargetProblem):
        restarted.check(problem(now[0] - timedelta(seconds=61)))
    # a condition's timestamp is read as the API server writes it
    pending = {
        "metadata": {"name": "p"},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": "2026-12-01T12:27:27Z",
                }
            ]
        },
    }
    found = decisions.pod_problem([pending])
    assert found is not None
    assert found.since == datetime(2026, 12, 1, 12, 27, 27, tzinfo=UTC)


def test_pod_problems_name_the_reason() -> None:
    pending = pod(
        "a",
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    problem = decisions.pod_problem([pending])
    assert problem is not None
    assert problem.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in problem.message
    assert not problem.fatal
    crashing = pod(
        "b",
        containerStatuses=[
            {
                "name": "server",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            }
        ],
    )
    problem = decisions.pod_problem([crashing])
    assert problem is not None
    assert (problem.reason, problem.fatal) == ("CrashLoopBackOff", True)
    assert decisions.pod_problem([pod("c", phase="Running")]) is None


def test_ready_pod_ips() -> None:
    ready = [{"type": "Ready", "status": "True"}]
    pods = [
        pod("a", phase="Running", podIP="10.0.0.2", conditions=ready),
        pod(
            "b",
            phase="Running",
            podIP="10.0.0.1",
            conditions=[{"type": "Ready", "status": "False"}],
        ),
        pod("c", phase="Pending", podIP="10.0.0.3", conditions=ready),
        {
            "metadata": {"name": "d", "deletionTimestamp": "x"},
            "status": {"phase": "Running", "podIP": "10.0.0.4", "conditions": ready},
        },
    ]
    assert decisions.ready_pod_ips(pods) == ["10.0.0.2"]
    assert decisions.label_selector(deployment()) == "app=resnet"


# --- the spec's own validation (the API server's CEL rules say the same) -------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parameters": {"maxBatchSize": {"min": 9, "max": 8}}}, "maxBatchSize.min must be"),
        ({"parameters": {"maxQueueTimeMs": {"min": 9, "max": 8}}}, "maxQueueTimeMs.min must be"),
        ({"sla": {"p99LatencyMs": 0}}, "spec.sla.p99LatencyMs"),
        ({"sla": {"p99LatencyMs": 100, "maxErrorRate": 1}}, "spec.sla.maxErrorRate"),
        ({"apply": {"method": "Live"}}, "apply.live"),
        (
            {"load": {"endpoint": {"port": 80, "path": "/x"}, "source": "prometheus"}},
            "load.prometheus",
        ),
        ({"tuning": {"strategy": "Sometimes"}}, "'Canary' or 'InPlace'"),
        ({"target": {"kind": "Pod", "name": "x"}}, "spec.target.kind"),
        (
            {"parameters": {"extra": [{"name": "max_num_seqs", "min": 1, "max": 8}]}},
            "needs env when apply.method is Env",
        ),
        (
            {"parameters": {"extra": [{"name": "a", "min": 1, "max": 8, "env": "A"}] * 2}},
            "names must be unique",
        ),
        (
            {"parameters": {"extra": [{"name": "a", "min": 1.5, "max": 8, "env": "A"}]}},
            "whole-number bounds",
        ),
    ],
)
def test_bad_specs_are_explained(change: dict[str, Any], message: str) -> None:
    raw: dict[str, Any] = {
        "target": {"name": "resnet"},
        "sla": {"p99LatencyMs": 300},
        "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
    }
    raw.update(change)
    with pytest.raises(ValidationError) as caught:
        parse_spec(raw)
    assert message in explain_validation_error(caught.value)


def test_defaults_fill_a_minimal_spec() -> None:
    s = parse_spec(
        {
            "target": {"name": "resnet"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}},
        }
    )
    assert (s.apply.method, s.tuning.strategy, s.tuning.write_back) == ("Env", "Canary", "Apply")
    assert s.env_names() == {
        "max_batch_size": "MAX_BATCH_SIZE",
        "max_queue_time_ms": "MAX_QUEUE_TIME_MS",
    }
    assert s.load.mix().mean_size() > 1  # the default mix has a tail


def test_restarted_pods_are_named() -> None:
    ready = [{"type": "Ready", "status": "True"}]

    def measured(uid: str, restarts: int) -> dict[str, Any]:
        return {
            "metadata": {"name": f"pod-{uid}", "uid": uid},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": ready,
                "containerStatuses": [{"name": "server", "restartCount": restarts}],
            },
        }

    before = [measured("a", 0), measured("b", 2)]
    assert decisions.restarted_pods(before, [measured("a", 0), measured("b", 2)]) == ""
    assert decisions.restarted_pods(before, [measured("a", 1), measured("b", 2)]) == (
        "pod pod-a restarted (0 → 1 restarts)"
    )
    assert decisions.restarted_pods(before, [measured("b", 2)]) == "pod pod-a is gone"
    # an autoscaler's scale-in by one: one pod going is the scale-in
    assert decisions.restarted_pods(before, [measured("b", 2)], scaled_in=1) == ""
    assert decisions.restarted_pods(before, [], scaled_in=2) == ""
    assert decisions.restarted_pods(before, [], scaled_in=1) == (
        "pod pod-a is gone; pod pod-b is gone; 1 of them by a scale-in"
    )
    # a restart is never a scale-in
    assert decisions.restarted_pods(before, [measured("a", 1)], scaled_in=1) == (
        "pod pod-a restarted (0 → 1 restarts)"
    )


def test_crashes_during_a_trial_are_named() -> None:
    def pod(finished: str | None) -> dict[str, Any]:
        last = {"terminated": {"finishedAt": finished, "reason": "OOMKilled"}} if finished else {}
        return {
            "metadata": {"name": "p"},
            "status": {"containerStatuses": [{"name": "server", "lastState": last}]},
        }

    start = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert decisions.crashed_since([pod(None)], start) == ""
    assert decisions.crashed_since([pod("2026-01-01T11:59:59Z")], start) == ""
    assert decisions.crashed_since([pod("2026-01-01T12:00:05Z")], start) == (
        "container server of pod p exited (OOMKilled)"
    )
    # the status has whole seconds: a crash 0.3 s into a trial that started at .7 s
    mid_second = datetime(2026, 1, 1, 12, 0, 5, 700_000, tzinfo=UTC)
    assert decisions.crashed_since([pod("2026-01-01T12:00:06Z")], mid_second) != ""
    assert decisions.crashed_since([pod("2026-01-01T12:00:05Z")], mid_second) != ""
    assert decisions.crashed_since([pod("2026-01-01T12:00:04Z")], mid_second) == ""


def at(number: int, batch: int, wait: float, rps: float, state: str = "Complete") -> TrialEntry:
    return trial(number, state, rps).model_copy(
        update={"params": {"max_batch_size": batch, "max_queue_time_ms": wait}}
    )


class TestConfirmation:
    BASE: ClassVar[dict[str, float | int]] = {"max_batch_size": 32, "max_queue_time_ms": 50.0}
    TRIALS = (
        at(0, 32, 50.0, 500.0),
        at(1, 16, 20.0, 600.0),
        at(2, 16, 20.0, 610.0),  # the same configuration again: one finalist
        at(3, 32, 50.0, 700.0),  # the incumbent measured again: never a finalist
        at(4, 8, 5.0, 550.0),
        # pruned far below the best: not a finalist
        at(5, 4, 5.0, 0.0, "Pruned").model_copy(update={"effective_rps": 400.0}),
        at(6, 2, 1.0, 520.0),
    )

    def test_the_trials_end_in_a_confirmation_of_the_top_distinct_finalists(self) -> None:
        s = status(*self.TRIALS)
        plan = decisions.plan(spec(maxTrials=7), s, 1)
        assert (plan.kind, plan.reason) == ("confirm", "all 7 trials done")
        conf = decisions.start_confirmation(spec(maxTrials=7, finalists=2), s.trials, "done")
        assert conf is not None
        assert conf.finalists == [
            {"max_batch_size": 16, "max_queue_time_ms": 20.0},
            {"max_batch_size": 8, "max_queue_time_ms": 5.0},
        ]
        assert conf.incumbent == self.BASE
        assert (conf.rounds, conf.reason) == (3, "done")

    def test_a_trial_pruned_near_the_best_is_a_finalist(self) -> None:
        # the highest rate it held before one window pruned it: ≥ 80 % of the best 700
        near = at(5, 4, 5.0, 0.0, "Pruned").model_copy(update={"effective_rps": 580.0})
        trials = [*self.TRIALS[:5], near, self.TRIALS[6]]
        conf = decisions.start_confirmation(spec(maxTrials=7, finalists=3), trials, "done")
        assert conf is not None
        assert conf.finalists == [
            {"max_batch_size": 16, "max_queue_time_ms": 20.0},
            {"max_batch_size": 4, "max_queue_time_ms": 5.0},
            {"max_batch_size": 8, "max_queue_time_ms": 5.0},
        ]

    def test_nothing_to_confirm_finishes_at_once(self) -> None:
        switched_off = status(*self.TRIALS)
        assert decisions.plan(spec(maxTrials=7, finalists=0), switched_off, 1).kind == "finish"
        only_baseline = status(*(at(i, 32, 50.0, 500.0) for i in range(4)))
        assert decisions.plan(spec(), only_baseline, 1).kind == "finish"
        no_baseline = status(at(0, 32, 50.0, 0.0, "Failed"), *self.TRIALS[1:4])
        assert decisions.start_confirmation(spec(), no_baseline.trials, "x") is None

    def test_measurements_go_round_by_round_and_resume_from_status(self) -> None:
        conf = decisions.start_confirmation(spec(finalists=2), list(self.TRIALS), "done")
        assert conf is not None
        order = [*conf.finalists, conf.incumbent]
        taken: list[tuple[int, dict[str, float | int]]] = []
        while (upcoming := decisions.next_measurement(conf, spec(finalists=2))) is not None:
            taken.append(upcoming)
            r, params = upcoming
            measured = RoundMeasurement(round=r, params=params, effective_rps=100.0 + r)
            # what a restarted operator sees: the status, through JSON
            conf = Confirmation.model_validate_json(
                conf.model_copy(
                    update={"measurements": [*conf.measurements, measured]}
                ).model_dump_json(by_alias=True)
            )
            s = status(*self.TRIALS, confirmation=conf)
            expected = "finish" if len(taken) == 9 else "confirm"
            assert decisions.plan(spec(finalists=2), s, 1).kind == expected
        # every configuration once a round, each round in its own seeded order
        assert taken == [(r, p) for r in range(3) for p in round_order(order, r, 0)]
        assert len({tuple(str(p) for _, p in taken[3 * r : 3 * r + 3]) for r in range(3)}) > 1

    def confirmation_with(
        self, figures: dict[int, list[float]], **tuning: Any
    ) -> tuple[Confirmation, InferenceServiceSpec]:
        """A confirmation of one finalist (batch 16) against the incumbent (batch 32)
        with these rounds measured, resumed from its JSON as a restarted operator would."""
        sp = spec(finalists=1, **tuning)
        conf = decisions.start_confirmation(sp, list(self.TRIALS), "done")
        assert conf is not None
        rounds = len(figures[32])
        measured = [
            RoundMeasurement(round=r, params=p, effective_rps=figures[int(p["max_batch_size"])][r])
            for r in range(rounds)
            for p in (*conf.finalists, conf.incumbent)
        ]
        conf = conf.model_copy(update={"measurements": measured})
        return Confirmation.model_validate_json(conf.model_dump_json(by_alias=True)), sp

    def test_an_undecided_verdict_measures_more_rounds_up_to_the_cap(self) -> None:
        # +7 % with a few per cent of noise: the interval reaches across the 5 % margin
        close = {16: [535.0, 520.0, 548.0], 32: [500.0, 500.0, 500.0]}
        conf, sp = self.confirmation_with(close, maxConfirmRounds=4)
        assert conf.max_rounds == 4
        verdict = decisions.verdict_of(conf, sp)
        assert verdict.gain_low_percent < 5.0 <= verdict.gain_high_percent
        fourth_round = round_order([*conf.finalists, conf.incumbent], 3, sp.tuning.seed)
        assert decisions.next_measurement(conf, sp) == (3, fourth_round[0])
        s = status(*self.TRIALS, confirmation=conf)
        assert decisions.plan(sp, s, 1).kind == "confirm"
        # the fourth round, however it ends, is the last: the cap
        fourth = {16: [*close[16], 530.0], 32: [*close[32], 500.0]}
        capped, sp = self.confirmation_with(fourth, maxConfirmRounds=4)
        assert decisions.next_measurement(capped, sp) is None
        assert decisions.plan(sp, status(*self.TRIALS, confirmation=capped), 1).kind == "finish"
        # a fixed number of rounds (the cap at confirmRounds) never adds one
        fixed, sp = self.confirmation_with(close, maxConfirmRounds=3)
        assert decisions.next_measurement(fixed, sp) is None

    def test_a_decided_verdict_or_an_old_status_stops_after_the_rounds(self) -> None:
        clear = {16: [700.0, 690.0, 720.0], 32: [500.0, 490.0, 505.0]}
        conf, sp = self.confirmation_with(clear)
        assert decisions.verdict_of(conf, sp).significant
        assert decisions.next_measurement(conf, sp) is None
        close = {16: [535.0, 520.0, 548.0], 32: [500.0, 500.0, 500.0]}
        old, sp = self.confirmation_with(close)
        old = old.model_copy(update={"max_rounds": None})  # written before the cap existed
        assert decisions.next_measurement(old, sp) is None

    def test_the_verdict_and_the_results_in_status(self) -> None:
        conf = decisions.start_confirmation(spec(finalists=1), list(self.TRIALS), "done")
        assert conf is not None
        figures = {16: [600.0, 500.0, 620.0], 32: [500.0, 410.0, 515.0]}
        conf = conf.model_copy(
            update={
                "measurements": [
                    RoundMeasurement(
                        round=r, params=p, effective_rps=figures[int(p["max_batch_size"])][r]
                    )
                    for r, p in [
                        (r, p) for r in range(3) for p in (*conf.finalists, conf.incumbent)
                    ]
                ]
            }
        )
        verdict = decisions.verdict_of(conf, spec(minGainPercent=5))
        assert verdict.significant
        assert verdict.chosen.max_batch_size == 16
        assert decisions.params_of(conf, verdict.chosen) == conf.finalists[0]
        best = decisions.estimate_result(verdict, verdict.winner, conf.finalists[0], 1, 1)
        assert best.effective_rps_low is not None
        assert best.effective_rps_high is not None
        assert best.effective_rps_low < (best.effective_rps or 0) < best.effective_rps_high
        assert best.gain_low_percent == pytest.approx(verdict.gain_low_percent, abs=0.05)
        assert decisions.trial_of(self.TRIALS, conf.finalists[0]) == 1
        strict = decisions.verdict_of(conf, spec(minGainPercent=50))
        assert not strict.significant
        assert strict.reason.startswith("NoSignificantGain")


@pytest.mark.parametrize(
    ("tuning", "field"),
    [
        ({"finalists": -1}, "tuning.finalists"),
        ({"finalists": 11}, "tuning.finalists"),
        ({"confirmRounds": 2}, "tuning.confirmRounds"),
        ({"maxConfirmRounds": 21}, "tuning.maxConfirmRounds"),
        ({"confirmRounds": 5, "maxConfirmRounds": 4}, "tuning.maxConfirmRounds"),
        ({"minGainPercent": -1}, "tuning.minGainPercent"),
    ],
)
def test_confirmation_settings_are_validated(tuning: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(**tuning)
    assert field in explain_validation_error(info.value)


ROLLED = {"observedGeneration": 3, "updatedReplicas": 1, "readyReplicas": 1, "replicas": 2}


def test_a_rollout_past_its_progress_deadline_has_failed() -> None:
    stuck = deployment(
        **ROLLED,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "resnet-7d9" has timed out progressing.',
            }
        ],
    )
    rollout = decisions.rollout_status(stuck)
    assert (rollout.done, rollout.failed, rollout.reason) == (
        False,
        True,
        "ProgressDeadlineExceeded",
    )
    assert "has timed out progressing" in rollout.message
    assert "progressDeadlineSeconds" in rollout.message
    # still progressing (a new ReplicaSet is being created) is no failure
    moving = deployment(
        **ROLLED,
        conditions=[{"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"}],
    )
    assert not decisions.rollout_status(moving).failed


def test_a_replica_failure_fails_the_rollout_with_its_message() -> None:
    refused = deployment(
        **ROLLED,
        conditions=[
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": 'pods "resnet-7d9-x" is forbidden: exceeded quota: gpu',
            }
        ],
    )
    rollout = decisions.rollout_status(refused)
    assert rollout.failed
    assert rollout.reason == "ReplicaFailure"
    assert "FailedCreate" in rollout.message
    assert "exceeded quota: gpu" in rollout.message
    cleared = deployment(**ROLLED, conditions=[{"type": "ReplicaFailure", "status": "False"}])
    assert not decisions.rollout_status(cleared).failed


def test_a_rolled_back_study_is_over() -> None:
    assert decisions.plan(spec(), status(trial(0), phase="RolledBack"), 1).kind == "idle"


def test_cleanup_left_names_the_canary_and_the_unrestored_target() -> None:
    original = OriginalConfig(env={"MAX_BATCH_SIZE": "32", "MAX_QUEUE_TIME_MS": None})
    in_place = parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 50},
            "tuning": {"strategy": "InPlace"},
        }
    )
    left = decisions.cleanup_left(
        status(trial(0), canary="resnet-bp-canary", original=original), in_place
    )
    assert "canary Deployment resnet-bp-canary" in left
    assert "Deployment resnet still runs the trial's configuration" in left
    assert "'MAX_BATCH_SIZE': '32'" in left
    assert decisions.cleanup_left(status(trial(0), restored=True), spec()) == "nothing"


def test_sla_breach_of_production_traffic() -> None:
    sla = SLA(p99_ms=300, max_error_rate=0.01)
    kept = decisions.sla_breach(p99_ms=250, ok_rps=100, total_rps=100.5, sla=sla)
    assert kept is None
    slow = decisions.sla_breach(p99_ms=480, ok_rps=100, total_rps=100, sla=sla)
    assert slow == "p99 480 ms > 300 ms at 100 req/s"
    failing = decisions.sla_breach(p99_ms=100, ok_rps=90, total_rps=100, sla=sla)
    assert failing is not None
    assert "error rate 10.00% > 1.00%" in failing
    # no traffic in the window (NaN from Prometheus): nothing to judge
    nan = float("nan")
    assert decisions.sla_breach(p99_ms=nan, ok_rps=nan, total_rps=nan, sla=sla) is None
    assert decisions.sla_breach(p99_ms=900, ok_rps=0, total_rps=0, sla=sla) is None


def test_an_interrupted_trial_is_shown_as_such_and_retried_by_the_tuner() -> None:
    from batchpilot.operator.status import INTERRUPTED_REASON
    from batchpilot.operator.trials import search_space, to_entry, to_record
    from batchpilot.tuner.study import Tuner

    running = trial(1, "Running", source="warm-start")
    tuner = Tuner(search_space(spec()), history=[to_record(trial(0)), to_record(running)])
    entries = [to_entry(r) for r in tuner.records()]
    assert (entries[1].state, entries[1].reason) == ("Interrupted", INTERRUPTED_REASON)
    # the status's Interrupted goes back to the tuner as its own "interrupted", so a
    # rebuilt tuner retries that configuration next and leaves it out of its budget
    rebuilt = Tuner(search_space(spec()), history=[to_record(e) for e in entries])
    number, _, params = rebuilt.ask()
    assert number == 2
    assert params == dict(running.params)
    assert rebuilt.measured_count() == 2  # the baseline and the retry asked now


class TestStudyGainShortfall:
    """finalists 0: the unconfirmed best passes the gain gate on the study's figures."""

    def best(self, rps: float) -> TrialEntry:
        params = {"max_batch_size": 16, "max_queue_time_ms": 2.0}
        return trial(3, rps=rps).model_copy(update={"params": params})

    def test_a_best_short_of_min_gain_is_refused_with_both_figures(self) -> None:
        trials = [trial(0, rps=100.0), self.best(104.0)]
        why = decisions.study_gain_shortfall(spec(finalists=0), trials, trials[1])
        assert why is not None
        assert "measured 104 req/s, +4.0 % over the incumbent" in why
        assert "(100 req/s), below minGainPercent 5 %" in why
        assert "unconfirmed: finalists 0" in why

    def test_a_best_at_min_gain_or_above_passes(self) -> None:
        trials = [trial(0, rps=100.0), self.best(105.0)]
        assert decisions.study_gain_shortfall(spec(finalists=0), trials, trials[1]) is None
        lower = spec(finalists=0, minGainPercent=2)
        smaller = [trial(0, rps=100.0), self.best(103.0)]
        assert decisions.study_gain_shortfall(lower, smaller, smaller[1]) is None

    def test_an_incumbent_that_met_the_sla_nowhere_is_beaten_by_any_best(self) -> None:
        failed = [trial(0, rps=0.0), self.best(1.0)]
        assert decisions.study_gain_shortfall(spec(finalists=0), failed, failed[1]) is None
        missing = [self.best(1.0)]
        assert decisions.study_gain_shortfall(spec(finalists=0), missing, missing[0]) is None

    def test_with_a_confirmation_the_verdict_holds_the_gate_instead(self) -> None:
        trials = [trial(0, rps=100.0), self.best(101.0)]
        assert decisions.study_gain_shortfall(spec(finalists=2), trials, trials[1]) is None
