"""Scenario: the user caps the load generator at two connections (load.maxConnections,
e.g. to protect production) and the target holds every request for its batch wait, so
the search's ramp soon needs more requests in flight than the cap allows. Requests wait
for a slot, the step is the client's limit, and the trial ends Complete with its score
as a lower bound: ClientBound in its status and its event, never the server's failure.

Deterministic on a loaded host: two connections each busy a whole batch wait carry at
most about 2 / 60 ms ≈ 33 req/s whatever the host does (Little's law), and a batch that
never fills (2 requests < batch 16) costs the server next to nothing, so it cannot be the
limit; a busier host only lowers the rate where the cap binds."""

from __future__ import annotations

import pytest

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import deploy_server, diagnostics, finished_trials, wait_converged
from .study import events
from .workloads import dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CAP = 2
WAIT_MS = 60


def test_a_capped_client_reports_the_trial_client_bound(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deploy_server(cluster, namespace, max_batch_size=16, max_queue_time_ms=WAIT_MS)
    isvc = inference_service(
        "capped", "server", method="Live", write_back="Recommend", max_trials=1,
        batch_range=(16, 16),
    )  # fmt: skip
    isvc["spec"]["parameters"]["maxQueueTimeMs"] = {"min": WAIT_MS, "max": WAIT_MS}
    load = isvc["spec"]["load"]
    load["maxConnections"] = CAP
    load["arrival"] = {"process": "Constant"}
    # a few dozen req/s cannot fill the default 2,000 requests a step: judge plain p99s
    load["minRequests"] = 0
    load["stepSeconds"] = 2
    cluster.kubectl.apply(dump(isvc), "-n", namespace)
    status = wait_converged(cluster, namespace, "capped", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)

    [trial] = finished_trials(status)
    assert trial["state"] == "Complete", trial  # scored, as a lower bound
    assert trial["clientBound"] is True, trial
    assert trial["reason"].startswith("ClientBound: capacity ≥ "), trial
    assert f"one of the {CAP} connections the client is allowed" in trial["reason"], trial
    # the cap, not the server, bounded the rate: never above what two connections carry
    assert 0.0 < trial["effectiveRps"] <= CAP * 1000.0 / WAIT_MS * 1.1, trial

    messages = [
        e["message"] for e in events(cluster.kubectl, namespace, "capped") if e["reason"] == "Trial"
    ]
    assert len(messages) == 1, messages
    assert "req/s" in messages[0]
    assert "; ClientBound: capacity ≥ " in messages[0], messages
