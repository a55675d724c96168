"""finalists 0 turns the confirmation off, not the gain gate: the operator writes the
study's best back only when its study figure clears minGainPercent over the incumbent."""

from __future__ import annotations

from collections.abc import Mapping

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

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]


def flat(params: Mapping[str, float | int]) -> float:
    """Every challenger within 2 % of the incumbent: noise, not a gain."""
    return 500.0 if dict(params) == ORIGINAL else 500.0 + float(params["max_batch_size"]) / 8.0


async def test_a_best_short_of_min_gain_is_not_written_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.score = flat
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 3, "finalists": 0})
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        await eventually(lambda: "NoSignificantGain" in reasons_of(kmock), what="the event")
    assert cluster.written_back == []
    ready = conditions(kmock)["Ready"]
    assert ready["reason"] == "NoSignificantGain"
    assert "below minGainPercent 5 % (unconfirmed: finalists 0)" in ready["message"]
    assert not status_of(kmock).get("applied")


async def test_with_no_gain_asked_for_the_best_is_written_back(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    cluster.score = flat
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"maxTrials": 3, "finalists": 0, "minGainPercent": 0}
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
    assert len(cluster.written_back) == 1
    assert conditions(kmock)["Ready"]["reason"] == "Converged"
