"""Scenarios c and d: the operator is killed with SIGKILL mid-trial and resumes the
study from its status (the trial cut short is Interrupted and retried, no failure); a
server pod crashes mid-trial and only that trial fails."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from batchpilot.operator.status import INTERRUPTED_REASON

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import (
    deploy_server,
    diagnostics,
    finished_trials,
    gap_free,
    pods,
    wait_converged,
    wait_running_trial,
)
from .study import status as read_status
from .workloads import dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def test_operator_killed_mid_trial_resumes(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deploy_server(cluster, namespace)
    isvc = inference_service("resume", "server", method="Live", max_trials=4)
    cluster.kubectl.apply(dump(isvc), "-n", namespace)

    killed = wait_running_trial(cluster, namespace, "resume", operator, at_least=1)
    operator.kill9()
    at_kill = read_status(cluster.kubectl, namespace, "resume")
    operator.start()

    status = wait_converged(cluster, namespace, "resume", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    trials = status["trials"]
    # Trial numbers have no gaps and no duplicates; nothing was lost or counted twice.
    assert gap_free(status), [t["number"] for t in trials]
    assert len(finished_trials(status)) == 4
    # What finished before the kill is kept as it was.
    for before in finished_trials(at_kill):
        assert trials[before["number"]] == before
    # The trial cut short is not left running: it is Interrupted, saying why, retried
    # next with the same configuration, and no failure toward tuning.maxFailures.
    [interrupted] = [t for t in trials if t["number"] == killed]
    assert interrupted["state"] == "Interrupted", interrupted
    assert interrupted["reason"] == INTERRUPTED_REASON, interrupted
    [retry] = [t for t in trials if t["number"] == killed + 1]
    assert retry["params"] == interrupted["params"], (interrupted, retry)
    assert operator.starts == 2


def test_server_pod_dies_mid_trial(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    if cluster.agent is None:
        pytest.skip("kills a container process of the local node agent")
    deploy_server(cluster, namespace)
    [pod] = pods(cluster, namespace, "app=server")
    # Recommend: a winner written back would roll the Deployment to a new pod, and the
    # pod that crashed and restarted is what the end of the scenario inspects.
    isvc = inference_service("crash", "server", method="Live", max_trials=3, write_back="Recommend")
    cluster.kubectl.apply(dump(isvc), "-n", namespace)

    crashed = wait_running_trial(cluster, namespace, "crash", operator, at_least=1)
    killed_at = datetime.now(UTC)
    cluster.agent.kill_container(namespace, pod["metadata"]["name"])

    status = wait_converged(cluster, namespace, "crash", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    [failed] = [t for t in status["trials"] if t["number"] == crashed]
    assert failed["state"] == "Failed", (
        f"killed at {killed_at:%H:%M:%S.%f}",
        status["trials"],
        diagnostics(cluster, operator),
    )
    assert failed["reason"], failed
    # The study went on after the crash and finished its trials on the restarted pod.
    assert any(t["number"] > crashed and t["state"] != "Failed" for t in status["trials"])
    assert len(finished_trials(status)) == 3
    assert gap_free(status)
    [after] = pods(cluster, namespace, "app=server")
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 1
