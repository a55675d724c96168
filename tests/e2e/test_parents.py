"""Parent targets on the real control plane: a study of a RayService and of a KServe
InferenceService writes the winner to the parent and never to the Deployment beneath.

Neither KubeRay nor KServe runs here, so the test installs minimal CRDs for their kinds
(a spec and status that keep unknown fields, as the operator's writes need nothing
more) and plays their controllers' part where the operator depends on it: the serving
pods are reference servers in a Deployment labelled as the parent's children, and for
KServe a thread copies the predictor's env onto that Deployment, as KServe would.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .conftest import Cluster
from .harness import wait_established
from .operatorproc import OperatorProcess
from .scenario import Poller, diagnostics, live_config, pods, wait_converged
from .workloads import container_env, dump, inference_service, server_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

PARENT_CRDS = {
    "rayservices.ray.io": ("ray.io", "v1", "RayService", "rayservices"),
    "inferenceservices.serving.kserve.io": (
        "serving.kserve.io",
        "v1beta1",
        "InferenceService",
        "inferenceservices",
    ),
}


def minimal_crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    open_object = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    # no status subresource: the test writes the status a controller
                    # would report together with the object
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": open_object, "status": open_object},
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def parent_crds(cluster: Cluster) -> None:
    cluster.kubectl.apply(dump(*(minimal_crd(*names) for names in PARENT_CRDS.values())))
    for name in PARENT_CRDS:
        wait_established(cluster.kubectl, name)


def child_server(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The reference server as the Deployment a parent's controller would own: its pods
    carry the parent's labels."""
    deployment = server_deployment(name, max_batch_size=4, max_queue_time_ms=2.0)
    deployment["spec"]["template"]["metadata"]["labels"].update(labels)
    return deployment


def managers(obj: dict[str, Any]) -> dict[str, str]:
    return {f["manager"]: f["operation"] for f in obj["metadata"].get("managedFields") or []}


def tuner(name: str, target: dict[str, Any], method: str) -> dict[str, Any]:
    isvc = inference_service(name, "unused", method=method)
    isvc["spec"]["target"] = target
    return isvc


# The batching is left to the app's defaults, which the pods run (4 / 2 ms): whichever
# configuration wins, even that incumbent, the write-back adds the two knobs to
# user_config. With the knobs spelled out, a winning incumbent is rightly never
# written, and the test could not tell a write-back from none.
SERVE_CONFIG = """\
applications:
  - name: ranker
    import_path: ranker:app
    deployments:
      - name: Ranker
        num_replicas: 1
        user_config:
          threshold: 0.5
"""


