"""KubeWorld and the API client against KMock: the calls the operator makes to the
API server (server-side apply, canary creation, rollout checks), without Kopf."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kmock
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kmock import KubernetesError, Request, ResourceInfo
from kmock import method as http_method

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig
from batchpilot.operator import decisions
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.canary import canary_name
from batchpilot.operator.kube import Connection, Kube, KubeError
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec
from batchpilot.operator.world import TargetProblem


def register_neighbours(kmock: kmock.KubernetesEmulator) -> None:
    """The resources the world lists besides the target: InferenceServices (one tuner
    per target), the selectors a canary must escape, and events. No PodMonitor CRD."""
    kmock.resources["batchpilot.dev/v1alpha1/inferenceservices"] = ResourceInfo(
        kind="InferenceService", namespaced=True
    )
    kmock.resources["v1/services"] = ResourceInfo(kind="Service", namespaced=True)
    kmock.resources["policy/v1/poddisruptionbudgets"] = ResourceInfo(
        kind="PodDisruptionBudget", namespaced=True
    )
    kmock.resources["v1/events"] = ResourceInfo(kind="Event", namespaced=True)


pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]

NS = "ns1"
DEPLOYMENTS = "apps/v1/deployments"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "resnet", "uid": "uid-1"},
}


def make_spec(strategy: str = "InPlace") -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 1000},
            "tuning": {"strategy": strategy},
        }
    )


def target() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "resnet", "namespace": NS, "generation": 1, "uid": "d1"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "resnet"}},
            "template": {
                "metadata": {"labels": {"app": "resnet"}},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "batchpilot:0.1.0",
                            "env": [{"name": "MAX_BATCH_SIZE", "value": "32"}],
                        }
                    ]
                },
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


def ready_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "resnet-1", "namespace": NS, "labels": {"app": "resnet"}},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    kmock.resources[DEPLOYMENTS] = ResourceInfo(kind="Deployment", namespaced=True)
    kmock.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    register_neighbours(kmock)
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


def world(kube: Kube, spec: InferenceServiceSpec, problems: list[Any] | None = None) -> KubeWorld:
    async def on_problem(problem: decisions.PodProblem) -> None:
        (problems if problems is not None else []).append(problem)

    return KubeWorld(kube, spec=spec, namespace=NS, owner=OWNER, on_problem=on_problem, poll_s=0.01)


async def test_env_apply_is_a_server_side_apply_by_batchpilot(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    w = world(kube, make_spec())
    original = await w.target.record_original(NOW)
    assert original.env == {"MAX_BATCH_SIZE": "32", "MAX_QUEUE_TIME_MS": None}
    assert original.params == {}  # one knob unset: the server's default is invisible
    assert await w.canary.prepare(None) is None  # InPlace: no canary
    await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 12.5})
    patches = [r for r in kmock["patch"] if r.resource is not None and r.name == "resnet"]
    assert len(patches) == 1
    request = patches[0]
    assert request.headers["Content-Type"] == "application/apply-patch+yaml"
    # a manager per InferenceService: another one's applies cannot release these fields
    assert request.params == {"fieldManager": "batchpilot/resnet", "force": "true"}
    container = request.data["spec"]["template"]["spec"]["containers"][0]
    assert container == {
        "name": "server",
        "env": [
            {"name": "MAX_BATCH_SIZE", "value": "8"},
            {"name": "MAX_QUEUE_TIME_MS", "value": "12.5"},
        ],
    }
    await w.target.restore(original)
    restore = [r for r in kmock["patch"] if r.name == "resnet"][-1]
    env = restore.data["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "MAX_BATCH_SIZE", "value": "32"}]  # the unset one is released


async def test_canary_is_created_owned_and_deleted(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    w = world(kube, make_spec("Canary"))
    name = await w.canary.prepare(None)
    assert name == canary_name("resnet", NS, "resnet", "uid-1")
    canary = kmock.objects[DEPLOYMENTS, NS, name].raw
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert canary["spec"]["template"]["metadata"]["labels"]["app"] != "resnet"
    assert await w.canary.prepare(name) == name  # after a restart: found, not created twice
    created = [r for r in kmock["post"] if r.resource is not None and r.resource.plural != "events"]
    assert len(created) == 1
    await w.canary.remove(name)
    assert len(kmock["delete"]) == 1
    await w.canary.remove(name)  # already gone: not an error


async def test_missing_target_and_container_are_target_problems(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    w = world(kube, make_spec())
    with pytest.raises(TargetProblem) as caught:
        await w.target.record_original(NOW)
    assert caught.value.reason == "TargetNotFound"
    other = target()
    other["spec"]["template"]["spec"]["containers"][0]["name"] = "sidecar"
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = other
    with pytest.raises(TargetProblem) as caught:
        await w.target.record_original(NOW)
    assert caught.value.reason == "ContainerNotFound"


async def test_crash_looping_pods_fail_the_apply_with_the_reason(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    crashing = ready_pod()
    crashing["status"]["containerStatuses"] = [
        {"name": "server", "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    ]
    kmock.objects["v1/pods", NS, "resnet-1"] = crashing
    with pytest.raises(TargetProblem) as caught:
        await world(kube, make_spec()).trials.apply({"max_batch_size": 8, "max_queue_time_ms": 1.0})
    assert caught.value.reason == "CrashLoopBackOff"


async def test_client_retries_conflicts_and_server_errors_then_gives_up(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    injected = [409, 503, 500]  # then the real answer
    decided: dict[int, int | None] = {}  # request id → code (filters run more than once)

    def code_for(request: Request) -> int | None:
        if request.id not in decided:
            decided[request.id] = injected.pop(0) if injected else None
        return decided[request.id]

    def fail(request: Request) -> KubernetesError:
        return KubernetesError(status=code_for(request) or 500, reason="Injected")

    (
        kmock[lambda request: request.method == http_method.GET and code_for(request) is not None]
        << fail
    )
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/resnet"
    got = await kube.get(path)
    assert got["metadata"]["name"] == "resnet"
    assert len(kmock["get"]) == 4
    with pytest.raises(KubeError) as caught:
        await kube.merge_patch(f"/apis/apps/v1/namespaces/{NS}/deployments/nope", {})
    assert caught.value.status == 404


def quick(spec: InferenceServiceSpec, **tuning: Any) -> InferenceServiceSpec:
    """`spec` with waits below the CRD's minimums, so that a test of a deadline is quick."""
    return spec.model_copy(update={"tuning": spec.tuning.model_copy(update=tuning)})


