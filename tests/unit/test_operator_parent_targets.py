"""Parent targets (KServe InferenceService, RayService): the spec's rules for them and
the pure functions that find their pods and build the writes to the parent."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from batchpilot.operator import parents
from batchpilot.operator.spec import InferenceServiceSpec, TargetRef, parse_spec

NOW = datetime(2026, 1, 1, tzinfo=UTC)
KSERVE = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "bert"}
RAY = {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "ranker"}


def spec(target: dict[str, Any], **sections: Any) -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": target,
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8000, "path": "/"}, "maxRps": 1000},
            **sections,
        }
    )


IN_PLACE = {"tuning": {"strategy": "InPlace"}}
LIVE = {"apply": {"method": "Live", "live": {"port": 8000, "path": "/admin/batching"}}}


# --- the spec ------------------------------------------------------------------------


def test_existing_targets_keep_their_default_api_version() -> None:
    target = spec({"name": "resnet"}).target
    assert (target.api_version, target.kind, target.is_parent) == ("apps/v1", "Deployment", False)
    assert spec(KSERVE, **IN_PLACE).target.is_parent


@pytest.mark.parametrize(
    ("target", "phrase"),
    [
        ({"kind": "RayService", "name": "x"}, "must be one of: apps/v1 Deployment"),
        ({"apiVersion": "ray.io/v1", "kind": "Deployment", "name": "x"}, "must be one of"),
        ({**RAY, "container": "ray-head"}, "target.container does not apply to a RayService"),
        ({**KSERVE, "serveDeployment": "app"}, "serveDeployment applies to a RayService"),
        ({**RAY, "serveDeployment": "a/b/c"}, "String should match pattern"),
    ],
)
def test_target_combinations_that_make_no_sense_are_refused(
    target: dict[str, Any], phrase: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        TargetRef.model_validate(target)
    assert phrase in str(caught.value)


@pytest.mark.parametrize(
    ("target", "sections", "phrase"),
    [
        (KSERVE, {}, "needs tuning.strategy InPlace"),
        (RAY, LIVE, "needs tuning.strategy InPlace"),
        (RAY, IN_PLACE, "a RayService target needs apply.method Live"),
    ],
)
def test_parent_needs_in_place_and_ray_needs_live(
    target: dict[str, Any], sections: dict[str, Any], phrase: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(target, **sections)
    assert phrase in str(caught.value)
    assert spec(target, **IN_PLACE, **LIVE).target.kind == target["kind"]


# --- paths and pods --------------------------------------------------------------------


def test_paths_of_parents_and_workloads() -> None:
    assert (
        parents.target_path(spec(KSERVE, **IN_PLACE).target, "ml")
        == "/apis/serving.kserve.io/v1beta1/namespaces/ml/inferenceservices/bert"
    )
    assert (
        parents.target_path(spec(RAY, **IN_PLACE, **LIVE).target, "ml")
        == "/apis/ray.io/v1/namespaces/ml/rayservices/ranker"
    )
    assert (
        parents.target_path(spec({"name": "w"}).target, "ml")
        == "/apis/apps/v1/namespaces/ml/deployments/w"
    )


def rayservice(serve_config: str, cluster: str | None = "ranker-raycluster-abc") -> dict[str, Any]:
    status = {"activeServiceStatus": {"rayClusterName": cluster}} if cluster else {}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "ranker", "namespace": "ml"},
        "spec": {"serveConfigV2": serve_config},
        "status": status,
    }


SERVE = """\
applications:
  - name: ranker
    import_path: app:graph
    deployments:
      - name: Ranker
        num_replicas: 2
        user_config:
          max_batch_size: 8
          batch_wait_timeout_s: 0.01
          threshold: 0.5
