"""The target workload on the API server (a Deployment or StatefulSet): the workload
read, its pods and the container tuned, its environment written by server-side apply
and the rollout followed to its end, the ready pods a live change goes to, and the
rule of one InferenceService per target."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from batchpilot.operator import decisions, neighbours
from batchpilot.operator.kube import (
    JSON,
    Kube,
    KubeError,
    NotFound,
    field_manager,
    isvcs_path,
    pods_path,
    workload_path,
)
from batchpilot.operator.selectors import SelectorError
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.world import ProblemSink, TargetProblem


class Workload:
    def __init__(
        self,
        kube: Kube,
        *,
        spec: InferenceServiceSpec,
        namespace: str,
        owner: Mapping[str, Any],
        on_problem: ProblemSink,
        poll_s: float,
    ) -> None:
        self._kube = kube
        self._spec = spec
        self._namespace = namespace
        self._owner = owner
        self._on_problem = on_problem
        self._poll_s = poll_s
        self._field_manager = field_manager(str(owner["metadata"]["name"]))

    async def target(self) -> JSON:
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

    def container(self, workload: Mapping[str, Any]) -> str:
        container = decisions.find_container(workload, self._spec.target.container)
        assert container is not None  # target() checked it
        return str(container["name"])

    async def pods(self, workload: Mapping[str, Any]) -> list[JSON]:
        try:
            selector = decisions.label_selector(workload)
        except SelectorError as exc:
            name = workload.get("metadata", {}).get("name", "?")
            raise TargetProblem("SelectorUnusable", f"{name}: {exc}") from exc
        listing = await self._kube.get(pods_path(self._namespace), {"labelSelector": selector})
        items: list[JSON] = listing.get("items", [])
        return items

    async def live_ips(self, workload: Mapping[str, Any]) -> list[str]:
        """The ready pods a live change goes to: every serving pod of the workload."""
        return decisions.ready_pod_ips(await self.pods(workload))

    async def check_sole_tuner(self) -> None:
        """One InferenceService per target: the first claimant tunes it, the others are
        refused (retried, so one starts once the first is gone)."""
        kind, name = self._spec.target.kind, self._spec.target.name
        aliases = await self._aliases()
        listing = await self._kube.get(isvcs_path(self._namespace))
        items = listing.get("items") or []
        first = next(iter(neighbours.claimants(items, kind, name, aliases)), None)
        if first is None or first["metadata"].get("uid") == self._owner["metadata"]["uid"]:
            return
        meta = first["metadata"]
        state = "being deleted" if meta.get("deletionTimestamp") else "in place"
        theirs = first.get("spec", {}).get("target", {})
        through = (
            f" through {theirs.get('kind', 'Deployment')} {theirs.get('name')}, the same pods"
            if (theirs.get("kind", "Deployment"), theirs.get("name")) != (kind, name)
            else ""
        )
        raise TargetProblem(
            "TargetTaken",
            f"{kind} {self._namespace}/{name} is tuned by InferenceService {meta['name']}"
            f"{through} (created {meta.get('creationTimestamp', '?')}, {state}); one "
            f"InferenceService per target: this one starts once {meta['name']} is deleted",
        )

    async def _aliases(self) -> set[tuple[str, str]]:
        """Other names of the target's pods: the KServe InferenceService that owns a
        target Deployment, or the predictor Deployment a KServe target owns."""
        target = self._spec.target
        if target.kind in ("Deployment", "StatefulSet"):
            try:
                workload = await self._kube.get(
                    workload_path(target.kind, self._namespace, target.name)
                )
            except NotFound:
                return set()
            owner = neighbours.kserve_owner(workload)
            return {("InferenceService", owner)} if owner else set()
        if target.kind != "InferenceService":
            return set()
        found: set[tuple[str, str]] = set()
        for name in neighbours.kserve_predictor_names(target.name):
            try:
                predictor = await self._kube.get(workload_path("Deployment", self._namespace, name))
            except NotFound:
                continue
            if neighbours.kserve_owner(predictor) == target.name:
                found.add(("Deployment", name))
        return found

    async def apply_env(
        self, workload: Mapping[str, Any], env: dict[str, str | None], *, force: bool
    ) -> None:
        meta = workload["metadata"]
        body = decisions.env_apply_patch(workload, self.container(workload), env)
        path = workload_path(workload.get("kind", "Deployment"), self._namespace, meta["name"])
        try:
            applied = await self._kube.server_side_apply(
                path, body, force=force, field_manager=self._field_manager
            )
        except KubeError as exc:
            raise TargetProblem(
                "ApplyFailed", f"server-side apply on {meta['name']}: {exc}"
            ) from exc
        await self.wait_rollout(applied)

    async def wait_rollout(self, workload: Mapping[str, Any]) -> None:
        """Return once the workload runs its template on every replica. Bounded by
        `tuning.trialDeadlineSeconds` (write-back, restore and cleanup run outside any
        trial's deadline); pods Unschedulable for `tuning.scheduleTimeoutSeconds`, a
        rollout the controller gave up on and crash-looping pods end it at once."""
        kind = workload.get("kind", "Deployment")
        name = workload["metadata"]["name"]
        await within_deadline(
            self._spec.tuning.trial_deadline_seconds,
            f"{kind} {name}",
            lambda last: self._follow_rollout(kind, name, last),
        )

    async def _follow_rollout(self, kind: str, name: str, last: list[str]) -> None:
        unschedulable = ScheduleTimeout(self._spec.tuning.schedule_timeout_seconds)
        reported: str | None = None
        while True:
            current = await self._kube.get(workload_path(kind, self._namespace, name))
            rollout = decisions.rollout_status(current)
            if rollout.failed:
                raise TargetProblem(rollout.reason, f"{kind} {name}: {rollout.message}")
            pods = await self.pods(current)
            problem = decisions.pod_problem(pods)
            last[0] = problem.message if problem is not None else rollout.message
            if problem is not None and problem.fatal:
                raise TargetProblem(problem.reason, problem.message)
            unschedulable.check(problem)
            if problem is not None and problem.message != reported:
                reported = problem.message
                await self._on_problem(problem)
            if rollout.done and len(decisions.ready_pod_ips(pods)) >= 1 and problem is None:
                return
            await asyncio.sleep(self._poll_s)

    def settled(self, workload: Mapping[str, Any], pods: list[JSON]) -> decisions.Rollout:
        """Whether the target runs its template on ready pods, as the verify watch judges
        it: a Deployment's or StatefulSet's own rollout status."""
        return decisions.rollout_status(workload)


async def within_deadline(
    limit_s: float, what: str, follow: Callable[[list[str]], Awaitable[None]]
) -> None:
    """Follow a rollout for at most `limit_s` (tuning.trialDeadlineSeconds); `follow`
    keeps in its list's one item what it saw last, which RolloutTimedOut then says."""
    last = ["nothing was read yet"]
    try:
        async with asyncio.timeout(limit_s):
            await follow(last)
    except TimeoutError:
        raise TargetProblem(
            "RolloutTimedOut",
            f"{what} did not roll out within {limit_s:g} s "
            f"(tuning.trialDeadlineSeconds): {last[0]}",
        ) from None


class ScheduleTimeout:
    """tuning.scheduleTimeoutSeconds: pods Unschedulable for that long end a rollout, and
    the study (no later trial would be placed either). Counted from when the pod's own
    condition says it became Unschedulable where that is earlier than when it was first
    seen here, so an operator restart does not start the wait over."""

    def __init__(
        self, limit_s: float, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._limit_s = float(limit_s)
        self._clock = clock
        self._since: datetime | None = None

    def check(self, problem: decisions.PodProblem | None) -> None:
        """Note what the pods show now; TargetProblem once Unschedulable has lasted the
        limit."""
        now = self._clock()
        if problem is None or problem.reason != "Unschedulable":
            self._since = None
            return
        if self._since is None:
            self._since = now
        # a condition stamped ahead of this clock (skew) never shortens the wait
        if problem.since is not None and problem.since < self._since:
            self._since = problem.since
        if (now - self._since).total_seconds() >= self._limit_s:
            raise TargetProblem(
                "Unschedulable",
                f"{problem.message} (for {self._limit_s:g} s, tuning.scheduleTimeoutSeconds)",
                stops_study=True,
            )