def unschedulable_pod(since: datetime | None = None) -> dict[str, Any]:
    pod = ready_pod()
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
    }
    if since is not None:
        condition["lastTransitionTime"] = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    pod["status"] = {"phase": "Pending", "conditions": [condition]}
    return pod


def _rolling_out_to(kmock: kmock.KubernetesEmulator, pod: dict[str, Any]) -> None:
    """The target mid-rollout, its one new pod `pod`."""
    waiting = target()
    waiting["status"]["updatedReplicas"] = 0
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = waiting
    kmock.objects["v1/pods", NS, "resnet-1"] = pod


async def test_an_unschedulable_pod_past_the_schedule_timeout_stops_the_study(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    _rolling_out_to(kmock, unschedulable_pod())
    problems: list[Any] = []
    spec = quick(make_spec(), schedule_timeout_seconds=0.2)
    with pytest.raises(TargetProblem) as caught:
        await world(kube, spec, problems).trials.apply(
            {"max_batch_size": 8, "max_queue_time_ms": 1.0}
        )
    assert caught.value.reason == "Unschedulable"
    assert caught.value.stops_study
    assert "Insufficient nvidia.com/gpu" in caught.value.message
    assert "tuning.scheduleTimeoutSeconds" in caught.value.message
    # reported once while it was waited for, not on every poll
    assert [p.reason for p in problems] == ["Unschedulable"]


async def test_a_pod_unschedulable_since_before_a_restart_is_not_waited_for_again(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    # the pod says it has been Unschedulable for 10 minutes: an operator that restarted
    # meanwhile stops at once instead of starting the 5-minute wait over
    _rolling_out_to(kmock, unschedulable_pod(datetime.now(UTC) - timedelta(minutes=10)))
    spec = quick(make_spec(), schedule_timeout_seconds=300.0)
    with pytest.raises(TargetProblem) as caught:
        async with asyncio.timeout(30):  # bounds a hung test only
            await world(kube, spec, []).trials.apply(
                {"max_batch_size": 8, "max_queue_time_ms": 1.0}
            )
    assert caught.value.reason == "Unschedulable"
    assert caught.value.stops_study


async def test_a_rollout_that_never_finishes_ends_at_its_deadline(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    stuck = target()
    stuck["status"]["readyReplicas"] = 0
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = stuck
    spec = quick(make_spec(), trial_deadline_seconds=0.3)
    w = world(kube, spec)
    original = await w.target.record_original(NOW)
    with pytest.raises(TargetProblem) as caught:
        await w.target.restore(original)
    assert caught.value.reason == "RolloutTimedOut"
    assert "0 of 1 replicas ready" in caught.value.message
    assert not caught.value.stops_study


async def test_a_rollout_past_its_progress_deadline_fails_the_write_back(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    stuck = target()
    stuck["status"]["updatedReplicas"] = 0
    stuck["status"]["conditions"] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "resnet-7d9" has timed out progressing.',
        }
    ]
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = stuck
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    with pytest.raises(TargetProblem) as caught:
        await world(kube, make_spec()).target.write_back(
            {"max_batch_size": 8, "max_queue_time_ms": 1.0}
        )
    assert caught.value.reason == "ProgressDeadlineExceeded"
    assert "has timed out progressing" in caught.value.message


async def test_verify_passes_a_healthy_target_and_catches_a_crash_loop(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    w = world(kube, make_spec())
    await w.target.verify(0.2)  # healthy for the whole window
    crashing = ready_pod()
    crashing["status"]["containerStatuses"] = [
        {
            "name": "server",
            "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
        }
    ]
    kmock.objects["v1/pods", NS, "resnet-1"] = crashing
    with pytest.raises(TargetProblem) as caught:
        await w.target.verify(30.0)
    assert caught.value.reason == "CrashLoopBackOff"


def _replicas(kmock: kmock.KubernetesEmulator, count: int) -> None:
    workload = target()
    workload["spec"]["replicas"] = count
    workload["status"].update(
        replicas=count, updatedReplicas=count, readyReplicas=count, availableReplicas=count
    )
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = workload


def _pod(name: str) -> dict[str, Any]:
    pod = ready_pod()
    pod["metadata"].update(name=name, uid=f"uid-{name}")
    return pod


@pytest.mark.parametrize("scaled_in", [True, False])
async def test_verify_tells_a_scale_in_from_a_pod_that_went_away(
    kmock: kmock.KubernetesEmulator, kube: Kube, scaled_in: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _replicas(kmock, 2)
    for name in ("resnet-1", "resnet-2"):
        kmock.objects["v1/pods", NS, name] = _pod(name)
    w = world(kube, make_spec())
    # the pods change only after verify has seen them as they were: on a busy machine a
    # fixed head start could let the change land before verify's first look
    seen = asyncio.Event()
    workload = w.target._workload
    pods_of = workload.pods

    async def pods_then_seen(target: Any) -> Any:
        found = await pods_of(target)
        seen.set()
        return found

    monkeypatch.setattr(workload, "pods", pods_then_seen)

    async def meanwhile() -> None:
        await seen.wait()
        await asyncio.sleep(0.2)
        if scaled_in:  # an HPA scales in, then out again within the window
            _replicas(kmock, 1)
        del kmock.objects["v1/pods", NS, "resnet-2"]
        await asyncio.sleep(0.2)
        if scaled_in:
            _replicas(kmock, 2)
            kmock.objects["v1/pods", NS, "resnet-3"] = _pod("resnet-3")

    changes = asyncio.create_task(meanwhile())
    try:
        if scaled_in:
            await w.target.verify(1.0)
        else:
            with pytest.raises(TargetProblem) as caught:
                await w.target.verify(30.0)
            assert caught.value.reason == "PodRestarted"
            assert "pod resnet-2 is gone" in caught.value.message
    finally:
        await changes


async def test_verify_catches_pods_that_stay_unready(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    unready = target()
    unready["status"]["readyReplicas"] = 0
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = unready
    with pytest.raises(TargetProblem) as caught:
        await world(kube, make_spec()).target.verify(0.2)
    assert caught.value.reason == "Unready"
    assert "0 of 1 replicas ready" in caught.value.message


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[str, dict[str, float]]]:
    """A loopback stand-in for Prometheus's instant-query API: each query answers the
    value set for the first key it contains ("p99" answers histogram_quantile(0.99...)."""
    answers: dict[str, float] = {}

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        key = "p99" if "0.99" in promql else "ok" if 'outcome="ok"' in promql else "total"
        value = answers.get(key)
        result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", answers
    await runner.cleanup()


async def test_verify_rolls_back_on_an_sla_breach_seen_by_prometheus(
    kmock: kmock.KubernetesEmulator, kube: Kube, prometheus: tuple[str, dict[str, float]]
) -> None:
    url, answers = prometheus
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    spec = parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300, "maxErrorRate": 0.01},
            "load": {
                "endpoint": {"port": 8080, "path": "/v1/predict"},
                "source": "prometheus",
                "prometheus": {"url": url, "scrapeIntervalSeconds": 1},
            },
        }
    )
    w = world(kube, spec)
    await w.target.verify(0.2)  # no traffic in the window: nothing to judge
    answers.update({"p99": 0.2, "ok": 50.0, "total": 50.0})
    await w.target.verify(0.2)  # traffic within the SLA
    answers["p99"] = 0.45
    with pytest.raises(TargetProblem) as caught:
        await w.target.verify(0.2)
    assert caught.value.reason == "SLABreached"
    assert "p99 450 ms > 300 ms at 50 req/s" in caught.value.message


@pytest.fixture
async def pod_server() -> AsyncIterator[tuple[int, list[float]]]:
    """A real HTTP server on loopback standing for the target's pod: it answers
    /v1/predict after the delay (s) in the list's one item."""
    delay = [0.0]

    async def predict(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay[0])
        return web.json_response({"outputs": [0.0]})

    app = web.Application()
    app.router.add_post("/v1/predict", predict)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    assert server.port is not None
    yield server.port, delay
    await server.close()


@pytest.mark.parametrize(("delay_s", "breaks"), [(0.005, False), (0.4, True)])
async def test_verify_without_prometheus_probes_the_pods_p99(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    pod_server: tuple[int, list[float]],
    delay_s: float,
    breaks: bool,
) -> None:
    port, delay = pod_server
    delay[0] = delay_s
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    spec = parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": port, "path": "/v1/predict"}, "maxRps": 5000},
        }
    )
    # a probe rate that fills a short window with enough requests to judge
    w = KubeWorld(
        kube, spec=spec, namespace=NS, owner=OWNER, on_problem=_ignore, poll_s=0.05,
        probe_rps_per_pod=decisions.PROBE_MIN_REQUESTS / 1.5,
    )  # fmt: skip
    if not breaks:
        await w.target.verify(2.0)
        return
    with pytest.raises(TargetProblem) as caught:
        await w.target.verify(2.0)
    assert caught.value.reason == "SLABreached"
    assert "a client probe after the write-back" in caught.value.message
    assert "> SLA 300 ms" in caught.value.message


