"""Leader election over a coordination.k8s.io Lease, so that of several operator
replicas exactly one sends load, patches workloads and writes study status.

The leader renews the Lease every renew period. A standby takes it over once it has
seen the Lease unchanged for the holder's whole lease duration, timed on its own clock
(clocks of two machines need not agree). The leader times its leadership from when it
sent its last successful renewal and steps down one renew period before the lease
could expire, so it has stopped before any standby can take over. The pure functions
(`next_action`, `leads`, `check_timing`) hold those decisions; `Elector` does the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol
from urllib.parse import quote

from batchpilot.operator.kube import Connection, Kube, KubeError, NotFound

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "batchpilot-operator"
DEFAULT_DURATION_S = 15
DEFAULT_RENEW_S = 5.0
# the leader may miss this many renewals in a row before it steps down
RENEWALS_PER_LEASE = 3
MIN_RENEW_S = 0.2
MAX_DURATION_S = 300

Action = Literal["create", "renew", "acquire", "follow"]


def check_timing(duration_s: int, renew_s: float) -> str | None:
    """What is wrong with a lease duration and renew period, or None when they work."""
    if not 1 <= duration_s <= MAX_DURATION_S:
        return f"the lease duration must be 1 to {MAX_DURATION_S} s, got {duration_s}"
    if renew_s < MIN_RENEW_S:
        return f"the renew period must be at least {MIN_RENEW_S} s, got {renew_s:g}"
    if renew_s * RENEWALS_PER_LEASE > duration_s:
        return (
            f"the renew period ({renew_s:g} s) must be at most a third of the lease "
            f"duration ({duration_s} s), so that a missed renewal does not cost the lease"
        )
    return None


@dataclass(frozen=True)
class ElectionSettings:
    namespace: str
    identity: str
    name: str = DEFAULT_LEASE_NAME
    duration_s: int = DEFAULT_DURATION_S
    renew_s: float = DEFAULT_RENEW_S

    def __post_init__(self) -> None:
        problem = check_timing(self.duration_s, self.renew_s)
        if problem is not None:
            raise ValueError(problem)


@dataclass(frozen=True)
class LeaseView:
    """What the election reads of a Lease."""

    holder: str
    duration_s: int
    resource_version: str
    transitions: int
    acquire_time: str | None

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> LeaseView:
        spec = body.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            resource_version=str((body.get("metadata") or {}).get("resourceVersion") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
            acquire_time=spec.get("acquireTime"),
        )


def next_action(view: LeaseView | None, identity: str, unchanged_for_s: float) -> Action:
    """What a replica does with the Lease it just read: create it when there is none,
    renew its own, acquire one released (no holder) or not renewed for the holder's
    lease duration, else follow."""
    if view is None:
        return "create"
    if view.holder == identity:
        return "renew"
    if not view.holder or unchanged_for_s >= view.duration_s:
        return "acquire"
    return "follow"


def step_down_at(renewed_at: float, settings: ElectionSettings) -> float:
    """When a leader whose last renewal was sent at `renewed_at` stops leading: one
    renew period before any standby may take the lease over."""
    return renewed_at + settings.duration_s - settings.renew_s


def leads(renewed_at: float | None, now: float, settings: ElectionSettings) -> bool:
    return renewed_at is not None and now < step_down_at(renewed_at, settings)


def lease_body(
    settings: ElectionSettings, previous: LeaseView | None, *, holder: str, now: datetime
) -> dict[str, Any]:
    """The Lease as `holder` writes it; with a previous version, a replace that the API
    server refuses (409) if another replica wrote in between."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    taking_over = previous is None or previous.holder != holder
    transitions = 0 if previous is None else previous.transitions
    if previous is not None and taking_over and holder:
        transitions += 1
    metadata: dict[str, Any] = {"name": settings.name, "namespace": settings.namespace}
    if previous is not None:
        metadata["resourceVersion"] = previous.resource_version
    spec: dict[str, Any] = {
        "holderIdentity": holder or None,
        "leaseDurationSeconds": settings.duration_s if holder else 1,
        "renewTime": stamp,
        "leaseTransitions": transitions,
        "acquireTime": stamp if taking_over or previous is None else previous.acquire_time,
    }
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": spec,
    }


def leases_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
    return f"{base}/{quote(name)}" if name else base


class Leadership(Protocol):
    """What the handlers ask of the election."""

    # how long a standby may take to notice that the leader died and take over
    takeover_s: float

    def is_leader(self) -> bool: ...

    async def wait_leader(self, timeout_s: float) -> bool: ...

    async def wait_lost(self) -> None: ...


