"""The operator's handlers under Kopf against KMock: the user's path without a cluster.

The World is a fake (opsupport.FakeWorld) so a study takes milliseconds; everything
between Kopf and the API server is real: watches, finalizers, status patches, events.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from typing import Any

import kmock
import pytest
from kmock import KubernetesError, Request
from kmock import method as http_method
from opsupport import (
    ISVC,
    ISVC_URL,
    NAMESPACE,
    ORIGINAL,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    events_of,
    eventually,
    isvc,
    obj_of,
    phase_is,
    reasons_of,
    score,
    status_of,
)

from batchpilot.operator.diffbase import DIGEST_KEY
from batchpilot.operator.spec import MAX_TRACE_TIMESTAMPS
from batchpilot.operator.status import INTERRUPTED_REASON
from batchpilot.operator.world import TargetProblem
from batchpilot.tuner.runner import round_order

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]


def condition(status: dict[str, Any], type: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type)


async def test_creation_runs_baseline_then_trials_and_writes_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        await eventually(lambda: "Converged" in reasons_of(kmock), what="events posted")
    status = status_of(kmock)
    trials = status["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert trials[0]["source"] == "baseline"
    assert trials[0]["params"] == ORIGINAL
    assert all(t["state"] == "Complete" for t in trials)
    assert status["baseline"]["effectiveRps"] == pytest.approx(score(ORIGINAL))
    best = max(trials, key=lambda t: t["effectiveRps"])
    assert status["best"]["trial"] == best["number"]
    assert status["best"]["generation"] == 1
    assert status["best"]["maxBatchSize"] == best["params"]["max_batch_size"]
    # Canary strategy: trials never touched the target, the best was written back to it
    assert cluster.written_back == [best["params"]]
    assert cluster.canaries == set()
    assert status.get("canary") is None
    assert status["applied"] is True
    assert condition(status, "Ready")["status"] == "True"
    messages = [e["message"] for e in events_of(kmock) if e["reason"] == "Trial"]
    assert len(messages) == 4
    assert messages[0].startswith("Trial 0: batch=32 wait=50ms → 500 req/s, p99 270 ms ≤ 300 ms")


async def test_a_spec_with_the_largest_trace_keeps_a_small_last_handled_annotation(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # about 120 KiB of spec: with kubectl's last-applied copy, a second copy of it would
    # fill the 256 KiB all annotations share, and every metadata patch would be refused
    timestamps = [86_400.0 + round(k * 0.0123457, 6) for k in range(MAX_TRACE_TIMESTAMPS)]
    load = {
        "endpoint": {"port": 8080, "path": "/v1/predict"},
        "maxRps": 1000,
        "arrival": {"process": "Trace", "timestamps": timestamps},
    }
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(load=load)
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
    annotations = obj_of(kmock, "resnet")["metadata"]["annotations"]
    last_handled = annotations["batchpilot.dev/last-handled-configuration"]
    assert set(json.loads(last_handled)) == {DIGEST_KEY}
    assert len(last_handled) < 100


async def test_restart_mid_trial_interrupts_and_retries_it_without_gaps(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()

    def running(number: int) -> bool:
        trials = status_of(kmock).get("trials", [])
        return any(t["number"] == number and t["state"] == "Running" for t in trials)

    cluster.hold_after = 2  # trial 2 hangs in apply
    async with operator():
        await eventually(lambda: running(2), what="trial 2 running")
    interrupted = status_of(kmock)["trials"][2]
    # the operator died with trial 2 in flight (Kopf may already have restarted the
    # daemon during its shutdown, which marks it as interrupted)
    assert (interrupted["state"], interrupted["reason"]) in {
        ("Running", ""),
        ("Interrupted", INTERRUPTED_REASON),
    }

    cluster.hold_after = None
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence after restart")
    trials = status_of(kmock)["trials"]
    assert [t["number"] for t in trials] == list(range(len(trials)))  # no gaps, no twins
    assert trials[2]["params"] == interrupted["params"]
    assert (trials[2]["state"], trials[2]["reason"]) == ("Interrupted", INTERRUPTED_REASON)
    assert not any(t["state"] == "Failed" for t in trials)  # a restart is no failure
    for cut, retry in itertools.pairwise(trials):
        if cut["state"] == "Interrupted":
            assert retry["params"] == cut["params"]  # retried next, never lost
    counted = [t for t in trials if t["state"] != "Interrupted"]
    assert len(counted) == 4  # maxTrials measured; interrupted ones are not counted
    assert all(t["state"] == "Complete" for t in counted)


async def test_spec_change_starts_a_new_study_and_restores_in_place_target(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    body = isvc(tuning={"strategy": "InPlace", "maxTrials": 3, "writeBack": "Recommend"})
    kmock.objects[ISVC, NAMESPACE, "resnet"] = body
    cluster.hold_after = 2  # trial 2 is in flight when the spec changes
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
        assert cluster.applied[0] == ORIGINAL  # the baseline is the original
        changed = {
            "metadata": {"generation": 2},
            "spec": {"sla": {"p99LatencyMs": 200, "maxErrorRate": 0.001}},
        }
        response = await kmock.patch(
            f"{ISVC_URL}/resnet",
            json=changed,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert response.status == 200
        await eventually(lambda: status_of(kmock).get("observedGeneration") == 2, what="restart")
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(lambda: phase_is(kmock, "Converged", generation=2), what="new study")
        await eventually(lambda: "Converged" in reasons_of(kmock), what="events posted")
    status = status_of(kmock)
    assert [t["number"] for t in status["trials"]] == [0, 1, 2]
    assert status["best"]["generation"] == 2
    assert status["observedGeneration"] == 2
    # the first study was cut short (restore), the second ended under Recommend (restore)
    assert cluster.restored >= 2
    assert cluster.target == ORIGINAL
    assert cluster.written_back == []
    assert reasons_of(kmock).count("StudyStarted") == 2


async def test_deletion_mid_study_restores_the_original(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "InPlace", "maxTrials": 10, "writeBack": "Apply"}
    )
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
        assert cluster.target != ORIGINAL
        response = await kmock.delete(f"{ISVC_URL}/resnet")
        assert response.status == 200
        await eventually(lambda: obj_of(kmock) == {}, what="finalizer released")
    assert cluster.target == ORIGINAL
    assert cluster.restored == 1
    assert cluster.written_back == []


async def test_invalid_spec_becomes_a_condition_and_an_event(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        parameters={"maxBatchSize": {"min": 64, "max": 8}}
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="invalid spec reported")
        status = status_of(kmock)
        valid = condition(status, "SpecValid")
        assert valid["status"] == "False"
        assert valid["reason"] == "InvalidSpec"
        assert "maxBatchSize.min must be less than or equal to max" in valid["message"]
        assert "spec.parameters.maxBatchSize" in valid["message"]
        await eventually(
            lambda: any(e["reason"] == "InvalidSpec" for e in events_of(kmock)),
            what="event posted",  # Kopf posts events from a queue, after the status write
        )
    events = [e for e in events_of(kmock) if e["reason"] == "InvalidSpec"]
    assert len(events) == 1  # once per generation, not once per poll
    assert events[0]["type"] == "Warning"
    assert "maxBatchSize.min" in events[0]["message"]
    assert cluster.applied == []


async def test_missing_target_is_retried_with_a_condition_not_a_crash(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.missing_target = True
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: cluster.lookups >= 3, what="retried target lookups")
        ready = condition(status_of(kmock), "TargetReady")
        assert ready["status"] == "False"
        assert ready["reason"] == "TargetNotFound"
        cluster.missing_target = False
        await eventually(lambda: phase_is(kmock, "Converged"), what="recovery")
        await eventually(lambda: "Converged" in reasons_of(kmock), what="events posted")
    assert reasons_of(kmock).count("TargetNotFound") == 1  # one event, not one per retry
    assert condition(status_of(kmock), "TargetReady")["status"] == "True"


async def test_conflicts_and_server_errors_on_status_writes_are_retried(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # every status write meets a 409 Conflict, then a 503, and only then goes through
    codes = itertools.cycle([409, 503, None])
    decided: dict[int, int | None] = {}  # request id → injected code (filters run repeatedly)

    def code_for(request: Request) -> int | None:
        if request.subresource != "status" or request.method != http_method.PATCH:
            return None
        if request.id not in decided:
            decided[request.id] = next(codes)
        return decided[request.id]

    def fail(request: Request) -> KubernetesError:
        code = code_for(request)
        return KubernetesError(status=code or 500, reason="Injected", message=f"injected {code}")

    kmock[lambda request: code_for(request) is not None] << fail
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 2})
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence despite faults")
    answered = [c for c in decided.values() if c is not None]
    assert 409 in answered
    assert 503 in answered
    trials = status_of(kmock)["trials"]
    assert [t["number"] for t in trials] == [0, 1]


async def test_one_trial_is_measured_at_a_time_and_waiting_is_visible(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.hold_after = 0  # the first trial to get the slot keeps it until the gate opens
    kmock.objects[ISVC, NAMESPACE, "first"] = isvc("first", tuning={"maxTrials": 1})
    kmock.objects[ISVC, NAMESPACE, "second"] = isvc("second", tuning={"maxTrials": 1})

    def waiting() -> list[str]:
        names = []
        for name in ("first", "second"):
            conditions = status_of(kmock, name).get("conditions", [])
            if any(
                c["type"] == "Measuring" and c["reason"] == "WaitingForSlot" for c in conditions
            ):
                names.append(name)
        return names

    async with operator():
        await eventually(lambda: len(waiting()) == 1, what="one study waiting for the slot")
        await eventually(lambda: len(cluster.applied) == 1, what="the other one measuring")
        assert len(waiting()) == 1  # still waiting while the first holds the slot
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(
            lambda: all(
                status_of(kmock, n).get("phase") == "Converged" for n in ("first", "second")
            ),
            what="both converged",
        )
    assert len(cluster.applied) == 2


async def test_a_study_whose_best_is_the_incumbent_writes_nothing_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # Only the baseline is measured: with a confirmation asked for, there is no finalist
    # besides the incumbent, and writing its own values back would take the target's
    # fields over for nothing.
    tuning = {"strategy": "Canary", "maxTrials": 1, "writeBack": "Apply", "finalists": 2}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        await eventually(lambda: "NoSignificantGain" in reasons_of(kmock), what="the event")
    status = status_of(kmock)
    assert cluster.written_back == []
    assert cluster.target == ORIGINAL
    assert status["applied"] is False
    assert status.get("confirmation") is None
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "NoSignificantGain")
    assert "the incumbent stays. NoSignificantGain: no other configuration" in status["message"]
    assert "Applied" not in reasons_of(kmock)


def _confirmation_seeds(cluster: FakeCluster, configs: int, rounds: int) -> list[int | None]:
    """The load seeds of the confirmation's measurements: the last configs x rounds."""
    return cluster.seeds[-configs * rounds :]


