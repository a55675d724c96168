"""The load-worker fleet of one InferenceService on the API server: start the Job (with
its ServiceAccount and token Secret), find its ready pods, send steps to them, remove it.

The token is made by this operator process and never read back (the operator needs no
`get` on Secrets): a fleet this process did not start -- one left by an earlier operator
process, or of another size -- is deleted and started again with a fresh token.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from batchpilot.loadgen.result import LoadResult
from batchpilot.loadgen.serve_worker import ShareSender, run_remote_shares
from batchpilot.loadgen.workers import ShareSpec, WorkerError
from batchpilot.models import StepResult
from batchpilot.operator import workerjob
from batchpilot.operator.kube import JSON, Kube, KubeError, NotFound, pods_path
from batchpilot.operator.spec import InferenceServiceSpec, WorkersSpec
from batchpilot.operator.status import LoadWorkersEntry

log = logging.getLogger(__name__)

IMAGE_ENV = "BATCHPILOT_WORKER_IMAGE"
# How long worker pods may take to be scheduled, pull their image and become ready.
READY_TIMEOUT_S = 180.0
# How long a deleted Job may take to be gone before a new one of its name is created.
GONE_TIMEOUT_S = 60.0


class FleetError(RuntimeError):
    """The worker fleet could not be started; `reason` is CamelCase."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def jobs_path(namespace: str, name: str = "") -> str:
    base = f"/apis/batch/v1/namespaces/{quote(namespace)}/jobs"
    return f"{base}/{quote(name)}" if name else base


