"""The pure parts of production safety: the pod matcher of the Prometheus source, the
scope a study's cleanup keeps, reverted environments, autoscalers, and trials retried
because something outside disturbed them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from testca import TEST_CA_PEM

from batchpilot.operator import decisions, promscope, scope, specdiff, writers
from batchpilot.operator.spec import explain_validation_error, parse_spec
from batchpilot.operator.status import TrialEntry
from batchpilot.tuner.study import INTERRUPTED, INVALID, replay_queue, retried


def test_the_pod_matcher_picks_exactly_the_measured_pods() -> None:
    assert promscope.pods_matcher(["b-2", "a-1", "a-1"]) == 'pod=~"a-1|b-2"'
    # a dot in a name is literal, as PromQL's string escapes spell it
    assert promscope.pods_matcher(["web.v1-0"]) == 'pod=~"web\\\\.v1-0"'
    assert promscope.scoped_selector('job="resnet"', ["p-0"]) == 'job="resnet",pod=~"p-0"'
    with pytest.raises(ValueError, match="no pods"):
        promscope.pods_matcher([])
    with pytest.raises(ValueError, match="not pod names"):
        promscope.pods_matcher(['x"}|or vector(1)'])
    # a scrape setup that relabels the pod's name into another label
    assert promscope.scoped_selector("", ["p-0"], "kubernetes_pod_name") == (
        'kubernetes_pod_name=~"p-0"'
    )


ENDPOINT = {"port": 8080, "path": "/v1/predict"}


@pytest.mark.parametrize("label", ["pod-name", "1pod", "__meta_kubernetes_pod_name", ""])
def test_the_pod_label_must_be_a_prometheus_label_name(label: str) -> None:
    prometheus = {"url": "http://prometheus:9090", "podLabel": label}
    with pytest.raises(ValidationError) as caught:
        spec(load={"endpoint": ENDPOINT, "maxRps": 1, "prometheus": prometheus})
    message = explain_validation_error(caught.value)
    assert "spec.load.prometheus.podLabel" in message
    if label:
        assert "must be a Prometheus label name" in message
        assert repr(label) in message
    assert spec().load.prometheus is None
    good = {"url": "http://prometheus:9090", "podLabel": "exported_pod"}
    parsed = spec(load={"endpoint": ENDPOINT, "maxRps": 1, "prometheus": good})
    assert parsed.load.prometheus.pod_label == "exported_pod"
    default = {"url": "http://prometheus:9090"}
    parsed = spec(load={"endpoint": ENDPOINT, "maxRps": 1, "prometheus": default})
    assert parsed.load.prometheus.pod_label == "pod"


def spec(**changes: Any) -> Any:
    raw: dict[str, Any] = {
        "target": {"name": "resnet", "container": "server"},
        "sla": {"p99LatencyMs": 300},
        "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 100},
        "tuning": {"strategy": "InPlace"},
    }
    raw.update(changes)
    return parse_spec(raw)


def test_cleanup_runs_under_the_spec_the_study_started_with() -> None:
    started = spec(apply={"method": "Env", "env": {"maxBatchSize": "BATCH"}})
    recorded = scope.scope_of(started)
    edited = spec(target={"name": "other"}, tuning={"strategy": "Canary"})
    cleanup = scope.cleanup_spec(edited, recorded)
    assert cleanup.target.name == "resnet"
    assert cleanup.target.container == "server"
    assert cleanup.tuning.strategy == "InPlace"
    assert cleanup.apply.env.max_batch_size == "BATCH"
    # unchanged: the spec itself; nothing recorded (an older study): the spec as it is
    assert scope.cleanup_spec(started, recorded) is started
    assert scope.cleanup_spec(edited, None) is edited
    with pytest.raises(scope.ScopeUnreadable):
        scope.cleanup_spec(edited, '{"target": 1}')


def test_a_large_valid_ca_bundle_is_recorded_with_the_scope() -> None:
    # a bundle of many certificates, up to the field's cap: the study must still start
    # (it used to stop at 8 KiB with a ValueError on every retry and write no status)
    count = 65536 // len(TEST_CA_PEM)
    bundle = TEST_CA_PEM * count
    assert 8192 < len(bundle) <= 65536
    endpoint = {"port": 8443, "path": "/v1/predict", "scheme": "https", "caBundle": bundle}
    started = spec(load={"endpoint": endpoint, "maxRps": 100})
    recorded = scope.scope_of(started)
    cleanup = scope.cleanup_spec(spec(target={"name": "other"}), recorded)
    assert cleanup.target.name == "resnet"
    assert cleanup.load.endpoint.ca_bundle == bundle


def test_an_invalid_spec_is_cleaned_up_under_the_recorded_one() -> None:
    started = spec(load={"endpoint": {"port": 9000, "path": "/p"}, "maxRps": 100})
    recorded = scope.scope_of(started)
    raw = started.model_dump(mode="json", by_alias=True)
    # only the recorded sections are wrong: the record puts them back, all else is kept
    bad_target = {**raw, "target": {"name": "Not A Name"}, "tuning": {"maxTrials": 7}}
    cleanup = scope.spec_from_scope(bad_target, recorded)
    assert cleanup.target.name == "resnet"
    assert cleanup.tuning.strategy == "InPlace"
    assert cleanup.tuning.max_trials == 7
    # wrong elsewhere: what cleanup reads comes from the record, valid sections from raw
    bad_space = {
        **raw,
        "target": {"name": "other"},
        "parameters": {"maxBatchSize": {"min": 64, "max": 8}},
        "load": {"endpoint": {"port": 1}, "stepSeconds": -1},
        "tuning": {"restoreDeadlineSeconds": 42},
    }
    cleanup = scope.spec_from_scope(bad_space, recorded)
    assert cleanup.target.name == "resnet"
    assert cleanup.load.endpoint.port == 9000
    assert cleanup.load.workers.max == started.load.workers.max
    assert cleanup.tuning.strategy == "InPlace"
    assert cleanup.tuning.restore_deadline_seconds == 42
    assert cleanup.sla == started.sla
    # a record written before load was kept, with spec.load invalid: nothing to go by
    older = '{"apply":{},"runtime":{},"strategy":"Canary","target":{"name":"resnet"}}'
    with pytest.raises(scope.ScopeUnreadable, match="no load"):
        scope.spec_from_scope(bad_space, older)


def pod(name: str, env: dict[str, str], *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "server", "env": [{"name": k, "value": v} for k, v in env.items()]}
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_pods_that_run_other_values_than_applied_are_named() -> None:
    wanted: dict[str, str | None] = {"MAX_BATCH_SIZE": "8", "EXTRA": None}
    assert writers.env_reverted([pod("a", {"MAX_BATCH_SIZE": "8"})], "server", wanted) is None
    message = writers.env_reverted(
        [pod("a", {"MAX_BATCH_SIZE": "8"}), pod("b", {"MAX_BATCH_SIZE": "32", "EXTRA": "1"})],
        "server",
        wanted,
    )
    assert message is not None
    assert "b runs MAX_BATCH_SIZE=32, EXTRA=1" in message
    assert "a runs" not in message
    # an unready pod (still starting, or on its way out) is not judged
    assert writers.env_reverted([pod("c", {}, ready=False)], "server", wanted) is None


def test_autoscalers_are_those_whose_scale_target_is_the_workload() -> None:
    def hpa(name: str, kind: str, target: str, api: str = "apps/v1") -> dict[str, Any]:
        ref = {"apiVersion": api, "kind": kind, "name": target}
        return {"metadata": {"name": name}, "spec": {"scaleTargetRef": ref}}

    items = [
        hpa("b", "Deployment", "resnet"),
        hpa("a", "Deployment", "resnet"),
        hpa("c", "StatefulSet", "resnet"),
        hpa("d", "Deployment", "web"),
        hpa("e", "Deployment", "resnet", api="example.com/v1"),
    ]
    assert writers.autoscalers_of(items, "Deployment", "resnet") == ["a", "b"]
    assert writers.replicas_of({"spec": {}}) == 1
    assert writers.replicas_of({"spec": {"replicas": 3}}) == 3


def entry(number: int, state: str, reason: str = "") -> TrialEntry:
    return TrialEntry.model_validate(
        {
            "number": number,
            "params": {"max_batch_size": number + 1, "max_queue_time_ms": 1.0},
            "source": "sampler",
            "state": state,
            "reason": reason,
        }
    )


def test_a_disturbed_trial_is_retried_and_counts_as_no_failure() -> None:
    disturbed = f"{INVALID}ScaledDuringTrial: Deployment resnet went from 1 to 2 replicas"
    assert retried(disturbed)
    assert retried(INTERRUPTED)
    assert not retried("CrashLoopBackOff: exit 1")
    trials = [entry(0, "Failed", "AdminUnreachable: x"), entry(1, "Failed", disturbed)]
    assert decisions.consecutive_failures(trials) == 1
    records = [decisions_record(t) for t in trials]
    queue = replay_queue([], records)
    assert list(queue) == [(dict(trials[1].params), "sampler")]


def decisions_record(t: TrialEntry) -> Any:
    from batchpilot.operator.trials import to_record

    return to_record(t)


def test_the_new_deadlines_do_not_restart_a_study() -> None:
    before = spec()
    after = spec(tuning={"strategy": "InPlace", "writeBackDeadlineSeconds": 60})
    assert not specdiff.restarts_study(before, after)
