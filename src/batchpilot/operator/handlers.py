"""Kopf handlers for InferenceService: thin glue between Kopf, the API client, the
study runner and the world. `kopf run -m batchpilot.operator.handlers` runs them, and so
does `batchpilot operator`.

Shared objects live in Kopf's memo, so a test (or the CLI) can pass its own:
`slots` (the measurement slots), `world_factory` (builds the World of a resource),
`poll_s` and `backoff_cap_s`; `policy` (policy.PlatformPolicy, the platform team's
limits from the operator's flags); `election` (leader.ElectionSettings) runs the replica in a
leader election, and only the leader measures, patches workloads and writes status.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from batchpilot.operator import decisions, kstatus, metrics, platform, scope, specdiff
from batchpilot.operator.crd import GROUP, PLURAL, VERSION
from batchpilot.operator.diffbase import DigestDiffBaseStorage
from batchpilot.operator.events import EventLimiter
from batchpilot.operator.identity import replica_identity, user_agent
from batchpilot.operator.kopfidentity import identified
from batchpilot.operator.kube import Connection, Kube, KubeError, isvc_path
from batchpilot.operator.kubeworld import KubeWorld
from batchpilot.operator.leader import ElectionSettings, Elector, Leadership, Standalone
from batchpilot.operator.parentworld import ParentWorld
from batchpilot.operator.policy import PlatformPolicy
from batchpilot.operator.slots import Slots
from batchpilot.operator.spec import InferenceServiceSpec, explain_validation_error, parse_spec
from batchpilot.operator.standby import stand_by, stop_when_deposed
from batchpilot.operator.status import MAX_REASON_CHARS, InferenceServiceStatus, clipped
from batchpilot.operator.study import StudyRunner
from batchpilot.operator.studystate import EventType, RecoverableError, utcnow
from batchpilot.operator.world import ProblemSink, TargetProblem, World

log = logging.getLogger(__name__)

WorldFactory = Callable[[Kube, InferenceServiceSpec, str, Mapping[str, Any], ProblemSink], World]


class NotLeader(RuntimeError):
    """This replica lost the election: what it was doing is left to the new leader."""


class _Credentials:
    """The connection Kopf logged in with, reused by the operator's own API client."""

    connection: Connection | None = None


CREDENTIALS = _Credentials()
# where Kubernetes mounts a pod's service account token (Kopf reads it from there too)
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# target problems that make restoring pointless rather than worth retrying
GONE = frozenset({"TargetNotFound", "ContainerNotFound"})
# An error no rule expects (a bug, a missing module, a value the code cannot handle)
# repeats on every retry: after this many in a row the study stops, Failed and Stalled
# with the error, and gives back what it holds (canary, InPlace values, the slot).
# API errors and target problems are retried with backoff for as long as they last.
MAX_UNEXPECTED_ERRORS = 5
# How often a step in flight looks for an edit that must stop it (a restarting spec, the
# suspend brake): a parse of the body, nothing sent to the API server.
EDIT_CHECK_S = 1.0
# polls between two checks of a winner written live (every 15 s at the 5 s poll)
LIVE_CHECK_POLLS = 3


def kube_world(
    kube: Kube,
    spec: InferenceServiceSpec,
    namespace: str,
    owner: Mapping[str, Any],
    on_problem: ProblemSink,
    *,
    policy: PlatformPolicy | None = None,
) -> World:
    world = ParentWorld if spec.target.is_parent else KubeWorld
    return world(
        kube,
        spec=spec,
        namespace=namespace,
        owner=owner,
        on_problem=on_problem,
        prometheus_guard=platform.address_guard(policy or PlatformPolicy()),
    )


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    return log_in(memo, **kwargs)


