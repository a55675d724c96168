"""Maintenance windows, suspend and re-tuning through Kopf and KMock, on an injected
clock: outside the window no trial starts; suspend restores an InPlace target and says
Suspended; resume goes on with the same study; a breached SLA starts a new study."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import kmock
import pytest
from opsupport import (
    ISVC,
    NAMESPACE,
    ORIGINAL,
    FakeCluster,
    FakeTarget,
    FakeWorld,
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

from batchpilot.operator import handlers
from batchpilot.operator.decisions import ProductionVerdict
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.world import ProblemSink

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]

PROMETHEUS_LOAD = {
    "endpoint": {"port": 8080, "path": "/v1/predict"},
    "maxRps": 1000,
    "source": "prometheus",
    "prometheus": {"url": "http://prometheus:9090"},
}


RETUNE_ON_BREACH = {
    "maxTrials": 3,
    "finalists": 0,
    "retune": "OnSLABreach",
    "retuneWindow": "10m",
    "verifySeconds": 0,
}


def retuning_on_breach(k: kmock.KubernetesEmulator, cluster: FakeCluster, **tuning: Any) -> Probe:
    """A study that re-tunes on a breach its Probe reports."""
    probe = Probe(cluster)
    probe.install()
    k.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        load=PROMETHEUS_LOAD, tuning={**RETUNE_ON_BREACH, **tuning}
    )
    return probe


async def converged_with_a_check(k: kmock.KubernetesEmulator) -> None:
    await eventually(
        lambda: phase_is(k, "Converged", None) and bool(status_of(k).get("nextRetuneAt")),
        what="the first study and its first check scheduled",
    )


class Clock:
    """The operator's wall clock, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    monkeypatch.setattr(handlers, "utcnow", fake)
    return fake


class BreachTarget(FakeTarget):
    """A FakeTarget whose production traffic breaks the SLA when the test says so."""

    def __init__(self, spec: InferenceServiceSpec, cluster: FakeCluster, probe: Probe) -> None:
        super().__init__(spec, cluster)
        self.probe = probe

    async def production_verdict(self, window_s: float) -> ProductionVerdict | None:
        self.probe.windows.append(window_s)
        if not self.probe.readable:
            return None  # Prometheus did not answer
        return ProductionVerdict(self.probe.breach)


class BreachWorld(FakeWorld):
    def __init__(self, spec: InferenceServiceSpec, cluster: FakeCluster, probe: Probe) -> None:
        super().__init__(spec, cluster)
        self.target = BreachTarget(spec, cluster, probe)


class Probe:
    def __init__(self, cluster: FakeCluster) -> None:
        self.breach: str | None = None
        self.readable = True
        self.windows: list[float] = []
        self.cluster = cluster

    def install(self) -> None:
        def make(
            kube: Any,
            spec: InferenceServiceSpec,
            namespace: str,
            owner: Mapping[str, Any],
            on_problem: ProblemSink,
        ) -> FakeWorld:
            return BreachWorld(spec, self.cluster, self)

        self.cluster.factory = lambda: make  # type: ignore[method-assign]


async def test_outside_the_window_no_trial_starts_until_it_opens(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    window = {"start": "0 2 * * *", "durationMinutes": 120}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"maxTrials": 3, "finalists": 0, "window": window}
    )
    async with operator():
        await eventually(
            lambda: conditions(kmock).get("InWindow", {}).get("reason") == "OutsideWindow",
            what="the study to wait for its window",
        )
        status = status_of(kmock)
        assert status["waitingUntil"].startswith("2026-12-02T02:00:00")
        assert "outside the maintenance window" in status["message"]
        found = conditions(kmock)
        assert (found["Reconciling"]["status"], found["Reconciling"]["reason"]) == (
            "True",
            "OutsideWindow",
        )
        assert found["Stalled"]["status"] == "False"
        assert cluster.applied == []  # no configuration applied, no load sent
        clock.now = datetime(2026, 12, 2, 2, 5, tzinfo=UTC)
        await eventually(
            lambda: phase_is(kmock, "Converged", None), what="trials inside the window"
        )
    assert len(cluster.applied) == 3
    assert conditions(kmock)["InWindow"]["reason"] == "InsideWindow"
    assert status_of(kmock).get("waitingUntil") is None
    assert "OutsideWindow" in reasons_of(kmock)
    assert "WindowOpen" in reasons_of(kmock)


