"""apply.method Env, verified on the pods: after the rollout the operator asks the server
itself which knobs it runs (apply.live's GET, or the runtime's API) and fails the trial
as EnvIgnored when the container did not read the variables. KMock plays the API
server; the 'pod' is an HTTP server on 127.0.0.1 that answers from the environment the
operator rolled out (a container that reads it) or from values of its own (one that
does not)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from aiohttp import web
from kmock import ResourceInfo
from opsupport import (
    ISVC,
    NAMESPACE,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    events_of,
    eventually,
    isvc,
    status_of,
)

from batchpilot.models import BatchingConfig, CapacityResult, StepResult
from batchpilot.operator import decisions
from batchpilot.operator.kube import Connection, Kube
from batchpilot.operator.kubetrials import KubeTrials
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec
from batchpilot.operator.world import ProblemSink, TargetProblem

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]

NS = NAMESPACE
DEPLOYMENTS = "apps/v1/deployments"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "resnet", "uid": "uid-resnet"},
}
# what a container that ignores the variables runs, whatever was rolled out
OWN = {"MAX_BATCH_SIZE": "8", "WAIT": "10"}


def cluster_objects(k: kmock.KubernetesEmulator) -> None:
    k.resources[DEPLOYMENTS] = ResourceInfo(kind="Deployment", namespaced=True)
    k.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    k.resources["v1/events"] = ResourceInfo(kind="Event", namespaced=True)
    k.resources[ISVC] = ResourceInfo(  # as the operator fixture's, which Kopf watches
        kind="InferenceService",
        singular="inferenceservice",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "update", "create", "delete"},
        subresources={"status"},
    )
    k.objects[DEPLOYMENTS, NS, "resnet"] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "resnet", "namespace": NS, "generation": 1, "uid": "d1"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "resnet"}},
            "template": {
                "metadata": {"labels": {"app": "resnet"}},
                "spec": {"containers": [{"name": "server", "image": "user/server:1"}]},
            },
        },
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
        },
    }
    k.objects["v1/pods", NS, "resnet-1"] = {
        "metadata": {"name": "resnet-1", "namespace": NS, "labels": {"app": "resnet"}},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def rolled_out(k: kmock.KubernetesEmulator) -> dict[str, str]:
    """The container's environment as the operator's latest server-side apply set it."""
    patches = [r for r in k["patch"] if r.resource is not None and r.name == "resnet"]
    if not patches:
        return {}
    container = patches[-1].data["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"]}


class Pod:
    """The target's pod: a reference server's GET /admin/batching and a Triton's model
    configuration, from the environment rolled out when `reads_env`, else from OWN."""

    def __init__(self, k: kmock.KubernetesEmulator) -> None:
        self.k = k
        self.reads_env = True
        self.asked = 0

    def env(self) -> dict[str, str]:
        return rolled_out(self.k) if self.reads_env else OWN

    async def admin(self, _: web.Request) -> web.Response:
        self.asked += 1
        env = self.env()
        return web.json_response(
            {
                "max_batch_size": int(env["MAX_BATCH_SIZE"]),
                "max_queue_time_ms": float(env["WAIT"]),  # the reference server's ms
                "threads": 2,
            }
        )

    async def triton_config(self, _: web.Request) -> web.Response:
        self.asked += 1
        env = self.env()
        return web.json_response(
            {
                "name": "resnet",
                "max_batch_size": int(env["MAX_BATCH_SIZE"]),
                # Triton's own unit, µs, which its variable is written in
                "dynamic_batching": {"max_queue_delay_microseconds": int(env["WAIT"])},
            }
        )


@contextlib.asynccontextmanager
async def on_loopback(app: web.Application) -> AsyncIterator[int]:
    """`app` served on 127.0.0.1 while the block runs; its port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture
async def pod(kmock: kmock.KubernetesEmulator) -> AsyncIterator[tuple[Pod, int]]:
    cluster_objects(kmock)
    server = Pod(kmock)
    app = web.Application()
    app.router.add_get("/admin/batching", server.admin)
    app.router.add_get("/v2/models/resnet/config", server.triton_config)
    async with on_loopback(app) as port:
        yield server, port


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


def reference_spec(admin_port: int | None, **tuning: Any) -> dict[str, Any]:
    apply: dict[str, Any] = {
        "method": "Env",
        "env": {"maxBatchSize": "MAX_BATCH_SIZE", "maxQueueTimeMs": "WAIT"},
    }
    if admin_port is not None:
        apply["live"] = {"port": admin_port, "path": "/admin/batching"}
    return {
        "target": {"name": "resnet", "container": "server"},
        "sla": {"p99LatencyMs": 300},
        "apply": apply,
        "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 1000},
        "tuning": {"strategy": "InPlace", **tuning},
    }


def triton_spec(port: int) -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "runtime": {"kind": "Triton", "model": "resnet"},
            "apply": {
                "method": "Env",
                "env": {"maxBatchSize": "MAX_BATCH_SIZE", "maxQueueTimeMs": "WAIT"},
            },
            "load": {"endpoint": {"port": port}, "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )


def world(kube: Kube, spec: InferenceServiceSpec) -> KubeWorld:
    async def on_problem(_: decisions.PodProblem) -> None:
        return None

    return KubeWorld(kube, spec=spec, namespace=NS, owner=OWNER, on_problem=on_problem, poll_s=0.01)


async def test_a_container_that_reads_the_variables_proceeds(
    kmock: kmock.KubernetesEmulator, kube: Kube, pod: tuple[Pod, int]
) -> None:
    server, port = pod
    w = world(kube, parse_spec(reference_spec(port)))
    await w.trials.apply({"max_batch_size": 32, "max_queue_time_ms": 12.5})
    assert rolled_out(kmock) == {"MAX_BATCH_SIZE": "32", "WAIT": "12.5"}
    assert server.asked == 1  # read back once the rollout was done


async def test_a_container_that_ignores_the_variables_fails_the_trial_as_env_ignored(
    kube: Kube, pod: tuple[Pod, int]
) -> None:
    server, port = pod
    server.reads_env = False
    w = world(kube, parse_spec(reference_spec(port)))
    with pytest.raises(TargetProblem) as caught:
        await w.trials.apply({"max_batch_size": 32, "max_queue_time_ms": 10.0})
    assert caught.value.reason == "EnvIgnored"
    assert caught.value.message.startswith(
        "pod resnet-1 runs max_batch_size=8 after MAX_BATCH_SIZE=32 was rolled out: the "
        "container does not read the variable"
    )
    assert not caught.value.stops_study  # a failed trial, counted toward maxFailures
    assert not caught.value.invalid


async def test_a_triton_pod_is_read_back_in_microseconds(
    kmock: kmock.KubernetesEmulator, kube: Kube, pod: tuple[Pod, int]
) -> None:
    server, port = pod
    w = world(kube, triton_spec(port))
    await w.trials.apply({"max_batch_size": 16, "max_queue_time_ms": 2.5})
    # Triton's variable carries whole µs; its model configuration answers the same
    assert rolled_out(kmock) == {"MAX_BATCH_SIZE": "16", "WAIT": "2500"}
    server.reads_env = False  # the model configuration says 8 and 10 µs
    with pytest.raises(TargetProblem) as caught:
        await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 2.5})
    assert caught.value.reason == "EnvIgnored"
    assert "max_queue_time_ms=0.01 after WAIT=2500" in caught.value.message