async def test_an_incumbent_that_is_already_best_stays_with_no_significant_gain(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # the target's own configuration (batch 32, wait 50 ms) is the peak of the surface
    cluster.score = lambda p: (
        700.0
        - 40.0 * abs(math.log2(float(p["max_batch_size"]) / 32.0))
        - 2.0 * abs(float(p["max_queue_time_ms"]) - 50.0)
    )
    tuning = {"strategy": "InPlace", "maxTrials": 4, "writeBack": "Apply", "finalists": 2}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        await eventually(lambda: "NoSignificantGain" in reasons_of(kmock), what="the event")
    status = status_of(kmock)
    # the target is untouched: nothing written back, the original put back in place
    assert cluster.written_back == []
    assert cluster.target == ORIGINAL
    assert cluster.restored == 1
    assert status["applied"] is False
    assert status["restored"] is True
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "NoSignificantGain")
    assert (
        "the incumbent stays. NoSignificantGain: the incumbent batch=32 wait=50ms"
        in (status["message"])
    )
    assert ready["message"] == status["message"]
    assert reasons_of(kmock).count("NoSignificantGain") == 1
    assert "Applied" not in reasons_of(kmock)
    confirmation = status["confirmation"]
    assert confirmation["incumbent"] == ORIGINAL
    assert len(confirmation["finalists"]) == 2
    measured = confirmation["measurements"]
    order = [*confirmation["finalists"], ORIGINAL]
    # every configuration once a round, each round in its own order from tuning.seed
    # (the default, 0)
    assert [m["params"] for m in measured] == [
        p for r in range(3) for p in round_order(order, r, 0)
    ]
    assert [m["round"] for m in measured] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert "two-sided 95% intervals" in confirmation["method"]
    seeds = _confirmation_seeds(cluster, 3, 3)
    assert seeds == [7919] * 3 + [2 * 7919] * 3 + [3 * 7919] * 3  # one schedule a round
    baseline = status["baseline"]
    assert baseline["maxBatchSize"] == 32
    assert baseline["effectiveRps"] == pytest.approx(700.0)
    assert baseline["effectiveRpsLow"] <= 700.0 <= baseline["effectiveRpsHigh"]
    assert status["best"]["gainPercent"] == 0.0  # the winner is the incumbent