async def test_suspend_stops_the_trial_in_flight_restores_and_resume_goes_on(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    tuning = {"strategy": "InPlace", "maxTrials": 4, "finalists": 0}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    cluster.hold_after = 1  # trial 1 holds on the target, its values live, until the gate
    async with operator():
        await eventually(lambda: len(cluster.applied) == 2, what="trial 1 applied")
        assert cluster.target == cluster.applied[1]
        await edit(kmock, 2, {"suspend": True})
        # the brake: the trial in flight is stopped, not waited for (the gate stays shut)
        await eventually(lambda: status_of(kmock).get("suspended") is True, what="suspension")
        assert not cluster.gate.is_set()
        assert cluster.target == ORIGINAL
        assert cluster.restored == 1
        assert cluster.measures == 1  # trial 1 never got to measure
        status = status_of(kmock)
        assert "trial 1 stopped mid-measurement" in status["message"], status["message"]
        assert "the original configuration restored" in status["message"]
        cluster.hold_after = None
        cluster.gate.set()
        await asyncio.sleep(0.5)  # ten polls of the daemon: none starts a trial
        assert len(cluster.applied) == 2
        found = conditions(kmock)
        assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("False", "Suspended")
        assert (found["Stalled"]["status"], found["Reconciling"]["status"]) == ("False", "False")
        assert found["Suspended"]["status"] == "True"
        assert "Suspended" in reasons_of(kmock)
        await edit(kmock, 3, {"suspend": False})
        await eventually(lambda: phase_is(kmock, "Converged", None), what="the resumed study")
    status = status_of(kmock)
    # the same study went on: trial 1 ran again on resume, 4 trials in all, the cut one
    # left out of the budget
    assert [t["state"] for t in status["trials"]].count("Complete") == 4, status["trials"]
    assert cluster.applied[2] == cluster.applied[1]  # the stopped trial's values, again
    assert status["suspended"] is False
    assert "Resumed" in reasons_of(kmock)
    assert reasons_of(kmock).count("StudyStarted") == 1


async def test_suspend_deletes_the_canary(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"maxTrials": 4, "finalists": 0}, suspend=False
    )
    cluster.hold_after = 1
    async with operator():
        await eventually(lambda: len(cluster.applied) == 2, what="trial 1 applied")
        assert cluster.canaries
        await edit(kmock, 2, {"suspend": True})
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(lambda: status_of(kmock).get("suspended") is True, what="suspension")
    assert cluster.canaries == set()
    assert status_of(kmock).get("canary") is None
    assert "CanaryDeleted" in reasons_of(kmock)


