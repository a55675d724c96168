"""The study's view of the cluster: read and change the target, run a canary, measure.

`World` is what the study runner needs; `KubeWorld` implements it against the API
server and the pods themselves. Tests give the runner a fake world instead.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from batchpilot.errors import TargetError
from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, json_capped, text_capped
from batchpilot.loadgen.protocols import REFERENCE_PATH, speaking
from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.operator import canary as canaries
from batchpilot.operator import decisions, envknobs, neighbours, promscope, workerfleet, writers
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.events import EventLimiter
from batchpilot.operator.kube import (
    JSON,
    Kube,
    KubeError,
    NotFound,
    events_path,
    field_manager,
    isvcs_path,
    pods_path,
    workload_path,
)
from batchpilot.operator.selectors import SelectorError, from_label_selector
from batchpilot.operator.spec import InferenceServiceSpec, Params, batching_config
from batchpilot.operator.status import OriginalConfig

if TYPE_CHECKING:
    from batchpilot.capacity.prometheus import PrometheusStepSource
    from batchpilot.capacity.prometheus_http import AddressGuard
    from batchpilot.runtimes.base import Runtime

log = logging.getLogger(__name__)

# problems of a pod that is (re)starting: waited out rather than failing the trial
TRANSIENT = frozenset({"NoReadyPods", "AdminUnreachable", "AdminNotApplied"})
# reads of a pod's knobs after an Env rollout before it counts as unreadable: the pod
# is ready, so its server answers; a port that never answers is not waited out
ENV_READ_ATTEMPTS = 3

ProblemSink = Callable[[decisions.PodProblem], Awaitable[None]]


class TargetProblem(TargetError):
    """The target cannot be used now; `reason` is CamelCase for conditions and events."""

    def __init__(
        self, reason: str, message: str, *, stops_study: bool = False, invalid: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        # retrying cannot help and the study holds what others wait for (the slot, a
        # canary's GPUs): the study fails instead of its next trial trying again
        self.stops_study = stops_study
        # something outside disturbed the measurement (an autoscaler): no verdict on the
        # configuration, whose trial is asked again without counting as a failure
        self.invalid = invalid


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
        light_load: bool | None = None,
    ) -> CapacityResult:
        """Score what is live. `since` is the trial's start: a container that exited
        after it (a crash, an OOM kill) spoils the trial, raised as TargetProblem.
        `seed` is the load's (default: the study's); the confirmation rounds set it.
        `light_load`: whether rates below the capacity found are measured too
        (capacity.lightload); by default when the wait is a large share of the SLA."""
        ...

    async def write_back(self, params: Params) -> None:
        """Write `params` onto the target's pod template (server-side apply), or, for a
        runtime applied live, onto every pod of the target."""
        ...

    async def restore(self, original: OriginalConfig) -> None:
        """Put the original configuration back on the target."""
        ...

    async def verify(self, seconds: float) -> None:
        """Watch the target for `seconds` after a write-back; a TargetProblem when its
        pods crash, restart or stay unready, or (load.source prometheus) when its
        traffic over the window broke the SLA."""
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
        prometheus_guard: AddressGuard | None = None,
    ) -> None:
        self._kube = kube
        # the platform's Prometheus URL policy, checked on every address a query uses
        self._prometheus_guard = prometheus_guard
        self._spec = spec
        self._namespace = namespace
        self._owner = owner
        self._on_problem = on_problem
        self._poll_s = poll_s
        self._http_timeout = aiohttp.ClientTimeout(total=http_timeout_s)
        self._settle_s = settle_s
        self._canary: str | None = None
        # pods the latest measurement spread its load over: its req/s are theirs together
        self.measured_pods: int | None = None
        # spec.runtime's adapter when it applies configurations live (None: apply.live
        # or the pod template)
        self._runtime = operator_runtimes.live_adapter(spec)
        self._field_manager = field_manager(str(owner["metadata"]["name"]))
        # load-worker pods, when load.workers.max allows more than the operator itself
        self.load_workers = workerfleet.for_spec(kube, spec, namespace, owner)
        # HorizontalPodAutoscalers targeting the target, found when trials are prepared
        self.autoscalers: list[str] = []
        # the environment the latest trial applied (method Env), checked on the pods
        self._trial_env: dict[str, str | None] | None = None
        # method Env: the unit the wait's variable is written in, and where the pods'
        # own knobs are read back after a rollout (None: nowhere)
        self._env_wait = operator_runtimes.env_wait(spec)
        self._env_readback = operator_runtimes.env_readback(spec)
        # events the world posts itself, deduplicated for the study's lifetime
        self._events = EventLimiter()

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

    async def _measured(self, *, recreate: bool = False) -> JSON:
        """The workload trials run on. A canary someone deleted is created again when
        `recreate` (before a trial's apply), else it is a TargetProblem."""
        if self._canary is None:
            return await self._target()
        path = workload_path(self._spec.target.kind, self._namespace, self._canary)
        try:
            return await self._kube.get(path)
        except NotFound as exc:
            if not recreate:
                raise TargetProblem("CanaryNotFound", f"canary {self._canary} is gone") from exc
        await self._create_canary(await self._target(), self._canary, recreated=True)
        return await self._kube.get(path)

    async def _pods(self, workload: Mapping[str, Any]) -> list[JSON]:
        try:
            selector = decisions.label_selector(workload)
        except SelectorError as exc:
            name = workload.get("metadata", {}).get("name", "?")
            raise TargetProblem("SelectorUnusable", f"{name}: {exc}") from exc
        listing = await self._kube.get(pods_path(self._namespace), {"labelSelector": selector})
        items: list[JSON] = listing.get("items", [])
        return items

    async def record_original(self, now: datetime) -> OriginalConfig:
        await self._check_sole_tuner()
        workload = await self._target()
        original = decisions.original_config(workload, self._spec, now, self._env_wait)
        if self._spec.apply.method == "Live":
            ips = await self._live_ips(workload)
            if ips:
                original = original.model_copy(update={"params": await self._live_read(ips[0])})
        return original

    async def _live_ips(self, workload: Mapping[str, Any]) -> list[str]:
        """The ready pods a live change goes to: every serving pod of the workload."""
        return decisions.ready_pod_ips(await self._pods(workload))

    async def _live_read(self, ip: str) -> Params:
        """The knobs live on the pod at `ip`: apply.live, or the runtime's adapter."""
        if self._runtime is None:
            return await self._live_get(ip)
        return await self._runtime_get(self._runtime, ip)

    # --- the canary -------------------------------------------------------------------

    async def _check_sole_tuner(self) -> None:
        """One InferenceService per target: the first claimant tunes it, the others are
        refused (retried, so one starts once the first is gone)."""
        kind, name = self._spec.target.kind, self._spec.target.name
        listing = await self._kube.get(isvcs_path(self._namespace))
        first = next(iter(neighbours.claimants(listing.get("items") or [], kind, name)), None)
        if first is None or first["metadata"].get("uid") == self._owner["metadata"]["uid"]:
            return
        meta = first["metadata"]
        state = "being deleted" if meta.get("deletionTimestamp") else "in place"
        raise TargetProblem(
            "TargetTaken",
            f"{kind} {self._namespace}/{name} is tuned by InferenceService {meta['name']} "
            f"(created {meta.get('creationTimestamp', '?')}, {state}); one InferenceService "
            f"per target: this one starts once {meta['name']} is deleted",
        )

    async def prepare(self, canary: str | None) -> str | None:
        await self._check_sole_tuner()
        await self._find_autoscalers()
        if self._spec.tuning.strategy == "InPlace":
            return None
        workload = await self._target()
        meta = self._owner["metadata"]
        name = canaries.canary_name(
            self._spec.target.name, self._namespace, str(meta["name"]), str(meta["uid"])
        )
        if canary is not None and canary != name and await self._owned_canary(canary):
            name = canary  # created under an earlier naming rule, and ours
        existing = await self._owned_canary(name, refuse=True)
        if existing is None:
            await self._create_canary(workload, name, recreated=False)
        self._canary = name
        return name

    async def _find_autoscalers(self) -> None:
        """Say which HorizontalPodAutoscalers target the workload: the trials' own load
        may scale it out, so InPlace trials count the replicas (`measure`)."""
        target = self._spec.target
        found = await writers.find_autoscalers(
            self._kube, self._namespace, target.kind, target.name
        )
        if found and found != self.autoscalers:
            await self._post_event(
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

    async def _owned_canary(self, name: str, *, refuse: bool = False) -> JSON | None:
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

    async def _create_canary(
        self, workload: Mapping[str, Any], name: str, *, recreated: bool
    ) -> None:
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
        await self._post_event(
            "CanaryRecreated" if recreated else "CanaryIsolated",
            f"canary {name} {verb}; its pods carry {canaries.CANARY_LABEL}={name} and no "
            f"selector of the namespace matches them: {found.describe()}",
        )

    async def _post_event(self, reason: str, message: str) -> None:
        """A Normal event on the InferenceService, through the study's limiter (events.py:
        one repeated on every trial is posted once per window, with a count); a failure
        to post is logged, never the study's failure."""
        text = self._events.admit("Normal", reason, message)
        if text is None:
            return
        message = text
        meta = self._owner["metadata"]
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": self._namespace,
            },
            "involvedObject": {
                "apiVersion": self._owner["apiVersion"],
                "kind": self._owner["kind"],
                "name": meta["name"],
                "namespace": self._namespace,
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Normal",
            "source": {"component": "batchpilot"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._kube.create(events_path(self._namespace), body)
        except KubeError as exc:
            log.warning("event %s not posted: %s", reason, exc)

    async def remove_canary(self, name: str) -> None:
        """Delete the canary if this InferenceService owns it (by uid, checked again by
        the API server's precondition); someone else's workload of that name stays."""
        found = await self._owned_canary(name)
        if found is not None:
            uid = found.get("metadata", {}).get("uid")
            await self._kube.delete(
                workload_path(self._spec.target.kind, self._namespace, name),
                uid=None if uid is None else str(uid),
            )
        self._canary = None

    # --- applying ---------------------------------------------------------------------

    async def apply(self, params: Params) -> None:
        workload = await self._measured(recreate=True)
        if self._spec.apply.method == "Env":
            env: dict[str, str | None] = dict(
                decisions.env_for_params(params, self._spec.env_names(), self._env_wait)
            )
            self._trial_env = None
            await self._apply_env(workload, env, force=True)
            self._trial_env = env
            measured = await self._measured()
            await self._check_not_reverted(measured)
            await self._check_env_read(measured, env)
        else:
            await self._wait_rollout(workload)
            await self._apply_live(await self._measured(), params)

    async def write_back(self, params: Params) -> None:
        if self._runtime is not None:
            # live on every pod of the target; status.persist says how to keep it
            await self._apply_live(await self._target(), params)
            return
        env = decisions.env_for_params(params, self._spec.env_names(), self._env_wait)
        await self._apply_env(await self._target(), dict(env), force=True)

    async def restore(self, original: OriginalConfig) -> None:
        workload = await self._target()
        if self._spec.apply.method == "Live" and original.params:
            await self._apply_live(workload, original.params)
        if self._runtime is not None:
            return  # the pod template was never changed
        # an apply that leaves out a variable the operator set releases it (removed if
        # it was unset before); variables that had a value get it back
        await self._apply_env(workload, dict(original.env), force=True)

    async def _check_not_reverted(self, workload: Mapping[str, Any]) -> None:
        """The ready pods run what the trial applied; a GitOps or parent controller that
        put its own values back makes the trial fail here, before anything is measured
        (or scored) under the trial's label."""
        if self._trial_env is None:
            return
        reverted = writers.env_reverted(
            await self._pods(workload), self._container(workload), self._trial_env
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
        tolerance = envknobs.resolution_ms(operator_runtimes.wait_knob(self._spec))
        for pod in await self._pods(workload):
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
                        return await self._live_get(ip)
                    runtime = operator_runtimes.adapter(self._spec)
                    assert runtime is not None  # env_readback names a runtime with one
                    return await self._runtime_get(runtime, ip)
            except TargetProblem as problem:
                last = problem.message
            except (TargetError, ValueError, TimeoutError, aiohttp.ClientError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        where = "apply.live" if self._env_readback == "apply.live" else self._spec.runtime.kind
        await self._post_event(
            "EnvUnverified",
            f"pod {pod}: the knobs it runs could not be read back through {where} ({last}); "
            "the trial is measured without knowing that the container read the variables",
        )
        return None

    async def _apply_env(
        self, workload: Mapping[str, Any], env: dict[str, str | None], *, force: bool
    ) -> None:
        meta = workload["metadata"]
        body = decisions.env_apply_patch(workload, self._container(workload), env)
        path = workload_path(workload.get("kind", "Deployment"), self._namespace, meta["name"])
        try:
            applied = await self._kube.server_side_apply(
                path, body, force=force, field_manager=self._field_manager
            )
        except KubeError as exc:
            raise TargetProblem(
                "ApplyFailed", f"server-side apply on {meta['name']}: {exc}"
            ) from exc
        await self._wait_rollout(applied)

    async def _wait_rollout(self, workload: Mapping[str, Any]) -> None:
        """Return once the workload runs its template on every replica. Bounded by
        `tuning.trialDeadlineSeconds` (write-back, restore and cleanup run outside any
        trial's deadline); pods Unschedulable for `tuning.scheduleTimeoutSeconds`, a
        rollout the controller gave up on and crash-looping pods end it at once."""
        kind = workload.get("kind", "Deployment")
        name = workload["metadata"]["name"]
        limit = float(self._spec.tuning.trial_deadline_seconds)
        last = ["the rollout was not read yet"]
        try:
            async with asyncio.timeout(limit):
                await self._follow_rollout(kind, name, last)
        except TimeoutError:
            raise TargetProblem(
                "RolloutTimedOut",
                f"{kind} {name} did not roll out within {limit:g} s "
                f"(tuning.trialDeadlineSeconds): {last[0]}",
            ) from None

    async def _follow_rollout(self, kind: str, name: str, last: list[str]) -> None:
        loop = asyncio.get_running_loop()
        schedule_limit = float(self._spec.tuning.schedule_timeout_seconds)
        unschedulable_since: float | None = None
        reported: str | None = None
        while True:
            current = await self._kube.get(workload_path(kind, self._namespace, name))
            rollout = decisions.rollout_status(current)
            if rollout.failed:
                raise TargetProblem(rollout.reason, f"{kind} {name}: {rollout.message}")
            pods = await self._pods(current)
            problem = decisions.pod_problem(pods)
            last[0] = problem.message if problem is not None else rollout.message
            if problem is not None and problem.fatal:
                raise TargetProblem(problem.reason, problem.message)
            if problem is not None and problem.reason == "Unschedulable":
                unschedulable_since = unschedulable_since or loop.time()
                if loop.time() - unschedulable_since >= schedule_limit:
                    raise TargetProblem(
                        "Unschedulable",
                        f"{problem.message} (for {schedule_limit:g} s, "
                        "tuning.scheduleTimeoutSeconds)",
                        stops_study=True,
                    )
            else:
                unschedulable_since = None
            if problem is not None and problem.message != reported:
                reported = problem.message
                await self._on_problem(problem)
            if rollout.done and len(decisions.ready_pod_ips(pods)) >= 1 and problem is None:
                return
            await asyncio.sleep(self._poll_s)

    def _settled(self, workload: Mapping[str, Any], pods: list[JSON]) -> decisions.Rollout:
        """Whether the target runs its template on ready pods, as the verify watch judges
        it: a Deployment's or StatefulSet's own rollout status."""
        return decisions.rollout_status(workload)

    async def verify(self, seconds: float) -> None:
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        workload = await self._target()
        kind, name = workload.get("kind", "Deployment"), workload["metadata"]["name"]
        before = await self._pods(workload)
        started = loop.time()
        # a pod may miss a readiness probe under load; one unready for half the window
        # (or still unready at its end) is what a broken configuration looks like
        grace = seconds / 2
        unready_since: float | None = None
        while True:
            current = await self._target()
            pods = await self._pods(current)
            # a pod that cannot be placed (an HPA scaling out on a full cluster) says
            # nothing about the configuration; one that crashes does
            problem = decisions.pod_problem(pods)
            if problem is not None and problem.fatal:
                raise TargetProblem(problem.reason, problem.message)
            restarted = decisions.restarted_pods(before, pods)
            if restarted:
                raise TargetProblem("PodRestarted", f"after the write-back: {restarted}")
            rollout = self._settled(current, pods)
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
        breach = await self._production_breach(seconds)
        if breach is not None:
            raise TargetProblem(
                "SLABreached",
                f"production traffic over {seconds:g} s after the write-back: {breach}",
            )

    async def production_breach(self, window_s: float) -> str | None:
        """How the target's traffic over the last `window_s` broke the SLA (re-tune
        OnSLABreach); None when it kept it or there is no Prometheus verdict."""
        return await self._production_breach(window_s)

    async def _production_breach(self, window_s: float) -> str | None:
        """The SLA breach Prometheus saw over the window, with load.source prometheus.
        A query that fails judges nothing: a monitoring outage is no reason to undo a
        configuration that runs."""
        from batchpilot.capacity.prometheus import NoLatencyHistogram, PrometheusQueryError
        from batchpilot.capacity.promql import MS_PER_UNIT

        if self._spec.load.source != "prometheus":
            return None
        pods = await self._pods(await self._target())
        if not pods:
            return None  # nothing runs to judge; the watch above saw to the pods
        try:
            source = self._prometheus_source([str(p["metadata"]["name"]) for p in pods])
        except NoLatencyHistogram:  # the study itself refused it: nothing to judge by
            return None
        if source is None:
            return None

        queries = source.queries(window_s)
        end = time.time()
        try:
            values = {
                name: await source.query_scalar(queries[name], at_unix=end)
                for name in ("p99", "ok_rps", "total_rps")
            }
        except PrometheusQueryError as exc:
            log.warning("verify: no SLA verdict from Prometheus: %s", exc)
            return None
        return decisions.sla_breach(
            p99_ms=values["p99"] * MS_PER_UNIT[source.metrics.latency_unit],
            ok_rps=values["ok_rps"],
            total_rps=values["total_rps"],
            sla=self._spec.sla.to_sla(),
        )

    def _admin_url(self, ip: str) -> str:
        live = self._spec.apply.live
        assert live is not None  # the spec's validation guarantees it for method Live
        # plain http even when the load is https: the spec keeps apply.live off an https
        # load port, so an admin port is never the TLS one
        return f"http://{ip}:{live.port}{live.path}"

    async def _live_get(self, ip: str) -> Params:
        """The pod's knobs from apply.live, read within the HTTP timeout (total) and
        MAX_CONTROL_BODY_BYTES: a longer answer is refused, not waited out."""
        url = self._admin_url(ip)
        async with aiohttp.ClientSession(timeout=self._http_timeout) as session:
            try:
                async with session.get(url) as response:
                    response.raise_for_status()
                    payload = await json_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
            except BodyTooLarge as exc:
                raise TargetProblem("AdminRejected", f"GET {url}: {exc}") from None
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TargetProblem("AdminUnreachable", f"GET {url}: {exc!r}") from exc
            except ValueError:
                raise TargetProblem("AdminRejected", f"GET {url} did not answer JSON") from None
        if not isinstance(payload, dict):
            raise TargetProblem(
                "AdminRejected",
                f"GET {url} answered {type(payload).__name__}, expected a JSON object",
            )
        return {k: v for k, v in payload.items() if isinstance(v, int | float)}

    async def _runtime_get(self, runtime: Runtime, ip: str) -> Params:
        control = operator_runtimes.control_for(runtime, self._spec, ip)
        try:
            config = await control.current()
        except TargetError as exc:
            raise TargetProblem("AdminUnreachable", f"{runtime.title} at {ip}: {exc}") from exc
        return dict(config.model_dump())

    async def _runtime_apply(
        self, runtime: Runtime, ips: list[str], params: Mapping[str, float | int]
    ) -> None:
        """Apply through the runtime's adapter on every pod; its `apply` returns only once
        the configuration is verified live. A value the runtime cannot take fails at
        once; anything else (a pod restarting, a load under way) is waited out."""
        config = batching_config(dict(params))
        try:
            runtime.check(config)
        except ValueError as exc:
            raise TargetProblem("AdminRejected", f"{runtime.title}: {exc}") from None
        for ip in ips:
            control = operator_runtimes.control_for(runtime, self._spec, ip)
            try:
                await control.apply(config)
            except TargetError as exc:
                raise TargetProblem(
                    "AdminNotApplied", f"{runtime.title} at {ip}: {config.label()}: {exc}"
                ) from exc

    async def _apply_live(
        self, workload: Mapping[str, Any], params: Mapping[str, float | int]
    ) -> None:
        """Apply `params` on every ready pod and verify them: PUT and GET on apply.live,
        or the runtime adapter's apply. A pod that is restarting (no ready pods, refused
        connections: its status lags its process) is waited for, up to `settle_s`; a
        refusal by the server (4xx) fails at once."""
        name = workload["metadata"]["name"]
        last = "no attempt"
        try:
            async with asyncio.timeout(self._settle_s):
                while True:
                    ips = await self._live_ips(workload)
                    try:
                        if not ips:
                            raise TargetProblem("NoReadyPods", f"{name} has no ready pods")
                        if self._runtime is None:
                            await self._put_and_verify(ips, params)
                        else:
                            await self._runtime_apply(self._runtime, ips, params)
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
                            text = (
                                await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
                            )[:300]
                            raise TargetProblem(
                                "AdminRejected", f"PUT {url} → {response.status}: {text}"
                            )
                except BodyTooLarge as exc:
                    raise TargetProblem("AdminRejected", f"PUT {url}: {exc}") from None
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
        light_load: bool | None = None,
    ) -> CapacityResult:
        from batchpilot.capacity.lightload import wait_needs_light_load

        if light_load is None:
            light_load = wait_needs_light_load(config, self._spec.sla.to_sla())
        workload = await self._measured()
        pods = await self._pods(workload)
        ips = decisions.ready_pod_ips(pods)
        if not ips:
            raise TargetProblem("NoReadyPods", "no ready pods to measure")
        urls = [operator_runtimes.pod_url(self._spec, ip) for ip in ips]
        names = [str(p["metadata"]["name"]) for p in pods if decisions.ready_pod_ips([p])]
        source = await self._checked_prometheus_source(names)
        self.measured_pods = len(ips)
        in_place = self._spec.tuning.strategy == "InPlace"
        replicas = writers.replicas_of(workload)
        from batchpilot.capacity.prometheus import PrometheusQueryError

        try:
            if source is not None and in_place:
                await self._subtract_live_traffic(source, len(ips))
            with speaking(operator_runtimes.load_protocol(self._spec)):
                result = await self._measure_capacity(urls, must_beat, seed, source, light_load)
        except PrometheusQueryError as exc:
            raise TargetProblem("PrometheusUnavailable", f"during the trial: {exc}") from None
        if in_place:
            await self._check_replicas(replicas)
        await self._check_not_reverted(await self._measured())
        # a container that ended mid-measurement (a crash, an OOM kill) is this
        # configuration's doing: the trial is a crash, which the study retries once and
        # then keeps the sampler away from; a pod that went away or restarted otherwise
        # (eviction, a node drain) makes the figures say nothing: the trial fails
        after = await self._pods(workload)
        crashed = decisions.crashed_since(after, since)
        if crashed:
            raise TargetProblem("Crashed", f"during the trial: {crashed}")
        restarted = decisions.restarted_pods(pods, after)
        if restarted:
            raise TargetProblem("PodRestarted", f"during the trial: {restarted}")
        return result

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
            # on production a breach is not provoked a second time to confirm it
            confirm_failures=not in_place,
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
            await self._post_event(
                "LiveTraffic",
                f"production serves {live / max(pods, 1):.1f} req/s per pod on the "
                f"{pods} measured pods ({live:.1f} req/s together): taken off each "
                "step's goodput before it is held against the offered load",
            )

    async def _check_replicas(self, before: int) -> None:
        """An InPlace trial during which the target's replicas changed measured a fleet
        that was not one size: invalid (asked again), naming the autoscaler."""
        after = writers.replicas_of(await self._measured())
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
            f"trial (changed by {by}); measured again",
            invalid=True,
        )

    async def _checked_prometheus_source(self, pod_names: list[str]) -> PrometheusStepSource | None:
        """The Prometheus source narrowed to the pods under load, its scrape interval
        checked against the step length before any load is sent."""
        from batchpilot.capacity.prometheus import NoLatencyHistogram, PrometheusQueryError

        try:
            source = self._prometheus_source(pod_names)
        except NoLatencyHistogram as exc:
            raise TargetProblem("NoLatencyHistogram", str(exc), stops_study=True) from None
        if source is None:
            return None
        from batchpilot.capacity.scrape import ScrapeWindowError

        try:
            await source.check_step(self._spec.load.step_seconds)
        except ScrapeWindowError as exc:
            raise TargetProblem("StepShorterThanScrapes", f"load.stepSeconds: {exc}") from None
        except PrometheusQueryError as exc:
            raise TargetProblem("PrometheusUnavailable", str(exc)) from None
        return source

    def _prometheus_source(self, pod_names: list[str]) -> PrometheusStepSource | None:
        """The source reading the series of `pod_names` only: a canary's pods, not
        production's; the pods under load, not every pod of the namespace."""
        prometheus = self._spec.load.prometheus
        if self._spec.load.source != "prometheus" or prometheus is None:
            return None
        from batchpilot.operator.promsource import prometheus_source

        try:
            selector = promscope.scoped_selector(
                prometheus.selector, pod_names, prometheus.pod_label
            )
        except ValueError as exc:
            raise TargetProblem("PrometheusScope", f"load.prometheus: {exc}") from None
        return prometheus_source(
            self._spec, selector=selector, address_guard=self._prometheus_guard
        )
