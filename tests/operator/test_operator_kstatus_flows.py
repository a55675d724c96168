"""kubectl, Flux and Argo CD through Kopf and KMock: kstatus conditions as a study runs,
fails and converges; SpecValid back to True; one event for a retried error; edits that
a study adopts without starting over."""

from __future__ import annotations

from collections.abc import Mapping

import kmock
import pytest
from opsupport import (
    ISVC,
    NAMESPACE,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    conditions,
    edit,
    eventually,
    isvc,
    phase_is,
    reasons_of,
    status_of,
)

from batchpilot.operator.world import TargetProblem

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]


def kstatus(k: kmock.KubernetesEmulator) -> tuple[str, str, str]:
    found = conditions(k)
    ready, reconciling, stalled = (
        str(found.get(t, {}).get("status", "")) for t in ("Ready", "Reconciling", "Stalled")
    )
    return ready, reconciling, stalled


async def test_kstatus_conditions_while_running_and_when_converged(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 3, "finalists": 0})
    cluster.hold_after = 1  # trial 1 waits in apply
    async with operator():
        await eventually(lambda: len(cluster.applied) == 2, what="trial 1 applied")
        assert kstatus(kmock) == ("False", "True", "False")  # Reconciling
        assert conditions(kmock)["Reconciling"]["observedGeneration"] == 1
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
    assert kstatus(kmock) == ("True", "False", "False")
    found = conditions(kmock)
    assert {found[t]["observedGeneration"] for t in ("Ready", "Reconciling", "Stalled")} == {1}
    assert found["Ready"]["reason"] == "Converged"
    status = status_of(kmock)
    assert status["trialsProgress"] == "3/3"
    assert status["gainPercent"] is not None


async def test_a_failed_study_is_stalled_not_in_progress(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    def refuse(params: Mapping[str, float | int]) -> float:
        raise TargetProblem("PodRestarted", "the server crashed during the trial")

    cluster.score = refuse
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 3, "maxFailures": 2})
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="the study to fail")
    assert kstatus(kmock) == ("False", "False", "True")
    stalled = conditions(kmock)["Stalled"]
    assert stalled["reason"] == "StudyFailed"
    assert stalled["observedGeneration"] == 1
    assert "2 trials in a row failed" in stalled["message"]


async def test_spec_valid_goes_back_to_true_once_the_spec_is_fixed(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        parameters={"maxBatchSize": {"min": 64, "max": 8}}
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="invalid spec reported")
        assert conditions(kmock)["SpecValid"]["status"] == "False"
        assert kstatus(kmock) == ("False", "False", "True")
        assert conditions(kmock)["Stalled"]["reason"] == "InvalidSpec"
        fixed = {"parameters": {"maxBatchSize": {"min": 1, "max": 64}}}
        await edit(kmock, 2, fixed)
        await eventually(lambda: phase_is(kmock, "Converged", 2), what="the fixed spec's study")
    valid = conditions(kmock)["SpecValid"]
    assert (valid["status"], valid["observedGeneration"]) == ("True", 2)
    assert kstatus(kmock) == ("True", "False", "False")


async def test_a_retried_api_error_is_posted_once(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.api_errors = 4  # four attempts, four different texts
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 2, "finalists": 0})
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="recovery")
        await eventually(lambda: "Converged" in reasons_of(kmock), what="events posted")
    assert cluster.lookups > 4
    reasons = reasons_of(kmock)
    assert reasons.count("APIError") == 1, reasons
    assert "Logging" not in reasons  # no retry log lines turned into events


async def test_editing_write_back_on_a_converged_study_does_not_rerun_it(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    tuning = {"strategy": "Canary", "maxTrials": 3, "writeBack": "Recommend", "finalists": 0}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        measured = len(cluster.applied)
        assert cluster.written_back == []
        best = status_of(kmock)["best"]["params"]

        await edit(kmock, 2, {"tuning": {**tuning, "writeBack": "Apply"}})
        await eventually(lambda: cluster.written_back == [best], what="write-back on edit")
        await eventually(lambda: phase_is(kmock, "Converged", 2), what="generation 2 adopted")
        # the write-back's own status patch may land after the adoption's
        await eventually(lambda: status_of(kmock)["applied"] is True, what="applied recorded")

        await edit(kmock, 3, {"tuning": {**tuning, "writeBack": "Recommend"}})
        await eventually(lambda: cluster.restored == 1, what="write-back withheld")
        await eventually(lambda: phase_is(kmock, "Converged", 3), what="generation 3 adopted")
        await eventually(lambda: "SpecAdopted" in reasons_of(kmock), what="events posted")
    status = status_of(kmock)
    assert (status["applied"], status["restored"]) == (False, True)
    assert len(cluster.applied) == measured  # not one trial more
    assert [t["number"] for t in status["trials"]] == [0, 1, 2]
    assert reasons_of(kmock).count("StudyStarted") == 1
    assert conditions(kmock)["Ready"]["observedGeneration"] == 3


async def test_raising_max_trials_continues_the_study(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    tuning = {"strategy": "Canary", "maxTrials": 2, "writeBack": "Apply", "finalists": 0}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        first = status_of(kmock)["trials"]
        await edit(kmock, 2, {"tuning": {**tuning, "maxTrials": 4}})
        await eventually(lambda: phase_is(kmock, "Converged", 2), what="the continued study")
        await eventually(lambda: "StudyResumed" in reasons_of(kmock), what="events posted")
    status = status_of(kmock)
    assert [t["number"] for t in status["trials"]] == [0, 1, 2, 3]
    assert status["trials"][:2] == first  # the first trials kept as they were
    assert status["trialsProgress"] == "4/4"
    assert reasons_of(kmock).count("StudyStarted") == 1
    assert status["applied"] is True


async def test_a_crash_is_retried_then_keeps_the_study_below_its_batch_size(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # every batch of 16 or more is OOM-killed: the first crash is retried at once, the
    # retry confirms it, and no later trial goes to 16 or above
    def oom(params: Mapping[str, float | int]) -> float:
        if int(params["max_batch_size"]) >= 16:
            raise TargetProblem(
                "Crashed", "during the trial: container server of pod p exited (OOMKilled)"
            )
        return 100.0 * int(params["max_batch_size"])

    cluster.score = oom
    tuning = {"maxTrials": 10, "maxFailures": 5, "finalists": 0, "sampler": "Random", "seed": 3}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    async with operator():
        await eventually(
            lambda: phase_is(kmock, "Converged") or phase_is(kmock, "Failed"), what="the end"
        )
    trials = status_of(kmock)["trials"]
    crashes = [i for i, t in enumerate(trials) if t["reason"].startswith("ServerDied")]
    assert crashes, trials
    first = crashes[0]
    assert (
        "Crashed: during the trial: container server of pod p exited (OOMKilled)"
        in (trials[first]["reason"])
    )
    assert trials[first + 1]["params"] == trials[first]["params"]  # the retry
    assert trials[first + 1]["reason"].startswith("ServerDied")
    limit = min(int(trials[i]["params"]["max_batch_size"]) for i in (first, first + 1))
    assert all(int(t["params"]["max_batch_size"]) < limit for t in trials[first + 2 :]), trials
