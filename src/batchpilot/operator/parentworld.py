"""A World whose target is a parent (KServe InferenceService, RayService): the pods are
found through the parent and every write goes to the parent (batchpilot.operator.parents).

Strategy is always InPlace (the CRD refuses Canary for parents). KServe: Env trials,
write-back and restore set the predictor's environment on the InferenceService and wait
until its pods run it; Live trials go to the pods as for a Deployment. RayService:
trials are Live (through apply.live on every serving pod, or, with runtime.kind
RayServe, once through the Serve REST API on the head); write-back and restore set the
Serve deployment's user_config in serveConfigV2.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from batchpilot.operator import decisions, parents
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.kube import JSON, KubeError, NotFound, pods_path
from batchpilot.operator.kubetarget import KubeTarget
from batchpilot.operator.kubeworkload import ScheduleTimeout, Workload, within_deadline
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.spec import Params
from batchpilot.operator.status import OriginalConfig
from batchpilot.operator.world import TargetProblem

T = TypeVar("T")


def checked(check: Callable[[], T]) -> T:
    try:
        return check()
    except parents.ParentProblem as problem:
        raise TargetProblem(problem.reason, problem.message) from None


class ParentWorkload(Workload):
    """The parent as the workload: read, its pods found, its environment or user_config
    written, its rollout judged by the pods."""

    _wanted_env: Mapping[str, str | None] | None = None

    async def target(self) -> JSON:
        target = self._spec.target
        try:
            parent = await self._kube.get(parents.target_path(target, self._namespace))
        except NotFound as exc:
            raise TargetProblem(
                "TargetNotFound", f"{target.kind} {self._namespace}/{target.name} does not exist"
            ) from exc
        checked(lambda: self._describe(parent))
        return parent

    def _describe(self, parent: Mapping[str, Any]) -> None:
        """Raises ParentProblem when the parent lacks what the study writes."""
        if parent.get("kind") == "RayService":
            parents.user_config_of(parent, self._spec.target)
        else:
            parents.predictor_slot(parent, self._spec.target.container)

    async def pods(self, workload: Mapping[str, Any]) -> list[JSON]:
        selector = checked(lambda: parents.pod_selector(workload))
        listing = await self._kube.get(pods_path(self._namespace), {"labelSelector": selector})
        items: list[JSON] = listing.get("items", [])
        return items

    def container(self, workload: Mapping[str, Any]) -> str:
        slot = checked(lambda: parents.predictor_slot(workload, self._spec.target.container))
        return slot.container

    async def live_ips(self, workload: Mapping[str, Any]) -> list[str]:
        """A RayService tuned through the Ray Serve adapter is changed once, for the
        whole application, through the Serve REST API on its head; otherwise every
        serving pod is."""
        if (
            workload.get("kind") != "RayService"
            or operator_runtimes.live_adapter(self._spec) is None
        ):
            return await super().live_ips(workload)
        selector = checked(lambda: parents.head_selector(workload))
        listing = await self._kube.get(pods_path(self._namespace), {"labelSelector": selector})
        heads = parents.head_pods(listing.get("items") or [])
        ips = decisions.ready_pod_ips(heads)
        return ips[:1]

    async def apply_user_config(self, parent: Mapping[str, Any], values: Mapping[str, Any]) -> None:
        body = checked(lambda: parents.ray_user_config_patch(parent, self._spec.target, values))
        if body is None:
            return  # already there: no write, so KubeRay has nothing to redeploy
        await self._server_side_apply(parent, body)

    async def apply_env(
        self, workload: Mapping[str, Any], env: dict[str, str | None], *, force: bool
    ) -> None:
        slot = checked(lambda: parents.predictor_slot(workload, self._spec.target.container))
        body = parents.kserve_env_patch(workload, slot, env)
        applied = await self._server_side_apply(workload, body, force=force)
        self._wanted_env = env
        try:
            await self.wait_rollout(applied)
        finally:
            self._wanted_env = None

    async def _server_side_apply(
        self, parent: Mapping[str, Any], body: JSON, *, force: bool = True
    ) -> JSON:
        name = parent["metadata"]["name"]
        path = parents.target_path(self._spec.target, self._namespace)
        try:
            return await self._kube.server_side_apply(
                path, body, force=force, field_manager=self._field_manager
            )
        except KubeError as exc:
            raise TargetProblem(
                "ApplyFailed", f"server-side apply on {parent.get('kind')} {name}: {exc}"
            ) from exc

    def settled(self, workload: Mapping[str, Any], pods: list[JSON]) -> decisions.Rollout:
        # a parent's status is its controller's own (KServe, KubeRay): the pods say
        # whether what was written runs, ready
        container = self.container(workload) if workload.get("kind") == "InferenceService" else ""
        return parents.pods_rollout(pods, container, None)

    async def wait_rollout(self, workload: Mapping[str, Any]) -> None:
        """Until every pod of the parent runs the wanted environment (when one was just
        written) and is ready. Bounded as a workload's rollout is: by
        `tuning.trialDeadlineSeconds` (write-back and restore run outside any trial's
        deadline), pods Unschedulable for `tuning.scheduleTimeoutSeconds` and
        crash-looping pods end it at once."""
        kind = str(workload.get("kind", "parent"))
        name = str(workload.get("metadata", {}).get("name", "?"))
        await within_deadline(
            self._spec.tuning.trial_deadline_seconds,
            f"{kind} {name}",
            lambda last: self._follow_pods(workload, last),
        )

    async def _follow_pods(self, workload: Mapping[str, Any], last: list[str]) -> None:
        container = self.container(workload) if workload.get("kind") == "InferenceService" else ""
        wanted = self._wanted_env
        unschedulable = ScheduleTimeout(self._spec.tuning.schedule_timeout_seconds)
        reported: str | None = None
        while True:
            current = await self.target()
            pods = await self.pods(current)
            problem = decisions.pod_problem(pods)
            rollout = parents.pods_rollout(pods, container, wanted)
            last[0] = problem.message if problem is not None else rollout.message
            if problem is not None:
                if problem.fatal:
                    raise TargetProblem(problem.reason, problem.message)
                if problem.message != reported:
                    reported = problem.message
                    await self._on_problem(problem)
            unschedulable.check(problem)
            if rollout.done and problem is None:
                return
            await asyncio.sleep(self._poll_s)


class ParentTarget(KubeTarget):
    """The parent's original configuration, write-back and restore: a RayService's in
    its Serve user_config, a KServe InferenceService's in its predictor's environment."""

    @property
    def _parent(self) -> ParentWorkload:
        assert isinstance(self._workload, ParentWorkload)  # ParentWorld builds both
        return self._workload

    async def record_original(self, now: datetime) -> OriginalConfig:
        parent = await self._parent.target()
        read = (
            parents.ray_original if parent.get("kind") == "RayService" else parents.kserve_original
        )
        return await self._with_live_params(parent, checked(lambda: read(parent, self._spec, now)))

    async def write_back(self, params: Params) -> None:
        parent = await self._parent.target()
        if parent.get("kind") != "RayService":
            await super().write_back(params)
            return
        # the serving pods run the winner now, as a Deployment's would after its
        # rollout; KubeRay then hands the same user_config to the replicas again
        if self._spec.apply.method == "Live":
            await self._live.apply(parent, params)
        await self._parent.apply_user_config(parent, parents.user_config_values(params))

    async def keep_live(self, params: Params) -> list[str]:
        parent = await self._parent.target()
        if parent.get("kind") == "RayService":
            # the winner is in serveConfigV2: KubeRay deploys it on every new cluster
            return []
        return await super().keep_live(params)

    async def restore(self, original: OriginalConfig) -> None:
        parent = await self._parent.target()
        if parent.get("kind") != "RayService":
            await super().restore(original)
            return
        if self._spec.apply.method == "Live" and original.params:
            await self._live.apply(parent, original.params)
        await self._parent.apply_user_config(parent, parents.ray_restore_values(original))


class ParentWorld(KubeWorld):
    """A KubeWorld on a KServe InferenceService or a RayService target."""

    workload_type = ParentWorkload
    target_type = ParentTarget