async def test_a_breached_sla_starts_a_new_study_from_the_written_back_configuration(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    probe = retuning_on_breach(kmock, cluster)
    async with operator():
        await converged_with_a_check(kmock)
        first = status_of(kmock)
        written = cluster.written_back[-1]
        assert first["nextRetuneAt"].startswith("2026-12-01T12:10:00")
        # the SLA holds: checked once when due, then not again before the next window
        clock.now += timedelta(minutes=10)
        await eventually(lambda: len(probe.windows) == 1, what="the first SLA check")
        await eventually(
            lambda: status_of(kmock)["nextRetuneAt"].startswith("2026-12-01T12:20:00"),
            what="the next check scheduled",
        )
        assert probe.windows == [600.0]
        assert phase_is(kmock, "Converged", None)
        probe.breach = "p99 450 ms > 300 ms at 800 req/s"
        clock.now += timedelta(minutes=10)
        await eventually(
            lambda: status_of(kmock).get("retunes") == 1 and phase_is(kmock, "Converged", None),
            what="the re-tune's study",
        )
    status = status_of(kmock)
    assert len(probe.windows) == 2
    assert "SLA breached over the last 10m: p99 450 ms" in status["lastRetuneReason"]
    assert status["lastRetuneAt"].startswith("2026-12-01T12:20:00")
    assert status["previousBest"]["params"] == first["best"]["params"]
    # the new study's baseline is what the first one wrote back
    assert status["trials"][0]["source"] == "baseline"
    assert status["trials"][0]["params"] == written
    assert "Retune" in reasons_of(kmock)
    assert reasons_of(kmock).count("StudyStarted") == 1


async def test_a_breach_holds_an_in_place_retune_until_production_keeps_the_sla(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    probe = retuning_on_breach(kmock, cluster, strategy="InPlace")
    async with operator():
        await converged_with_a_check(kmock)
        trials = len(cluster.applied)
        # production breaks the SLA: an InPlace re-tune would add load to it, so it waits
        probe.breach = "p99 450 ms > 300 ms at 800 req/s"
        clock.now += timedelta(minutes=10)
        await eventually(lambda: "RetuneHeld" in reasons_of(kmock), what="the held re-tune")
        status = status_of(kmock)
        assert (
            status["retuneHeld"]
            == "SLA breached over the last 10m: p99 450 ms > 300 ms at 800 req/s"
        )
        assert "waits until production keeps the SLA" in status["message"]
        assert status["nextRetuneAt"].startswith("2026-12-01T12:20:00")
        # still breaching, then Prometheus silent: neither is a recovery
        for readable in (True, False):
            probe.readable = readable
            checks = len(probe.windows) + 1
            clock.now += timedelta(minutes=10)
            await eventually(lambda: len(probe.windows) == checks, what="a check")  # noqa: B023
            await asyncio.sleep(0.3)  # six polls of the daemon
            assert len(cluster.applied) == trials
            assert status_of(kmock).get("retunes", 0) == 0
            assert phase_is(kmock, "Converged", None)
        assert reasons_of(kmock).count("RetuneHeld") == 1  # one event for the episode
        # production keeps the SLA over a whole window: the re-tune starts
        probe.readable, probe.breach = True, None
        clock.now += timedelta(minutes=10)
        await eventually(
            lambda: status_of(kmock).get("retunes") == 1 and phase_is(kmock, "Converged", None),
            what="the re-tune's study",
        )
    status = status_of(kmock)
    assert status["lastRetuneReason"] == (
        "SLA breached over the last 10m: p99 450 ms > 300 ms at 800 req/s; "
        "production kept the SLA again over the last 10m"
    )
    assert status.get("retuneHeld", "") == ""
    assert len(cluster.applied) > trials


async def test_recommend_turned_to_apply_waits_for_the_window_and_suspend_then_verifies(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    clock.now = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    window = {"start": "0 2 * * *", "durationMinutes": 120}
    tuning = {
        "maxTrials": 3, "finalists": 0, "writeBack": "Recommend", "window": window,
        "verifySeconds": 45,
    }  # fmt: skip
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    async with operator():
        await eventually(lambda: phase_is(kmock, "Converged", None), what="the study")
        best = status_of(kmock)["best"]["params"]
        assert (cluster.written_back, cluster.verified) == ([], [])
        # Apply, asked outside the window: nothing is written until it opens
        clock.now = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
        await edit(kmock, 2, {"tuning": {**tuning, "writeBack": "Apply"}})
        await eventually(lambda: "SpecAdopted" in reasons_of(kmock), what="the edit adopted")
        await eventually(
            lambda: conditions(kmock).get("InWindow", {}).get("reason") == "OutsideWindow",
            what="the write-back held for the window",
        )
        # and suspended when the window opens: still nothing
        await edit(kmock, 3, {"suspend": True})
        await eventually(lambda: status_of(kmock).get("suspended") is True, what="suspension")
        clock.now = datetime(2026, 12, 3, 2, 5, tzinfo=UTC)
        await asyncio.sleep(0.5)  # ten polls of the daemon
        assert cluster.written_back == []
        # resumed inside the window: written, then watched like a study's own write-back
        await edit(kmock, 4, {"suspend": False})
        await eventually(lambda: cluster.written_back == [best], what="the write-back")
        await eventually(lambda: status_of(kmock).get("applied") is True, what="applied")
        await eventually(lambda: "Applied" in reasons_of(kmock), what="the event")
    assert cluster.verified == [45.0]
    status = status_of(kmock)
    assert status["phase"] == "Converged"
    assert "writeBack Apply: wrote" in status["message"]


async def test_an_in_place_target_is_restored_while_the_window_is_shut(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    clock.now = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    window = {"start": "0 2 * * *", "durationMinutes": 120}
    tuning = {"strategy": "InPlace", "maxTrials": 4, "finalists": 0, "window": window}
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(tuning=tuning)
    cluster.hold_after = 1  # trial 1 waits in apply, on the target
    async with operator():
        await eventually(lambda: len(cluster.applied) == 2, what="trial 1 applied")
        # too late for another whole trial (deadline 900 s) before the 04:00 close
        clock.now = datetime(2026, 12, 2, 3, 50, tzinfo=UTC)
        cluster.hold_after = None
        cluster.gate.set()
        await eventually(
            lambda: conditions(kmock).get("InWindow", {}).get("reason") == "OutsideWindow",
            what="the wait for the next window",
        )
        assert cluster.target == ORIGINAL
        assert cluster.restored == 1
        assert len(cluster.applied) == 2
        status = status_of(kmock)
        assert status["waitingUntil"].startswith("2026-12-03T02:00:00")
        assert "before a trial could finish" in status["message"]
        assert "the original configuration restored" in status["message"]
        clock.now = datetime(2026, 12, 3, 2, 0, tzinfo=UTC)
        await eventually(
            lambda: phase_is(kmock, "Converged", None), what="the next window's trials"
        )
    assert [t["number"] for t in status_of(kmock)["trials"]] == [0, 1, 2, 3]
    assert cluster.written_back


async def test_a_restarting_edit_while_suspended_lifts_the_pause_with_it(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster, clock: Clock
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"maxTrials": 3, "finalists": 0}, suspend=True
    )
    async with operator():
        await eventually(lambda: status_of(kmock).get("suspended") is True, what="suspension")
        assert cluster.applied == []
        await edit(kmock, 2, {"suspend": False, "sla": {"p99LatencyMs": 250}})
        await eventually(lambda: phase_is(kmock, "Converged", None), what="the new study")
    found = conditions(kmock)
    assert (found["Suspended"]["status"], found["Suspended"]["reason"]) == ("False", "Resumed")
    assert found["Ready"]["status"] == "True"
