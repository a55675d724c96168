"""The workload trials run on: for strategy Canary a copy of the target beside it, named
by `canary.canary_name`, adopted only when this InferenceService owns it, isolated from
every selector of the namespace, created again when someone deleted it, and deleted
when the study is done; for InPlace the target itself. Preparing it also finds the
HorizontalPodAutoscalers that scale the target."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from batchpilot.operator import canary as canaries
from batchpilot.operator import neighbours, writers
from batchpilot.operator.kube import JSON, Kube, NotFound, workload_path
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.selectors import SelectorError, from_label_selector
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.world import TargetProblem
from batchpilot.operator.worldevents import EventPoster

log = logging.getLogger(__name__)


class KubeCanary:
    def __init__(
        self,
        kube: Kube,
        workload: Workload,
        events: EventPoster,
        *,
        spec: InferenceServiceSpec,
        namespace: str,
        owner: Mapping[str, Any],
    ) -> None:
        self._kube = kube
        self._workload = workload
        self._events = events
        self._spec = spec
        self._namespace = namespace
        self._owner = owner
        # the canary's name once prepared (None: trials run on the target)
        self.name: str | None = None
        # HorizontalPodAutoscalers targeting the target, found when trials are prepared
        self.autoscalers: list[str] = []

    async def prepare(self, canary: str | None) -> str | None:
        await self._workload.check_sole_tuner()
        await self._find_autoscalers()
        if self._spec.tuning.strategy == "InPlace":
            return None
        workload = await self._workload.target()
        meta = self._owner["metadata"]
        name = canaries.canary_name(
            self._spec.target.name, self._namespace, str(meta["name"]), str(meta["uid"])
        )
        if canary is not None and canary != name and await self._owned(canary):
            name = canary  # created under an earlier naming rule, and ours
        existing = await self._owned(name, refuse=True)
        if existing is None:
            await self._create(workload, name, recreated=False)
        self.name = name
        return name

    async def measured(self, *, recreate: bool = False) -> JSON:
        """The workload trials run on. A canary someone deleted is created again when
        `recreate` (before a trial's apply), else it is a TargetProblem."""
        if self.name is None:
            return await self._workload.target()
        path = workload_path(self._spec.target.kind, self._namespace, self.name)
        try:
            return await self._kube.get(path)
        except NotFound as exc:
            if not recreate:
                raise TargetProblem("CanaryNotFound", f"canary {self.name} is gone") from exc
        await self._create(await self._workload.target(), self.name, recreated=True)
        return await self._kube.get(path)

    async def remove(self, name: str) -> None:
        """Delete the canary if this InferenceService owns it (by uid, checked again by
        the API server's precondition); someone else's workload of that name stays."""
        found = await self._owned(name)
        if found is not None:
            uid = found.get("metadata", {}).get("uid")
            await self._kube.delete(
                workload_path(self._spec.target.kind, self._namespace, name),
                uid=None if uid is None else str(uid),
            )
        self.name = None

    async def _find_autoscalers(self) -> None:
        """Say which HorizontalPodAutoscalers target the workload: the trials' own load
        may scale it out, so InPlace trials count the replicas (`KubeTrials.measure`)."""
        target = self._spec.target
        found = await writers.find_autoscalers(
            self._kube, self._namespace, target.kind, target.name
        )
        if found and found != self.autoscalers:
            await self._events.post(
                "AutoscalerDetected",
                f"HorizontalPodAutoscaler {', '.join(found)} scales {target.kind} "
                f"{target.name}: "
                + (
                    "an InPlace trial during which the replicas change is measured again"
                    if self._spec.tuning.strategy == "InPlace"
                    else "the canary is not scaled by it; the write-back is"
                ),
            )
        self.autoscalers = found

    async def _owned(self, name: str, *, refuse: bool = False) -> JSON | None:
        """The workload `name` when this InferenceService owns it; None when there is
        none, or (unless `refuse`) when someone else owns it."""
        try:
            found = await self._kube.get(
                workload_path(self._spec.target.kind, self._namespace, name)
            )
        except NotFound:
            return None
        try:
            canaries.check_adoptable(found, self._owner)
        except canaries.CanaryRefused as refused:
            if refuse:
                raise TargetProblem(refused.reason, refused.message) from None
            log.warning("%s", refused.message)
            return None
        return found

    async def _create(self, workload: Mapping[str, Any], name: str, *, recreated: bool) -> None:
        """Create the canary with pod labels no selector of the namespace matches, and
        say in an event which selectors were checked."""
        template = workload.get("spec", {}).get("template", {})
        try:
            own = from_label_selector(workload.get("spec", {}).get("selector"))
            if own is None:
                raise SelectorError("the target has no selector")
            found = await neighbours.survey(self._kube, self._namespace)
            isolation = canaries.isolate(
                (template.get("metadata") or {}).get("labels") or {}, own, found.selectors, name
            )
        except canaries.CanaryRefused as refused:
            raise TargetProblem(refused.reason, refused.message) from None
        except SelectorError as exc:
            raise TargetProblem("SelectorUnusable", f"canary {name}: {exc}") from None
        body = canaries.canary_manifest(workload, self._owner, name, isolation.labels)
        await self._kube.create(workload_path(self._spec.target.kind, self._namespace), body)
        verb = "recreated (it was deleted)" if recreated else "created"
        await self._events.post(
            "CanaryRecreated" if recreated else "CanaryIsolated",
            f"canary {name} {verb}; its pods carry {canaries.CANARY_LABEL}={name} and no "
            f"selector of the namespace matches them: {found.describe()}",
        )
