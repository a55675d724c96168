"""Kopf running the real handlers against KMock (the Kopf authors' mock API server),
with a fake World so that a study takes milliseconds instead of minutes."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import kmock
import kopf
import pytest
from kmock import ResourceInfo

import batchpilot.operator.handlers  # noqa: F401  (registers the handlers)
from batchpilot.models import SLA, BatchingConfig, CapacityResult, ClientHealth, StepResult
from batchpilot.operator.canary import canary_name
from batchpilot.operator.crd import GROUP, PLURAL, VERSION
from batchpilot.operator.decisions import ProductionVerdict
from batchpilot.operator.kube import KubeError
from batchpilot.operator.platform import policy_from_flags
from batchpilot.operator.slots import Slots
from batchpilot.operator.spec import InferenceServiceSpec, Params
from batchpilot.operator.status import OriginalConfig
from batchpilot.operator.workerfleet import LoadWorkers
from batchpilot.operator.world import ProblemSink, TargetProblem

ISVC = f"{GROUP}/{VERSION}/{PLURAL}"
NAMESPACE = "ns1"
ORIGINAL: Params = {"max_batch_size": 32, "max_queue_time_ms": 50.0}


def score(params: Mapping[str, float | int]) -> float:
    """A made-up throughput surface with its peak at batch 16, wait 20 ms."""
    batch, wait = float(params["max_batch_size"]), float(params["max_queue_time_ms"])
    return 600.0 - 40.0 * abs(math.log2(batch / 16.0)) - 2.0 * abs(wait - 20.0)


class GenerateNameEmulator(kmock.KubernetesEmulator):
    """KMock's emulator plus `metadata.generateName`, which Kopf's events use."""

    _generated: int = 0

    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                GenerateNameEmulator._generated += 1
                meta["name"] = f"{meta['generateName']}{GenerateNameEmulator._generated:05d}"
        return await super()._handle(request)


class FakeWorld:
    """A World with no cluster: its parts record what the runner asked for."""

    def __init__(self, spec: InferenceServiceSpec, cluster: FakeCluster) -> None:
        self.spec = spec
        self.cluster = cluster
        self.target: FakeTarget = FakeTarget(spec, cluster)
        self.canary = FakeCanary(spec, cluster)
        self.trials = FakeTrials(spec, cluster)


class FakeTarget:
    def __init__(self, spec: InferenceServiceSpec, cluster: FakeCluster) -> None:
        self.spec = spec
        self.cluster = cluster

    async def record_original(self, now: datetime) -> OriginalConfig:
        self.cluster.lookups += 1
        if self.cluster.api_errors >= self.cluster.lookups:
            # a different text on every attempt, as real API errors have
            raise KubeError(503, "ServiceUnavailable", f"attempt {self.cluster.lookups} refused")
        if self.cluster.missing_target:
            raise TargetProblem("TargetNotFound", f"Deployment {self.spec.target.name} is missing")
        return OriginalConfig(
            params=dict(self.cluster.target),
            env={"MAX_BATCH_SIZE": "32", "MAX_QUEUE_TIME_MS": "50"},
            recorded_at=now,
        )

    async def write_back(self, params: Params) -> None:
        if self.cluster.write_back_hangs:
            await asyncio.Event().wait()  # a rollout that never ends
        self.cluster.target = dict(params)
        self.cluster.written_back.append(dict(params))
        self.cluster.pods = {name: dict(params) for name in self.cluster.pods}

    async def keep_live(self, params: Params) -> list[str]:
        self.cluster.live_checks += 1
        kept = [name for name, live in sorted(self.cluster.pods.items()) if live != params]
        said = [f"{name} (ran {self.cluster.label(name)})" for name in kept]
        for name in kept:
            self.cluster.pods[name] = dict(params)
        return said

    async def restore(self, original: OriginalConfig) -> None:
        if self.cluster.restore_problem is not None:
            raise self.cluster.restore_problem
        if self.cluster.restore_hangs:
            await asyncio.Event().wait()
        self.cluster.target = dict(original.params)
        self.cluster.restored += 1
        self.cluster.restored_targets.append(self.spec.target.name)

    async def verify(self, seconds: float) -> None:
        self.cluster.verified.append(seconds)
        if self.cluster.crashes(self.cluster.target):
            raise TargetProblem(
                "CrashLoopBackOff", "pod resnet-2 container server: CrashLoopBackOff: exit 1"
            )

    async def production_verdict(self, window_s: float) -> ProductionVerdict | None:
        return None  # no Prometheus verdict


class FakeCanary:
    def __init__(self, spec: InferenceServiceSpec, cluster: FakeCluster) -> None:
        self.spec = spec
        self.cluster = cluster
        self.autoscalers: list[str] = []

    async def prepare(self, canary: str | None) -> str | None:
        if self.spec.tuning.strategy == "InPlace":
            return None
        name = canary or canary_name(self.spec.target.name, "ns", "resnet", "uid")
        self.cluster.canaries.add(name)
        self.cluster.prepares += 1
        return name

    async def remove(self, name: str) -> None:
        self.cluster.canaries.discard(name)


class FakeTrials:
    def __init__(self, spec: InferenceServiceSpec, cluster: FakeCluster) -> None:
        self.spec = spec
        self.cluster = cluster
        self.measured_pods: int | None = None
        self.load_workers: LoadWorkers | None = None

    async def apply(self, params: Params) -> None:
        self.cluster.applied.append(dict(params))
        if self.cluster.unschedulable is not None:
            raise TargetProblem(
                "Unschedulable",
                f"pod resnet-bp-canary-1 cannot be scheduled: {self.cluster.unschedulable}",
                stops_study=True,
            )
        if self.spec.tuning.strategy == "InPlace":
            self.cluster.target = dict(params)
        hold = self.cluster.hold_after
        if hold is not None and len(self.cluster.applied) > hold:
            await self.cluster.gate.wait()

    async def measure(
        self,
        config: BatchingConfig,
        *,
        must_beat: float | None,
        since: datetime,
        seed: int | None = None,
        light_load: bool | None = None,
    ) -> CapacityResult:
        params = self.cluster.applied[-1]
        self.cluster.measures += 1
        self.cluster.light_load_asked.append(bool(light_load))
        if self.cluster.measure_error is not None:
            raise self.cluster.measure_error
        if self.cluster.measures in self.cluster.disturbed:
            raise TargetProblem(
                "ScaledDuringTrial",
                "Deployment resnet went from 1 to 2 replicas during the trial (changed by "
                "HorizontalPodAutoscaler resnet-hpa)",
                invalid=True,
            )
        self.cluster.seeds.append(seed)
        rps = self.cluster.score(params)
        sla = self.spec.sla.to_sla()
        limit = self.cluster.client_limit_rps
        if limit is not None and rps > limit:
            return _client_bound(limit, sla)
        step = StepResult(
            offered_rps=rps,
            achieved_rps=rps,
            p50_ms=sla.scale_ms() / 4,
            p99_ms=sla.scale_ms() * 0.9,
            error_rate=0.0,
            requests=int(rps * 5),
            passed=True,
            duration_s=5.0,
        )
        if light_load and self.cluster.breaks_at_light_load(params):
            return CapacityResult(
                effective_rps=0.0,
                p99_ms=None,
                sla=sla,
                feasible=False,
                precision=0.05,
                steps=[step],
                light_load=f"LightLoad: at {0.1 * rps:.1f} req/s (10 % of {rps:,.0f} req/s) "
                f"p99 {1.03 * sla.scale_ms():.1f} ms, breaking the SLA",
            )
        return CapacityResult(
            effective_rps=rps,
            p99_ms=step.p99_ms,
            sla=sla,
            feasible=True,
            precision=0.05,
            steps=[step],
        )

    async def remove_load_workers(self) -> None:
        pass


def _client_bound(limit: float, sla: SLA) -> CapacityResult:
    """What the capacity search returns when the load generator stalls above `limit`: a
    pass at the limit, then an invalid step, and the capacity as a lower bound."""
    healthy = ClientHealth(
        lag_p99_ms=1.5, lag_max_ms=3.0, conn_wait_p99_ms=0.0, conn_wait_max_ms=0.0,
        loop_delay_p99_ms=2.0, loop_delay_max_ms=4.0, cpu=0.41,
    )  # fmt: skip
    stalled = healthy.model_copy(
        update={"lag_p99_ms": 48.0, "loop_delay_p99_ms": 45.0, "loop_delay_max_ms": 80.0}
    )
    passed = StepResult(
        offered_rps=limit, achieved_rps=limit, p50_ms=sla.scale_ms() / 4,
        p99_ms=sla.scale_ms() * 0.9,
        error_rate=0.0, requests=int(limit * 5), passed=True, duration_s=5.0, client=healthy,
    )  # fmt: skip
    invalid = passed.model_copy(
        update={
            "offered_rps": 2 * limit,
            "achieved_rps": 2 * limit,
            "p99_ms": sla.scale_ms() * 1.2,
            "passed": False,
            "valid": False,
            "reason": f"invalid, client-bound: {stalled.limit_reason(sla)}",
            "client": stalled,
        }
    )
    return CapacityResult(
        effective_rps=limit, p99_ms=passed.p99_ms, sla=sla, feasible=True, precision=0.05,
        steps=[passed, invalid], client_bound=True, client_ceiling_rps=limit,
    )  # fmt: skip


class FakeCluster:
    """What the fake worlds of one test share: the target's live configuration."""

    def __init__(self) -> None:
        self.target: Params = dict(ORIGINAL)
        self.applied: list[Params] = []
        self.written_back: list[Params] = []
        self.canaries: set[str] = set()
        self.restored = 0
        self.seeds: list[int | None] = []  # the load seed of every measurement
        self.score: Callable[[Mapping[str, float | int]], float] = score
        # a configuration scoring above this finds the load generator's limit first
        self.client_limit_rps: float | None = None
        self.missing_target = False
        self.api_errors = 0  # the first this many lookups of the target meet a 503
        self.lookups = 0
        # applies after the first `hold_after` ones wait until `gate` is set
        self.hold_after: int | None = None
        self.gate = asyncio.Event()
        self.prepares = 0  # canaries made ready (created or found)
        # the scheduler's message for every measured pod: none fits
        self.unschedulable: str | None = None
        self.restore_problem: TargetProblem | None = None
        self.measures = 0
        # an error no rule expects, raised by every measurement (a bug, a missing module)
        self.measure_error: Exception | None = None
        # the measurements (1-based, in order) an autoscaler disturbs
        self.disturbed: set[int] = set()
        self.restored_targets: list[str] = []  # the target of every restore, in order
        # a write-back or restore that never finishes (a rollout stuck for good)
        self.write_back_hangs = False
        self.restore_hangs = False
        # whether the target crash-loops on a configuration once it is written back
        self.crashes: Callable[[Params], bool] = lambda params: False
        self.verified: list[float] = []  # the verify windows asked for
        # whether a configuration breaks the SLA at light load, when that is measured
        self.breaks_at_light_load: Callable[[Params], bool] = lambda params: False
        self.light_load_asked: list[bool] = []  # every measurement's light_load, in order
        # what each pod of the target runs live (a write-back sets them all)
        self.pods: dict[str, Params] = {"resnet-0": dict(ORIGINAL), "resnet-1": dict(ORIGINAL)}
        self.live_checks = 0  # keep_live calls

    def label(self, pod: str) -> str:
        live = self.pods[pod]
        return f"batch={live['max_batch_size']:g} wait={live['max_queue_time_ms']:g}ms"

    def factory(self) -> Callable[..., FakeWorld]:
        def make(
            kube: Any,
            spec: InferenceServiceSpec,
            namespace: str,
            owner: Mapping[str, Any],
            on_problem: ProblemSink,
        ) -> FakeWorld:
            return FakeWorld(spec, self)

        return make


