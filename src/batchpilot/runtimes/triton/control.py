"""Triton's batching knobs changed live, and what Triton reports it did.

The change goes through explicit model control: read the model's configuration, edit the
two knobs, and load the model again with the edited configuration as a JSON string.
Triton loads the new instance beside the old one and switches over when it is ready, so
requests keep being served. A change is verified twice: by reading the configuration
back, and by the batch sizes Triton executes afterwards (its inference and execution
counters)."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from batchpilot.errors import TargetError
from batchpilot.httpbody import MAX_METRICS_BODY_BYTES, BodyTooLarge, text_capped
from batchpilot.runtimes.http import DIRECT, ControlClient, HttpAccess
from batchpilot.runtimes.triton.repository import TritonBatching


class TritonError(TargetError):
    """Triton answered something unexpected or runs another configuration than asked."""


def preferred_sizes(original: dict[str, Any], cap: int) -> list[int]:
    """The preferred batch sizes a trial at `cap` runs with, always decided from the
    user's original configuration, never from a previous trial's: the sizes the user
    pinned are kept exactly when every one is within the cap; otherwise (none pinned, or
    one above the cap, which Triton refuses) they are cleared, and Triton then prefers
    the cap itself. A list equal to the original cap alone is what Triton fills in for a
    model that pins none, so it counts as none pinned."""
    dynamic = original.get("dynamic_batching") or {}
    pinned = [int(size) for size in dynamic.get("preferred_batch_size", [])]
    if pinned == [original.get("max_batch_size")]:
        return []
    return pinned if all(size <= cap for size in pinned) else []


def effective_preferred(original: dict[str, Any], cap: int) -> list[int]:
    """What Triton reads back (and runs) for `preferred_sizes`: a cleared list is
    filled in with the cap."""
    return preferred_sizes(original, cap) or [cap]


def with_batching(original: dict[str, Any], batching: TritonBatching) -> dict[str, Any]:
    """A copy of the user's original model configuration (Triton's JSON form) with the
    batching knobs replaced and the preferred batch sizes by `preferred_sizes`.
    Everything else in the configuration is kept as it is."""
    edited: dict[str, Any] = json.loads(json.dumps(original))
    edited["max_batch_size"] = batching.max_batch_size
    dynamic = dict(edited.get("dynamic_batching") or {})
    dynamic["max_queue_delay_microseconds"] = batching.max_queue_delay_microseconds
    dynamic["preferred_batch_size"] = preferred_sizes(original, batching.max_batch_size)
    edited["dynamic_batching"] = dynamic
    return edited


def preferred_of(config: dict[str, Any]) -> list[int]:
    """The preferred batch sizes in a model configuration read back."""
    dynamic = config.get("dynamic_batching") or {}
    return [int(size) for size in dynamic.get("preferred_batch_size", [])]


def batching_of(config: dict[str, Any]) -> TritonBatching:
    """The batching knobs in a model configuration. Raises TritonError when the model
    does not batch dynamically (no `dynamic_batching`, or `max_batch_size` 0)."""
    size = config.get("max_batch_size")
    dynamic = config.get("dynamic_batching")
    if not isinstance(size, int) or size < 1 or not isinstance(dynamic, dict):
        raise TritonError(
            f"model {config.get('name')!r} does not batch dynamically "
            f"(max_batch_size={size!r}, dynamic_batching "
            f"{'set' if isinstance(dynamic, dict) else 'absent'}): set max_batch_size >= 1 "
            "and a dynamic_batching block in its config.pbtxt"
        )
    # The JSON form carries 64-bit integers as strings or numbers depending on the field.
    delay = int(dynamic.get("max_queue_delay_microseconds", 0) or 0)
    return TritonBatching(max_batch_size=size, max_queue_delay_microseconds=delay)


@dataclass(frozen=True)
class TritonCounters:
    """Triton's cumulative counters for one model (all versions summed)."""

    success: float = 0.0
    failure: float = 0.0
    inferences: float = 0.0  # nv_inference_count: batch-dimension items inferred
    executions: float = 0.0  # nv_inference_exec_count: model executions (batches)
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0

    def since(self, before: TritonCounters) -> TritonCounters:
        """The increase since `before`. A counter that went down was reset (the model
        was unloaded in between): its whole value is the increase."""

        def delta(now: float, then: float) -> float:
            return now - then if now >= then else now

        return TritonCounters(
            success=delta(self.success, before.success),
            failure=delta(self.failure, before.failure),
            inferences=delta(self.inferences, before.inferences),
            executions=delta(self.executions, before.executions),
            request_us=delta(self.request_us, before.request_us),
            queue_us=delta(self.queue_us, before.queue_us),
            compute_us=delta(self.compute_us, before.compute_us),
        )

    @property
    def mean_batch(self) -> float:
        """Mean executed batch size (rate(count) / rate(exec_count) on a delta); NaN
        when nothing executed."""
        return self.inferences / self.executions if self.executions else math.nan

    @property
    def mean_queue_ms(self) -> float:
        total = self.success + self.failure
        return self.queue_us / total / 1000.0 if total else math.nan


_FIELDS = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_infer_duration_us": "compute_us",
}
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_]+)="(?P<value>[^"]*)"')


def parse_counters(text: str, model: str) -> TritonCounters:
    """Triton's counters for `model` from its Prometheus text (:8002/metrics)."""
    sums = dict.fromkeys(_FIELDS.values(), 0.0)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in _FIELDS:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"])}
        if labels.get("model") != model:
            continue
        sums[_FIELDS[match["name"]]] += float(match["value"])
    return TritonCounters(**sums)