async def test_verify_sends_no_probe_too_short_to_judge(
    kmock: kmock.KubernetesEmulator, kube: Kube, pod_server: tuple[int, list[float]]
) -> None:
    port, delay = pod_server
    delay[0] = 0.4  # would break the SLA, were it judged
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    spec = parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "load": {"endpoint": {"port": port, "path": "/v1/predict"}},
        }
    )
    # 2 req/s on one pod over 2 s: 4 requests, no p99 worth a rollback
    await world(kube, spec).target.verify(2.0)


async def _ignore(problem: decisions.PodProblem) -> None:
    return None


async def test_verify_does_not_blame_the_configuration_for_a_pod_without_room(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    scaled = target()
    scaled["spec"]["replicas"] = 2  # scaled out; the second pod finds no node
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = scaled
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    pending = unschedulable_pod()
    pending["metadata"]["name"] = "resnet-2"
    kmock.objects["v1/pods", NS, "resnet-2"] = pending
    await world(kube, make_spec()).target.verify(0.2)


class FakeControl:
    """A runtime control of one pod: what was applied, and what the pod runs."""

    def __init__(self, ip: str, live: dict[str, BatchingConfig], fail: list[str]) -> None:
        self.ip, self._live, self._fail = ip, live, fail
        self.last_verification = None

    async def current(self) -> BatchingConfig:
        return self._live.setdefault(self.ip, BatchingConfig(max_batch_size=4, max_queue_time_ms=1))

    async def native(self) -> dict[str, int | float]:
        return {}

    async def apply(self, config: BatchingConfig) -> None:
        if self._fail:
            raise TargetError(self._fail.pop(0))
        self._live[self.ip] = config


def triton_spec() -> InferenceServiceSpec:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "sla": {"p99LatencyMs": 300},
            "runtime": {"kind": "Triton", "model": "resnet"},
            "apply": {"method": "Live"},
            "load": {"endpoint": {"port": 8000}, "maxRps": 1000},
            "tuning": {"strategy": "InPlace"},
        }
    )


