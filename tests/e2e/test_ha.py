"""Two operator replicas in a leader election against the real API server: the leader
is killed with SIGKILL mid-trial, the standby takes the Lease over and finishes the
study; the trial cut short is Interrupted and retried, nothing lost or counted twice.
The API server's audit log shows that the standby wrote nothing but the Lease until it
held the Lease: each replica's requests carry its identity in their User-Agent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from batchpilot.operator.identity import user_agent
from batchpilot.operator.leader import DEFAULT_LEASE_NAME
from batchpilot.operator.status import INTERRUPTED_REASON

from . import audit, procs
from .conftest import Cluster, OperatorIdentity
from .operatorproc import OperatorProcess
from .scenario import (
    deploy_server,
    diagnostics,
    finished_trials,
    gap_free,
    wait_converged,
    wait_running_trial,
)
from .study import status as read_status
from .workloads import dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# short, so the failover is quick; the renew period is a third of it at most
LEASE_DURATION_S = 5
RENEW_PERIOD_S = 1.0
ELECTED_TIMEOUT_S = 60.0


def election_args(lease_namespace: str) -> list[str]:
    return [
        "--all-namespaces",
        "--liveness",
        "",
        "--metrics-port",
        "0",
        "--leader-election",
        "--lease-namespace",
        lease_namespace,
        f"--lease-duration={LEASE_DURATION_S}",
        f"--renew-period={RENEW_PERIOD_S}",
    ]


@pytest.fixture
def started_at() -> datetime:
    """Before the replicas start: the audit log is read from here on."""
    return datetime.now(UTC)


@pytest.fixture
def replicas(
    cluster: Cluster, operator_identity: OperatorIdentity, namespace: str, started_at: datetime
) -> Iterator[list[OperatorProcess]]:
    """Two `batchpilot operator --leader-election` processes with the manifests'
    ServiceAccount; on the way out one of them handles the test's finalizers."""
    args = election_args(operator_identity.namespace)
    processes = [
        OperatorProcess(
            operator_identity.kubeconfig, cluster.workdir / f"operator-{namespace}-{i}.log", args
        )
        for i in (0, 1)
    ]
    for process in processes:
        process.start()
    yield processes
    if not any(p.running() for p in processes):
        processes[0].start()
    cluster.kubectl.run(
        "delete", "inferenceservices", "--all", "-n", namespace, "--timeout=60s", check=False
    )
    for process in processes:
        process.stop()


def lease_holder(cluster: Cluster, namespace: str) -> str:
    return cluster.kubectl.run(
        "get",
        "lease",
        DEFAULT_LEASE_NAME,
        "-n",
        namespace,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        check=False,
    ).stdout.strip()


def leader_of(cluster: Cluster, namespace: str, processes: list[OperatorProcess]) -> int:
    """Which process holds the Lease: the one that logged leading under the holder's
    identity. Waits (bounded) for a holder that one of them claims."""
    deadline = time.monotonic() + ELECTED_TIMEOUT_S
    while time.monotonic() < deadline:
        holder = lease_holder(cluster, namespace)
        claims = [
            i
            for i, p in enumerate(processes)
            if p.running() and holder and f"leading as {holder} " in p.output(200_000)
        ]
        if len(claims) == 1:
            return claims[0]
        time.sleep(0.5)
    raise AssertionError(
        f"no replica leads (holder {lease_holder(cluster, namespace)!r})\n"
        + "\n".join(p.output() for p in processes)
    )


def _micro_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def check_standby_wrote_only_the_lease(
    cluster: Cluster,
    identity: OperatorIdentity,
    started_at: datetime,
    first: str,
    second: str,
) -> None:
    """From the API server's audit log: every write of the operator's ServiceAccount
    since `started_at` came from one of the two replicas (Kopf's client and the
    operator's own both say which), and `second` wrote nothing but the Lease before
    the API server had granted it the Lease."""
    if cluster.audit_log is None:
        print("no audit log on an existing cluster: the standby's writes are not checked")
        return
    writes = audit.writes(cluster.audit_log, user=identity.user, since=started_at)
    agents = {user_agent(first): first, user_agent(second): second}
    unnamed = [str(w) for w in writes if w.user_agent not in agents]
    assert not unnamed, "writes that name neither replica:\n" + "\n".join(unnamed)
    lease = cluster.kubectl.json(
        "get", "lease", DEFAULT_LEASE_NAME, "-n", identity.namespace, "-o", "json"
    )
    assert lease["spec"]["holderIdentity"] == second, lease["spec"]
    acquired = _micro_time(lease["spec"]["acquireTime"])
    by_second = [w for w in writes if w.user_agent == user_agent(second)]
    took_over = [
        w
        for w in by_second
        if w.on_lease and w.name == DEFAULT_LEASE_NAME and w.succeeded and w.received >= acquired
    ]
    assert took_over, (acquired, [str(w) for w in by_second])
    granted = took_over[0].completed
    early = [str(w) for w in by_second if not w.on_lease and w.received < granted]
    assert not early, (
        f"the standby wrote before its Lease (acquired {acquired.isoformat()}, granted "
        f"{granted.isoformat()}):\n" + "\n".join(early)
    )
    # not vacuous: the log holds the study's writes of each replica while it led
    for name, who in (("leader", first), ("standby", second)):
        studied = [
            w for w in writes if w.user_agent == user_agent(who) and w.subresource == "status"
        ]
        assert studied, f"no status write by the {name} {who} in the audit log"
    print(
        f"audit: {len(writes)} writes by the operator's ServiceAccount, "
        f"{len(by_second)} by the standby, none off the Lease before "
        f"{granted.isoformat()} (its Lease's acquireTime {acquired.isoformat()})"
    )