async def test_a_real_gain_is_confirmed_and_written_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        await eventually(lambda: "Applied" in reasons_of(kmock), what="write-back")
    status = status_of(kmock)
    best = status["best"]
    assert best["gainLowPercent"] >= 5.0
    assert best["gainPercent"] == pytest.approx(
        100.0 * (best["effectiveRps"] / status["baseline"]["effectiveRps"] - 1.0), abs=0.2
    )
    assert cluster.written_back == [best["params"]]
    assert condition(status, "Ready")["reason"] == "Converged"
    assert "over the incumbent (lower bound" in status["message"]
    reasons = reasons_of(kmock)
    assert reasons.count("Confirming") == 1
    assert reasons.count("Confirmation") == len(status["confirmation"]["measurements"])
    assert reasons.index("Confirming") < reasons.index("Applied")


async def test_a_finalist_that_breaks_the_sla_at_light_load_is_never_written_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # every configuration but the target's own breaks the SLA at light load
    cluster.breaks_at_light_load = lambda params: params != ORIGINAL
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        await eventually(lambda: "NoSignificantGain" in reasons_of(kmock), what="the event")
    status = status_of(kmock)
    assert cluster.written_back == []
    confirmation = status["confirmation"]
    first = [m for m in confirmation["measurements"] if m["round"] == 0]
    finalists = [m for m in first if m["params"] != ORIGINAL]
    assert finalists
    for measured in finalists:
        assert measured["effectiveRps"] == 0.0
        assert measured["reason"].startswith("LightLoad: at ")
    # probed once, in its first round; the incumbent never
    rounds = len(confirmation["measurements"])
    assert cluster.light_load_asked[-rounds:].count(True) == len(finalists)
    assert "no finalist met the SLA in every round" in status["message"]