def core_path(kind: str, namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/{kind}"
    return f"{base}/{quote(name)}" if name else base


@dataclass(frozen=True)
class FleetFigures:
    """What status shows of the fleet that ran the latest trial."""

    job: str
    workers: int
    ceiling_rps: float | None


class WorkerFleet:
    """One InferenceService's worker Job, as this operator process started it."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        owner: Mapping[str, Any],
        spec: WorkersSpec,
        default_image: str | None,
        poll_s: float = 1.0,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._owner = owner
        self._spec = spec
        self._image = spec.image or default_image
        self._poll_s = poll_s
        self._ready_timeout_s = ready_timeout_s
        meta = owner["metadata"]
        self.name = workerjob.fleet_name(str(meta["name"]), namespace, str(meta["uid"]))
        self._token: str | None = None
        self._workers = 0

    @property
    def workers(self) -> int:
        """Workers of the Job this process started (0: none)."""
        return self._workers

    async def ensure(self, workers: int) -> list[str]:
        """A Job of `workers` ready pods, started by this process; their addresses in
        index order."""
        if self._image is None:
            raise FleetError(
                "NoWorkerImage",
                f"load.workers.image is unset and the operator has no default ({IMAGE_ENV})",
            )
        if workers != self._workers or self._token is None:
            await self._start(workers, self._image)
        return await self._wait_ready(workers)

    async def _start(self, workers: int, image: str) -> None:
        await self.remove()
        token = secrets.token_urlsafe(32)
        ns, owner = self._namespace, self._owner
        await self._create(
            core_path("serviceaccounts", ns),
            workerjob.service_account_manifest(self.name, ns, owner),
        )
        await self._create(
            core_path("secrets", ns), workerjob.secret_manifest(self.name, ns, owner, token)
        )
        job = workerjob.job_manifest(
            self.name, ns, owner, workers=workers, spec=self._spec, image=image
        )
        await self._kube.create(jobs_path(ns), job)
        self._token, self._workers = token, workers
        log.info("%s/%s: load-worker Job of %d workers started", ns, self.name, workers)

    async def _create(self, path: str, body: JSON) -> None:
        """Create, or replace an object of that name left behind (owned by us: same name
        hash) -- a Secret must carry this process's token."""
        try:
            await self._kube.create(path, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
            await self._kube.delete(f"{path}/{quote(self.name)}")
            await self._kube.create(path, body)

    async def _wait_ready(self, workers: int) -> list[str]:
        last = "no pods yet"
        try:
            async with asyncio.timeout(self._ready_timeout_s):
                while True:
                    listing = await self._kube.get(
                        pods_path(self._namespace),
                        {"labelSelector": f"{workerjob.WORKER_LABEL}={self.name}"},
                    )
                    pods = listing.get("items") or []
                    addresses = workerjob.worker_addresses(pods, workers)
                    if addresses is not None:
                        return addresses
                    last = f"{len(pods)} pods, not all {workers} indexes ready"
                    await asyncio.sleep(self._poll_s)
        except TimeoutError:
            raise FleetError(
                "WorkersNotReady",
                f"load-worker Job {self.name}: not ready within {self._ready_timeout_s:g} s "
                f"({last})",
            ) from None

    async def send(self, addresses: list[str], spec: ShareSpec) -> LoadResult:
        assert self._token is not None  # ensure() started the fleet
        return await run_remote_shares(addresses, self._token, spec)

    async def remove(self) -> None:
        """Delete the Job (its pods go with it), the Secret and the ServiceAccount, and
        wait until the Job is gone, so one of the same name can follow."""
        ns = self._namespace
        self._token, self._workers = None, 0
        await self._kube.delete(jobs_path(ns, self.name))
        await self._kube.delete(core_path("secrets", ns, self.name))
        await self._kube.delete(core_path("serviceaccounts", ns, self.name))
        try:
            async with asyncio.timeout(GONE_TIMEOUT_S):
                while True:
                    try:
                        await self._kube.get(jobs_path(ns, self.name))
                    except NotFound:
                        return
                    await asyncio.sleep(self._poll_s)
        except TimeoutError:
            raise FleetError(
                "WorkersNotRemoved", f"load-worker Job {self.name} still there after deletion"
            ) from None


def for_spec(
    kube: Kube, spec: InferenceServiceSpec, namespace: str, owner: Mapping[str, Any]
) -> LoadWorkers | None:
    """The study's load workers; None when load.workers.max is 1 (no Job, ever)."""
    workers = spec.load.workers
    if workers.max <= 1:
        return None
    fleet = WorkerFleet(
        kube,
        namespace=namespace,
        owner=owner,
        spec=workers,
        default_image=os.environ.get(IMAGE_ENV) or None,
    )
    return LoadWorkers(fleet, workers.max)


class LoadWorkers:
    """The sizing and the fleet of one study's load workers, as the world measures with
    them: how many a trial needs, the sender of its steps, the figures status shows."""

    def __init__(self, fleet: WorkerFleet, max_workers: int) -> None:
        self._fleet = fleet
        self._max = max_workers
        self._ceiling_rps: float | None = None
        self._best_rps: float | None = None
        # the fleet that ran the latest trial (None: the operator sent the load itself)
        self.figures: FleetFigures | None = None

    @property
    def ceiling_rps(self) -> float | None:
        return None if self._ceiling_rps is None else round(self._ceiling_rps, 1)

    def needed(self, max_rps_total: float | None) -> int:
        top = workerjob.highest_search_rps(max_rps_total, self._best_rps)
        return workerjob.workers_needed(top, self._ceiling_rps, self._max)

    async def sender(self, max_rps_total: float | None) -> ShareSender | None:
        """The sender of this trial's steps, its fleet started and ready; None when one
        client is enough (the operator sends the load itself)."""
        workers = self.needed(max_rps_total)
        if workers <= 1:
            self.figures = None
            return None
        # said before the fleet is ready: a trial that fails waiting for it was meant
        # for these workers
        self.figures = FleetFigures(self._fleet.name, workers, self._ceiling_rps)
        await self._fleet.ensure(workers)
        fleet = self._fleet

        async def send(spec: ShareSpec) -> LoadResult:
            # addresses found again at every step: a worker pod the Job controller
            # replaced after a crash has a new IP
            try:
                addresses = await fleet.ensure(workers)
            except (FleetError, KubeError) as exc:
                raise WorkerError(f"load workers unavailable: {exc}") from exc
            return await fleet.send(addresses, spec)

        return send

    def observe(self, steps: Sequence[StepResult], effective_rps: float) -> None:
        """Learn the per-worker ceiling and the throughput from a finished trial."""
        ceiling = workerjob.worker_ceiling_rps(steps)
        if ceiling is not None:
            self._ceiling_rps = ceiling
        if effective_rps > 0:
            self._best_rps = max(self._best_rps or 0.0, effective_rps)
        if self.figures is not None:
            self.figures = FleetFigures(self.figures.job, self.figures.workers, ceiling)

    async def remove(self) -> None:
        await self._fleet.remove()
        self.figures = None


def trial_entry(workers: LoadWorkers | None, trial: int) -> LoadWorkersEntry | None:
    """Status's record of the load workers of `trial` (None without load workers)."""
    if not isinstance(workers, LoadWorkers):
        return None
    figures = workers.figures
    if figures is None:
        return LoadWorkersEntry(trial=trial, workers=1, ceiling_rps=workers.ceiling_rps)
    return LoadWorkersEntry(
        trial=trial,
        workers=figures.workers,
        ceiling_rps=None if figures.ceiling_rps is None else round(figures.ceiling_rps, 1),
        job=figures.job,
    )