class Standalone:
    """One replica (no election): always the leader."""

    takeover_s = 0.0

    def is_leader(self) -> bool:
        return True

    async def wait_leader(self, timeout_s: float) -> bool:
        return True

    async def wait_lost(self) -> None:
        # never lost; the caller cancels this wait with the step it guards
        await asyncio.Event().wait()


class Elector:
    """Runs the election of one replica. `run()` until cancelled; `release()` on a
    clean shutdown hands the Lease over at once instead of after its duration."""

    def __init__(
        self,
        settings: ElectionSettings,
        connect: Callable[[], Connection | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self._connect = connect
        self._clock = clock
        self._now = now
        self._kube: Kube | None = None
        self._renewed_at: float | None = None
        self._seen: tuple[str, str] | None = None
        self._seen_at = clock()
        self._leading = asyncio.Event()
        self._following = asyncio.Event()
        self._following.set()
        self._path = leases_path(settings.namespace, settings.name)
        self.takeover_s = settings.duration_s + 2 * settings.renew_s

    def is_leader(self) -> bool:
        return leads(self._renewed_at, self._clock(), self.settings)

    async def wait_leader(self, timeout_s: float) -> bool:
        # the events follow the clock first: a set event whose lead just ran out would
        # return at once, and a caller looping on it would never let the loop run
        self._update()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._leading.wait()
        return self.is_leader()

    async def wait_lost(self) -> None:
        self._update()
        await self._following.wait()

    def _client(self) -> Kube | None:
        if self._kube is None:
            connection = self._connect()
            if connection is None:
                return None  # not logged in yet
            # one attempt per round, timed out well within the step-down margin: the
            # next round is the retry
            self._kube = Kube(
                connection, timeout_s=max(MIN_RENEW_S, self.settings.renew_s), attempts=1
            )
        return self._kube

    def _update(self) -> None:
        if self.is_leader():
            if not self._leading.is_set():
                log.info(f"leading as {self.settings.identity} (lease {self._path})")
            self._leading.set()
            self._following.clear()
        else:
            if self._leading.is_set():
                log.warning(f"{self.settings.identity} stepped down: the lease was not renewed")
            self._leading.clear()
            self._following.set()

    async def _read(self, kube: Kube) -> LeaseView | None:
        try:
            return LeaseView.from_api(await kube.get(self._path))
        except NotFound:
            return None

    async def round(self) -> Action | None:
        """Read the Lease and act on it once; the action taken, None when the API
        could not be asked."""
        kube = self._client()
        if kube is None:
            return None
        try:
            view = await self._read(kube)
            now = self._clock()
            seen = None if view is None else (view.holder, view.resource_version)
            if seen != self._seen:
                self._seen, self._seen_at = seen, now
            action = next_action(view, self.settings.identity, now - self._seen_at)
            if action == "follow":
                self._renewed_at = None  # another replica holds it: stop at once
                return action
            sent = self._clock()
            body = lease_body(self.settings, view, holder=self.settings.identity, now=self._now())
            if view is None:
                await kube.create(leases_path(self.settings.namespace), body)
            else:
                await kube.request("PUT", self._path, body=body)
            self._renewed_at = sent
            return action
        except KubeError as error:
            # a conflict is another replica's write; anything else is retried next
            # round, and the lease's own deadline decides when this replica steps down
            log.warning(f"lease {self._path}: {error}")
            return None
        finally:
            self._update()

    def _pause(self) -> float:
        if self._renewed_at is None:
            return self.settings.renew_s
        until_step_down = step_down_at(self._renewed_at, self.settings) - self._clock()
        return max(0.0, min(self.settings.renew_s, until_step_down))

    async def run(self) -> None:
        while True:
            await self.round()
            await asyncio.sleep(self._pause())
            self._update()

    async def release(self) -> None:
        """Give the Lease up when this replica holds it (a clean shutdown)."""
        kube = self._kube
        if kube is None or not self.is_leader():
            return
        self._renewed_at = None
        self._leading.clear()  # stepping down on purpose: no warning from _update
        self._update()
        log.info(f"{self.settings.identity} releases the lease {self._path}")
        try:
            view = await self._read(kube)
            if view is not None and view.holder == self.settings.identity:
                body = lease_body(self.settings, view, holder="", now=self._now())
                await kube.request("PUT", self._path, body=body)
        except KubeError as error:
            log.warning(f"lease {self._path}: not released: {error}")

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()
            self._kube = None