def test_leader_killed_mid_trial_standby_finishes_the_study(
    cluster: Cluster,
    namespace: str,
    operator_identity: OperatorIdentity,
    replicas: list[OperatorProcess],
    started_at: datetime,
) -> None:
    lease_namespace = operator_identity.namespace
    deploy_server(cluster, namespace)
    # two trials: the baseline, and the one killed (retried); Recommend spares the
    # write-back's rollout and watch, which the HA scenario is not about
    isvc = inference_service("ha", "server", method="Live", max_trials=2, write_back="Recommend")
    cluster.kubectl.apply(dump(isvc), "-n", namespace)

    killed = wait_running_trial(cluster, namespace, "ha", replicas[0], at_least=1)
    leader = leader_of(cluster, lease_namespace, replicas)
    old_holder = lease_holder(cluster, lease_namespace)
    replicas[leader].kill9()
    killed_at = time.monotonic()
    at_kill = read_status(cluster.kubectl, namespace, "ha")
    standby = replicas[1 - leader]
    assert leader_of(cluster, lease_namespace, replicas) == 1 - leader
    # what a failover costs, for the record (bounded by leader_of, not asserted)
    print(f"failover: the standby leads {time.monotonic() - killed_at:.1f} s after the kill")

    status = wait_converged(cluster, namespace, "ha", standby)
    assert status["phase"] == "Converged", diagnostics(cluster, standby)
    # the standby took the Lease over and finished the study
    new_holder = lease_holder(cluster, lease_namespace)
    assert new_holder not in ("", old_holder), (old_holder, new_holder)
    assert f"leading as {new_holder} " in standby.output(200_000)
    trials = status["trials"]
    # numbers without gaps or twins, and exactly maxTrials measured: nothing lost or
    # counted twice
    assert gap_free(status), [t["number"] for t in trials]
    assert len(finished_trials(status)) == 2, trials
    for before in finished_trials(at_kill):
        assert trials[before["number"]] == before
    # the trial cut short is Interrupted, not Failed, and retried next
    [interrupted] = [t for t in trials if t["number"] == killed]
    assert (interrupted["state"], interrupted["reason"]) == ("Interrupted", INTERRUPTED_REASON)
    [retry] = [t for t in trials if t["number"] == killed + 1]
    assert retry["params"] == interrupted["params"], (interrupted, retry)
    check_standby_wrote_only_the_lease(
        cluster, operator_identity, started_at, old_holder, new_holder
    )


def set_lease_holder(cluster: Cluster, namespace: str, holder: str | None) -> None:
    """Write the Lease as another party would, without its resourceVersion: the
    replica's next renewal conflicts, and its next read shows the new holder."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "leaseDurationSeconds": 60, "renewTime": stamp}
    cluster.kubectl(
        "patch",
        "lease",
        DEFAULT_LEASE_NAME,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": spec}),
    )


def test_a_leader_that_loses_the_lease_stops_and_exits(
    cluster: Cluster, namespace: str, operator_identity: OperatorIdentity
) -> None:
    """Kept running, a deposed leader's Kopf would go on writing to the resources it
    watches: it stops and exits instead, to stand by once restarted."""
    lease_namespace = operator_identity.namespace
    process = OperatorProcess(
        operator_identity.kubeconfig,
        cluster.workdir / f"operator-{namespace}.log",
        election_args(lease_namespace),
    )
    process.start()
    try:
        leader_of(cluster, lease_namespace, [process])
        set_lease_holder(cluster, lease_namespace, "another-replica")
        exited = procs.wait_until(lambda: not process.running(), timeout_s=6 * LEASE_DURATION_S)
        assert exited, process.output()
        assert process.proc is not None
        assert process.proc.returncode == 2, process.output()
        assert "lost the leader election" in process.output()
    finally:
        # released: the next test's replicas take it at once
        set_lease_holder(cluster, lease_namespace, None)
        process.stop()
