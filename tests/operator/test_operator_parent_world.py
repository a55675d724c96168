"""ParentWorld against KMock: a KServe InferenceService and a RayService as targets. The
pods are found through the parent, every write goes to the parent by server-side apply,
and the child Deployment their controller owns is never written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
import yaml
from aiohttp import web
from kmock import ResourceInfo

from batchpilot.operator import decisions
from batchpilot.operator.handlers import kube_world
from batchpilot.operator.kube import FIELD_MANAGER, Connection, Kube
from batchpilot.operator.neighbours import kserve_predictor_names
from batchpilot.operator.parentworld import ParentWorld
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec
from batchpilot.operator.world import TargetProblem

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]

NS = "ns1"
ISVCS = "serving.kserve.io/v1beta1/inferenceservices"
RAYSERVICES = "ray.io/v1/rayservices"
DEPLOYMENTS = "apps/v1/deployments"
PODS = "v1/pods"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "tuner", "uid": "uid-1"},
}


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    kmock.resources[ISVCS] = ResourceInfo(kind="InferenceService", namespaced=True)
    kmock.resources[RAYSERVICES] = ResourceInfo(kind="RayService", namespaced=True)
    kmock.resources[DEPLOYMENTS] = ResourceInfo(kind="Deployment", namespaced=True)
    kmock.resources[PODS] = ResourceInfo(kind="Pod", namespaced=True)
    # the operator's own resources: a world checks that it is the target's only tuner
    kmock.resources["batchpilot.dev/v1alpha1/inferenceservices"] = ResourceInfo(
        kind="InferenceService", namespaced=True
    )
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


def world(kube: Kube, spec: InferenceServiceSpec) -> ParentWorld:
    async def on_problem(problem: decisions.PodProblem) -> None:
        pass

    return ParentWorld(
        kube, spec=spec, namespace=NS, owner=OWNER, on_problem=on_problem, poll_s=0.01
    )


def pod(name: str, labels: dict[str, str], env: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "kserve-container"}
    if env is not None:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels, "uid": name},
        "spec": {"containers": [container]},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def child_deployment(name: str, owner_kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": NS,
            "ownerReferences": [{"kind": owner_kind, "name": "parent", "controller": True}],
        },
        "spec": {"template": {"spec": {"containers": [{"name": "kserve-container"}]}}},
    }


def untouched_children(k: kmock.KubernetesEmulator) -> bool:
    """Not one write went to a Deployment: the parent's controller owns it. The only
    reads are of KServe's predictor Deployments by name, to learn whether another
    InferenceService tunes them under that name (one tuner per target)."""
    every = [r for method in ("get", "post", "put", "patch", "delete") for r in k[method]]
    assert every
    touched = [r for r in every if r.resource is not None and r.resource.plural == "deployments"]
    allowed = set(kserve_predictor_names("bert"))
    return all(r.method.name == "GET" and r.name in allowed for r in touched)


def pod_selectors(k: kmock.KubernetesEmulator) -> set[str]:
    """The label selectors the pods were listed with (KMock itself does not filter)."""
    return {
        str(r.params.get("labelSelector"))
        for r in k["get"]
        if r.resource is not None and r.resource.plural == "pods"
    }


def applies_to(k: kmock.KubernetesEmulator, plural: str) -> list[Any]:
    return [r for r in k["patch"] if r.resource is not None and r.resource.plural == plural]


# --- KServe -------------------------------------------------------------------------------

KSERVE_LABELS = {"serving.kserve.io/inferenceservice": "bert", "component": "predictor"}


def kserve_isvc() -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "bert", "namespace": NS, "generation": 1},
        "spec": {
            "predictor": {
                "triton": {
                    "storageUri": "s3://models/bert",
                    "env": [
                        {"name": "OMP_NUM_THREADS", "value": "4"},
                        {"name": "MAX_BATCH_SIZE", "value": "16"},
                    ],
                }
            }
        },
    }


def kserve_spec() -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {
                "apiVersion": "serving.kserve.io/v1beta1",
                "kind": "InferenceService",
                "name": "bert",
            },
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/v2/models/bert/infer"}, "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )


async def kserve_controller(k: kmock.KubernetesEmulator, rolled: list[dict[str, Any]]) -> None:
    """KServe's part, as far as the operator sees it: after each write to the
    InferenceService, the predictor pod is replaced by one running its new env."""
    seen = 0
    while True:
        patches = applies_to(k, "inferenceservices")
        if len(patches) > seen:
            seen = len(patches)
            env = k.objects[ISVCS, NS, "bert"].raw["spec"]["predictor"]["triton"]["env"]
            values = {e["name"]: e["value"] for e in env}
            rolled.append(values)
            k.objects[PODS, NS, "bert-predictor-1"] = pod("bert-predictor-1", KSERVE_LABELS, values)
        await asyncio.sleep(0.01)


async def test_kserve_env_goes_to_the_predictor_and_the_pods_are_awaited(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[ISVCS, NS, "bert"] = kserve_isvc()
    kmock.objects[DEPLOYMENTS, NS, "bert-predictor"] = child_deployment(
        "bert-predictor", "InferenceService"
    )
    kmock.objects[PODS, NS, "bert-predictor-1"] = pod(
        "bert-predictor-1", KSERVE_LABELS, {"OMP_NUM_THREADS": "4", "MAX_BATCH_SIZE": "16"}
    )
    w = world(kube, kserve_spec())
    original = await w.target.record_original(NOW)
    assert original.env == {"MAX_BATCH_SIZE": "16", "MAX_QUEUE_TIME_MS": None}
    assert await w.canary.prepare(None) is None

    rolled: list[dict[str, Any]] = []
    controller = asyncio.create_task(kserve_controller(kmock, rolled))
    try:
        await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 12.5})
        # apply returned only once the pod ran the new env: KServe's stand-in made it
        assert rolled == [
            {"OMP_NUM_THREADS": "4", "MAX_BATCH_SIZE": "8", "MAX_QUEUE_TIME_MS": "12.5"}
        ]
        await w.target.write_back({"max_batch_size": 32, "max_queue_time_ms": 5.0})
        await w.target.restore(original)
    finally:
        controller.cancel()

    patches = applies_to(kmock, "inferenceservices")
    assert len(patches) == 3
    first = patches[0]
    assert first.headers["Content-Type"] == "application/apply-patch+yaml"
    assert first.params == {"fieldManager": f"{FIELD_MANAGER}/tuner", "force": "true"}
    assert first.data["apiVersion"] == "serving.kserve.io/v1beta1"
    assert first.data["spec"] == {
        "predictor": {
            "triton": {
                "env": [
                    {"name": "OMP_NUM_THREADS", "value": "4"},
                    {"name": "MAX_BATCH_SIZE", "value": "8"},
                    {"name": "MAX_QUEUE_TIME_MS", "value": "12.5"},
                ]
            }
        }
    }
    written = patches[1].data["spec"]["predictor"]["triton"]["env"]
    assert {"name": "MAX_BATCH_SIZE", "value": "32"} in written
    # restore: the original value back, the variable that was unset removed again
    assert patches[2].data["spec"]["predictor"]["triton"]["env"] == [
        {"name": "OMP_NUM_THREADS", "value": "4"},
        {"name": "MAX_BATCH_SIZE", "value": "16"},
    ]
    assert kmock.objects[ISVCS, NS, "bert"].raw["spec"]["predictor"]["triton"]["storageUri"]
    assert pod_selectors(kmock) == {"serving.kserve.io/inferenceservice=bert,component=predictor"}
    assert untouched_children(kmock)


async def test_kserve_missing_target_and_container_are_target_problems(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    w = world(kube, kserve_spec())
    with pytest.raises(TargetProblem) as caught:
        await w.target.record_original(NOW)
    assert caught.value.reason == "TargetNotFound"
    kmock.objects[ISVCS, NS, "bert"] = {**kserve_isvc(), "spec": {"predictor": {}}}
    with pytest.raises(TargetProblem) as caught:
        await w.target.record_original(NOW)
    assert caught.value.reason == "ContainerNotFound"


# --- RayService ---------------------------------------------------------------------------

SERVE = """\
applications:
  - name: ranker
    import_path: app:graph
    deployments:
      - name: Ranker
        user_config:
          max_batch_size: 8
          batch_wait_timeout_s: 0.01
