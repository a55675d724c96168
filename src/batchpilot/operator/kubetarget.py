"""The target as production runs it: its original configuration recorded before
anything changes, the winner written back (the pod template by server-side apply, or
live on every pod), the original put back, the watch after a write-back (crashes,
restarts, pods that stay unready, production's SLA) and the SLA verdict a re-tune
asks for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from batchpilot.loadgen.protocols import REFERENCE_PATH, RequestProtocol, speaking
from batchpilot.operator import decisions, writers
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.livepods import LivePods
from batchpilot.operator.promreads import PrometheusReads
from batchpilot.operator.spec import InferenceServiceSpec, Params
from batchpilot.operator.status import OriginalConfig
from batchpilot.operator.world import TargetProblem

log = logging.getLogger(__name__)

# the requests a trial sends to the pod at an IP (KubeTrials.request_protocol)
RequestsFor = Callable[[str], Awaitable[RequestProtocol | None]]


class KubeTarget:
    def __init__(
        self,
        *,
        workload: Workload,
        live: LivePods,
        prometheus: PrometheusReads,
        spec: InferenceServiceSpec,
        poll_s: float,
        requests_for: RequestsFor | None = None,
        probe_rps_per_pod: float = decisions.PROBE_RPS_PER_POD,
    ) -> None:
        self._workload = workload
        self._live = live
        self._prometheus = prometheus
        self._spec = spec
        self._poll_s = poll_s
        self._requests_for = requests_for
        self._probe_rps_per_pod = probe_rps_per_pod
        # method Env: the unit the wait's variable is written in
        self._env_wait = operator_runtimes.env_wait(spec)

    async def record_original(self, now: datetime) -> OriginalConfig:
        await self._workload.check_sole_tuner()
        workload = await self._workload.target()
        original = decisions.original_config(workload, self._spec, now, self._env_wait)
        return await self._with_live_params(workload, original)

    async def _with_live_params(
        self, workload: Mapping[str, Any], original: OriginalConfig
    ) -> OriginalConfig:
        """With apply.method Live, the knobs a ready pod runs are the original's."""
        if self._spec.apply.method == "Live":
            ips = await self._workload.live_ips(workload)
            if ips:
                original = original.model_copy(update={"params": await self._live.read(ips[0])})
        return original

    async def write_back(self, params: Params) -> None:
        if self._live.runtime is not None:
            # live on every pod of the target; status.persist says how to keep it
            await self._live.apply(await self._workload.target(), params)
            return
        env = decisions.env_for_params(params, self._spec.env_names(), self._env_wait)
        await self._workload.apply_env(await self._workload.target(), dict(env), force=True)

    async def keep_live(self, params: Params) -> list[str]:
        """A winner written live: every pod running other values set back to it (a pod
        template write-back needs nothing: a new pod starts from the template)."""
        if self._live.runtime is None:
            return []
        return await self._live.keep(await self._workload.target(), params)

    async def restore(self, original: OriginalConfig) -> None:
        workload = await self._workload.target()
        if self._spec.apply.method == "Live" and original.params:
            await self._live.apply(workload, original.params)
        if self._live.runtime is not None:
            return  # the pod template was never changed
        # an apply that leaves out a variable the operator set releases it (removed if
        # it was unset before); variables that had a value get it back
        await self._workload.apply_env(workload, dict(original.env), force=True)

    async def verify(self, seconds: float) -> None:
        if seconds <= 0:
            return
        workload = await self._workload.target()
        before = await self._workload.pods(workload)
        replicas = writers.replicas_of(workload)
        started = asyncio.get_running_loop().time()
        probe = self._start_probe(decisions.ready_pod_ips(before), seconds)
        try:
            await self._watch_pods(workload, before, replicas, seconds, started)
        except BaseException:
            if probe is not None:
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await probe  # its own failure says less than the pods' problem
            raise
        if probe is not None:
            breach = await probe
            if breach is not None:
                raise TargetProblem("SLABreached", f"a client probe after the write-back: {breach}")
        verdict = await self._prometheus.production_verdict(seconds)
        if verdict is not None and verdict.breach is not None:
            raise TargetProblem(
                "SLABreached",
                f"production traffic over {seconds:g} s after the write-back: {verdict.breach}",
            )

    async def _watch_pods(
        self,
        workload: Mapping[str, Any],
        before: list[Any],
        replicas: int,
        seconds: float,
        started: float,
    ) -> None:
        """Watch the target's pods for the window: crashes, restarts, pods that stay
        unready; TargetProblem on the first."""
        loop = asyncio.get_running_loop()
        kind, name = workload.get("kind", "Deployment"), workload["metadata"]["name"]
        fewest = replicas
        # a pod may miss a readiness probe under load; one unready for half the window
        # (or still unready at its end) is what a broken configuration looks like
        grace = seconds / 2
        unready_since: float | None = None
        while True:
            current = await self._workload.target()
            pods = await self._workload.pods(current)
            # a pod that cannot be placed (an HPA scaling out on a full cluster) says
            # nothing about the configuration; one that crashes does
            problem = decisions.pod_problem(pods)
            if problem is not None and problem.fatal:
                raise TargetProblem(problem.reason, problem.message)
            # pods an autoscaler's scale-in removed are not a failure (also when it scales
            # out again within the window); restarts always are
            fewest = min(fewest, writers.replicas_of(current))
            restarted = decisions.restarted_pods(before, pods, scaled_in=replicas - fewest)
            if restarted:
                # the workload was read before its pods: a scale-in in between shows now
                fewest = min(fewest, writers.replicas_of(await self._workload.target()))
                restarted = decisions.restarted_pods(before, pods, scaled_in=replicas - fewest)
            if restarted:
                raise TargetProblem("PodRestarted", f"after the write-back: {restarted}")
            rollout = self._workload.settled(current, pods)
            now = loop.time()
            if rollout.done or (problem is not None and problem.reason == "Unschedulable"):
                unready_since = None
            else:
                unready_since = unready_since or now
                if now - unready_since >= grace or now - started >= seconds:
                    raise TargetProblem(
                        "Unready", f"{kind} {name} after the write-back: {rollout.message}"
                    )
            if now - started >= seconds:
                break
            await asyncio.sleep(min(self._poll_s, max(0.0, started + seconds - now)))

    def _start_probe(self, ips: list[str], seconds: float) -> asyncio.Task[str | None] | None:
        """With load.source client (no Prometheus to read production from), light load
        on the target's ready pods for the window, beside production's; None when there
        is nothing to probe or the window is too short to hold enough requests."""
        if self._spec.load.source != "client" or self._requests_for is None or not ips:
            return None
        rate = decisions.probe_rate(self._spec, len(ips), self._probe_rps_per_pod)
        if rate * seconds < decisions.PROBE_MIN_REQUESTS:
            log.info(
                "verify: no client probe: %.1f req/s over %g s holds fewer than %d requests",
                rate, seconds, decisions.PROBE_MIN_REQUESTS,
            )  # fmt: skip
            return None
        return asyncio.create_task(self._probe(ips, rate, seconds))

    async def _probe(self, ips: list[str], rate: float, seconds: float) -> str | None:
        """What broke the SLA in the probe's window, None when it held (or when the
        requests could not be built: the pod health watch judges the rest)."""
        # imported when first used
        from batchpilot.capacity.http import default_timeout_s, judged_protocol, measure_step
        from batchpilot.loadgen.lengths import long_output_tokens

        assert self._requests_for is not None
        spec = self._spec
        load = spec.load
        sla = spec.sla.to_sla()
        urls = [operator_runtimes.pod_url(spec, ip) for ip in ips]
        try:
            protocol = await self._requests_for(ips[0])
        except TargetProblem as exc:
            log.warning("verify: no client probe: %s", exc.message)
            return None
        with speaking(protocol):
            # a token stream's goodput counts against the SLA's own targets
            judged = judged_protocol(sla)
        stream = judged.stream if judged is not None else None
        timeout = load.request_timeout_seconds or default_timeout_s(
            sla, long_output_tokens(stream.lengths) if stream is not None else 1
        )
        with speaking(judged):
            step, _ = await measure_step(
                urls,
                rate=rate,
                sla=sla,
                mix=load.mix(),
                duration_s=seconds,
                timeout_s=timeout,
                seed=spec.tuning.seed,
                arrival="poisson",
                path=load.endpoint.path or REFERENCE_PATH,
            )
        if step.passed:
            return None
        return f"{rate:.3g} req/s over {seconds:g} s: {step.reason}"

    async def production_verdict(self, window_s: float) -> decisions.ProductionVerdict | None:
        """Whether the target's traffic over the last `window_s` kept the SLA (re-tune
        OnSLABreach); None when nothing could be judged."""
        return await self._prometheus.production_verdict(window_s)