def parse_batch_stats(data: object, model: str) -> dict[int, float]:
    """Batches executed by size, from Triton's statistics extension (`GET
    /v2/models/M/stats`): each `batch_stats` entry's `compute_infer.count`, summed over
    the model's versions. Any model has them, whatever it records of its own."""
    sizes: dict[int, float] = {}
    entries = data.get("model_stats") if isinstance(data, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("name") != model:
            continue
        for batch in entry.get("batch_stats") or []:
            size = batch.get("batch_size") if isinstance(batch, dict) else None
            infer = batch.get("compute_infer") if isinstance(batch, dict) else None
            count = infer.get("count") if isinstance(infer, dict) else None
            if isinstance(size, int) and size > 0 and isinstance(count, int | float):
                sizes[size] = sizes.get(size, 0.0) + float(count)
    return sizes


def batches_since(now: dict[int, float], before: dict[int, float]) -> dict[int, int]:
    """Batches per size executed between two readings (sizes with none left out)."""
    delta = {size: round(count - before.get(size, 0.0)) for size, count in now.items()}
    return {size: n for size, n in sorted(delta.items()) if n > 0}


@dataclass(frozen=True)
class Change:
    """One live change: what was asked, what Triton reads back, how long it took."""

    asked: TritonBatching
    live: TritonBatching
    seconds: float
    preferred: tuple[int, ...] = ()  # the preferred batch sizes read back


class TritonControl:
    """The HTTP endpoints of one Triton for one model: configuration, load, metrics.
    Connection errors and 5xx are retried; a 4xx (Triton refusing) raises TargetError."""

    def __init__(
        self,
        url: str,
        metrics_url: str,
        model: str,
        *,
        timeout_s: float = 120.0,
        access: HttpAccess = DIRECT,
    ) -> None:
        # A load builds the new instance before it answers: a generous timeout.
        self._client = ControlClient(url, timeout_s=timeout_s, access=access)
        # Triton answers 500 to a configuration it cannot load: final, and a load that
        # timed out may still be under way, so a load is never retried.
        self._loader = ControlClient(url, timeout_s=timeout_s, attempts=1, access=access)
        self.access = access
        self.url = self._client.url
        self.metrics_url = metrics_url
        self.model = model
        self._timeout = aiohttp.ClientTimeout(total=30.0)
        # the configuration first read, before any change: every trial edits this one
        self._original: dict[str, Any] | None = None

    async def config(self) -> dict[str, Any]:
        path = f"/v2/models/{self.model}/config"
        data = await self._client.call("GET", path)
        if not isinstance(data, dict):
            raise TritonError(f"GET {path} did not answer a JSON object: {str(data)[:200]}")
        if self._original is None:
            self._original = data
        return data

    async def original(self) -> dict[str, Any]:
        """The model's configuration as it was before BatchPilot changed it."""
        if self._original is None:
            await self.config()
        assert self._original is not None
        return self._original

    async def ready(self) -> None:
        """Raise TritonError unless Triton reports the model READY."""
        path = f"/v2/models/{self.model}/ready"
        try:
            await self._client.call("GET", path, empty_ok=True)
        except TargetError as exc:
            raise TritonError(
                f"model {self.model!r} is not READY after the change: {exc}"
            ) from None

    async def batching(self) -> TritonBatching:
        return batching_of(await self.config())

    async def load(self, config: dict[str, Any]) -> None:
        """Load the model with `config` (Triton's JSON form); returns once Triton has it
        serving. A configuration Triton refuses leaves the running one in place."""
        path = f"/v2/repository/models/{self.model}/load"
        body = {"parameters": {"config": json.dumps(config)}}
        try:
            await self._loader.call("POST", path, body, empty_ok=True)
        except TargetError as exc:
            raise TritonError(
                f"Triton did not load {self.model!r} with the new configuration: {exc}"
            ) from None

    async def apply(self, batching: TritonBatching) -> Change:
        """Change the knobs live; the change counts once Triton's configuration read
        back holds the new knobs and preferred batch sizes and the model is READY.
        Raises TritonError otherwise."""
        started = time.monotonic()
        original = await self.original()
        await self.load(with_batching(original, batching))
        config = await self.config()
        live = batching_of(config)
        preferred = preferred_of(config)
        wanted = effective_preferred(original, batching.max_batch_size)
        if live != batching or preferred != wanted:
            raise TritonError(
                f"asked Triton for max_batch_size={batching.max_batch_size} "
                f"max_queue_delay_microseconds={batching.max_queue_delay_microseconds} "
                f"preferred_batch_size={wanted}, it runs "
                f"max_batch_size={live.max_batch_size} "
                f"max_queue_delay_microseconds={live.max_queue_delay_microseconds} "
                f"preferred_batch_size={preferred}"
            )
        await self.ready()
        seconds = time.monotonic() - started
        return Change(asked=batching, live=live, seconds=seconds, preferred=tuple(preferred))

    async def metrics_text(self) -> str:
        try:
            async with (
                self.access.session(self._timeout) as session,
                session.get(self.metrics_url) as response,
            ):
                text = await text_capped(response, cap=MAX_METRICS_BODY_BYTES, url=self.metrics_url)
        except BodyTooLarge as exc:
            raise TritonError(str(exc)) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TritonError(f"GET {self.metrics_url} failed: {exc!r}") from exc
        if response.status != 200:
            raise TritonError(f"GET {self.metrics_url} answered HTTP {response.status}")
        return text

    async def counters(self) -> TritonCounters:
        return parse_counters(await self.metrics_text(), self.model)

    async def batch_stats(self) -> dict[int, float]:
        """The model's batches executed so far, by size (Triton's statistics extension)."""
        path = f"/v2/models/{self.model}/stats"
        try:
            return parse_batch_stats(await self._client.call("GET", path), self.model)
        except TargetError as exc:
            raise TritonError(f"GET {path}: {exc}") from None