"""


def rayservice() -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "ranker", "namespace": NS, "generation": 1},
        "spec": {"serveConfigV2": SERVE},
        "status": {
            "activeServiceStatus": {"rayClusterName": "ranker-abc"},
            "pendingServiceStatus": {"rayClusterName": "ranker-def"},
        },
    }


class AdminServer:
    """A pod's admin endpoint (GET and PUT of the knobs), recording what it was sent."""

    def __init__(self) -> None:
        self.values: dict[str, float | int] = {"max_batch_size": 8, "max_queue_time_ms": 10.0}
        self.puts: list[dict[str, Any]] = []

    async def get(self, _: web.Request) -> web.Response:
        return web.json_response(self.values)

    async def put(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.puts.append(body)
        self.values.update(body)
        return web.json_response(self.values)


@pytest.fixture
async def admin() -> AsyncIterator[tuple[AdminServer, int]]:
    server = AdminServer()
    app = web.Application()
    app.router.add_get("/admin/batching", server.get)
    app.router.add_put("/admin/batching", server.put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield server, port
    await runner.cleanup()


def ray_spec(port: int) -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "ranker"},
            "sla": {"p99LatencyMs": 300},
            "apply": {"method": "Live", "live": {"port": port, "path": "/admin/batching"}},
            "load": {"endpoint": {"port": 8000, "path": "/"}, "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )


async def test_rayservice_trials_are_live_and_the_winner_goes_to_serve_config(
    kmock: kmock.KubernetesEmulator, kube: Kube, admin: tuple[AdminServer, int]
) -> None:
    server, port = admin
    kmock.objects[RAYSERVICES, NS, "ranker"] = rayservice()
    serving = {"ray.io/cluster": "ranker-abc", "ray.io/serve": "true"}
    kmock.objects[PODS, NS, "ranker-abc-head"] = pod("ranker-abc-head", serving)
    w = world(kube, ray_spec(port))

    original = await w.target.record_original(NOW)
    assert original.params == {"max_batch_size": 8, "max_queue_time_ms": 10.0}
    assert original.env == {"max_batch_size": "8", "batch_wait_timeout_s": "0.01"}
    await w.trials.apply({"max_batch_size": 4, "max_queue_time_ms": 2.0})
    assert server.puts == [{"max_batch_size": 4, "max_queue_time_ms": 2.0}]  # one pod
    assert applies_to(kmock, "rayservices") == []  # trials do not touch the RayService

    await w.target.write_back({"max_batch_size": 32, "max_queue_time_ms": 25.0})
    assert server.values == {"max_batch_size": 32, "max_queue_time_ms": 25.0}
    patches = applies_to(kmock, "rayservices")
    assert len(patches) == 1
    assert patches[0].params == {"fieldManager": f"{FIELD_MANAGER}/tuner", "force": "true"}
    assert set(patches[0].data["spec"]) == {"serveConfigV2"}
    written = yaml.safe_load(kmock.objects[RAYSERVICES, NS, "ranker"].raw["spec"]["serveConfigV2"])
    deployment = written["applications"][0]["deployments"][0]
    assert deployment["user_config"] == {"max_batch_size": 32, "batch_wait_timeout_s": 0.025}
    assert written["applications"][0]["import_path"] == "app:graph"

    await w.target.write_back({"max_batch_size": 32, "max_queue_time_ms": 25.0})
    assert len(applies_to(kmock, "rayservices")) == 1  # already there: not written twice

    await w.target.restore(original)
    assert server.puts[-1] == {"max_batch_size": 8, "max_queue_time_ms": 10.0}
    restored = yaml.safe_load(kmock.objects[RAYSERVICES, NS, "ranker"].raw["spec"]["serveConfigV2"])
    assert restored == yaml.safe_load(SERVE)
    # the active cluster's serving pods only: the pending one of an upgrade takes no traffic
    assert pod_selectors(kmock) == {"ray.io/cluster=ranker-abc,ray.io/serve=true"}
    assert untouched_children(kmock)


async def test_rayservice_without_active_cluster_or_serve_config_is_a_target_problem(
    kmock: kmock.KubernetesEmulator, kube: Kube, admin: tuple[AdminServer, int]
) -> None:
    _, port = admin
    service = rayservice()
    service["status"] = {}
    kmock.objects[RAYSERVICES, NS, "ranker"] = service
    w = world(kube, ray_spec(port))
    with pytest.raises(TargetProblem) as caught:
        await w.target.record_original(NOW)
    assert caught.value.reason == "NoActiveRayCluster"
    kmock.objects[RAYSERVICES, NS, "ranker"] = {**rayservice(), "spec": {}}
    with pytest.raises(TargetProblem) as caught:
        await w.target.record_original(NOW)
    assert caught.value.reason == "ServeConfigMissing"


class ServeApi:
    """The head's Serve REST API (GET and PUT /api/serve/applications/) for the
    RayService's one deployment; every PUT is recorded and rolled out at once."""

    def __init__(self) -> None:
        self.user_config: dict[str, Any] = {"max_batch_size": 8, "batch_wait_timeout_s": 0.01}
        self.puts: list[dict[str, Any]] = []

    def document(self) -> dict[str, Any]:
        deployment = {"name": "Ranker", "user_config": self.user_config}
        return {
            "applications": {
                "ranker": {
                    "name": "ranker",
                    "status": "RUNNING",
                    "deployed_app_config": {
                        "name": "ranker",
                        "import_path": "app:graph",
                        "deployments": [deployment],
                    },
                    "deployments": {
                        "Ranker": {
                            "name": "Ranker",
                            "status": "HEALTHY",
                            "deployment_config": {"user_config": self.user_config},
                            "target_num_replicas": 2,
                            "replicas": [
                                {"replica_id": "a", "state": "RUNNING", "pid": 11},
                                {"replica_id": "b", "state": "RUNNING", "pid": 12},
                            ],
                        }
                    },
                }
            }
        }

    async def get(self, _: web.Request) -> web.Response:
        return web.json_response(self.document())

    async def put(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.puts.append(body)
        self.user_config = dict(body["applications"][0]["deployments"][0]["user_config"])
        return web.Response()


@pytest.fixture
async def serve_api() -> AsyncIterator[tuple[ServeApi, int]]:
    api = ServeApi()
    app = web.Application()
    app.router.add_get("/api/serve/applications/", api.get)
    app.router.add_put("/api/serve/applications/", api.put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield api, runner.addresses[0][1]
    await runner.cleanup()


def ray_runtime_spec(dashboard_port: int) -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "ranker"},
            "runtime": {
                "kind": "RayServe",
                "model": "ranker/Ranker",
                "managementPort": dashboard_port,
            },
            "sla": {"p99LatencyMs": 300},
            "apply": {"method": "Live"},
            "load": {"endpoint": {"port": 8000, "path": "/"}, "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )


async def test_rayservice_with_the_rayserve_runtime_goes_through_the_heads_serve_api(
    kmock: kmock.KubernetesEmulator, kube: Kube, serve_api: tuple[ServeApi, int]
) -> None:
    api, port = serve_api
    kmock.objects[RAYSERVICES, NS, "ranker"] = rayservice()
    cluster = {"ray.io/cluster": "ranker-abc", "ray.io/serve": "true"}
    kmock.objects[PODS, NS, "ranker-abc-head"] = pod(
        "ranker-abc-head", {**cluster, "ray.io/node-type": "head"}
    )
    for worker in ("ranker-abc-worker-1", "ranker-abc-worker-2"):
        kmock.objects[PODS, NS, worker] = pod(worker, {**cluster, "ray.io/node-type": "worker"})
    w = world(kube, ray_runtime_spec(port))

    original = await w.target.record_original(NOW)
    assert original.params == {"max_batch_size": 8, "max_queue_time_ms": 10.0}
    await w.trials.apply({"max_batch_size": 4, "max_queue_time_ms": 2.0})
    # one call for the application, however many pods serve it
    assert len(api.puts) == 1
    assert api.user_config == {"max_batch_size": 4, "batch_wait_timeout_s": 0.002}
    assert applies_to(kmock, "rayservices") == []  # trials do not touch the RayService

    await w.target.write_back({"max_batch_size": 32, "max_queue_time_ms": 25.0})
    assert len(api.puts) == 2
    assert api.user_config == {"max_batch_size": 32, "batch_wait_timeout_s": 0.025}
    written = yaml.safe_load(kmock.objects[RAYSERVICES, NS, "ranker"].raw["spec"]["serveConfigV2"])
    user = written["applications"][0]["deployments"][0]["user_config"]
    assert user == {"max_batch_size": 32, "batch_wait_timeout_s": 0.025}
    # serveConfigV2 holds the winner, which KubeRay deploys on every new cluster: no pod
    # to set back, nothing sent to Serve
    api.user_config = {"max_batch_size": 8, "batch_wait_timeout_s": 0.01}
    assert await w.target.keep_live({"max_batch_size": 32, "max_queue_time_ms": 25.0}) == []
    assert len(api.puts) == 2

    await w.target.restore(original)
    assert len(api.puts) == 3
    assert api.user_config == {"max_batch_size": 8, "batch_wait_timeout_s": 0.01}
    restored = yaml.safe_load(kmock.objects[RAYSERVICES, NS, "ranker"].raw["spec"]["serveConfigV2"])
    assert restored == yaml.safe_load(SERVE)
    assert "ray.io/cluster=ranker-abc,ray.io/node-type=head" in pod_selectors(kmock)
    assert untouched_children(kmock)


async def test_the_operator_picks_the_parent_world_for_parent_kinds(kube: Kube) -> None:
    async def sink(problem: decisions.PodProblem) -> None:
        pass

    assert isinstance(kube_world(kube, kserve_spec(), NS, OWNER, sink), ParentWorld)
    assert isinstance(kube_world(kube, ray_spec(8000), NS, OWNER, sink), ParentWorld)
    deployment = parse_spec(
        {
            "target": {"name": "resnet"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/"}},
        }
    )
    assert not isinstance(kube_world(kube, deployment, NS, OWNER, sink), ParentWorld)


def quick_kserve(**tuning: Any) -> InferenceServiceSpec:
    """The KServe spec with waits below the CRD's minimums, so a deadline test is quick."""
    spec = kserve_spec()
    return spec.model_copy(update={"tuning": spec.tuning.model_copy(update=tuning)})


async def test_a_kserve_pod_unschedulable_past_the_schedule_timeout_stops_the_study(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[ISVCS, NS, "bert"] = kserve_isvc()
    pending = pod("bert-predictor-1", KSERVE_LABELS, {"MAX_BATCH_SIZE": "16"})
    pending["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
            }
        ],
    }
    kmock.objects[PODS, NS, "bert-predictor-1"] = pending
    w = world(kube, quick_kserve(schedule_timeout_seconds=0.2))
    with pytest.raises(TargetProblem) as caught:
        await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 12.5})
    assert caught.value.reason == "Unschedulable"
    assert caught.value.stops_study
    assert "tuning.scheduleTimeoutSeconds" in caught.value.message


async def test_a_kserve_write_back_whose_pods_never_roll_out_ends_at_the_deadline(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    # no KServe controller: the predictor keeps its old environment for ever
    kmock.objects[ISVCS, NS, "bert"] = kserve_isvc()
    kmock.objects[PODS, NS, "bert-predictor-1"] = pod(
        "bert-predictor-1", KSERVE_LABELS, {"OMP_NUM_THREADS": "4", "MAX_BATCH_SIZE": "16"}
    )
    w = world(kube, quick_kserve(trial_deadline_seconds=0.3))
    await w.target.record_original(NOW)
    with pytest.raises(TargetProblem) as caught:
        await w.target.write_back({"max_batch_size": 32, "max_queue_time_ms": 5.0})
    assert caught.value.reason == "RolloutTimedOut"
    assert "1 of 1 pods still run another environment" in caught.value.message
    assert "tuning.trialDeadlineSeconds" in caught.value.message
