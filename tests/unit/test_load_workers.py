"""Load-worker pods: the spec, the Job manifest, reading the pods, and the sizing rule."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.capacity.http import worker_failed_step
from batchpilot.loadgen.serve_worker import MAX_LATE_S, TOKEN_ENV, lateness_s
from batchpilot.models import CLIENT_MAX_CPU, ClientHealth, StepResult
from batchpilot.operator import workerjob
from batchpilot.operator.spec import WorkersSpec

OWNER: dict[str, Any] = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "web", "namespace": "prod", "uid": "u-1"},
}


def health(cpu: float) -> ClientHealth:
    return ClientHealth(
        lag_p99_ms=1, lag_max_ms=2, conn_wait_p99_ms=0, conn_wait_max_ms=0,
        loop_delay_max_ms=1, loop_delay_p99_ms=1, cpu=cpu,
    )  # fmt: skip


def step(rate: float, workers: list[float] | None = None, cpu: float = 0.5) -> StepResult:
    return StepResult(
        offered_rps=rate, achieved_rps=rate, p50_ms=1, p99_ms=2, error_rate=0, requests=100,
        passed=True, duration_s=5, client=health(cpu),
        worker_clients=[health(c) for c in workers or []],
    )  # fmt: skip


# --- the spec ---------------------------------------------------------------------------


def test_workers_default_to_the_operator_alone() -> None:
    spec = WorkersSpec()
    assert spec.max == 1
    assert spec.image is None
    assert spec.resources.requests.cpu == "1"
    assert spec.ttl_seconds_after_finished == 300


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"max": 0}, "greater than or equal to 1"),
        ({"max": 65}, "less than or equal to 64"),
        ({"tolerations": [{"operator": "Exists", "value": "x"}]}, "Exists takes no value"),
        ({"resources": {"requests": {"cpu": "lots"}}}, "should match pattern"),
        ({"ttlSecondsAfterFinished": -1}, "greater than or equal to 0"),
    ],
)
def test_bad_workers_specs_say_what_is_wrong(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        WorkersSpec.model_validate(given)


# --- the Job ----------------------------------------------------------------------------


def test_the_job_is_indexed_owned_and_has_no_api_rights() -> None:
    spec = WorkersSpec.model_validate(
        {
            "max": 4,
            "nodeSelector": {"pool": "load"},
            "tolerations": [{"key": "load", "operator": "Exists", "effect": "NoSchedule"}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}},
            "ttlSecondsAfterFinished": 60,
        }
    )
    name = workerjob.fleet_name("web", "prod", "u-1")
    job = workerjob.job_manifest(name, "prod", OWNER, workers=3, spec=spec, image="img:1")
    assert job["kind"] == "Job"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == name
    assert pod["nodeSelector"] == {"pool": "load"}
    assert pod["tolerations"] == [{"key": "load", "operator": "Exists", "effect": "NoSchedule"}]
    [container] = pod["containers"]
    assert container["image"] == "img:1"
    assert container["args"][0] == "load-worker"
    assert container["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}
    token = next(e for e in container["env"] if e["name"] == TOKEN_ENV)
    assert token["valueFrom"]["secretKeyRef"]["name"] == name
    account = workerjob.service_account_manifest(name, "prod", OWNER)
    assert account["automountServiceAccountToken"] is False
    secret = workerjob.secret_manifest(name, "prod", OWNER, "t0ken")
    assert secret["stringData"] == {workerjob.TOKEN_KEY: "t0ken"}
    assert secret["metadata"]["ownerReferences"] == job["metadata"]["ownerReferences"]


def test_fleet_names_fit_pod_names_and_differ_per_inference_service() -> None:
    long = workerjob.fleet_name("x" * 200, "prod", "u-1")
    assert len(long) <= workerjob.NAME_LIMIT
    assert workerjob.fleet_name("web", "prod", "u-1") != workerjob.fleet_name("web", "prod", "u-2")


def pod(index: int, ip: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": {workerjob.INDEX_ANNOTATION: str(index)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_worker_addresses_are_in_index_order_once_every_index_is_ready() -> None:
    pods = [pod(1, "10.0.0.2"), pod(0, "10.0.0.1")]
    assert workerjob.worker_addresses(pods, 2, port=81) == ["10.0.0.1:81", "10.0.0.2:81"]
    assert workerjob.worker_addresses([pod(0, "10.0.0.1")], 2) is None
    assert workerjob.worker_addresses([pod(0, "a"), pod(1, "b", ready=False)], 2) is None
    # a pod being replaced does not count; its successor does
    replaced = [pod(0, "a"), pod(1, "old", deleting=True), pod(1, "new")]
    assert workerjob.worker_addresses(replaced, 2, port=1) == ["a:1", "new:1"]


# --- sizing -----------------------------------------------------------------------------


def test_ceiling_comes_from_the_busiest_step_per_worker() -> None:
    steps = [step(100, [0.1, 0.1]), step(1000, [0.5, 0.4])]
    # 500 req/s per worker at half a core: ceiling at the CPU bound
    assert workerjob.worker_ceiling_rps(steps) == pytest.approx(500 / 0.5 * CLIENT_MAX_CPU)
    # one process (no worker_clients): its own health
    assert workerjob.worker_ceiling_rps([step(300, cpu=0.3)]) == pytest.approx(
        1000 * CLIENT_MAX_CPU
    )
    assert workerjob.worker_ceiling_rps([step(300, cpu=0.0)]) is None
    assert workerjob.worker_ceiling_rps([]) is None


def test_no_worker_runs_above_60_percent_of_its_ceiling() -> None:
    assert workerjob.workers_needed(6000, 10_000, 8) == 1
    assert workerjob.workers_needed(6001, 10_000, 8) == 2
    assert workerjob.workers_needed(100_000, 10_000, 8) == 8  # capped at max
    assert workerjob.workers_needed(100_000, 10_000, 1) == 1
    for top in (1.0, 5_000.0, 59_999.0, 60_000.0):
        n = workerjob.workers_needed(top, 10_000, 64)
        assert top / n <= workerjob.TARGET_UTILISATION * 10_000
        assert n == 1 or top / (n - 1) > workerjob.TARGET_UTILISATION * 10_000


def test_unknown_figures_take_every_worker_allowed() -> None:
    assert workerjob.workers_needed(None, 10_000, 3) == 3
    assert workerjob.workers_needed(5_000, None, 3) == 3


def test_the_highest_rate_is_the_budget_else_twice_the_best() -> None:
    assert workerjob.highest_search_rps(2_000, 5_000) == 2_000
    assert workerjob.highest_search_rps(None, 5_000) == 10_000
    assert workerjob.highest_search_rps(None, None) is None
    assert workerjob.highest_search_rps(None, 0.0) is None


# --- a worker that did not deliver ------------------------------------------------------


def test_a_failed_worker_makes_the_step_invalid_never_passed() -> None:
    failed = worker_failed_step(800, 5, "load worker 1 (10.0.0.2:8070): reset")
    assert not failed.passed
    assert not failed.valid
    assert failed.offered_rps == 800
    assert "load worker 1" in failed.reason


def test_lateness_is_measured_from_the_schedules_zero() -> None:
    assert lateness_s(100.0, 99.0) < 0
    assert lateness_s(100.0, 100.0 + MAX_LATE_S) == MAX_LATE_S
