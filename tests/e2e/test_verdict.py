"""Scenario: the target's own configuration is already the best there is to have, so
no challenger measures above it (nothing to confirm) or the confirmation after the
trials finds no significant gain; either way the study ends Converged with reason
NoSignificantGain and the target is never touched."""

from __future__ import annotations

import pytest

from batchpilot.tuner.runner import round_order

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import deploy_server, diagnostics, gap_free
from .study import events, wait_for
from .workloads import container_env, dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# Two trials (the baseline and the rule of thumb) and six confirmation measurements, each
# an Env rollout plus a capacity search: longer than the tier's usual study.
STUDY_TIMEOUT_S = 420.0
MIN_GAIN = 60


def test_an_already_best_target_stays_untouched_with_no_significant_gain(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # The server runs batch 16, wait 2 ms, the largest batch of a space whose wait is
    # fixed at 2 ms: on the reference server a batch costs little more than one request,
    # so every other point of the space serves less (a free wait could win for real on a
    # busy host, where a longer wait fills batches the short one dispatches part-full).
    deploy_server(cluster, namespace, max_batch_size=16, max_queue_time_ms=2.0)
    before = cluster.kubectl.json("get", "deployment", "server", "-n", namespace)
    isvc = inference_service(
        "keep", "server", strategy="Canary", batch_range=(8, 16), max_trials=2, finalists=1
    )
    isvc["spec"]["parameters"]["maxQueueTimeMs"] = {"min": 2, "max": 2}
    # A fixed count of rounds (no adaptive ones): the study stays inside the tier's time.
    # The searches stop at 30 % precision, so one measurement of the same capacity can
    # land a whole bracket above another: a margin under two brackets would let a loaded
    # host's noise pass for a gain.
    rounds = {"confirmRounds": 3, "maxConfirmRounds": 3, "minGainPercent": MIN_GAIN}
    isvc["spec"]["tuning"].update(rounds)
    cluster.kubectl.apply(dump(isvc), "-n", namespace)

    status = wait_for(
        cluster.kubectl,
        namespace,
        "keep",
        lambda s: s.get("phase") in ("Converged", "Failed"),
        what="finished",
        timeout_s=STUDY_TIMEOUT_S,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    assert gap_free(status)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    outcome = (ready["status"], ready["reason"])
    assert outcome == ("True", "NoSignificantGain"), diagnostics(cluster, operator)
    assert "the incumbent stays. NoSignificantGain" in status["message"]
    assert status["applied"] is False

    confirmation = status.get("confirmation")
    if confirmation is None:
        # Every challenger's ramp stopped below the incumbent's rate (pruned) or served
        # less: no finalist to confirm, the incumbent is the study's best.
        baseline = next(t for t in status["trials"] if t["source"] == "baseline")
        challengers = [t for t in status["trials"] if t["source"] != "baseline"]
        assert challengers, status["trials"]
        assert all(
            t["state"] != "Complete" or t["effectiveRps"] <= baseline["effectiveRps"]
            for t in challengers
        ), status["trials"]
        assert "no other configuration measured above the incumbent" in status["message"]
    else:
        # A challenger measured above it: the finalist and the incumbent, interleaved,
        # three rounds, and the gain's lower bound short of the margin.
        assert confirmation["incumbent"] == {"max_batch_size": 16, "max_queue_time_ms": 2.0}
        [finalist] = confirmation["finalists"]
        measured = confirmation["measurements"]
        # each round in its own order, drawn from tuning.seed (7) and the round
        pair = [finalist, confirmation["incumbent"]]
        assert [m["params"] for m in measured] == [
            p for r in range(3) for p in round_order(pair, r, 7)
        ]
        assert [m["round"] for m in measured] == [0, 0, 1, 1, 2, 2]
        baseline, best = status["baseline"], status["best"]
        assert baseline["maxBatchSize"] == 16
        low, high = baseline["effectiveRpsLow"], baseline["effectiveRpsHigh"]
        assert low <= baseline["effectiveRps"] <= high
        assert best["gainLowPercent"] < MIN_GAIN

    # The target is untouched: same template generation, same environment, no field
    # of it owned by the operator.
    after = cluster.kubectl.json(
        "get", "deployment", "server", "-n", namespace, "--show-managed-fields"
    )
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert container_env(after) == container_env(before)
    managers = {f["manager"] for f in after["metadata"].get("managedFields", [])}
    assert not any(m.startswith("batchpilot") for m in managers), managers
    deployments = cluster.kubectl.json("get", "deployments", "-n", namespace)["items"]
    canaries = [
        d["metadata"]["name"]
        for d in deployments
        if "batchpilot.dev/canary" in (d["metadata"].get("labels") or {})
        and not d["metadata"].get("deletionTimestamp")
    ]
    assert canaries == []

    reasons = [e["reason"] for e in events(cluster.kubectl, namespace, "keep")]
    assert reasons.count("NoSignificantGain") == 1, reasons
    assert ("Confirming" in reasons) == (confirmation is not None), reasons
    assert "Applied" not in reasons
    table = cluster.kubectl("get", "inferenceservices", "keep", "-n", namespace).splitlines()
    header = table[0].split()
    assert {"GAIN-%", "GAIN-LOW-%"} <= set(header), header