def log_in(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    # one identity per process, for Kopf's client and the operator's own alike
    agent = user_agent(str(memo.setdefault("identity", replica_identity())))
    info = kopf.login_with_service_account(**kwargs)
    if info is not None:
        # the kubelet rotates this token: the operator's client re-reads it
        CREDENTIALS.connection = Connection.from_kopf(
            info, token_path=SERVICE_ACCOUNT_TOKEN, user_agent=agent
        )
        return identified(info, agent)
    info = kopf.login_with_kubeconfig(**kwargs)
    if info is None:
        return None
    CREDENTIALS.connection = Connection.from_kopf(info, user_agent=agent)
    return identified(info, agent)


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    prefix = GROUP
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    # Kopf would post every INFO log line as an event; the runner posts its own.
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 60.0
    settings.networking.connect_timeout = 10.0
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    memo.setdefault("slots", Slots(int(memo.get("max_concurrent_trials", 1))))
    # the platform team's limits (operator flags); without them, the defaults: no
    # Prometheus on loopback, link-local or the API server, trials of at most an hour
    policy = memo.setdefault("policy", platform.policy_from_flags())
    memo.setdefault("world_factory", functools.partial(kube_world, policy=policy))
    memo.setdefault("poll_s", 5.0)
    memo.setdefault("backoff_cap_s", 300.0)
    memo.setdefault("runners", {})
    memo.setdefault("locks", {})
    memo.setdefault("event_limiters", {})
    # Kopf gives every resource a shallow copy of the memo: objects created later are
    # shared through this dict, not through new memo keys
    memo.setdefault("clients", {})
    # set once the operator shuts down (its API session closes): an object, so that the
    # resources' copies of the memo see it
    memo.setdefault("shutting_down", asyncio.Event())
    if "leadership" not in memo:
        election = memo.get("election")
        if isinstance(election, ElectionSettings):
            # Kopf logs in only after startup, and the election runs before that
            if CREDENTIALS.connection is None:
                log_in(memo, settings=settings, logger=logger)
            if CREDENTIALS.connection is None:
                raise kopf.PermanentError("no credentials: no service account, no kubeconfig")
            elector = Elector(election, lambda: CREDENTIALS.connection)
            memo["leadership"] = elector
            memo["election_task"] = asyncio.create_task(elector.run())
            # no watch before this replica leads, and none after it lost the lead
            await stand_by(elector, memo["election_task"], str(memo.get("liveness") or ""))
            deposed = memo.get("deposed")
            if isinstance(deposed, asyncio.Event):
                memo["deposed_task"] = asyncio.create_task(stop_when_deposed(elector, deposed))
        else:
            memo["leadership"] = Standalone()


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    # a study daemon that has not stopped yet meets a closed session from here on
    memo["shutting_down"].set()
    deposed = memo.get("deposed_task")
    if isinstance(deposed, asyncio.Task):
        deposed.cancel()
    task = memo.get("election_task")
    if isinstance(task, asyncio.Task):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        elector = memo["leadership"]
        if isinstance(elector, Elector):
            # handed over now, not after the lease duration: the standby goes on at once
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(elector.settings.renew_s * 2):
                    await elector.release()
            await elector.close()
    kube = memo["clients"].pop("kube", None)
    if isinstance(kube, Kube):
        await kube.close()


def _kube(memo: kopf.Memo) -> Kube:
    clients: dict[str, Kube] = memo["clients"]
    kube = clients.get("kube")
    if kube is None:
        if CREDENTIALS.connection is None:
            raise kopf.TemporaryError("not logged in to the API server yet", delay=5)
        kube = clients["kube"] = Kube(CREDENTIALS.connection)
    return kube


def _post(memo: kopf.Memo, body: kopf.Body, type: EventType, reason: str, message: str) -> None:
    """Post an event through the resource's limiter (events.py): a Warning repeated on
    every retry is posted once per window."""
    key = (str(body.metadata.namespace), str(body.metadata.name))
    limiters: dict[tuple[str, str], EventLimiter] = memo["event_limiters"]
    text = limiters.setdefault(key, EventLimiter()).admit(type, reason, message)
    if text is not None:
        kopf.event(body, type=type, reason=reason, message=text[:1024])


def _lock(memo: kopf.Memo, key: tuple[str, str]) -> asyncio.Lock:
    locks: dict[tuple[str, str], asyncio.Lock] = memo["locks"]
    return locks.setdefault(key, asyncio.Lock())


def _runner(
    memo: kopf.Memo,
    body: kopf.Body,
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
) -> StudyRunner:
    namespace, name = str(body.metadata.namespace), str(body.metadata.name)
    kube = _kube(memo)
    leadership: Leadership = memo["leadership"]
    owner = {
        "apiVersion": body.get("apiVersion", f"{GROUP}/{VERSION}"),
        "kind": body.get("kind", "InferenceService"),
        "metadata": {"name": name, "uid": body.metadata.uid},
    }

    async def write_status(new: InferenceServiceStatus) -> None:
        if not leadership.is_leader():
            raise NotLeader(f"{namespace}/{name}: not the leader, status left to the leader")
        await kube.merge_patch(
            isvc_path(namespace, name, status=True),
            {"status": new.model_dump(mode="json", by_alias=True)},
        )

    def event(type: EventType, reason: str, message: str) -> None:
        if leadership.is_leader():
            _post(memo, body, type, reason, message)

    holder: list[StudyRunner] = []

    async def on_problem(problem: decisions.PodProblem) -> None:
        await holder[0].report_pod_problem(problem)

    def world_for(other: InferenceServiceSpec) -> World:
        made: World = memo["world_factory"](kube, other, namespace, owner, on_problem)
        return made

    world: World = world_for(spec)
    runner = StudyRunner(
        namespace=namespace,
        name=name,
        spec=spec,
        status=status,
        world=world,
        write_status=write_status,
        event=event,
        slots=memo["slots"],
        clock=utcnow,
        world_for=world_for,
        # a pod restarted off a live winner is set back within a few polls
        live_check_s=LIVE_CHECK_POLLS * float(memo["poll_s"]),
    )
    holder.append(runner)
    memo["runners"][namespace, name] = runner
    return runner


def _status_of(body: kopf.Body) -> InferenceServiceStatus:
    try:
        return InferenceServiceStatus.model_validate(dict(body.get("status") or {}))
    except ValidationError:
        # a status this version cannot read is replaced by a new study, not a crash loop
        return InferenceServiceStatus()


async def _fresh_status(memo: kopf.Memo, body: kopf.Body) -> InferenceServiceStatus:
    """The status as the API server has it now. A replica that just became the leader
    must not resume from a watch that may lag behind the last write of the one before."""
    leadership: Leadership = memo["leadership"]
    if isinstance(leadership, Standalone):
        return _status_of(body)
    namespace, name = str(body.metadata.namespace), str(body.metadata.name)
    try:
        current = await _kube(memo).get(isvc_path(namespace, name))
    except KubeError as error:
        log.warning(f"{namespace}/{name}: status not read ({error}); using the watched one")
        return _status_of(body)
    try:
        return InferenceServiceStatus.model_validate(dict(current.get("status") or {}))
    except ValidationError:
        return InferenceServiceStatus()


async def _report_invalid(
    memo: kopf.Memo,
    body: kopf.Body,
    generation: int,
    message: str,
    running: InferenceServiceStatus | None = None,
    *,
    reason: str = "InvalidSpec",
) -> None:
    """SpecValid=False (`reason`: InvalidSpec, or the platform policy's refusal), and the
    phase Failed unless a study is under way: that one keeps its phase, its `original`
    and its `canary`, so that a fixed spec or a deletion still undoes what it changed
    (`running`: the status of the study in memory)."""
    if not memo["leadership"].is_leader():
        return
    previous = running if running is not None else _status_of(body)
    conditions = decisions.set_condition(
        previous.conditions,
        type="SpecValid",
        status="False",
        reason=reason,
        message=message,
        generation=generation,
        now=utcnow(),
    )
    started = previous.canary is not None or previous.original is not None
    # a study that changed something is kept for its cleanup; nothing else is
    base = previous if started else InferenceServiceStatus()
    phase = previous.phase if started and previous.phase in decisions.ACTIVE_PHASES else "Failed"
    status = kstatus.with_kstatus(
        base.model_copy(
            update={
                "phase": phase,
                "observed_generation": generation,
                "message": message,
                "conditions": conditions,
            }
        ),
        utcnow(),
    )
    _post(memo, body, "Warning", reason, message)
    await _kube(memo).merge_patch(
        isvc_path(str(body.metadata.namespace), str(body.metadata.name), status=True),
        {"status": status.model_dump(mode="json", by_alias=True)},
    )


async def _caught(step: Awaitable[bool]) -> bool | Exception:
    """The step's result, or the error it raised held as its result: the daemon raises it
    again in its own frame. A task that ends in an exception while Kopf shuts down would
    be re-raised by Kopf as the operator's own failure."""
    try:
        return await step
    except Exception as error:
        return error


async def _until_stopped(
    task: asyncio.Task[bool | Exception],
    stopped: kopf.DaemonStopped,
    changed: Callable[[], bool],
    poll_s: float,
    leadership: Leadership,
) -> bool | None:
    """The step's result, or None when the daemon was told to stop, the spec changed or
    this replica lost the election first: the step is cancelled (a trial cut short is
    retried by the next leader or after a restart, or dropped with the study a new spec
    replaces)."""
    waiter = asyncio.ensure_future(stopped.wait())
    lost = asyncio.ensure_future(leadership.wait_lost())
    try:
        while True:
            done, _ = await asyncio.wait(
                {task, waiter, lost}, timeout=poll_s, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                result = task.result()
                if isinstance(result, Exception):
                    raise result
                return result
            if waiter in done or lost in done or changed():
                break
    finally:
        waiter.cancel()
        lost.cancel()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=60.0)
async def study(
    body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    key = (str(body.metadata.namespace), str(body.metadata.name))
    leadership: Leadership = memo["leadership"]
    rng = random.Random()
    runner: StudyRunner | None = None
    runner_generation: int | None = None
    attempt = 0
    unexpected = 0  # unexpected errors in a row
    while not stopped:
        if not leadership.is_leader():
            # another replica may move the study on: a later leadership starts from
            # the status the API server holds then, not from this one's memory
            runner, runner_generation = None, None
            memo["runners"].pop(key, None)
            await leadership.wait_leader(float(memo["poll_s"]))
            continue
        generation = int(body.metadata.get("generation") or 1)
        if runner_generation != generation:
            try:
                spec = parse_spec(body.get("spec"))
            except ValidationError as error:
                if runner_generation != -generation:
                    running = runner.status if runner is not None else None
                    message = f"invalid spec: {explain_validation_error(error)}"
                    await _report_invalid(memo, body, generation, message, running)
                    runner_generation = -generation  # reported once per generation
                await stopped.wait(float(memo["poll_s"]))
                continue
            # the platform team's limits: a refused spec is reported like an invalid one,
            # once per generation (its Prometheus host resolved once; every connection
            # checks again)
            if runner_generation == -generation:
                await stopped.wait(float(memo["poll_s"]))
                continue
            refused = await platform.spec_refusal(spec, memo["policy"])
            if refused is not None:
                running = runner.status if runner is not None else None
                reason, message = refused
                await _report_invalid(memo, body, generation, message, running, reason=reason)
                runner_generation = -generation
                await stopped.wait(float(memo["poll_s"]))
                continue
            status = runner.status if runner is not None else await _fresh_status(memo, body)
            if runner is not None and specdiff.restarts_study(runner.spec, spec):
                # undone under the spec it ran with: the old target, the old strategy
                async with _lock(memo, key):
                    try:
                        await runner.stop_early("the spec changed")
                    except Exception as error:  # the next study's start tries it again
                        await runner.cleanup_failed("the spec changed", error)
                status = runner.status
            runner = _runner(memo, body, spec, status)
            runner_generation = generation
        assert runner is not None  # set above once the spec parsed
        async with _lock(memo, key):
            task = asyncio.ensure_future(_caught(runner.step(generation)))

            def changed(seen: int = generation, running: StudyRunner = runner) -> bool:
                """A new generation that the step in flight must not finish under: one
                that restarts the study, or suspends it while load is being sent (the
                emergency brake: the pause that follows restores the target)."""
                if int(body.metadata.get("generation") or 1) == seen:
                    return False
                try:
                    new = parse_spec(body.get("spec"))
                except ValidationError:
                    return True
                if new.suspend and not running.spec.suspend and running.brakes_on_suspend:
                    return True
                return specdiff.restarts_study(running.spec, new)

            try:
                busy = await _until_stopped(
                    task, stopped, changed, min(EDIT_CHECK_S, float(memo["poll_s"])), leadership
                )
            except NotLeader:
                continue  # the loop's first check hands the study over
            except Exception as error:  # expected or not, the daemon must never crash-loop
                if stopped or memo["shutting_down"].is_set():
                    # the operator is stopping and may have closed its API session: an
                    # error now says nothing about the study, and must not count toward
                    # failing it
                    return
                delay = decisions.backoff_delay(
                    attempt, base=2.0, cap=float(memo["backoff_cap_s"]), rng=rng
                )
                attempt += 1
                # the module's logger, not Kopf's: Kopf would post each line as an event
                # whose text (the delay) changes on every retry
                where = f"{key[0]}/{key[1]}"
                if isinstance(error, RecoverableError):
                    log.warning(f"{where}: {error.reason}: {error.message}; retry in {delay:.0f} s")
                else:
                    unexpected += 1
                    if unexpected >= MAX_UNEXPECTED_ERRORS:
                        log.exception(f"{where}: study step failed {unexpected} times; stopped")
                        await runner.fail_unexpected(error, unexpected)
                        unexpected = 0
                        continue
                    log.exception(f"{where}: study step failed; retrying in {delay:.0f} s")
                    _post(memo, body, "Warning", "StepFailed", repr(error))
                await stopped.wait(delay)
                continue
        attempt = 0
        unexpected = 0
        if busy is None and stopped:
            return
        if busy is False:
            await stopped.wait(float(memo["poll_s"]))


@kopf.on.delete(GROUP, VERSION, PLURAL, retries=20, backoff=10)
async def finalize(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Undo an unfinished study before the resource goes: delete the canary, restore
    the original configuration of an InPlace target."""
    key = (str(body.metadata.namespace), str(body.metadata.name))
    leadership: Leadership = memo["leadership"]
    if not await leadership.wait_leader(leadership.takeover_s):
        # the leader cleans up; this replica only retries in case the leader dies
        raise kopf.TemporaryError("another operator replica leads and cleans up", delay=10)
    async with _lock(memo, key):
        runner: StudyRunner | None = memo["runners"].pop(key, None)
        recorded = False
        if runner is None:
            status = _status_of(body)
            try:
                spec = parse_spec(body.get("spec"))
            except ValidationError as error:
                # e.g. an operator restart after an invalid edit mid-study
                found = _recorded_cleanup_spec(body, status, error)
                if found is None:
                    return
                spec, recorded = found, True
            runner = _runner(memo, body, spec, status)
            memo["runners"].pop(key, None)
        plan = scope.cleanup_plan(runner.status, runner.spec)
        try:
            await runner.stop_early("the InferenceService was deleted")
        except TargetProblem as problem:
            if problem.reason in GONE:
                logger.warning(f"nothing to restore: {problem.message}")
            else:
                # every wait of the cleanup has a deadline and ran out: the resource goes
                # anyway (a finalizer that never lets go blocks `kubectl delete` and any
                # namespace deletion), saying what it leaves behind
                left = decisions.cleanup_left(runner.status, runner.spec)
                message = f"cleanup gave up ({problem.reason}: {problem.message}); left: {left}"
                kopf.event(body, type="Warning", reason="CleanupIncomplete", message=message[:1024])
                logger.warning(message)
        except KubeError as error:
            # the message goes into an annotation, whose size the API server caps
            message = clipped(f"cleanup: {error}", MAX_REASON_CHARS)
            raise kopf.TemporaryError(message, delay=10) from error
        else:
            if recorded:
                message = (
                    "cleaned up under the spec the study started with (status.startedWith), "
                    f"the current one being invalid: {plan}"
                )
                kopf.event(body, type="Normal", reason="CleanedUp", message=message[:1024])
    metrics.forget(*key)
    memo["locks"].pop(key, None)
    logger.info("cleaned up")


def _recorded_cleanup_spec(
    body: kopf.Body, status: InferenceServiceStatus, error: ValidationError
) -> InferenceServiceSpec | None:
    """The spec a deletion cleans up under when the current one is invalid: the one the
    study recorded when it started. None when there is nothing to undo, or nothing to
    undo it with (a Warning event says what stays behind)."""
    if status.canary is None and status.original is None:
        return None  # an invalid spec that never started a study: nothing to undo
    problem = "no status.startedWith was recorded (a study of an older version)"
    if status.started_with is not None:
        try:
            return scope.spec_from_scope(body.get("spec"), status.started_with)
        except scope.ScopeUnreadable as unreadable:
            problem = str(unreadable)
    left = scope.leftovers(status)
    message = (
        f"cannot clean up: the spec is invalid ({explain_validation_error(error)}) and "
        f"{problem}; left: {left}"
    )
    kopf.event(body, type="Warning", reason="CleanupIncomplete", message=message[:1024])
    return None