async def test_a_pod_that_cannot_be_read_back_is_measured_unverified_and_said_so(
    kmock: kmock.KubernetesEmulator, kube: Kube, pod: tuple[Pod, int]
) -> None:
    server, port = pod
    spec = reference_spec(port)
    spec["apply"]["live"]["path"] = "/no-such-admin"  # answers 404
    w = world(kube, parse_spec(spec))
    await w.trials.apply({"max_batch_size": 32, "max_queue_time_ms": 10.0})
    posted = [e for e in events_of(kmock) if e["reason"] == "EnvUnverified"]
    assert len(posted) == 1
    assert "pod resnet-1" in posted[0]["message"]
    assert server.asked == 0


async def test_without_a_read_back_the_rollout_is_trusted_as_before(
    kmock: kmock.KubernetesEmulator, kube: Kube, pod: tuple[Pod, int]
) -> None:
    server, _ = pod
    server.reads_env = False
    await world(kube, parse_spec(reference_spec(None))).trials.apply(
        {"max_batch_size": 32, "max_queue_time_ms": 10.0}
    )
    assert server.asked == 0
    assert not [e for e in events_of(kmock) if e["reason"] == "EnvUnverified"]


class UnmeasuredTrials(KubeTrials):
    """KubeTrials whose measurement is a fixed figure: the study's path through apply is
    real, and no load is sent."""

    measured: int = 0

    async def measure(self, config: BatchingConfig, **_: Any) -> CapacityResult:
        UnmeasuredTrials.measured += 1
        sla = self._spec.sla.to_sla()
        step = StepResult(
            offered_rps=100.0,
            achieved_rps=100.0,
            p50_ms=50.0,
            p99_ms=200.0,
            error_rate=0.0,
            requests=500,
            passed=True,
            duration_s=5.0,
        )
        return CapacityResult(
            effective_rps=100.0, p99_ms=200.0, sla=sla, feasible=True, precision=0.05, steps=[step]
        )


class UnmeasuredWorld(KubeWorld):
    trials_type = UnmeasuredTrials


