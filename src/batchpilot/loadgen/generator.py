"""The open-loop generator (DESIGN.md §6).

Every request has a scheduled send time from the arrival process, computed before the run;
its latency runs from that scheduled time, so a slow server cannot slow the generator down
and hide its own tail (no coordinated omission). When the generator itself falls behind,
the lag is measured and reported rather than silently under-driving.

The HTTP client is aiohttp: measured against httpx on the same endpoint it sustained over
ten times the request rate per core (see benchmarks/loadgen_accuracy.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import resource
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import SimpleNamespace

import aiohttp
from yarl import URL

from batchpilot.loadgen.arrivals import ArrivalKind, as_arrival, describe_arrival, schedule
from batchpilot.loadgen.endpoints import endpoint_url, normalise_urls
from batchpilot.loadgen.protocols import JSON_HEADERS, client_tls, in_force, synthetic_body
from batchpilot.loadgen.result import (
    CANCELLED,
    CONNECTION,
    OK,
    OVERLOAD,
    TIMEOUT,
    TLS,
    LoadResult,
    summarise,
)
from batchpilot.models import RequestMix, SizeSampler

MAX_RATE = 1_000_000.0
MAX_DURATION_S = 24 * 3600.0
# The schedule and per-request records are held in memory: about 100 bytes a request.
MAX_REQUESTS = 10_000_000
# Sends start this long after the schedule is ready, so the first requests are not late.
_LEAD_S = 0.005
# Longest single sleep of the dispatcher, so a stop request is noticed promptly at low rates.
_MAX_SLEEP_S = 0.1
# How often the reaper looks for requests past their deadline (bounded by timeout/10).
_REAP_INTERVAL_S = 0.01
# The loop-delay sampler's period: its oversleep past this is how long the loop stalled.
_LOOP_SAMPLE_S = 0.01

__all__ = ["default_max_connections", "run_load", "synthetic_body"]


def default_max_connections() -> int:
    # Open loop needs a connection per request in flight; stay well inside the fd limit.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(1024, soft // 2 if soft > 0 else 512))


async def run_load(
    urls: str | Sequence[str],
    *,
    rate: float,
    duration_s: float,
    mix: RequestMix,
    arrival: ArrivalKind | str = "poisson",
    timeout_s: float = 10.0,
    seed: int = 0,
    path: str = "/v1/predict",
    stop: asyncio.Event | None = None,
    body_for_size: Callable[[int], bytes] = synthetic_body,
    max_in_flight: int = 50_000,
    max_connections: int | None = None,
    warmup_s: float = 0.0,
    share: tuple[int, int] = (0, 1),
    start_at: float | None = None,
) -> LoadResult:
    """Offer `rate` req/s for `duration_s` seconds, spread round-robin over `urls`, and
    measure. Requests scheduled in the first `warmup_s` are sent but left out of the
    figures. Setting `stop` ends the run early: requests still in flight are cancelled and
    the partial result is returned with `interrupted=True`.

    With `share=(i, n)` this process sends only requests i, i + n, i + 2n, ... of the one
    seeded schedule (each at the time and with the size it has there), so n processes
    started with the same arguments and `start_at` (a wall-clock time, the schedule's
    zero) send exactly the single schedule between them; `merge_results` makes one run of
    their results. `max_connections` caps the connections (so the requests in flight) of
    this process; set, it is the user's cap and a wait for a slot is the client's limit
    (ClientHealth.connection_cap), while the default pool is sized for open loop and a
    wait there is the server's backpressure. A request protocol put in force around the call
    (`loadgen.protocols.speaking`) decides the path, bodies and headers instead of `path`
    and `body_for_size`. Raises ValueError for bad arguments."""
    headers: Mapping[str, str] = JSON_HEADERS
    server_name: str | None = None
    if (protocol := in_force()) is not None:
        path, body_for_size, headers = protocol.path, protocol.body, protocol.headers
        server_name = protocol.server_name
    bases = normalise_urls(urls)
    process = as_arrival(arrival)
    _validate(rate, duration_s, timeout_s, max_in_flight, warmup_s)
    if max_connections is not None and max_connections < 1:
        raise ValueError(f"max connections must be ≥ 1, got {max_connections}")
    index, of = share
    if not 0 <= index < of:
        raise ValueError(f"share must be i of n with 0 ≤ i < n, got {index} of {of}")
    offsets, sizes, positions = share_of_schedule(
        schedule(rate, duration_s, process, seed), mix.sampler(seed), index, of
    )
    bodies = {size: body_for_size(size) for size in set(sizes)}
    targets = [endpoint_url(base, path) for base in bases]
    health = _HealthProbe()
    run = _Run(
        offsets=offsets,
        # the URL is the one the request has in the single schedule: round-robin by position
        requests=[
            (targets[k % len(targets)], bodies[s]) for k, s in zip(positions, sizes, strict=True)
        ],
        timeout_s=timeout_s,
        max_in_flight=max_in_flight,
        stop=stop,
        headers=headers,
        server_name=server_name,
        start_at=start_at,
        conn_waits_ms=health.conn_waits_ms,
    )
    connector = aiohttp.TCPConnector(
        limit=max_connections or default_max_connections(),
        limit_per_host=0,
        ssl=client_tls(),
    )
    async with aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        # Deadlines run from each request's scheduled time; the run's reaper enforces them.
        timeout=aiohttp.ClientTimeout(total=None),
        trace_configs=[health.trace_config()],
    ) as session:
        with _rare_gc():
            async with health.sampling():
                window_s = await run.execute(session, duration_s)
    return summarise(
        urls=bases,
        arrival=describe_arrival(process),
        seed=seed,
        target_rps=rate / of,
        window_s=window_s,
        offsets=offsets,
        outcomes=run.outcomes,
        latencies_ms=run.latencies_ms,
        lags_ms=run.lags_ms,
        done_at=run.done_at,
        elapsed_s=run.elapsed_s,
        interrupted=run.interrupted,
        conn_waits_ms=health.conn_waits_ms,
        loop_delays_ms=health.loop_delays_ms,
        cpu=health.cpu,
        warmup_s=warmup_s,
        timeout_s=timeout_s,
        connection_cap=max_connections,
        slot_waits_ms=run.slot_waits_ms,
    )


def share_of_schedule(
    offsets: Sequence[float], sizes: SizeSampler, index: int, of: int
) -> tuple[list[float], list[int], range]:
    """Share `index` of `of` of one seeded schedule: the send offsets and request sizes of
    requests index, index + of, ... and their positions in the single schedule. Sizes are
    drawn for the whole schedule first, so every request keeps the size it has there."""
    every = sizes.draw(len(offsets))
    positions = range(index, len(offsets), of)
    return [offsets[k] for k in positions], [every[k] for k in positions], positions


class _SlotWait:
    """One request's wait for a free connection: since when it is waiting (None: not
    waiting) and how long it waited. A request that times out still waiting never
    reaches the end of its wait, which would otherwise be missing from the figures."""

    __slots__ = ("queued_at", "waited_ms")

    def __init__(self) -> None:
        self.queued_at: float | None = None
        self.waited_ms = 0.0


class _HealthProbe:
    """The client's own health during a run: time requests wait for a free connection
    (from aiohttp's connection-queue trace), the event loop's stalls (a task that sleeps
    a fixed period and records how late it wakes) and the process's CPU share."""

    def __init__(self) -> None:
        self.conn_waits_ms: list[float] = []
        self.loop_delays_ms: list[float] = []
        self.cpu = 0.0

    def trace_config(self) -> aiohttp.TraceConfig:
        trace = aiohttp.TraceConfig()
        waits = self.conn_waits_ms

        async def queued(_: object, ctx: SimpleNamespace, __: object) -> None:
            ctx.queued_at = time.monotonic()
            if isinstance(slot := ctx.trace_request_ctx, _SlotWait):
                slot.queued_at = ctx.queued_at

        async def dequeued(_: object, ctx: SimpleNamespace, __: object) -> None:
            waited_ms = (time.monotonic() - ctx.queued_at) * 1000.0
            waits.append(waited_ms)
            if isinstance(slot := ctx.trace_request_ctx, _SlotWait):
                slot.queued_at, slot.waited_ms = None, waited_ms

        trace.on_connection_queued_start.append(queued)
        trace.on_connection_queued_end.append(dequeued)
        return trace

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        sampler = loop.create_task(self._sample(loop))
        wall0, cpu0 = time.monotonic(), time.process_time()
        try:
            yield
        finally:
            wall = time.monotonic() - wall0
            self.cpu = (time.process_time() - cpu0) / wall if wall > 0 else 0.0
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    async def _sample(self, loop: asyncio.AbstractEventLoop) -> None:
        delays = self.loop_delays_ms
        while True:
            before = loop.time()
            await asyncio.sleep(_LOOP_SAMPLE_S)
            delays.append(max(loop.time() - before - _LOOP_SAMPLE_S, 0.0) * 1000.0)


@contextlib.contextmanager
def _rare_gc() -> Iterator[None]:
    """Collect garbage rarely during a run: the client churns through short-lived
    objects, and frequent collections cost about a fifth of the CPU per request, which
    would show up as generator lag at high rates."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 50_000), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _validate(
    rate: float, duration_s: float, timeout_s: float, max_in_flight: int, warmup_s: float
) -> None:
    if not (math.isfinite(rate) and 0 < rate <= MAX_RATE):
        raise ValueError(f"rate must be > 0 and ≤ {MAX_RATE:g} req/s, got {rate:g}")
    if not (math.isfinite(duration_s) and 0 < duration_s <= MAX_DURATION_S):
        raise ValueError(f"duration must be > 0 and ≤ {MAX_DURATION_S:g} s, got {duration_s:g}")
    if rate * duration_s > MAX_REQUESTS:
        raise ValueError(
            f"rate x duration is {rate * duration_s:,.0f} requests, more than one run holds "
            f"({MAX_REQUESTS:,}): split it into shorter runs"
        )
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout_s:g}")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be ≥ 1, got {max_in_flight}")
    if not (math.isfinite(warmup_s) and 0 <= warmup_s < duration_s):
        raise ValueError(
            f"warm-up must be ≥ 0 s and shorter than the run ({duration_s:g} s), got {warmup_s:g}"
        )


class _Run:
    """One run's schedule and per-request records. The hot path only writes into
    preallocated lists; everything else happens in `summarise` afterwards.

    Timeouts are enforced by one reaper task rather than a timer per request: deadlines
    arrive in schedule order, so the reaper only ever looks at the head of a queue, and
    the client saves the cost of arming and disarming a timer for every request."""

    def __init__(
        self,
        *,
        offsets: list[float],
        requests: list[tuple[URL, bytes]],
        timeout_s: float,
        max_in_flight: int,
        stop: asyncio.Event | None,
        headers: Mapping[str, str] = JSON_HEADERS,
        server_name: str | None = None,
        start_at: float | None = None,
        conn_waits_ms: list[float] | None = None,
    ) -> None:
        n = len(offsets)
        # https: the name the certificate is verified against and sent as SNI (None: the
        # URL's host, aiohttp's default, so plain http passes the same argument as before)
        self.server_name = server_name
        # where the wait of a request that timed out waiting for a connection goes
        self.conn_waits_ms = conn_waits_ms if conn_waits_ms is not None else []
        self.slot_waits_ms = [0.0] * n  # each request's own wait for a connection
        self.headers = dict(headers)
        self.start_at = start_at
        self.offsets = offsets
        self.requests = requests
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.stop = stop
        self.outcomes: list[str | None] = [None] * n
        self.latencies_ms = [0.0] * n
        self.lags_ms = [math.nan] * n  # NaN until the request starts
        self.done_at = [0.0] * n
        self.elapsed_s = 0.0
        self.interrupted = False
        self._timed_out = [False] * n
        # (deadline, index, task) in dispatch order, hence in deadline order
        self._pending: deque[tuple[float, int, asyncio.Task[None]]] = deque()
        self._in_flight = 0
        self._t0 = 0.0

    async def execute(self, session: aiohttp.ClientSession, duration_s: float) -> float:
        """Run the schedule; returns the scheduling window actually covered (shorter than
        `duration_s` when stopped)."""
        loop = asyncio.get_running_loop()
        lead = _LEAD_S if self.start_at is None else max(self.start_at - time.time(), 0.0)
        self._t0 = t0 = loop.time() + lead
        window_s = duration_s
        reaper = loop.create_task(self._reap(loop))
        try:
            stopped_at = await self._dispatch(session, loop, t0)
            if stopped_at is not None:
                self.interrupted = True
                window_s = max(stopped_at - t0, 1e-3)
                self._cancel_pending()
            await self._wait_pending()
        finally:
            reaper.cancel()
            if self._pending:  # cancelled from outside: leave nothing running
                self._cancel_pending()
                await self._wait_pending()
        self.elapsed_s = loop.time() - t0
        return window_s

    async def _dispatch(
        self, session: aiohttp.ClientSession, loop: asyncio.AbstractEventLoop, t0: float
    ) -> float | None:
        """Send every request at its time; returns the loop time of a stop, if any."""
        offsets = self.offsets
        n = len(offsets)
        pending = self._pending
        timeout_s = self.timeout_s
        stop = self.stop
        i = 0
        while i < n:
            if stop is not None and stop.is_set():
                return loop.time()
            now = loop.time()
            due = t0 + offsets[i]
            if due > now:
                await asyncio.sleep(min(due - now, _MAX_SLEEP_S))
                continue
            # Everything already due goes out now, then the loop yields once so responses
            # are read even while the generator is behind.
            while i < n and t0 + offsets[i] <= now:
                due = t0 + offsets[i]
                if self._in_flight >= self.max_in_flight:
                    self.outcomes[i] = OVERLOAD
                    self.lags_ms[i] = 0.0
                else:
                    self._in_flight += 1
                    task = loop.create_task(self._fire(session, i, due))
                    pending.append((due + timeout_s, i, task))
                i += 1
            await asyncio.sleep(0)
        return None

    async def _fire(self, session: aiohttp.ClientSession, i: int, due: float) -> None:
        loop_time = asyncio.get_running_loop().time
        self.lags_ms[i] = (loop_time() - due) * 1000.0
        url, body = self.requests[i]
        slot = _SlotWait()
        outcome: str
        try:
            async with session.post(
                url,
                data=body,
                headers=self.headers,
                server_hostname=self.server_name,
                trace_request_ctx=slot,
            ) as response:
                await response.read()
                status = response.status
            outcome = OK if 200 <= status < 300 else str(status)
        except asyncio.CancelledError:
            if not self._timed_out[i]:
                self.outcomes[i] = CANCELLED
                raise
            outcome = TIMEOUT  # the reaper's cancellation: this request ran out of time
            if slot.queued_at is not None:  # it timed out still waiting for a connection
                slot.waited_ms = (time.monotonic() - slot.queued_at) * 1000.0
                self.conn_waits_ms.append(slot.waited_ms)
        except TimeoutError:
            outcome = TIMEOUT
        except aiohttp.ClientSSLError:
            # told apart from a refused connection: a missing CA bundle, not the server
            outcome = TLS
        except (aiohttp.ClientConnectionError, OSError):
            outcome = CONNECTION
        except aiohttp.ClientError as e:
            outcome = type(e).__name__
        finally:
            self._in_flight -= 1
            self.slot_waits_ms[i] = slot.waited_ms
        now = loop_time()
        latency_s = now - due
        if outcome == TIMEOUT:
            latency_s = max(latency_s, self.timeout_s)
        self.latencies_ms[i] = latency_s * 1000.0
        self.done_at[i] = now - self._t0
        self.outcomes[i] = outcome

    async def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel requests past their deadline (scheduled time + timeout)."""
        pending = self._pending
        interval = min(_REAP_INTERVAL_S, self.timeout_s / 10.0)
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            while pending and (pending[0][2].done() or pending[0][0] <= now):
                deadline, i, task = pending.popleft()
                if task.done():
                    continue
                self._timed_out[i] = True
                if math.isnan(self.lags_ms[i]):
                    # Never started: the generator was further behind than the timeout.
                    self.lags_ms[i] = (now - (deadline - self.timeout_s)) * 1000.0
                    self.outcomes[i] = TIMEOUT
                    self.latencies_ms[i] = (
                        max(now - deadline + self.timeout_s, self.timeout_s) * 1000.0
                    )
                    self.done_at[i] = now - self._t0
                    self._in_flight -= 1
                task.cancel()

    async def _wait_pending(self) -> None:
        # The reaper keeps running meanwhile, so this ends by the last deadline at worst.
        while tasks := [task for _, _, task in self._pending if not task.done()]:
            await asyncio.wait(tasks)
        self._pending.clear()

    def _cancel_pending(self) -> None:
        for _, _, task in self._pending:
            task.cancel()