"""


def test_pod_selectors_follow_the_parent() -> None:
    isvc = {"kind": "InferenceService", "metadata": {"name": "bert"}}
    assert (
        parents.pod_selector(isvc) == "serving.kserve.io/inferenceservice=bert,component=predictor"
    )
    assert (
        parents.pod_selector(rayservice(SERVE))
        == "ray.io/cluster=ranker-raycluster-abc,ray.io/serve=true"
    )
    with pytest.raises(parents.ParentProblem) as caught:
        parents.pod_selector(rayservice(SERVE, cluster=None))
    assert caught.value.reason == "NoActiveRayCluster"


def test_the_head_of_the_active_ray_cluster_is_where_serves_rest_api_is() -> None:
    assert (
        parents.head_selector(rayservice(SERVE))
        == "ray.io/cluster=ranker-raycluster-abc,ray.io/node-type=head"
    )
    head = {"metadata": {"name": "h", "labels": {"ray.io/node-type": "head"}}}
    worker = {"metadata": {"name": "w", "labels": {"ray.io/node-type": "worker"}}}
    assert parents.head_pods([worker, head, {"metadata": {"name": "bare"}}]) == [head]
    with pytest.raises(parents.ParentProblem) as caught:
        parents.head_selector(rayservice(SERVE, cluster=None))
    assert caught.value.reason == "NoActiveRayCluster"


def pod(env: dict[str, str], *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "uid": "u"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "containers": [
                {
                    "name": "kserve-container",
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_rollout_is_judged_by_what_the_pods_run() -> None:
    wanted = {"MAX_BATCH_SIZE": "8", "MAX_QUEUE_TIME_MS": None}
    new = {"MAX_BATCH_SIZE": "8"}
    old = {"MAX_BATCH_SIZE": "4", "MAX_QUEUE_TIME_MS": "5"}
    c = parents.KSERVE_CONTAINER
    assert not parents.pods_rollout([], c, wanted).done
    assert "another environment" in parents.pods_rollout([pod(old)], c, wanted).message
    assert (
        "terminating"
        in parents.pods_rollout([pod(new), pod(old, deleting=True)], c, wanted).message
    )
    assert "0 of 1 pods ready" in parents.pods_rollout([pod(new, ready=False)], c, wanted).message
    assert parents.pods_rollout([pod(new), pod(new)], c, wanted).done
    assert parents.pods_rollout([pod(old)], c, None).done  # no env written: readiness only


# --- KServe: the predictor's environment -----------------------------------------------


def isvc(predictor: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "bert", "namespace": "ml"},
        "spec": {"predictor": predictor},
    }


TRITON = isvc(
    {
        "minReplicas": 1,
        "triton": {
            "storageUri": "gs://models/bert",
            "env": [
                {"name": "OMP_NUM_THREADS", "value": "4"},
                {"name": "MAX_BATCH_SIZE", "value": "16"},
            ],
        },
    }
)
CUSTOM = isvc(
    {
        "containers": [
            {"name": "sidecar", "image": "proxy:1"},
            {
                "name": "server",
                "image": "server:1",
                "env": [{"name": "MAX_QUEUE_TIME_MS", "value": "3"}],
            },
        ]
    }
)


def test_framework_predictor_is_patched_in_its_own_field() -> None:
    slot = parents.predictor_slot(TRITON, None)
    assert (slot.field, slot.container) == ("triton", "kserve-container")
    body = parents.kserve_env_patch(
        TRITON, slot, {"MAX_BATCH_SIZE": "8", "MAX_QUEUE_TIME_MS": "12.5"}
    )
    assert body == {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "bert", "namespace": "ml"},
        "spec": {
            "predictor": {
                "triton": {
                    "env": [
                        {"name": "OMP_NUM_THREADS", "value": "4"},
                        {"name": "MAX_BATCH_SIZE", "value": "8"},
                        {"name": "MAX_QUEUE_TIME_MS", "value": "12.5"},
                    ]
                }
            }
        },
    }
    with pytest.raises(parents.ParentProblem) as caught:
        parents.predictor_slot(TRITON, "server")
    assert caught.value.reason == "ContainerNotFound"


def test_custom_containers_are_written_whole_with_one_env_changed() -> None:
    slot = parents.predictor_slot(CUSTOM, "server")
    assert (slot.field, slot.index, slot.container) == ("containers", 1, "server")
    body = parents.kserve_env_patch(
        CUSTOM, slot, {"MAX_BATCH_SIZE": "8", "MAX_QUEUE_TIME_MS": None}
    )
    containers = body["spec"]["predictor"]["containers"]
    # an atomic list is replaced by what is sent: every container goes, unchanged but one
    assert containers[0] == {"name": "sidecar", "image": "proxy:1"}
    assert containers[1] == {
        "name": "server",
        "image": "server:1",
        "env": [{"name": "MAX_BATCH_SIZE", "value": "8"}],
    }
    assert CUSTOM["spec"]["predictor"]["containers"][1]["env"] == [
        {"name": "MAX_QUEUE_TIME_MS", "value": "3"}
    ]  # the object read is not changed
    assert parents.predictor_slot(CUSTOM, None).container == "sidecar"
    with pytest.raises(parents.ParentProblem):
        parents.predictor_slot(isvc({}), None)


def test_kserve_original_reads_the_predictor_env() -> None:
    s = spec({**KSERVE, "container": "server"}, **IN_PLACE)
    original = parents.kserve_original(CUSTOM, s, NOW)
    assert original.env == {"MAX_BATCH_SIZE": None, "MAX_QUEUE_TIME_MS": "3"}
    assert original.params == {}  # one knob unset: the server's default is invisible
    full = parents.kserve_original(TRITON, spec(KSERVE, **IN_PLACE), NOW)
    assert full.env == {"MAX_BATCH_SIZE": "16", "MAX_QUEUE_TIME_MS": None}


# --- RayService: serveConfigV2 ----------------------------------------------------------


def ray_spec(**target: Any) -> InferenceServiceSpec:
    return spec({**RAY, **target}, **IN_PLACE, **LIVE)


def test_ray_original_and_write_back_keep_the_other_user_config_keys() -> None:
    service = rayservice(SERVE)
    s = ray_spec()
    original = parents.ray_original(service, s, NOW)
    assert original.params == {"max_batch_size": 8, "max_queue_time_ms": 10.0}
    assert original.env == {"max_batch_size": "8", "batch_wait_timeout_s": "0.01"}
    values = parents.user_config_values({"max_batch_size": 32, "max_queue_time_ms": 25.0})
    assert values == {"max_batch_size": 32, "batch_wait_timeout_s": 0.025}
    body = parents.ray_user_config_patch(service, s.target, values)
    assert body is not None
    assert body["metadata"] == {"name": "ranker", "namespace": "ml"}
    written = yaml.safe_load(body["spec"]["serveConfigV2"])
    deployment = written["applications"][0]["deployments"][0]
    assert deployment == {
        "name": "Ranker",
        "num_replicas": 2,
        "user_config": {"max_batch_size": 32, "batch_wait_timeout_s": 0.025, "threshold": 0.5},
    }
    assert written["applications"][0]["import_path"] == "app:graph"
    # restoring the original onto the written service gives the original values back
    after = rayservice(body["spec"]["serveConfigV2"])
    back = parents.ray_user_config_patch(after, s.target, parents.ray_restore_values(original))
    assert back is not None
    assert yaml.safe_load(back["spec"]["serveConfigV2"]) == yaml.safe_load(SERVE)
    # values already in place: nothing to write
    assert parents.ray_user_config_patch(service, s.target, {"max_batch_size": 8}) is None


def test_ray_restore_removes_keys_that_were_absent() -> None:
    bare = SERVE.replace("        user_config:\n", "        unused:\n")
    service = rayservice(bare)
    original = parents.ray_original(service, ray_spec(), NOW)
    assert original.params == {}
    assert original.env == {"max_batch_size": None, "batch_wait_timeout_s": None}
    body = parents.ray_user_config_patch(
        service,
        ray_spec().target,
        parents.user_config_values({"max_batch_size": 4, "max_queue_time_ms": 1.0}),
    )
    assert body is not None
    back = parents.ray_user_config_patch(
        rayservice(body["spec"]["serveConfigV2"]),
        ray_spec().target,
        parents.ray_restore_values(original),
    )
    assert back is not None
    restored = yaml.safe_load(back["spec"]["serveConfigV2"])
    assert "user_config" not in restored["applications"][0]["deployments"][0]


TWO_APPS = """\
applications:
  - name: a
    deployments: [{name: A1}, {name: A2}]
  - name: b
    deployments: [{name: B1, user_config: {max_batch_size: 2, batch_wait_timeout_s: 0}}]
