"""Cleanup under the spec a study started with, failed cleanups surfaced, invalid edits
that keep what is left to undo, and the write-back's and restore's own deadlines: the
real handlers under Kopf against KMock, with the fake World."""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from opsupport import (
    ISVC,
    ISVC_URL,
    NAMESPACE,
    ORIGINAL,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    edit,
    events_of,
    eventually,
    isvc,
    obj_of,
    phase_is,
    reasons_of,
    status_of,
)

from batchpilot.operator.decisions import MAX_DISTURBED_TRIALS
from batchpilot.operator.status import TRIALS_KEPT
from batchpilot.operator.world import TargetProblem

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(90),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]


def condition(k: kmock.KubernetesEmulator, type: str) -> dict[str, Any]:
    found = [c for c in status_of(k).get("conditions", []) if c["type"] == type]
    return found[0] if found else {}


IN_PLACE = {"strategy": "InPlace", "maxTrials": 3, "writeBack": "Recommend"}
OTHER_TARGET = {"kind": "Deployment", "name": "other", "container": "server"}


async def test_after_a_restart_the_cleanup_restores_the_target_the_study_started_on(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=IN_PLACE)
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
    assert cluster.target != ORIGINAL
    # the target is changed while no operator runs: the new one knows only the new spec
    await edit(kmock, 2, {"target": OTHER_TARGET})
    cluster.hold_after = None
    cluster.gate.set()
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged", 2), what="the new study")
    # the first study's cleanup restored its own target, the second study's its own
    assert cluster.restored_targets[0] == "resnet"
    assert cluster.restored_targets[-1] == "other"
    assert '"name":"other"' in status_of(kmock)["startedWith"]


async def test_a_failed_cleanup_on_a_spec_change_is_surfaced_and_retried(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=IN_PLACE)
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
        cluster.restore_problem = TargetProblem(
            "RolloutTimedOut", "Deployment resnet did not roll out within 900 s"
        )
        await edit(kmock, 2, {"target": OTHER_TARGET})
        await eventually(
            lambda: condition(kmock, "CleanedUp").get("status") == "False", what="condition"
        )
        await eventually(lambda: "CleanupFailed" in reasons_of(kmock), what="the event")
        assert "RolloutTimedOut" in condition(kmock, "CleanedUp")["message"]
        # what is left to undo stays in status for the retry
        assert status_of(kmock)["original"]["params"] == ORIGINAL
        assert cluster.restored_targets == []
        cluster.restore_problem = None
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(lambda: phase_is(kmock, "Converged", 2), what="the new study")
    assert cluster.restored_targets[0] == "resnet"
    assert condition(kmock, "CleanedUp")["status"] == "True"


async def test_an_invalid_edit_mid_study_keeps_the_canary_and_the_original(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 6})
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
        canary = status_of(kmock)["canary"]
        assert canary in cluster.canaries
        await edit(kmock, 2, {"parameters": {"maxBatchSize": {"min": 64, "max": 8}}})
        await eventually(
            lambda: condition(kmock, "SpecValid").get("status") == "False", what="invalid"
        )
        status = status_of(kmock)
        assert status["canary"] == canary
        assert status["original"]["params"] == ORIGINAL
        assert status["trials"]
        response = await kmock.delete(f"{ISVC_URL}/resnet")
        assert response.status == 200
        cluster.gate.set()
        await eventually(lambda: obj_of(kmock) == {}, what="finalizer released")
    assert cluster.canaries == set()


async def test_a_write_back_that_never_finishes_ends_at_its_deadline_and_rolls_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.write_back_hangs = True
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"maxTrials": 3, "finalists": 0, "writeBackDeadlineSeconds": 1}
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "RolledBack"), what="rolled back")
    degraded = condition(kmock, "Degraded")
    assert degraded["reason"] == "RolledBack"
    assert "WriteBackTimedOut" in degraded["message"]
    assert "tuning.writeBackDeadlineSeconds" in degraded["message"]
    assert cluster.restored == 1


async def test_a_restore_that_never_finishes_ends_in_a_condition_not_a_hang(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.restore_hangs = True
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={**IN_PLACE, "restoreDeadlineSeconds": 1}
    )
    async with operator():
        await eventually(
            lambda: condition(kmock, "TargetReady").get("reason") == "RestoreTimedOut",
            what="the condition",
        )
    message = condition(kmock, "TargetReady")["message"]
    assert "tuning.restoreDeadlineSeconds" in message