def test_rayservice_winner_goes_to_serve_config_not_the_child(
    cluster: Cluster, namespace: str, operator: OperatorProcess, parent_crds: None
) -> None:
    labels = {"ray.io/cluster": "ranker-abc", "ray.io/serve": "true"}
    rayservice = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "ranker"},
        "spec": {"serveConfigV2": SERVE_CONFIG},
        "status": {"activeServiceStatus": {"rayClusterName": "ranker-abc"}},
    }
    child = child_server("ranker-abc-worker", labels)
    cluster.kubectl.apply(dump(rayservice, child), "-n", namespace)
    cluster.kubectl(
        "rollout", "status", "deployment/ranker-abc-worker", "-n", namespace, "--timeout=120s"
    )
    target = {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "ranker"}
    cluster.kubectl.apply(dump(tuner("ray", target, "Live")), "-n", namespace)
    status = wait_converged(cluster, namespace, "ray", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    best = status["best"]

    # The winner is in the RayService's serveConfigV2, written by batchpilot's apply;
    # the rest of the Serve config is as the user wrote it.
    stored = cluster.kubectl.json(
        "get", "rayservices.ray.io", "ranker", "-n", namespace, "--show-managed-fields"
    )
    serve = yaml.safe_load(stored["spec"]["serveConfigV2"])
    deployment = serve["applications"][0]["deployments"][0]
    assert deployment["user_config"] == {
        "max_batch_size": best["maxBatchSize"],
        "batch_wait_timeout_s": pytest.approx(best["maxQueueTimeMs"] / 1000.0),
        "threshold": 0.5,
    }
    assert serve["applications"][0]["import_path"] == "ranker:app"
    assert managers(stored).get("batchpilot/ray") == "Apply", managers(stored)

    # The pods serve the winner, and the child Deployment was never written.
    [pod] = pods(cluster, namespace, "ray.io/cluster=ranker-abc")
    assert live_config(pod)["max_batch_size"] == best["maxBatchSize"]
    child_now = cluster.kubectl.json(
        "get", "deployment", "ranker-abc-worker", "-n", namespace, "--show-managed-fields"
    )
    assert child_now["metadata"]["generation"] == 1
    assert not [m for m in managers(child_now) if m.startswith("batchpilot")]
    assert container_env(child_now)["MAX_BATCH_SIZE"] == "4"


class KServeStandIn(Poller):
    """KServe's part: the predictor's env copied onto the Deployment it owns, so the
    pods roll out to what the InferenceService says."""

    interval_s = 0.5
    join_s = 30.0

    def __init__(self, cluster: Cluster, namespace: str, isvc: str, child: str) -> None:
        super().__init__()
        self._kubectl = cluster.kubectl
        self._namespace = namespace
        self._isvc = isvc
        self._child = child
        self._copied: list[dict[str, Any]] | None = None
        self.copies = 0
        self.errors: list[str] = []

    def poll(self) -> None:
        try:
            isvc = self._kubectl.json(
                "get", "inferenceservices.serving.kserve.io", self._isvc, "-n", self._namespace
            )
            env = isvc["spec"]["predictor"]["containers"][0].get("env") or []
            if env != self._copied:
                patch = {
                    "spec": {"template": {"spec": {"containers": [{"name": "server", "env": env}]}}}
                }
                self._kubectl(
                    "patch",
                    "deployment",
                    self._child,
                    "-n",
                    self._namespace,
                    "--field-manager=kserve",
                    "--type=strategic",
                    "-p",
                    yaml.safe_dump(patch),
                )
                self._copied = env
                self.copies += 1
        except Exception as exc:  # the next poll retries; the test reports them
            self.errors.append(repr(exc))


def test_kserve_predictor_env_is_written_to_the_inference_service(
    cluster: Cluster, namespace: str, operator: OperatorProcess, parent_crds: None
) -> None:
    labels = {"serving.kserve.io/inferenceservice": "bert", "component": "predictor"}
    child = child_server("bert-predictor", labels)
    server = child["spec"]["template"]["spec"]["containers"][0]
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "bert"},
        "spec": {
            "predictor": {
                "containers": [
                    {
                        "name": "server",
                        "image": server["image"],
                        "env": [dict(e) for e in server["env"]],
                    }
                ]
            }
        },
    }
    cluster.kubectl.apply(dump(isvc, child), "-n", namespace)
    cluster.kubectl(
        "rollout", "status", "deployment/bert-predictor", "-n", namespace, "--timeout=120s"
    )
    target = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "name": "bert",
        "container": "server",
    }
    with KServeStandIn(cluster, namespace, "bert", "bert-predictor") as kserve:
        cluster.kubectl.apply(dump(tuner("kserve", target, "Env")), "-n", namespace)
        status = wait_converged(cluster, namespace, "kserve", operator)
    assert status["phase"] == "Converged", diagnostics(cluster, operator)
    best = status["best"]

    stored = cluster.kubectl.json(
        "get",
        "inferenceservices.serving.kserve.io",
        "bert",
        "-n",
        namespace,
        "--show-managed-fields",
    )
    [container] = stored["spec"]["predictor"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["MAX_BATCH_SIZE"]) == best["maxBatchSize"]
    assert float(env["MAX_QUEUE_TIME_MS"]) == pytest.approx(best["maxQueueTimeMs"])
    assert env["PORT"] == "8080"
    assert container["image"] == server["image"]
    assert managers(stored).get("batchpilot/kserve") == "Apply", managers(stored)

    # Every trial reached the pods through the InferenceService: KServe's stand-in made
    # each rollout, batchpilot never wrote the Deployment.
    assert kserve.copies >= 2, kserve.errors
    child_now = cluster.kubectl.json(
        "get", "deployment", "bert-predictor", "-n", namespace, "--show-managed-fields"
    )
    assert not [m for m in managers(child_now) if m.startswith("batchpilot")]
    assert int(container_env(child_now)["MAX_BATCH_SIZE"]) == best["maxBatchSize"]