"""


def test_serve_deployment_names_the_one_to_tune() -> None:
    service = rayservice(TWO_APPS)
    with pytest.raises(parents.ParentProblem) as caught:
        parents.user_config_of(service, ray_spec().target)
    assert caught.value.reason == "ServeDeploymentAmbiguous"
    assert "name one in target.serveDeployment" in caught.value.message
    assert parents.user_config_of(service, ray_spec(serveDeployment="b").target) == {
        "max_batch_size": 2,
        "batch_wait_timeout_s": 0,
    }
    with pytest.raises(parents.ParentProblem) as caught:
        parents.user_config_of(service, ray_spec(serveDeployment="a").target)
    assert "name one as APP/DEPLOYMENT" in caught.value.message
    assert parents.user_config_of(service, ray_spec(serveDeployment="a/A2").target) == {}
    with pytest.raises(parents.ParentProblem) as caught:
        parents.user_config_of(service, ray_spec(serveDeployment="c").target)
    assert caught.value.reason == "ServeDeploymentNotFound"
    with pytest.raises(parents.ParentProblem) as caught:
        parents.user_config_of(rayservice("just: text"), ray_spec().target)
    assert caught.value.reason == "ServeConfigInvalid"
    with pytest.raises(parents.ParentProblem) as caught:
        parents.user_config_of(rayservice(""), ray_spec().target)
    assert caught.value.reason == "ServeConfigMissing"


def test_extra_parameters_go_under_their_own_names() -> None:
    s = parse_spec(
        {
            "target": RAY,
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8000, "path": "/"}, "maxRps": 1000},
            "parameters": {"extra": [{"name": "threshold", "kind": "float", "min": 0, "max": 1}]},
            **IN_PLACE,
            **LIVE,
        }
    )
    original = parents.ray_original(rayservice(SERVE), s, NOW)
    assert original.params == {"max_batch_size": 8, "max_queue_time_ms": 10.0, "threshold": 0.5}
    assert original.env["threshold"] == "0.5"
