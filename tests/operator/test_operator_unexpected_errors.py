"""An error no rule expects is bounded: retried with backoff a few times, then the study
stops Failed (kstatus Stalled) with the error's text, its canary deleted and an InPlace
target's original values back, instead of retrying forever while holding them."""

from __future__ import annotations

import kmock
import pytest
from opsupport import (
    ISVC,
    NAMESPACE,
    ORIGINAL,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    conditions,
    eventually,
    isvc,
    phase_is,
    reasons_of,
    status_of,
)

from batchpilot.operator.handlers import MAX_UNEXPECTED_ERRORS
from batchpilot.operator.status import MAX_MESSAGE_CHARS, MAX_REASON_CHARS

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]


async def test_a_repeated_unexpected_error_stalls_the_study_and_frees_the_canary(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.measure_error = ModuleNotFoundError("No module named 'torch'")
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 3, "finalists": 0})
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="the study stopped")
        measured = cluster.measures
        # stopped for good: no further attempt while nothing changes
        await eventually(lambda: "StudyFailed" in reasons_of(kmock), what="the event")
    assert measured == MAX_UNEXPECTED_ERRORS
    assert cluster.measures == measured
    assert cluster.canaries == set()
    found = conditions(kmock)
    assert found["Stalled"]["status"] == "True"
    message = status_of(kmock)["message"]
    assert f"UnexpectedError ({MAX_UNEXPECTED_ERRORS} times in a row)" in message
    assert "ModuleNotFoundError: No module named 'torch'" in message
    assert reasons_of(kmock).count("StepFailed") == 1  # a Warning: once per 10 minutes


async def test_an_in_place_target_gets_its_original_values_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.measure_error = ValueError("a value the code cannot handle")
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "InPlace", "maxTrials": 3, "finalists": 0},
        load={"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 500},
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="the study stopped")
    assert cluster.applied  # the trial's values went onto the target first
    assert cluster.target == ORIGINAL
    assert status_of(kmock)["restored"] is True


async def test_a_text_of_any_size_is_stored_within_the_status_caps(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # the scheduler's words quoted whole: a megabyte of text in the trial's failure
    cluster.unschedulable = "0/1 nodes are available: " + "x" * 1_000_000
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 3, "finalists": 0})
    async with operator():
        await eventually(lambda: phase_is(kmock, "Failed"), what="the study stopped")
    status = status_of(kmock)
    assert len(status["message"]) <= MAX_MESSAGE_CHARS
    assert "0/1 nodes are available: xxx" in status["message"]
    assert status["message"].endswith("more characters)")  # says that text was left out
    for condition in status["conditions"]:
        assert len(condition["message"]) <= MAX_MESSAGE_CHARS
    assert status["trials"]
    assert all(len(trial.get("reason", "")) <= MAX_REASON_CHARS for trial in status["trials"])