def isvc(name: str = "resnet", **spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "resnet", "container": "server"},
        "sla": {"p99LatencyMs": 300, "maxErrorRate": 0.001},
        "parameters": {
            "maxBatchSize": {"min": 1, "max": 64},
            "maxQueueTimeMs": {"min": 0, "max": 100},
        },
        "load": {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 1000},
        "tuning": {"strategy": "Canary", "maxTrials": 4, "writeBack": "Apply"},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": spec,
    }


# the tests' Prometheus runs on loopback: allowed as `--prometheus-allow` allows it
LOOPBACK_ALLOWED = policy_from_flags(["127.0.0.0/8", "::1"], environ={})


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def kubeconfig(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{str(kmock.url).rstrip('/')}'}}}}]\n"
        "users: [{name: kmock, user: {token: test}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: kmock}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kmock.resources[ISVC] = ResourceInfo(
        kind="InferenceService",
        singular="inferenceservice",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "update", "create", "delete"},
        subresources={"status"},
    )
    kmock.resources["v1/events"] = ResourceInfo(kind="Event", namespaced=True, verbs={"create"})
    kmock.resources["v1/namespaces"] = ResourceInfo(
        kind="Namespace", namespaced=False, verbs={"list", "watch"}
    )
    return path


Operator = Callable[..., contextlib.AbstractAsyncContextManager[None]]


