"""The study's view of the cluster: read and change the target, run a canary, measure.

`World` is what the study runner needs; `KubeWorld` implements it against the API
server and the pods themselves. Tests give the runner a fake world instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.operator import decisions
from batchpilot.operator.kube import JSON, Kube, KubeError, NotFound, pods_path, workload_path
from batchpilot.operator.spec import InferenceServiceSpec, Params
from batchpilot.operator.status import OriginalConfig
from batchpilot.tuner.interfaces import TargetError

if TYPE_CHECKING:
    from batchpilot.capacity.prometheus import PrometheusStepSource

# problems of a pod that is (re)starting: waited out rather than failing the trial
TRANSIENT = frozenset({"NoReadyPods", "AdminUnreachable", "AdminNotApplied"})

ProblemSink = Callable[[decisions.PodProblem], Awaitable[None]]


class TargetProblem(TargetError):
    """The target cannot be used now; `reason` is CamelCase for conditions and events."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class World(Protocol):
    async def record_original(self, now: datetime) -> OriginalConfig:
        """The target's configuration before anything is changed."""
        ...

    async def prepare(self, canary: str | None) -> str | None:
        """Make the workload that trials run on ready (create the canary for strategy
        Canary; `canary` is the name in status if one was created before a restart).
        Returns the canary's name, or None when trials run on the target itself."""
        ...

    async def apply(self, params: Params) -> None:
        """Bring the measured workload to `params`; return once every pod runs them."""
        ...

    async def measure(
        self,
        config: BatchingConfig,
        *,
        must_beat: float | None,
        since: datetime,
        seed: int | None = None,
    ) -> CapacityResult:
        """Score what is live. `since` is the trial's start: a container that exited
        after it (a crash, an OOM kill) spoils the trial, raised as TargetProblem.
        `seed` is the load's (default: the study's); the confirmation rounds set it."""
        ...

    async def write_back(self, params: Params) -> None:
        """Write `params` onto the target's pod template (server-side apply)."""
        ...

    async def restore(self, original: OriginalConfig) -> None:
        """Put the original configuration back on the target."""
        ...

    async def remove_canary(self, name: str) -> None: ...


