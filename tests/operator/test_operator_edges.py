"""The operator says when a study's best sits on the edge of the searched range, with
the spec field that widens it, and stays quiet when the best lies inside."""

from __future__ import annotations

import kmock
import pytest
from opsupport import (
    ISVC,
    NAMESPACE,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    events_of,
    eventually,
    isvc,
    phase_is,
)

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]


def edge_messages(k: kmock.KubernetesEmulator) -> list[str]:
    return [str(e["message"]) for e in events_of(k) if e["reason"] == "EdgeOfSpace"]


async def test_a_best_at_the_top_of_the_batch_range_is_reported_with_the_field_to_raise(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # throughput grows with the batch: the best is the range's top, 2 of 1..2
    cluster.score = lambda params: 100.0 * float(params["max_batch_size"])
    cluster.target = {"max_batch_size": 2, "max_queue_time_ms": 5.0}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        parameters={"maxBatchSize": {"min": 1, "max": 2}, "maxQueueTimeMs": {"min": 5, "max": 5}},
        tuning={"maxTrials": 3, "finalists": 0},
    )
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
        await eventually(lambda: bool(edge_messages(kmock)), what="the edge event")
    (message,) = edge_messages(kmock)  # the wait is pinned (min = max): no edge there
    assert message.startswith("max_batch_size 2 is the top of the searched range 1..2")
    assert "raise spec.parameters.maxBatchSize.max" in message


async def test_a_best_inside_the_range_reports_no_edge(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    # the default surface peaks at 16 / 20 ms, well inside 1..64 / 0..100
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning={"maxTrials": 3, "finalists": 0})
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged"), what="convergence")
    assert edge_messages(kmock) == []