@pytest.fixture
def operator(kubeconfig: Path, cluster: FakeCluster) -> Operator:
    """Starts Kopf in this event loop; stopping it is what a restart looks like."""

    @contextlib.asynccontextmanager
    async def run(**extra: Any) -> AsyncIterator[None]:
        """`extra` goes into the memo (e.g. `leadership`, the replica's election)."""
        stop = asyncio.Event()
        options: dict[str, Any] = {"policy": LOOPBACK_ALLOWED, **extra}
        memo = kopf.Memo(
            world_factory=cluster.factory(),
            slots=Slots(),
            poll_s=0.05,
            backoff_cap_s=0.2,
            **options,
        )
        task = asyncio.create_task(
            kopf.operator(clusterwide=True, standalone=True, memo=memo, stop_flag=stop)
        )
        try:
            yield
        finally:
            stop.set()
            done, _ = await asyncio.wait({task}, timeout=30)
            if not done:
                task.cancel()
                raise AssertionError("the operator did not stop")
            # Kopf treats every task created in the loop after its start as its own and
            # cancels the leftovers at exit, KMock's request handlers included; their
            # cancellation surfaces here and says nothing about the operator.
            if not task.cancelled() and not isinstance(
                task.exception(), TimeoutError | asyncio.CancelledError | type(None)
            ):
                raise task.exception()  # type: ignore[misc]

    return run


