"""The handlers under a leader election, against KMock: a replica that does not lead
never measures, patches a workload or writes status, and one that loses the lead
mid-trial stops there; the trial is retried by the next leader, not counted as failed.

The election itself is a switch the test flips (its decisions are unit-tested in
tests/unit/test_operator_leader.py); what is tested here is what the handlers do
with its answer.
"""

from __future__ import annotations

import asyncio
import contextlib

import kmock
import pytest
from opsupport import (
    ISVC,
    NAMESPACE,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    eventually,
    isvc,
    status_of,
)

from batchpilot.operator.status import INTERRUPTED_REASON

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]


class Switch:
    """A Leadership whose answer the test sets; counts the waits of standby daemons."""

    takeover_s = 0.2

    def __init__(self, leading: bool) -> None:
        self._on = asyncio.Event()
        self._off = asyncio.Event()
        self.waits = 0
        self.set(leading)

    def set(self, leading: bool) -> None:
        (self._on if leading else self._off).set()
        (self._off if leading else self._on).clear()

    def is_leader(self) -> bool:
        return self._on.is_set()

    async def wait_leader(self, timeout_s: float) -> bool:
        self.waits += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._on.wait()
        return self.is_leader()

    async def wait_lost(self) -> None:
        await self._off.wait()


def posted_reasons(k: kmock.KubernetesEmulator) -> list[str]:
    return [
        str(r.data["reason"])
        for r in k["post"]
        if r.resource is not None and r.resource.plural == "events"
    ]


def converged(k: kmock.KubernetesEmulator) -> bool:
    return status_of(k).get("phase") == "Converged"


async def test_a_standby_does_nothing_until_it_leads(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()
    leadership = Switch(leading=False)
    async with operator(leadership=leadership):
        await eventually(lambda: leadership.waits >= 5, what="the daemon standing by")
        assert status_of(kmock) == {}
        assert (cluster.applied, cluster.prepares, cluster.lookups) == ([], 0, 0)
        assert posted_reasons(kmock) == []
        leadership.set(True)
        await eventually(lambda: converged(kmock), what="convergence once leading")
    trials = status_of(kmock)["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]


async def test_a_lost_lead_stops_the_trial_and_the_next_leader_retries_it(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc()

    def running(number: int) -> bool:
        trials = status_of(kmock).get("trials", [])
        return any(t["number"] == number and t["state"] == "Running" for t in trials)

    leadership = Switch(leading=True)
    cluster.hold_after = 2  # trial 2 hangs in apply
    async with operator(leadership=leadership):
        await eventually(lambda: running(2), what="trial 2 running")
        leadership.set(False)
        waits = leadership.waits
        await eventually(lambda: leadership.waits >= waits + 3, what="the daemon standing by")
        frozen = status_of(kmock)
        # a trial still in flight would go on now and write its result
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(lambda: leadership.waits >= waits + 8, what="more standing by")
        assert status_of(kmock) == frozen
        assert running(2)

        leadership.set(True)  # leading again, as a standby that took over would
        await eventually(lambda: converged(kmock), what="convergence under the new lead")
    trials = status_of(kmock)["trials"]
    assert [t["number"] for t in trials] == list(range(len(trials)))  # no gaps, no twins
    assert (trials[2]["state"], trials[2]["reason"]) == ("Interrupted", INTERRUPTED_REASON)
    assert trials[3]["params"] == trials[2]["params"]  # retried next
    counted = [t for t in trials if t["state"] != "Interrupted"]
    assert len(counted) == 4  # maxTrials measured; the interrupted one is not counted
    assert all(t["state"] == "Complete" for t in counted)
