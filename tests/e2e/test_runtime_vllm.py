"""A token-streaming engine through the operator on the real control plane: vLLM's CPU
build in a pod (runtime VLLM, apply.method Env), its batch cap a start-up option the
pod's command line reads from a variable, so every trial is a rollout. The study runs on
streamed completions under TTFT and TPOT targets, searches the batch cap alone (the
queue wait pinned at 0: continuous batching has none), verifies every rollout on the
engine's own gauge of running sequences, converges, and writes the best
cap back into the Deployment without any queue-wait variable; its status shows each
trial's TTFT and TPOT p99."""

from __future__ import annotations

import pytest

from batchpilot.runtimes.vllm.process import engine_dir
from runtimes.support import require_engine

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import diagnostics, finished_trials, gap_free
from .study import wait_for
from .workloads import container_env, dump, vllm_deployment, vllm_inference_service

# an engine start is about a minute of two shared cores; a study holds three of them
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
STUDY_TIMEOUT_S = 900.0


def test_vllm_rollout_study_on_token_targets(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    require_engine(engine_dir() / "bin" / "python")
    cluster.kubectl.apply(dump(vllm_deployment("llm")), "-n", namespace)
    cluster.kubectl("rollout", "status", "deployment/llm", "-n", namespace, "--timeout=400s")

    cluster.kubectl.apply(dump(vllm_inference_service("tune-llm", "llm")), "-n", namespace)
    status = wait_for(
        cluster.kubectl,
        namespace,
        "tune-llm",
        lambda s: s.get("phase") in ("Converged", "Failed"),
        what="finished",
        timeout_s=STUDY_TIMEOUT_S,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    assert gap_free(status)
    trials = finished_trials(status)
    assert len(trials) == 2, diagnostics(cluster, operator)

    # the baseline is the cap the Deployment ran, the wait 0: vLLM has none
    baseline = status["trials"][0]
    assert baseline["source"] == "baseline"
    assert baseline["params"] == {"max_batch_size": 4, "max_queue_time_ms": 0.0}
    assert all(t["params"]["max_queue_time_ms"] == 0.0 for t in trials)
    assert trials[1]["params"]["max_batch_size"] != 4
    assert all(t["state"] == "Complete" for t in trials), diagnostics(cluster, operator)
    # every rollout was verified on the engine itself: its gauge of running sequences
    # under a burst beyond the cap (a trial it failed would be EnvIgnored)
    unverified = cluster.kubectl.json(
        "get", "events", "-n", namespace, "--field-selector", "reason=EnvUnverified"
    )["items"]
    assert not unverified, [e["message"] for e in unverified]
    assert all(t["effectiveRps"] > 0 for t in trials)
    # each trial shows the tails it was judged on, and the best its own
    assert all(t["ttftP99Ms"] > 0 and t["tpotP99Ms"] > 0 for t in trials)
    assert status["best"]["ttftP99Ms"] > 0

    # the best cap is what the Deployment now carries, and no queue-wait variable
    best = status["best"]["maxBatchSize"]
    workload = cluster.kubectl.json("get", "deployment", "llm", "-n", namespace)
    env = container_env(workload)
    assert env["MAX_BATCH_SIZE"] == str(best)
    assert "MAX_QUEUE_TIME_MS" not in env
