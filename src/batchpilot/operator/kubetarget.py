"""The target as production runs it: its original configuration recorded before
anything changes, the winner written back (the pod template by server-side apply, or
live on every pod), the original put back, the watch after a write-back (crashes,
restarts, pods that stay unready, production's SLA) and the SLA verdict a re-tune
asks for."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from batchpilot.operator import decisions, writers
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.livepods import LivePods
from batchpilot.operator.promreads import PrometheusReads
from batchpilot.operator.spec import InferenceServiceSpec, Params
from batchpilot.operator.status import OriginalConfig
from batchpilot.operator.world import TargetProblem


class KubeTarget:
    def __init__(
        self,
        *,
        workload: Workload,
        live: LivePods,
        prometheus: PrometheusReads,
        spec: InferenceServiceSpec,
        poll_s: float,
    ) -> None:
        self._workload = workload
        self._live = live
        self._prometheus = prometheus
        self._spec = spec
        self._poll_s = poll_s
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
        loop = asyncio.get_running_loop()
        workload = await self._workload.target()
        kind, name = workload.get("kind", "Deployment"), workload["metadata"]["name"]
        before = await self._workload.pods(workload)
        replicas = fewest = writers.replicas_of(workload)
        started = loop.time()
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
        verdict = await self._prometheus.production_verdict(seconds)
        if verdict is not None and verdict.breach is not None:
            raise TargetProblem(
                "SLABreached",
                f"production traffic over {seconds:g} s after the write-back: {verdict.breach}",
            )

    async def production_verdict(self, window_s: float) -> decisions.ProductionVerdict | None:
        """Whether the target's traffic over the last `window_s` kept the SLA (re-tune
        OnSLABreach); None when nothing could be judged."""
        return await self._prometheus.production_verdict(window_s)