async def test_a_client_bound_trial_says_so_in_the_status(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # the original scores 500 req/s, but the load generator stalls above 450
    cluster.client_limit_rps = 450.0
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
    trials = status_of(kmock)["trials"]
    baseline = trials[0]
    assert baseline["state"] == "Complete"  # scored, as a lower bound
    assert baseline["clientBound"] is True
    assert baseline["effectiveRps"] == pytest.approx(450.0)
    assert baseline["reason"].startswith(
        "ClientBound: capacity ≥ 450.0 req/s, client-bound: invalid, client-bound: "
        "client event-loop stall up to 80.0 ms > 10% of SLA p99 (30 ms)"
    )
    assert baseline["clientLagP99Ms"] == pytest.approx(48.0)
    assert baseline["clientCpu"] == pytest.approx(0.41)
    # a trial the client could drive is not flagged
    for trial in trials:
        assert trial["clientBound"] == (cluster.score(trial["params"]) > 450.0)


async def test_a_queued_study_creates_no_canary_until_it_holds_the_slot(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.hold_after = 0
    kmock.objects[ISVC, NAMESPACE, "first"] = isvc("first", tuning={"maxTrials": 1})
    kmock.objects[ISVC, NAMESPACE, "second"] = isvc("second", tuning={"maxTrials": 1})

    def waiting() -> bool:
        return any(
            c["type"] == "Measuring" and c["reason"] == "WaitingForSlot"
            for n in ("first", "second")
            for c in status_of(kmock, n).get("conditions", [])
        )

    async with operator():
        await eventually(waiting, what="one study waiting for the slot")
        await eventually(lambda: len(cluster.applied) == 1, what="the other one measuring")
        assert cluster.prepares == 1  # the waiting study has no canary yet
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(
            lambda: all(
                status_of(kmock, n).get("phase") == "Converged" for n in ("first", "second")
            ),
            what="both converged",
        )
    assert cluster.prepares == 2


async def test_an_unschedulable_canary_fails_the_study_and_frees_the_slot(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.unschedulable = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="the study failed")
        status = status_of(kmock)
        # the first trial ends the study: no retries while holding the slot
        assert [t["state"] for t in status["trials"]] == ["Failed"]
        assert "Insufficient nvidia.com/gpu" in status["message"]
        assert condition(status, "Ready")["reason"] == "StudyFailed"
        assert cluster.canaries == set()  # deleted: its GPUs are free again
        assert status.get("canary") is None
        assert status.get("stopping") is None
        # the slot is free: another study runs to the end
        cluster.unschedulable = None
        created = await kmock.post(ISVC_URL, json=isvc("other", tuning={"maxTrials": 1}))
        assert created.status in (200, 201)
        await eventually(
            lambda: status_of(kmock, "other").get("phase") == "Converged", what="next study"
        )


async def test_a_study_a_measurement_stopped_still_fails_after_a_restart(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
    assert cluster.canaries
    # what a measurement that met an unschedulable canary left in status, the operator
    # restarting before it failed the study
    stopping = "Unschedulable: pod resnet-bp-1 cannot be scheduled (for 300 s)"
    response = await kmock.patch(
        f"{ISVC_URL}/resnet",
        json={"status": {"stopping": stopping}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200
    cluster.hold_after = None
    cluster.gate.set()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="the study failed")
    status = status_of(kmock)
    assert status["message"].startswith(f"study failed: {stopping}")
    assert status.get("stopping") is None
    assert cluster.canaries == set()
    assert len(cluster.applied) == 3  # no trial after it


async def test_a_write_back_that_crash_loops_is_rolled_back_once(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # whatever wins, the target crash-loops on anything but the original
    cluster.crashes = lambda params: params != ORIGINAL
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "Canary", "maxTrials": 4, "writeBack": "Apply", "verifySeconds": 60}
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "RolledBack"), what="rolled back")
        await eventually(lambda: "RolledBack" in reasons_of(kmock), what="the event")
    status = status_of(kmock)
    assert cluster.written_back
    assert cluster.target == ORIGINAL
    assert cluster.restored == 1
    assert cluster.verified == [60.0]
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RolledBack")
    assert "CrashLoopBackOff" in degraded["message"]
    assert condition(status, "Ready")["status"] == "False"
    assert status["applied"] is False
    assert status["restored"] is True
    assert reasons_of(kmock).count("RolledBack") == 1
    assert "Converged" not in reasons_of(kmock)


async def test_a_healthy_write_back_is_watched_then_converges(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
    assert cluster.verified == [300.0]  # tuning.verifySeconds' default
    assert all(c["type"] != "Degraded" for c in status_of(kmock)["conditions"])


async def test_deletion_whose_restore_cannot_finish_gives_up_with_an_event(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "InPlace", "maxTrials": 10, "writeBack": "Apply"}
    )
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
        cluster.restore_problem = TargetProblem(
            "RolloutTimedOut", "Deployment resnet did not roll out within 900 s: 0 of 1 ready"
        )
        response = await kmock.delete(f"{ISVC_URL}/resnet")
        assert response.status == 200
        await eventually(lambda: obj_of(kmock) == {}, what="finalizer released")
        await eventually(lambda: "CleanupIncomplete" in reasons_of(kmock), what="the event")
    [event] = [e for e in events_of(kmock) if e["reason"] == "CleanupIncomplete"]
    assert event["type"] == "Warning"
    assert "RolloutTimedOut" in event["message"]
    assert "Deployment resnet still runs the trial's configuration" in event["message"]
    assert cluster.restored == 0


def rolling_back(k: kmock.KubernetesEmulator) -> bool:
    return any(
        c["type"] == "Degraded" and c["reason"] == "RollingBack"
        for c in status_of(k).get("conditions", [])
    )


async def test_a_rollback_whose_restore_fails_is_finished_on_the_next_step(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.crashes = lambda params: params != ORIGINAL
    cluster.restore_problem = TargetProblem(
        "RolloutTimedOut", "Deployment resnet did not roll out within 900 s"
    )
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()

    async with operator():
        await eventually(lambda: rolling_back(kmock), what="the rollback started")
        written = len(cluster.written_back)
        cluster.restore_problem = None
        await eventually(lambda: phase_is(kmock, "RolledBack"), what="rolled back")
        await eventually(lambda: "RolledBack" in reasons_of(kmock), what="the event")
    assert cluster.target == ORIGINAL
    assert len(cluster.written_back) == written  # the broken values were not written again
    assert cluster.restored == 1
    assert reasons_of(kmock).count("RolledBack") == 1
    degraded = condition(status_of(kmock), "Degraded")
    assert degraded["reason"] == "RolledBack"
    assert "CrashLoopBackOff" in degraded["message"]


async def test_deletion_mid_rollback_of_a_canary_study_finishes_the_rollback(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # the write-back lands on the target itself, whatever the strategy the trials used
    cluster.crashes = lambda params: params != ORIGINAL
    cluster.restore_hangs = True  # the rollback's restore is still rolling out
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "Canary", "maxTrials": 3, "writeBack": "Apply", "verifySeconds": 5}
    )

    async with operator():
        await eventually(lambda: rolling_back(kmock), what="the rollback started")
        await asyncio.sleep(0.5)  # its restore is called, and hangs
        assert cluster.target != ORIGINAL  # the values that crash-loop
        assert cluster.restored == 0
        cluster.restore_hangs = False
        response = await kmock.delete(f"{ISVC_URL}/resnet")
        assert response.status == 200
        await eventually(lambda: obj_of(kmock) == {}, what="finalizer released")
    assert cluster.target == ORIGINAL
    assert cluster.restored == 1


def triton_live_isvc() -> dict[str, Any]:
    """A study of Triton through its own API: the winner is written back live."""
    return isvc(
        runtime={"kind": "Triton", "model": "resnet"},
        apply={"method": "Live"},
        load={"endpoint": {"port": 8000}},
    )


async def test_live_runtime_write_back_leaves_the_snippet_to_commit_in_status(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = triton_live_isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
    status = status_of(kmock)
    best = status["best"]
    assert status["applied"] is True
    assert cluster.written_back[-1] == best["params"]
    persist = status["persist"]
    assert (persist["runtime"], persist["kind"]) == ("Triton", "recommend")
    assert f"max_batch_size: {best['maxBatchSize']}" in persist["snippet"]
    delay_us = round(best["maxQueueTimeMs"] * 1000)
    assert f"max_queue_delay_microseconds: {delay_us}" in persist["snippet"]
    assert "config.pbtxt" in persist["where"]


async def test_a_pod_restarted_off_a_live_winner_is_set_back_once_and_said(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = triton_live_isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        best = status_of(kmock)["best"]["params"]
        assert set(map(str, cluster.pods.values())) == {str(best)}
        checks = cluster.live_checks
        await eventually(lambda: cluster.live_checks > checks + 1, what="checks of the pods")
        assert "LiveReapplied" not in reasons_of(kmock), "nothing to set back"
        # the pod restarts from the model's configuration
        cluster.pods["resnet-1"] = dict(ORIGINAL)
        await eventually(lambda: "LiveReapplied" in reasons_of(kmock), what="the winner set back")
        assert cluster.pods["resnet-1"] == best
        await eventually(lambda: status_of(kmock).get("liveReapplied") == 1, what="the count")
        checks = cluster.live_checks
        await eventually(lambda: cluster.live_checks > checks + 1, what="more checks")
    status = status_of(kmock)
    assert status["phase"] == "Converged"
    assert status["liveReapplied"] == 1
    [event] = [e for e in events_of(kmock) if e["reason"] == "LiveReapplied"]
    assert event["type"] == "Warning"
    assert "on resnet-1 (ran batch=32 wait=50ms)" in event["message"]
    assert (
        "to keep it, commit status.persist.snippet: replace these lines in config.pbtxt"
        in (event["message"])
    )


async def test_a_winner_in_the_pod_template_needs_no_live_checks(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        assert status_of(kmock)["applied"] is True
        cluster.pods["resnet-1"] = {"max_batch_size": 1, "max_queue_time_ms": 0.0}
        await asyncio.sleep(0.5)  # several polls of the converged study
    assert cluster.live_checks == 0
    assert "LiveReapplied" not in reasons_of(kmock)
