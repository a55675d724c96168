"""The events the world posts itself on the InferenceService (a canary isolated, an
autoscaler found, production's live traffic, a read-back that failed), deduplicated
for the study's lifetime by `events.EventLimiter`."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from batchpilot.operator.events import EventLimiter
from batchpilot.operator.kube import Kube, KubeError, events_path

log = logging.getLogger(__name__)


class EventPoster:
    def __init__(self, kube: Kube, *, namespace: str, owner: Mapping[str, Any]) -> None:
        self._kube = kube
        self._namespace = namespace
        self._owner = owner
        self._limiter = EventLimiter()

    async def post(self, reason: str, message: str) -> None:
        """A Normal event on the InferenceService, through the study's limiter (events.py:
        one repeated on every trial is posted once per window, with a count); a failure
        to post is logged, never the study's failure."""
        text = self._limiter.admit("Normal", reason, message)
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