async def test_trials_and_rounds_an_autoscaler_disturbed_are_measured_again(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # the second measurement (a trial) and the sixth (a confirmation round)
    cluster.disturbed = {2, 6}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "InPlace", "maxTrials": 4, "maxFailures": 1}
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="converged")
    status = status_of(kmock)
    trials = status["trials"]
    invalid = [t for t in trials if t["reason"].startswith("invalid: ScaledDuringTrial")]
    assert len(invalid) == 1
    assert "HorizontalPodAutoscaler resnet-hpa" in invalid[0]["reason"]
    # measured again next, and neither a failure (maxFailures 1 would end the study)
    # nor one of the maxTrials
    retry = trials[invalid[0]["number"] + 1]
    assert retry["params"] == invalid[0]["params"]
    assert retry["state"] == "Complete"
    assert len([t for t in trials if t is not invalid[0]]) == 4
    # no confirmation round scored 0 for the disturbance
    measurements = status["confirmation"]["measurements"]
    assert measurements
    assert all(m["effectiveRps"] > 0 for m in measurements)
    assert "ScaledDuringTrial" in reasons_of(kmock)


async def test_an_autoscaler_that_disturbs_every_trial_ends_the_study_through_max_failures(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # an HPA that answers every trial's load by scaling: the trials are measured again a
    # few times, then count as failures, so production is not loaded until the history fills
    cluster.disturbed = set(range(1, TRIALS_KEPT))
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "InPlace", "maxTrials": 20, "maxFailures": 2}
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="failed")
    status = status_of(kmock)
    reasons = [t["reason"] for t in status["trials"]]
    invalid = [r for r in reasons if r.startswith("invalid: ScaledDuringTrial")]
    counted = [r for r in reasons if r.startswith("ScaledDuringTrial")]
    assert len(invalid) == MAX_DISTURBED_TRIALS
    assert len(counted) == 2  # maxFailures
    assert reasons == invalid + counted
    assert "HorizontalPodAutoscaler resnet-hpa" in counted[0]
    assert "minReplicas = maxReplicas" in counted[0]
    assert "tuning.strategy Canary" in counted[0]
    assert cluster.measures == MAX_DISTURBED_TRIALS + 2
    assert "2 trials in a row failed" in status["message"]


@pytest.mark.parametrize("strategy", ["InPlace", "Canary"])
async def test_a_deletion_after_a_restart_with_an_invalid_spec_cleans_up_as_recorded(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, strategy: str
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": strategy, "maxTrials": 6, "writeBack": "Recommend"}
    )
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
    canary = status_of(kmock).get("canary")
    assert (canary in cluster.canaries) if strategy == "Canary" else cluster.target != ORIGINAL
    # invalid, and naming another target: the cleanup must go by the record, not by it
    await edit(
        kmock,
        2,
        {
            "target": OTHER_TARGET,
            "parameters": {"maxBatchSize": {"min": 64, "max": 8}},
        },
    )
    cluster.hold_after = None
    cluster.gate.set()
    async with operator():
        await eventually(
            lambda: condition(kmock, "SpecValid").get("status") == "False", what="invalid"
        )
        response = await kmock.delete(f"{ISVC_URL}/resnet")
        assert response.status == 200
        await eventually(lambda: obj_of(kmock) == {}, what="finalizer released")
    assert cluster.canaries == set()
    assert cluster.target == ORIGINAL
    assert cluster.restored_targets == (["resnet"] if strategy == "InPlace" else [])
    cleaned = [e for e in events_of(kmock) if e["reason"] == "CleanedUp"]
    assert len(cleaned) == 1
    message = cleaned[0]["message"]
    assert "status.startedWith" in message
    if strategy == "InPlace":
        assert "Deployment resnet restored to its original configuration" in message
    else:
        assert f"canary {canary} deleted" in message


async def test_a_deletion_with_an_invalid_spec_and_no_record_says_what_stays(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 6})
    cluster.hold_after = 2
    async with operator():
        await eventually(lambda: len(cluster.applied) == 3, what="trial 2 applied")
    canary = status_of(kmock)["canary"]
    await edit(kmock, 2, {"parameters": {"maxBatchSize": {"min": 64, "max": 8}}})
    # a status written by a version that kept no record of the study's spec
    response = await kmock.patch(
        f"{ISVC_URL}/resnet",
        json={"status": {"startedWith": None}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200
    assert "startedWith" not in status_of(kmock)
    cluster.hold_after = None
    cluster.gate.set()
    async with operator():
        await eventually(
            lambda: condition(kmock, "SpecValid").get("status") == "False", what="invalid"
        )
        response = await kmock.delete(f"{ISVC_URL}/resnet")
        assert response.status == 200
        # the finalizer lets go: a resource that cannot be cleaned up must not hang
        await eventually(lambda: obj_of(kmock) == {}, what="finalizer released")
    [warning] = [e for e in events_of(kmock) if e["reason"] == "CleanupIncomplete"]
    assert warning["type"] == "Warning"
    assert "spec.parameters.maxBatchSize" in warning["message"]
    assert "no status.startedWith was recorded" in warning["message"]
    assert f"canary {canary}" in warning["message"]
    assert canary in cluster.canaries  # left to garbage collection, as the event says