async def test_a_study_on_a_container_that_ignores_the_variables_fails_on_max_failures(
    kmock: kmock.KubernetesEmulator,
    operator: Operator,
    cluster: FakeCluster,
    pod: tuple[Pod, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, port = pod
    server.reads_env = False
    kmock.objects["apps/v1/deployments", NS, "resnet"].raw["spec"]["template"]["spec"][
        "containers"
    ][0]["env"] = [{"name": "MAX_BATCH_SIZE", "value": "8"}, {"name": "WAIT", "value": "10"}]

    def factory() -> Callable[..., KubeWorld]:
        def make(
            kube: Kube,
            spec: InferenceServiceSpec,
            namespace: str,
            owner: Any,
            on_problem: ProblemSink,
        ) -> KubeWorld:
            return UnmeasuredWorld(
                kube,
                spec=spec,
                namespace=namespace,
                owner=owner,
                on_problem=on_problem,
                poll_s=0.01,
            )

        return make

    monkeypatch.setattr(cluster, "factory", factory)
    kmock.objects[ISVC, NS, "resnet"] = isvc(**reference_spec(port, maxFailures=2))
    async with operator():
        await eventually(
            lambda: status_of(kmock).get("phase") == "Failed", what="the study failing"
        )
    status = status_of(kmock)
    # the original runs (the container's own values are the original ones): measured
    assert status["trials"][0]["state"] == "Complete"
    assert UnmeasuredTrials.measured == 1
    failed = [t for t in status["trials"] if t["state"] == "Failed"]
    assert len(failed) == 2
    assert all(t["reason"].startswith("EnvIgnored: pod resnet-1 runs ") for t in failed)
    assert "2 trials in a row failed" in status["message"]
    assert "EnvIgnored" in [e["reason"] for e in events_of(kmock)]


class VllmPod:
    """The target's pod as a vLLM engine: streamed completions, at most `max_num_seqs`
    of them running at once (the others wait), and its gauge of those running in
    /metrics. It runs MAX_BATCH_SIZE from the environment rolled out when `reads_env`,
    else vLLM's own default."""

    DEFAULT_MAX_NUM_SEQS = 256

    def __init__(self, k: kmock.KubernetesEmulator) -> None:
        self.k = k
        self.reads_env = True
        self.running = 0
        self.streams = 0
        self.admission = asyncio.Condition()

    def cap(self) -> int:
        if not self.reads_env:
            return self.DEFAULT_MAX_NUM_SEQS
        return int(rolled_out(self.k)["MAX_BATCH_SIZE"])

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.streams += 1
        if body["model"] != "tiny":
            return web.json_response({"error": f"model {body['model']!r} not found"}, status=404)
        async with self.admission:  # admitted once a running sequence ends
            await self.admission.wait_for(lambda: self.running < self.cap())
            self.running += 1
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for _ in range(body["max_tokens"]):
                await asyncio.sleep(0.002)
                await response.write(b'data: {"choices": [{"text": " hi"}]}\n\n')
            usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
            await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            return response
        finally:
            async with self.admission:
                self.running -= 1
                self.admission.notify_all()

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            text="# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="tiny"}} {self.running}\n'
        )


@pytest.fixture
async def vllm_pod(kmock: kmock.KubernetesEmulator) -> AsyncIterator[tuple[VllmPod, int]]:
    cluster_objects(kmock)
    server = VllmPod(kmock)
    app = web.Application()
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_get("/metrics", server.metrics)
    async with on_loopback(app) as port:
        yield server, port


def vllm_spec(port: int, model: str = "tiny") -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"ttftP99Ms": 3000, "tpotP99Ms": 300},
            "runtime": {"kind": "VLLM", "model": model},
            "apply": {"method": "Env", "env": {"maxBatchSize": "MAX_BATCH_SIZE"}},
            "parameters": {"maxBatchSize": {"min": 2, "max": 8}},
            "load": {"endpoint": {"port": port}, "protocol": "OpenAIStream", "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )


async def test_a_vllm_pod_is_verified_by_its_engines_own_gauge_under_a_burst(
    kmock: kmock.KubernetesEmulator, kube: Kube, vllm_pod: tuple[VllmPod, int]
) -> None:
    server, port = vllm_pod
    w = world(kube, vllm_spec(port))
    await w.trials.apply({"max_batch_size": 4, "max_queue_time_ms": 0.0})
    assert rolled_out(kmock)["MAX_BATCH_SIZE"] == "4"
    assert server.streams == 6  # beyond the cap, so a cap it did not run would show
    assert not [e for e in events_of(kmock) if e["reason"] == "EnvUnverified"]
    server.reads_env = False  # the engine runs its default, whatever the variable says
    with pytest.raises(TargetProblem) as caught:
        await w.trials.apply({"max_batch_size": 4, "max_queue_time_ms": 0.0})
    assert caught.value.reason == "EnvIgnored"
    assert caught.value.message.startswith(
        "pod resnet-1 ran 6 sequences at once (vllm:num_requests_running under 6 concurrent "
        "streams) after MAX_BATCH_SIZE=4 was rolled out: the container does not pass the "
        "variable to vLLM"
    )
    assert caught.value.message.endswith("e.g. --max-num-seqs=$(MAX_BATCH_SIZE)")


async def test_a_vllm_pod_whose_burst_fails_is_measured_unverified_and_said_so(
    kmock: kmock.KubernetesEmulator, kube: Kube, vllm_pod: tuple[VllmPod, int]
) -> None:
    _, port = vllm_pod
    await world(kube, vllm_spec(port, model="not-served")).trials.apply(
        {"max_batch_size": 4, "max_queue_time_ms": 0.0}
    )
    [posted] = [e for e in events_of(kmock) if e["reason"] == "EnvUnverified"]
    assert posted["message"].startswith(
        "pod resnet-1: 6 concurrent streams, sent to see that vLLM runs at most "
        "max_num_seqs=4 at once, failed (POST /v1/completions answered HTTP 404"
    )
