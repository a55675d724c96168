"""The pure parts of benchmarks/operator_study.py: counting the operator's requests in
the API server's audit log, and the resident memory of a process group."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import operator_study as study

OPERATOR = "system:serviceaccount:batchpilot-system:batchpilot-operator"
CONTROLLER = "system:serviceaccount:kube-system:deployment-controller"


def event(audit_id: str, user: str, verb: str, stage: str, received: str) -> dict[str, Any]:
    return {
        "kind": "Event",
        "auditID": audit_id,
        "stage": stage,
        "verb": verb,
        "user": {"username": user},
        "requestReceivedTimestamp": received,
    }


def test_requests_are_counted_once_per_audit_id_for_the_operator_since_the_start(
    tmp_path: Path,
) -> None:
    log = tmp_path / "audit.log"
    events = [
        # a watch logs when its response starts and when it ends: one request
        event("w1", OPERATOR, "watch", "ResponseStarted", "2026-01-01T10:00:01.000000Z"),
        event("w1", OPERATOR, "watch", "ResponseComplete", "2026-01-01T10:00:01.000000Z"),
        event("g1", OPERATOR, "get", "ResponseComplete", "2026-01-01T10:00:02.500000Z"),
        event("p1", OPERATOR, "patch", "ResponseComplete", "2026-01-01T10:00:03Z"),
        # another ServiceAccount's request, and one of the operator's before the start
        event("c1", CONTROLLER, "get", "ResponseComplete", "2026-01-01T10:00:02Z"),
        event("old", OPERATOR, "list", "ResponseComplete", "2026-01-01T09:59:59.999999Z"),
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))

    counted = study.count_requests(log, OPERATOR, datetime(2026, 1, 1, 10, tzinfo=UTC))

    assert dict(counted) == {"watch": 1, "get": 1, "patch": 1}


def test_group_rss_covers_this_process() -> None:
    own_kb = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    assert study.group_rss_mb(os.getpgid(0)) >= own_kb / 1024 * 0.5
    # a group with no process holds no memory
    assert study.group_rss_mb(2**22 + 7) == 0.0