class KubeWorld:
    """A World on a real API server."""

    def __init__(
        self,
        kube: Kube,
        *,
        spec: InferenceServiceSpec,
        namespace: str,
        owner: Mapping[str, Any],
        on_problem: ProblemSink,
        poll_s: float = 2.0,
        http_timeout_s: float = 10.0,
        settle_s: float = 120.0,
    ) -> None:
        self._kube = kube
        self._spec = spec
        self._namespace = namespace
        self._owner = owner
        self._on_problem = on_problem
        self._poll_s = poll_s
        self._http_timeout = aiohttp.ClientTimeout(total=http_timeout_s)
        self._settle_s = settle_s
        self._canary: str | None = None

    # --- reading ----------------------------------------------------------------------

    async def _target(self) -> JSON:
        target = self._spec.target
        try:
            workload = await self._kube.get(
                workload_path(target.kind, self._namespace, target.name)
            )
        except NotFound as exc:
            raise TargetProblem(
                "TargetNotFound", f"{target.kind} {self._namespace}/{target.name} does not exist"
            ) from exc
        if decisions.find_container(workload, target.container) is None:
            raise TargetProblem(
                "ContainerNotFound",
                f"{target.kind} {target.name} has no container {target.container or '(any)'}",
            )
        return workload

    def _container(self, workload: Mapping[str, Any]) -> str:
        container = decisions.find_container(workload, self._spec.target.container)
        assert container is not None  # _target() checked it
        return str(container["name"])

    async def _measured(self) -> JSON:
        if self._canary is None:
            return await self._target()
        try:
            return await self._kube.get(workload_path("Deployment", self._namespace, self._canary))
        except NotFound as exc:
            raise TargetProblem("CanaryNotFound", f"canary {self._canary} is gone") from exc

    async def _pods(self, workload: Mapping[str, Any]) -> list[JSON]:
        selector = decisions.label_selector(workload)
        listing = await self._kube.get(pods_path(self._namespace), {"labelSelector": selector})
        items: list[JSON] = listing.get("items", [])
        return items

    async def record_original(self, now: datetime) -> OriginalConfig:
        workload = await self._target()
        original = decisions.original_config(workload, self._spec, now)
        if self._spec.apply.method == "Live":
            ips = decisions.ready_pod_ips(await self._pods(workload))
            if ips:
                original = original.model_copy(update={"params": await self._live_get(ips[0])})
        return original

    # --- the canary -------------------------------------------------------------------

    async def prepare(self, canary: str | None) -> str | None:
        if self._spec.tuning.strategy == "InPlace":
            return None
        workload = await self._target()
        name = canary or decisions.canary_name(self._spec.target.name)
        try:
            await self._kube.get(workload_path("Deployment", self._namespace, name))
        except NotFound:
            body = decisions.canary_manifest(workload, self._owner, name)
            await self._kube.create(workload_path("Deployment", self._namespace), body)
        self._canary = name
        return name

    async def remove_canary(self, name: str) -> None:
        await self._kube.delete(workload_path("Deployment", self._namespace, name))
        self._canary = None

    # --- applying ---------------------------------------------------------------------

    async def apply(self, params: Params) -> None:
        workload = await self._measured()
        if self._spec.apply.method == "Env":
            env = decisions.env_for_params(params, self._spec.env_names())
            await self._apply_env(workload, dict(env), force=True)
        else:
            await self._wait_rollout(workload)
            await self._apply_live(await self._measured(), params)

    async def write_back(self, params: Params) -> None:
        env = decisions.env_for_params(params, self._spec.env_names())
        await self._apply_env(await self._target(), dict(env), force=True)

    async def restore(self, original: OriginalConfig) -> None:
        workload = await self._target()
        if self._spec.apply.method == "Live" and original.params:
            await self._apply_live(workload, original.params)
        # an apply that leaves out a variable the operator set releases it (removed if
        # it was unset before); variables that had a value get it back
        await self._apply_env(workload, dict(original.env), force=True)

    async def _apply_env(
        self, workload: Mapping[str, Any], env: dict[str, str | None], *, force: bool
    ) -> None:
        meta = workload["metadata"]
        body = decisions.env_apply_patch(workload, self._container(workload), env)
        path = workload_path(workload.get("kind", "Deployment"), self._namespace, meta["name"])
        try:
            applied = await self._kube.server_side_apply(path, body, force=force)
        except KubeError as exc:
            raise TargetProblem(
                "ApplyFailed", f"server-side apply on {meta['name']}: {exc}"
            ) from exc
        await self._wait_rollout(applied)

    async def _wait_rollout(self, workload: Mapping[str, Any]) -> None:
        kind = workload.get("kind", "Deployment")
        name = workload["metadata"]["name"]
        reported: str | None = None
        while True:
            current = await self._kube.get(workload_path(kind, self._namespace, name))
            rollout = decisions.rollout_status(current)
            pods = await self._pods(current)
            problem = decisions.pod_problem(pods)
            if problem is not None:
                if problem.fatal:
                    raise TargetProblem(problem.reason, problem.message)
                if problem.message != reported:
                    reported = problem.message
                    await self._on_problem(problem)
            if rollout.done and len(decisions.ready_pod_ips(pods)) >= 1 and problem is None:
                return
            await asyncio.sleep(self._poll_s)

    def _admin_url(self, ip: str) -> str:
        live = self._spec.apply.live
        assert live is not None  # the spec's validation guarantees it for method Live
        return f"http://{ip}:{live.port}{live.path}"

    async def _live_get(self, ip: str) -> Params:
        async with aiohttp.ClientSession(timeout=self._http_timeout) as session:
            try:
                async with session.get(self._admin_url(ip)) as response:
                    response.raise_for_status()
                    payload = await response.json()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TargetProblem(
                    "AdminUnreachable", f"GET {self._admin_url(ip)}: {exc!r}"
                ) from exc
        return {k: v for k, v in payload.items() if isinstance(v, int | float)}

    async def _apply_live(
        self, workload: Mapping[str, Any], params: Mapping[str, float | int]
    ) -> None:
        """PUT `params` on every ready pod and verify with GET. A pod that is restarting
        (no ready pods, refused connections: its status lags its process) is waited
        for, up to `settle_s`; a refusal by the server (4xx) fails at once."""
        name = workload["metadata"]["name"]
        last = "no attempt"
        try:
            async with asyncio.timeout(self._settle_s):
                while True:
                    ips = decisions.ready_pod_ips(await self._pods(workload))
                    try:
                        if not ips:
                            raise TargetProblem("NoReadyPods", f"{name} has no ready pods")
                        await self._put_and_verify(ips, params)
                        return
                    except TargetProblem as problem:
                        if problem.reason not in TRANSIENT:
                            raise
                        last = problem.message
                    await asyncio.sleep(self._poll_s)
        except TimeoutError:
            raise TargetProblem(
                "AdminUnreachable", f"{name}: not live after {self._settle_s:g} s: {last}"
            ) from None

    async def _put_and_verify(self, ips: list[str], params: Mapping[str, float | int]) -> None:
        async with aiohttp.ClientSession(timeout=self._http_timeout) as session:
            for ip in ips:
                url = self._admin_url(ip)
                try:
                    async with session.put(url, json=dict(params)) as response:
                        if response.status >= 400:
                            text = (await response.text())[:300]
                            raise TargetProblem(
                                "AdminRejected", f"PUT {url} → {response.status}: {text}"
                            )
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise TargetProblem("AdminUnreachable", f"PUT {url}: {exc!r}") from exc
                live = await self._live_get(ip)
                wrong = {
                    k: (v, live.get(k))
                    for k, v in params.items()
                    if k in live and abs(float(live[k]) - float(v)) > 1e-9
                }
                if wrong:
                    raise TargetProblem(
                        "AdminNotApplied", f"{url} reports {wrong} (wanted, seen) after PUT"
                    )

    # --- measuring --------------------------------------------------------------------

    async def measure(
        self,
        config: BatchingConfig,
        *,
        must_beat: float | None,
        since: datetime,
        seed: int | None = None,
    ) -> CapacityResult:
        from batchpilot.capacity.http import measure_capacity  # imported when first used

        load = self._spec.load
        workload = await self._measured()
        pods = await self._pods(workload)
        ips = decisions.ready_pod_ips(pods)
        if not ips:
            raise TargetProblem("NoReadyPods", "no ready pods to measure")
        urls = [f"http://{ip}:{load.endpoint.port}" for ip in ips]
        source = await self._checked_prometheus_source()
        result = await measure_capacity(
            urls,
            path=load.endpoint.path,
            sla=self._spec.sla.to_sla(),
            mix=load.mix(),
            precision=load.precision,
            step_duration_s=load.step_seconds,
            warmup_s=load.warmup_seconds,
            must_beat=must_beat,
            timeout_s=load.request_timeout_seconds,
            min_requests=load.min_requests,
            seed=self._spec.tuning.seed if seed is None else seed,
            source=source,
            arrival=load.arrival.process_model(),
        )
        # a pod that restarted mid-measurement (crash, OOM kill, eviction) makes the
        # figures say nothing about this configuration: the trial fails and is not scored
        after = await self._pods(workload)
        restarted = "; ".join(
            m
            for m in (decisions.restarted_pods(pods, after), decisions.crashed_since(after, since))
            if m
        )
        if restarted:
            raise TargetProblem("PodRestarted", f"during the trial: {restarted}")
        return result

    async def _checked_prometheus_source(self) -> PrometheusStepSource | None:
        """The Prometheus source, its scrape interval checked against the step length
        before any load is sent."""
        source = self._prometheus_source()
        if source is None:
            return None
        from batchpilot.capacity.prometheus import PrometheusQueryError
        from batchpilot.capacity.scrape import ScrapeWindowError

        try:
            await source.check_step(self._spec.load.step_seconds)
        except ScrapeWindowError as exc:
            raise TargetProblem("StepShorterThanScrapes", f"load.stepSeconds: {exc}") from None
        except PrometheusQueryError as exc:
            raise TargetProblem("PrometheusUnavailable", str(exc)) from None
        return source

    def _prometheus_source(self) -> PrometheusStepSource | None:
        prometheus = self._spec.load.prometheus
        if self._spec.load.source != "prometheus" or prometheus is None:
            return None
        from batchpilot.capacity.prometheus import PrometheusStepSource

        # unset metric names keep the source's defaults: the reference server's metrics
        options: dict[str, Any] = {
            "ok_outcome": prometheus.ok_outcome,
            "selector": prometheus.selector,
        }
        if prometheus.latency_metric:
            options["latency_metric"] = prometheus.latency_metric
        if prometheus.requests_metric:
            options["requests_metric"] = prometheus.requests_metric
        if prometheus.scrape_interval_seconds is not None:
            options["scrape_interval_s"] = prometheus.scrape_interval_seconds
        return PrometheusStepSource(prometheus.url, ca_pem=prometheus.ca_bundle, **options)