async def eventually(
    check: Callable[[], bool], *, limit_s: float = 30.0, what: str = "condition"
) -> None:
    """Wait for `check` to hold. The timeout only bounds a hung test; nothing is
    asserted about how long it took."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not happen")
        await asyncio.sleep(0.02)


# --- reading the InferenceService and its events back from KMock --------------------------

ISVC_URL = f"/apis/batchpilot.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices"


def obj_of(k: kmock.KubernetesEmulator, name: str = "resnet") -> dict[str, Any]:
    try:
        return dict(k.objects[ISVC, NAMESPACE, name].raw)
    except (KeyError, ValueError):  # never created, or deleted (soft-deleted in KMock)
        return {}


def status_of(k: kmock.KubernetesEmulator, name: str = "resnet") -> dict[str, Any]:
    return dict(obj_of(k, name).get("status") or {})


def conditions(k: kmock.KubernetesEmulator) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status_of(k).get("conditions", [])}


def events_of(k: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    return [
        dict(r.data) for r in k["post"] if r.resource is not None and r.resource.plural == "events"
    ]


def reasons_of(k: kmock.KubernetesEmulator) -> list[str]:
    return [str(e["reason"]) for e in events_of(k)]


def phase_is(k: kmock.KubernetesEmulator, phase: str, generation: int | None = 1) -> bool:
    """The study is in `phase` for spec `generation` (any generation with None)."""
    status = status_of(k)
    return status.get("phase") == phase and (
        generation is None or status.get("observedGeneration") == generation
    )


async def edit(k: kmock.KubernetesEmulator, generation: int, spec: Mapping[str, Any]) -> None:
    """An edit of the spec as kubectl would make it, with the generation it bumps to."""
    response = await k.patch(
        f"{ISVC_URL}/resnet",
        json={"metadata": {"generation": generation}, "spec": dict(spec)},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200