def fake_controls(
    monkeypatch: pytest.MonkeyPatch, fail: list[str] | None = None
) -> dict[str, BatchingConfig]:
    live: dict[str, BatchingConfig] = {}
    errors = fail if fail is not None else []

    def control_for(runtime: object, spec: InferenceServiceSpec, ip: str) -> FakeControl:
        assert spec.runtime.kind == "Triton"
        return FakeControl(ip, live, errors)

    monkeypatch.setattr(operator_runtimes, "control_for", control_for)
    return live


def two_ready_pods(kmock: kmock.KubernetesEmulator) -> None:
    """The target with pods resnet-0 at 127.0.0.1 and resnet-1 at 127.0.0.2, both ready."""
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    for n, ip in enumerate(("127.0.0.1", "127.0.0.2")):
        pod = ready_pod()
        pod["metadata"]["name"] = f"resnet-{n}"
        pod["status"]["podIP"] = ip
        kmock.objects["v1/pods", NS, f"resnet-{n}"] = pod


async def test_runtime_live_applies_on_every_pod_and_never_touches_the_template(
    kmock: kmock.KubernetesEmulator, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = fake_controls(monkeypatch)
    two_ready_pods(kmock)
    w = world(kube, triton_spec())
    original = await w.target.record_original(NOW)
    # read through the runtime's control, not from the environment
    assert original.params == {"max_batch_size": 4, "max_queue_time_ms": 1.0}
    await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 2.5})
    wanted = BatchingConfig(max_batch_size=8, max_queue_time_ms=2.5)
    assert live == {"127.0.0.1": wanted, "127.0.0.2": wanted}
    await w.target.write_back({"max_batch_size": 16, "max_queue_time_ms": 0.5})
    assert {c.max_batch_size for c in live.values()} == {16}
    await w.target.restore(original)
    assert {c.label() for c in live.values()} == {"batch=4 wait=1ms"}
    assert not [r for r in kmock["patch"] if r.resource is not None]


