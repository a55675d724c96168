"""Target and probe for a reference server reached over HTTP (local mode): the live
admin endpoint applies a configuration without a restart, the built-in load generator
scores it."""

from __future__ import annotations

import json
import logging
import random
from typing import TYPE_CHECKING, Any

import aiohttp

from batchpilot.models import (
    DEFAULT_MIN_REQUESTS,
    SLA,
    BatchingConfig,
    CapacityResult,
    RequestMix,
)
from batchpilot.retry import backoff_delay, retry
from batchpilot.tuner.interfaces import TargetError

if TYPE_CHECKING:
    from batchpilot.loadgen.arrivals import ArrivalKind

log = logging.getLogger(__name__)

ADMIN_PATH = "/admin/batching"
PROFILE_PATH = "/admin/profile"
# No single wait longer than this, however many attempts are configured.
_BACKOFF_CAP_S = 5.0


class _Retryable(Exception):
    pass


class LocalTarget:
    """`PUT /admin/batching`, then `GET` it back: the configuration is live when the
    server says it runs it. Connection errors, timeouts and 5xx are retried with
    exponential backoff and jitter; a 4xx is the server refusing the values, final."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        attempts: int = 4,
        backoff_s: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.url = url.rstrip("/")
        # Generous: growing the batch cap makes the server warm the model up at the new
        # size before it answers.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._rng = rng or random.Random()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        def logged(attempt: int, error: Exception) -> None:
            log.warning("%s %s failed (attempt %d): %s", method, path, attempt + 1, error)

        try:
            return await retry(
                lambda: self._once(method, path, body),
                attempts=self._attempts,
                retryable=lambda error: isinstance(error, _Retryable),
                delay=lambda attempt: backoff_delay(
                    attempt, base=self._backoff_s, cap=_BACKOFF_CAP_S, rng=self._rng
                ),
                on_error=logged,
            )
        except _Retryable as exc:
            raise TargetError(
                f"{method} {self.url}{path} failed {self._attempts} times: {exc}"
            ) from None

    async def _once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as session,
                session.request(method, f"{self.url}{path}", json=body) as response,
            ):
                text = await response.text()
                if response.status >= 500:
                    raise _Retryable(f"HTTP {response.status}: {text[:200]}")
                if response.status >= 400:
                    raise TargetError(
                        f"the server refused {method} {path} with HTTP {response.status}: "
                        f"{_message(text)}"
                    )
                try:
                    return await response.json(content_type=None)
                except ValueError as exc:
                    raise TargetError(
                        f"{method} {path} answered something that is not JSON: {text[:200]}"
                    ) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc

    async def current(self) -> BatchingConfig:
        return _config(await self._call("GET", ADMIN_PATH), ADMIN_PATH)

    async def apply(self, config: BatchingConfig) -> None:
        await self._call("PUT", ADMIN_PATH, config.model_dump(mode="json"))
        live = await self.current()
        if live != config:
            raise TargetError(f"asked for {config.label()}, the server runs {live.label()}")

    async def profile(self) -> dict[str, Any]:
        """The server's per-batch-size compute statistics (GET /admin/profile)."""
        data = await self._call("GET", PROFILE_PATH)
        if not isinstance(data, dict):
            raise TargetError(f"GET {PROFILE_PATH} did not answer a JSON object")
        return data


def _message(text: str) -> str:
    """The server's error message when it sent JSON {"error": ...}, else the text."""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, str) else text[:300]


def _config(data: Any, path: str) -> BatchingConfig:
    try:
        return BatchingConfig.model_validate(data)
    except ValueError as exc:
        raise TargetError(f"GET {path} answered an unexpected body: {data!r}") from exc


def start_rate(must_beat: float | None) -> float | None:
    """Where a ramp starts. With something to beat, at half of it: the second step is
    then at the rate to beat itself, which decides at once whether the configuration
    can win (failing there prunes it). Without, the capacity search starts at half the
    rate its closed-loop warm-up reached."""
    if must_beat is not None and must_beat > 0:
        return must_beat * 0.5
    return None


class LocalProbe:
    """Effective throughput of what the server at `url` runs now, by the open-loop
    load generator and the capacity search."""

    def __init__(
        self,
        url: str,
        *,
        sla: SLA,
        mix: RequestMix,
        precision: float,
        step_duration_s: float,
        warmup_s: float,
        timeout_s: float | None = None,
        seed: int = 0,
        min_requests: int = DEFAULT_MIN_REQUESTS,
        arrival: ArrivalKind | str = "poisson",
        workers: int = 1,
    ) -> None:
        self.url = url.rstrip("/")
        self.workers = workers
        self.min_requests = min_requests
        self.arrival = arrival
        self.sla = sla
        self.mix = mix
        self.precision = precision
        self.step_duration_s = step_duration_s
        self.warmup_s = warmup_s
        self.timeout_s = timeout_s
        self.seed = seed

    async def measure(
        self, config: BatchingConfig, *, must_beat: float | None, start_rps: float | None = None
    ) -> CapacityResult:
        """`start_rps` overrides where the ramp starts (the interleaved re-measurement
        brackets a configuration's known figure); by default see `start_rate`."""
        from batchpilot.capacity.http import measure_capacity

        return await measure_capacity(
            [self.url],
            sla=self.sla,
            mix=self.mix,
            precision=self.precision,
            step_duration_s=self.step_duration_s,
            warmup_s=self.warmup_s,
            start_rps=start_rps if start_rps is not None else start_rate(must_beat),
            must_beat=must_beat,
            timeout_s=self.timeout_s,
            seed=self.seed,
            min_requests=self.min_requests,
            arrival=self.arrival,
            workers=self.workers,
        )
