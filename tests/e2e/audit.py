"""The API server's audit log in the e2e control plane: a policy that records who wrote
what (Metadata level: no bodies) for the groups the operator touches, and a reader.

Only writes by ServiceAccounts are logged (the operator runs as one; so do the
controller-manager's controllers), and the log is rotated, so that the whole session
costs little disk and little API server time. The operator's replicas share one
ServiceAccount and tell themselves apart by their User-Agent."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
GROUPS = ("", "apps", "batchpilot.dev", "coordination.k8s.io", "events.k8s.io")
LEASES = ("coordination.k8s.io", "leases")
POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # one event per request, once it completed (a write has no long-running stages)
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": list(WRITE_VERBS),
            "userGroups": ["system:serviceaccounts"],
            "resources": [{"group": group} for group in GROUPS],
        },
        {"level": "None"},
    ],
}
MAX_SIZE_MB = 20
MAX_BACKUPS = 2


def apiserver_args(workdir: Path) -> tuple[list[str], Path]:
    """kube-apiserver flags for the audit log under `workdir`, and the log's path."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY, sort_keys=False))
    log = workdir / "audit.log"
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={log}",
        "--audit-log-format=json",
        f"--audit-log-maxsize={MAX_SIZE_MB}",
        f"--audit-log-maxbackup={MAX_BACKUPS}",
    ], log


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Write:
    """One write the API server answered, as its audit log has it."""

    verb: str
    user: str
    user_agent: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    received: datetime
    completed: datetime

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Write:
        ref = event.get("objectRef") or {}
        return cls(
            verb=str(event["verb"]),
            user=str((event.get("user") or {}).get("username", "")),
            user_agent=str(event.get("userAgent", "")),
            group=str(ref.get("apiGroup", "")),
            resource=str(ref.get("resource", "")),
            subresource=str(ref.get("subresource", "")),
            namespace=str(ref.get("namespace", "")),
            name=str(ref.get("name", "")),
            code=int((event.get("responseStatus") or {}).get("code", 0)),
            received=_time(event["requestReceivedTimestamp"]),
            completed=_time(event["stageTimestamp"]),
        )

    @property
    def on_lease(self) -> bool:
        return (self.group, self.resource) == LEASES

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300

    def __str__(self) -> str:
        what = "/".join(p for p in (self.resource, self.subresource) if p)
        return (
            f"{self.received.isoformat()} {self.verb} {self.group or 'core'} {what} "
            f"{self.namespace}/{self.name} -> {self.code} by {self.user_agent!r}"
        )


def _files(log: Path) -> list[Path]:
    # rotated backups are named after the log with a timestamp: oldest first, then the log
    backups = sorted(log.parent.glob(f"{log.stem}-*{log.suffix}"))
    return [*backups, log] if log.exists() else backups


def writes(log: Path, *, user: str, since: datetime) -> list[Write]:
    """The writes `user` sent from `since` on, in the order the API server received
    them."""
    found: list[Write] = []
    for path in _files(log):
        found.extend(_parse(path.read_text().splitlines(), user, since))
    return sorted(found, key=lambda w: w.received)


def _parse(lines: Iterable[str], user: str, since: datetime) -> Iterable[Write]:
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
            continue
        write = Write.from_event(event)
        if write.user == user and write.received >= since:
            yield write