async def test_a_live_winner_is_set_back_on_the_pods_that_run_other_values(
    kmock: kmock.KubernetesEmulator, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = fake_controls(monkeypatch, fail=[])
    two_ready_pods(kmock)
    w = world(kube, triton_spec())
    winner = {"max_batch_size": 16, "max_queue_time_ms": 0.5}
    await w.target.write_back(winner)
    assert await w.target.keep_live(winner) == []
    del live["127.0.0.2"]  # restarted: back on the model's configuration (4, 1 ms)
    assert await w.target.keep_live(winner) == ["resnet-1 (ran batch=4 wait=1ms)"]
    assert live["127.0.0.2"] == BatchingConfig(max_batch_size=16, max_queue_time_ms=0.5)
    # both pods restarted; the first refuses the change now: it is left to the next
    # check, the other kept
    fake_controls(monkeypatch, fail=["still loading"])
    assert await w.target.keep_live(winner) == ["resnet-1 (ran batch=4 wait=1ms)"]
    assert await w.target.keep_live(winner) == ["resnet-0 (ran batch=4 wait=1ms)"]


async def test_a_winner_in_the_pod_template_reads_no_pod(
    kmock: kmock.KubernetesEmulator, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    def control_for(*_: object) -> None:
        raise AssertionError("no pod is read")

    monkeypatch.setattr(operator_runtimes, "control_for", control_for)
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    assert await world(kube, make_spec()).target.keep_live({"max_batch_size": 8}) == []


async def test_runtime_apply_waits_out_a_failing_pod_then_names_it(
    kmock: kmock.KubernetesEmulator, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = fake_controls(monkeypatch, fail=["load under way"])
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    w = world(kube, triton_spec())
    await w.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 2.5})  # second attempt took
    assert live["127.0.0.1"].max_batch_size == 8
    fake_controls(monkeypatch, fail=["refused"] * 1000)
    settling = KubeWorld(
        kube,
        spec=triton_spec(),
        namespace=NS,
        owner=OWNER,
        on_problem=lambda problem: asyncio.sleep(0),
        poll_s=0.01,
        settle_s=0.2,
    )
    with pytest.raises(TargetProblem) as caught:
        await settling.trials.apply({"max_batch_size": 8, "max_queue_time_ms": 2.5})
    assert caught.value.reason == "AdminUnreachable"
    assert "refused" in caught.value.message
    assert "127.0.0.1" in caught.value.message


@pytest.fixture
async def runtime_prometheus() -> AsyncIterator[tuple[str, dict[str, float], list[str]]]:
    """A loopback stand-in for Prometheus's instant-query API that answers p99 for
    histogram_quantile(0.99 ...), the same rate for either counter, and keeps every
    query it was asked."""
    answers: dict[str, float] = {}
    seen: list[str] = []

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        seen.append(promql)
        value = answers.get("p99" if "0.99" in promql else "rps")
        result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", answers, seen
    await runner.cleanup()


@pytest.mark.parametrize(
    ("runtime", "method", "p99", "histogram"),
    [
        # MLServer's histogram counts seconds, Ray Serve's milliseconds: both 450 ms
        ({"kind": "MLServer", "model": "iris"}, "Env", 0.45, "rest_server_request_duration"),
        ({"kind": "RayServe", "model": "shop"}, "Live", 450.0, "ray_serve_http_request_latency"),
    ],
)
async def test_verify_reads_a_runtimes_own_metrics_in_its_units(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    runtime_prometheus: tuple[str, dict[str, float], list[str]],
    runtime: dict[str, Any],
    method: str,
    p99: float,
    histogram: str,
) -> None:
    url, answers, seen = runtime_prometheus
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    spec = parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "runtime": runtime,
            "apply": {"method": method},
            "sla": {"p99LatencyMs": 300, "maxErrorRate": 0.01},
            "load": {
                "endpoint": {"port": 8080},
                "source": "prometheus",
                "prometheus": {"url": url, "scrapeIntervalSeconds": 1},
            },
        }
    )
    answers.update({"p99": p99, "rps": 50.0})
    with pytest.raises(TargetProblem) as caught:
        await world(kube, spec).target.verify(0.2)
    assert caught.value.reason == "SLABreached"
    assert "p99 450 ms > 300 ms at 50 req/s" in caught.value.message
    assert seen
    assert all("batchpilot_" not in q for q in seen)
    assert any(histogram in q for q in seen)


async def test_a_runtime_without_a_latency_histogram_stops_the_study_saying_why(
    kube: Kube, runtime_prometheus: tuple[str, dict[str, float], list[str]]
) -> None:
    url, _, seen = runtime_prometheus
    spec = parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "runtime": {"kind": "Triton", "model": "resnet"},
            "apply": {"method": "Live"},
            "sla": {"p99LatencyMs": 300},
            "load": {
                "endpoint": {"port": 8000},
                "source": "prometheus",
                "prometheus": {"url": url, "scrapeIntervalSeconds": 1},
            },
        }
    )
    with pytest.raises(TargetProblem) as caught:
        await world(kube, spec).prometheus.checked_source(["resnet-1"])
    assert caught.value.reason == "NoLatencyHistogram"
    assert caught.value.stops_study
    assert "exports no latency histogram" in caught.value.message
    assert not seen
