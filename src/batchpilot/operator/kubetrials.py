"""A trial on the measured workload (the canary, or the target InPlace): its
configuration applied (the environment rolled out, or the knobs set live on every pod)
and checked on the pods, then measured by the capacity search from the operator or its
load workers, with what makes a measurement say nothing caught: a crash, a restart,
replicas that changed, values someone put back."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp

from batchpilot.errors import TargetError
from batchpilot.loadgen.protocols import REFERENCE, REFERENCE_PATH, RequestProtocol, speaking
from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.operator import decisions, envknobs, workerfleet, writers
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.kube import Kube
from batchpilot.operator.kubecanary import KubeCanary
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.livepods import LivePods
from batchpilot.operator.promreads import PrometheusReads
from batchpilot.operator.spec import InferenceServiceSpec, Params
from batchpilot.operator.world import TargetProblem
from batchpilot.operator.worldevents import EventPoster

if TYPE_CHECKING:
    from batchpilot.capacity.prometheus import PrometheusStepSource

# reads of a pod's knobs after an Env rollout before it counts as unreadable: the pod
# is ready, so its server answers; a port that never answers is not waited out
ENV_READ_ATTEMPTS = 3
# the bound of one pod's verification burst (vLLM's engine, method Env)
ENGINE_BURST_TIMEOUT_S = 120.0


class KubeTrials:
    def __init__(
        self,
        kube: Kube,
        *,
        workload: Workload,
        canary: KubeCanary,
        live: LivePods,
        prometheus: PrometheusReads,
        events: EventPoster,
        spec: InferenceServiceSpec,
        namespace: str,
        owner: Mapping[str, Any],
        poll_s: float,
        http_timeout: aiohttp.ClientTimeout,
    ) -> None:
        self._kube = kube
        self._workload = workload
        self._canary = canary
        self._live = live
        self._prometheus = prometheus
        self._events = events
        self._spec = spec
        self._namespace = namespace
        self._poll_s = poll_s
        self._http_timeout = http_timeout
        # pods the latest measurement spread its load over: its req/s are theirs together
        self.measured_pods: int | None = None
        # load-worker pods, when load.workers.max allows more than the operator itself
        self.load_workers = workerfleet.for_spec(kube, spec, namespace, owner)
        # the environment the latest trial applied (method Env), checked on the pods
        self._trial_env: dict[str, str | None] | None = None
        # method Env: the unit the wait's variable is written in, and where the pods'
        # own knobs are read back after a rollout (None: nowhere)
        self._env_wait = operator_runtimes.env_wait(spec)
        self._env_readback = operator_runtimes.env_readback(spec)

    async def apply(self, params: Params) -> None:
        workload = await self._canary.measured(recreate=True)
        if self._spec.apply.method == "Env":
            env: dict[str, str | None] = dict(
                decisions.env_for_params(params, self._spec.env_names(), self._env_wait)
            )
            self._trial_env = None
            await self._workload.apply_env(workload, env, force=True)
            self._trial_env = env
            measured = await self._canary.measured()
            await self._check_not_reverted(measured)
            await self._check_env_read(measured, env)
        else:
            await self._workload.wait_rollout(workload)
            await self._live.apply(await self._canary.measured(), params)

    async def _check_not_reverted(self, workload: Mapping[str, Any]) -> None:
        """The ready pods run what the trial applied; a GitOps or parent controller that
        put its own values back makes the trial fail here, before anything is measured
        (or scored) under the trial's label."""
        if self._trial_env is None:
            return
        reverted = writers.env_reverted(
            await self._workload.pods(workload),
            self._workload.container(workload),
            self._trial_env,
        )
        if reverted is not None:
            name = workload["metadata"]["name"]
            raise TargetProblem("ConfigReverted", f"{name}: {reverted}")

    async def _check_env_read(
        self, workload: Mapping[str, Any], env: Mapping[str, str | None]
    ) -> None:
        """The ready pods run what the variables carry, by the server's own report
        (apply.live's GET, or the runtime's API): a container that does not read them
        fails the trial as EnvIgnored, before a study of identical configurations is
        measured. A pod whose report cannot be read is measured unverified, as a
        server without a read-back is, and an event says so."""
        if self._env_readback is None:
            return
        names = self._spec.env_names()
        expected = decisions.params_from_env(env, names, self._env_wait)
        if not expected:
            return
        if self._env_readback == "engine":
            cap = expected.get("max_batch_size")
            if cap is not None:
                await self._check_engine_cap(workload, int(cap), env)
            return
        tolerance = envknobs.resolution_ms(operator_runtimes.wait_knob(self._spec))
        for pod in await self._workload.pods(workload):
            ips = decisions.ready_pod_ips([pod])
            if not ips:
                continue
            name = str(pod["metadata"].get("name", ips[0]))
            read = await self._env_read(name, ips[0])
            if read is None:
                return
            ignored = envknobs.env_ignored(
                expected=expected, read=read, names=names, written=env, tolerance_ms=tolerance
            )
            if ignored is not None:
                raise TargetProblem("EnvIgnored", f"pod {name} {ignored}")

    async def _check_engine_cap(
        self, workload: Mapping[str, Any], cap: int, env: Mapping[str, str | None]
    ) -> None:
        """vLLM reports no configuration, but its own gauge of running sequences never
        exceeds the max_num_seqs it runs: under a burst of more streams than `cap`, a peak
        above it is a container that did not read the variable (EnvIgnored). A burst that
        fails leaves the pod measured unverified, and an event says so."""
        from batchpilot.runtimes.vllm.control import RUNNING, burst_streams, peak_running

        variable = self._spec.env_names()["max_batch_size"]
        model = self._spec.runtime.model
        assert model is not None  # the spec requires it for kind VLLM
        streams = burst_streams(cap)
        for name, ip in decisions.ready_pods(await self._workload.pods(workload)):
            url = operator_runtimes.pod_url(self._spec, ip)
            try:
                peak = await peak_running(url, model, streams, timeout_s=ENGINE_BURST_TIMEOUT_S)
            except TargetError as exc:
                await self._events.post(
                    "EnvUnverified",
                    f"pod {name}: {streams} concurrent streams, sent to see that vLLM runs "
                    f"at most max_num_seqs={cap} at once, failed ({exc}); the trial is "
                    "measured without knowing that the container read the variables",
                )
                continue
            if peak > cap:
                raise TargetProblem(
                    "EnvIgnored",
                    f"pod {name} ran {peak:g} sequences at once ({RUNNING} under {streams} "
                    f"concurrent streams) after {variable}={env.get(variable)} was rolled out: "
                    "the container does not pass the variable to vLLM (every trial would "
                    f"measure the same configuration); give it in the args, e.g. "
                    f"--max-num-seqs=$({variable})",
                )

    async def _env_read(self, pod: str, ip: str) -> Params | None:
        """The knobs the pod at `ip` reports, None (with an event) when it does not
        answer within ENV_READ_ATTEMPTS reads, each bounded by the HTTP timeout."""
        last = ""
        for attempt in range(ENV_READ_ATTEMPTS):
            if attempt:
                await asyncio.sleep(self._poll_s)
            try:
                async with asyncio.timeout(self._http_timeout.total):
                    if self._env_readback == "apply.live":
                        return await self._live.admin_get(ip)
                    runtime = operator_runtimes.adapter(self._spec)
                    assert runtime is not None  # env_readback names a runtime with one
                    return await self._live.runtime_get(runtime, ip)
            except TargetProblem as problem:
                last = problem.message
            except (TargetError, ValueError, TimeoutError, aiohttp.ClientError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        where = "apply.live" if self._env_readback == "apply.live" else self._spec.runtime.kind
        await self._events.post(
            "EnvUnverified",
            f"pod {pod}: the knobs it runs could not be read back through {where} ({last}); "
            "the trial is measured without knowing that the container read the variables",
        )
        return None

    async def measure(
        self,
        config: BatchingConfig,
        *,
        must_beat: float | None,
        since: datetime,
        seed: int | None = None,
        light_load: bool | None = None,
    ) -> CapacityResult:
        from batchpilot.capacity.lightload import wait_needs_light_load

        if light_load is None:
            light_load = wait_needs_light_load(config, self._spec.sla.to_sla())
        workload = await self._canary.measured()
        pods = await self._workload.pods(workload)
        ips = decisions.ready_pod_ips(pods)
        if not ips:
            raise TargetProblem("NoReadyPods", "no ready pods to measure")
        urls = [operator_runtimes.pod_url(self._spec, ip) for ip in ips]
        names = [str(p["metadata"]["name"]) for p in pods if decisions.ready_pod_ips([p])]
        source = await self._prometheus.checked_source(names)
        self.measured_pods = len(ips)
        in_place = self._spec.tuning.strategy == "InPlace"
        replicas = writers.replicas_of(workload)
        from batchpilot.capacity.prometheus import PrometheusQueryError

        try:
            if source is not None and in_place:
                await self._subtract_live_traffic(source, len(ips))
            with speaking(await self.request_protocol(ips[0])):
                result = await self._measure_capacity(urls, must_beat, seed, source, light_load)
        except PrometheusQueryError as exc:
            raise TargetProblem("PrometheusUnavailable", f"during the trial: {exc}") from None
        if in_place:
            await self._check_replicas(replicas)
        await self._check_not_reverted(await self._canary.measured())
        # a container that ended mid-measurement (a crash, an OOM kill) is this
        # configuration's doing: the trial is a crash, which the study retries once and
        # then keeps the sampler away from; a pod that went away or restarted otherwise
        # (eviction, a node drain) makes the figures say nothing: the trial fails
        after = await self._workload.pods(workload)
        crashed = decisions.crashed_since(after, since)
        if crashed:
            raise TargetProblem("Crashed", f"during the trial: {crashed}")
        restarted = decisions.restarted_pods(pods, after)
        if restarted:
            raise TargetProblem("PodRestarted", f"during the trial: {restarted}")
        return result

    async def request_protocol(self, ip: str) -> RequestProtocol | None:
        """The requests of this trial, tried on the pod at `ip` first: a 4xx to them stops
        the study (RequestShape) with the server's message and the fields that set them.
        v2 requests of a model's metadata (load.protocol V2, Triton's own) are built as
        that pod serves it (its own inputs, datatypes and shapes), read again each trial:
        the model a rollout brings may differ from the last."""
        spec = self._spec
        if operator_runtimes.shaped_by_metadata(spec):
            protocol: RequestProtocol | None = await self._metadata_protocol(ip)
        else:
            protocol = operator_runtimes.load_protocol(spec)
        await self._check_first_requests(ip, protocol)
        return protocol

    async def _metadata_protocol(self, ip: str) -> RequestProtocol:
        from batchpilot.loadgen.v2model import MetadataError, fetch_v2_model, v2_model_protocol
        from batchpilot.tls import verifying_context

        spec = self._spec
        endpoint = spec.load.endpoint
        headers = dict(spec.load.request.headers or {}) if spec.load.request is not None else {}
        tls = verifying_context(ca_pem=endpoint.ca_bundle) if endpoint.scheme == "https" else True
        try:
            metadata = await fetch_v2_model(
                operator_runtimes.pod_url(spec, ip),
                operator_runtimes.metadata_model(spec),
                # Triton says whether its model batches; another v2 server may not know
                triton_config=True if spec.runtime.kind == "Triton" else None,
                tls=tls,
                server_name=endpoint.server_name,
                headers=headers,
            )
        except MetadataError as exc:
            raise TargetProblem("ModelMetadataUnreadable", f"pod {ip}: {exc}") from None
        try:
            protocol = v2_model_protocol(metadata, headers=headers)
        except MetadataError as exc:
            # the model itself says too little: every trial would fail the same way
            raise TargetProblem(
                "RequestShape",
                f"{exc} (in an InferenceService: load.protocol Template with "
                "load.request.bodyTemplate)",
                stops_study=True,
            ) from None
        return operator_runtimes.on_endpoint(protocol, spec)

    async def _check_first_requests(self, ip: str, protocol: RequestProtocol | None) -> None:
        from batchpilot.loadgen.firstrequests import first_refusal

        spec = self._spec
        sent = protocol or operator_runtimes.on_endpoint(
            dataclasses.replace(REFERENCE, path=spec.load.endpoint.path or REFERENCE_PATH), spec
        )
        sizes = [r.size for r in spec.load.requests]
        refusal = await first_refusal(
            operator_runtimes.pod_url(spec, ip), sent, sizes, seed=spec.tuning.seed
        )
        if refusal is not None:
            # the requests, not the configuration, are wrong: every trial would be refused
            raise TargetProblem(
                "RequestShape",
                operator_runtimes.refusal_message(spec, str(refusal)),
                stops_study=True,
            )

    async def _measure_capacity(
        self,
        urls: list[str],
        must_beat: float | None,
        seed: int | None,
        source: PrometheusStepSource | None,
        light_load: bool,
    ) -> CapacityResult:
        from batchpilot.capacity.http import measure_capacity  # imported when first used
        from batchpilot.capacity.lightload import LightLoad

        load = self._spec.load
        in_place = self._spec.tuning.strategy == "InPlace"
        max_rps = decisions.load_ceiling(load.max_rps, len(urls))
        sender = None
        if self.load_workers is not None:
            try:
                sender = await self.load_workers.sender(None if load.max_rps is None else max_rps)
            except workerfleet.FleetError as exc:
                raise TargetProblem(exc.reason, exc.message) from None
        result = await measure_capacity(
            urls,
            # a runtime's protocol, in force around the call, brings its own path
            path=load.endpoint.path or REFERENCE_PATH,
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
            max_rps=max_rps,
            max_overload_s=load.max_overload_seconds,
            max_connections=load.max_connections,
            # on production a breach is not provoked a second time to confirm it, and a
            # step ends as soon as its breach is certain
            confirm_failures=not in_place,
            stop_on_breach=in_place,
            sender=sender,
            light_load=LightLoad() if light_load else None,
        )
        if self.load_workers is not None:
            self.load_workers.observe(result.steps, result.effective_rps)
        return result

    async def remove_load_workers(self) -> None:
        """Delete the study's load-worker Job, Secret and ServiceAccount (none: a no-op)."""
        if self.load_workers is not None:
            try:
                await self.load_workers.remove()
            except workerfleet.FleetError as exc:
                raise TargetProblem(exc.reason, exc.message) from None

    async def _subtract_live_traffic(self, source: PrometheusStepSource, pods: int) -> None:
        """On production the measured pods serve live traffic beside the load: what they
        served over the step's length before the load starts is taken off each step's
        goodput before it is held against the offer. The steps still report all they
        served (live plus load) as the pods' throughput."""
        live = await source.live_ok_rps(self._spec.load.step_seconds)
        source.set_background(live)
        if live > 0:
            await self._events.post(
                "LiveTraffic",
                f"production serves {live / max(pods, 1):.1f} req/s per pod on the "
                f"{pods} measured pods ({live:.1f} req/s together): taken off each "
                "step's goodput before it is held against the offered load",
            )

    async def _check_replicas(self, before: int) -> None:
        """An InPlace trial during which the target's replicas changed measured a fleet
        that was not one size: invalid (no verdict on its configuration), naming the
        autoscaler."""
        after = writers.replicas_of(await self._canary.measured())
        if after == before:
            return
        target = self._spec.target
        found = await writers.find_autoscalers(
            self._kube, self._namespace, target.kind, target.name
        )
        by = f"HorizontalPodAutoscaler {', '.join(found)}" if found else "someone"
        raise TargetProblem(
            "ScaledDuringTrial",
            f"{target.kind} {target.name} went from {before} to {after} replicas during the "
            f"trial (changed by {by})",
            invalid=True,
        )
