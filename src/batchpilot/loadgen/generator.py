"""The open-loop generator (docs/architecture.md, "How a measurement flows").

Every request has a scheduled send time from the arrival process, computed before the run;
its latency runs from that scheduled time, so a slow server cannot slow the generator down
and hide its own tail (no coordinated omission). When the generator itself falls behind,
the lag is measured and reported rather than silently under-driving.

The load's requests go through the lean HTTP/1.1 client in `loadgen.http1` (prepared bytes,
responses timed in the protocol callback) and sends wake on a timerfd (`loadgen.waker`):
against Triton beside NVIDIA's Perf Analyzer the general-purpose client and asyncio's
millisecond timers cost over a third of a 3 ms p50 (benchmarks/loadgen_accuracy.py)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import math
import resource
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from yarl import URL

from batchpilot.loadgen import breach as breaches
from batchpilot.loadgen.arrivals import ArrivalKind, as_arrival, describe_arrival, schedule
from batchpilot.loadgen.breach import BreachRule
from batchpilot.loadgen.endpoints import endpoint_url, normalise_urls
from batchpilot.loadgen.http1 import BadResponseError, Http1Client, Prepared, prepare
from batchpilot.loadgen.lengths import TokenLengths, draw_lengths
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
from batchpilot.loadgen.sse import TokenStream
from batchpilot.loadgen.streaming import OpenAIStream, stream_body
from batchpilot.loadgen.tokens import StreamMeasure, StreamSummary, measure, summarise_stream
from batchpilot.loadgen.waker import Waker
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
# How often a run with a breach rule counts the requests over its bound.
_BREACH_CHECK_S = 0.05
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
    breach: BreachRule | None = None,
) -> LoadResult:
    """Offer `rate` req/s for `duration_s` seconds, spread round-robin over `urls`, and
    measure. Requests scheduled in the first `warmup_s` are sent but left out of the
    figures. Setting `stop` ends the run early: requests still in flight are cancelled and
    the partial result is returned with `interrupted=True`.

    With `share=(i, n)` this process sends only requests i, i + n, i + 2n, ... of the one
    seeded schedule (each at the time and with the size it has there), so n processes
    started with the same arguments and `start_at` (a wall-clock time, the schedule's
    zero) send exactly the single schedule between them; `merge_results` makes one run of
    their results. With `breach`, the run stops (requests in flight cancelled,
    `LoadResult.breach_stop` saying why) as soon as the p99 of its measured requests is
    certain to exceed the rule's bound (`loadgen.breach`). `max_connections` caps the
    connections (so the requests in flight) of
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
    stream = protocol.stream if protocol is not None else None
    every = schedule(rate, duration_s, process, seed)
    targets = [endpoint_url(base, path) for base in bases]
    request_at: Callable[[int], Prepared]
    if stream is None:
        offsets, sizes, positions = share_of_schedule(every, mix.sampler(seed), index, of)
        request_at = _sized_requests(targets, positions, sizes, body_for_size, headers).__getitem__
    else:
        offsets, lengths, positions = share_of_lengths(every, stream.lengths, seed, index, of)
        request_at = _stream_requests(targets, positions, lengths, stream, headers)
    health = _HealthProbe()
    run = _Run(
        offsets=offsets,
        request_at=request_at,
        streaming=stream is not None,
        timeout_s=timeout_s,
        max_in_flight=max_in_flight,
        stop=stop,
        start_at=start_at,
        conn_waits_ms=health.conn_waits_ms,
        breach=breach,
        measured_from=bisect.bisect_left(offsets, warmup_s),  # offsets are in order
    )
    # Deadlines run from each request's scheduled time; the run's reaper enforces them.
    async with Http1Client(
        limit=max_connections or default_max_connections(),
        tls=client_tls(),
        server_name=server_name,
    ) as client:
        with _rare_gc():
            async with health.sampling():
                window_s = await run.execute(client, duration_s)
    tokens: StreamSummary | None = None
    if stream is not None:
        tokens = summarise_stream(
            run.measures(warmup_s), sla=stream.sla, measured_s=window_s - warmup_s
        )
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
        stream=tokens,
        breach_stop=run.breach_stop,
    )


def _sized_requests(
    targets: Sequence[URL],
    positions: range,
    sizes: Sequence[int],
    body_for_size: Callable[[int], bytes],
    headers: Mapping[str, str],
) -> list[Prepared]:
    """One prepared request per URL and size, shared by every request that has both; the
    URL is the one the request has in the single schedule: round-robin by position."""
    bodies = {size: body_for_size(size) for size in set(sizes)}
    prepared = {
        (t, size): prepare(target, body, headers)
        for t, target in enumerate(targets)
        for size, body in bodies.items()
    }
    return [prepared[(k % len(targets), s)] for k, s in zip(positions, sizes, strict=True)]


def _stream_requests(
    targets: Sequence[URL],
    positions: range,
    lengths: Sequence[tuple[int, int]],
    stream: OpenAIStream,
    headers: Mapping[str, str],
) -> Callable[[int], Prepared]:
    """Request i of a token-stream share, prepared when it is sent: every prompt is its
    own (it starts with its position, `streaming.stream_prompt`), and the prompts of a
    long run held all at once would take gigabytes. A generative run's rates leave the
    few tens of microseconds this costs a send well inside its time to first token (and
    in the send lag, which is measured)."""
    count = len(targets)

    def request_at(i: int) -> Prepared:
        k = positions[i]
        prompt, output = lengths[i]
        return prepare(targets[k % count], stream_body(stream, k, prompt, output), headers)

    return request_at


def share_of_lengths(
    offsets: Sequence[float], lengths: TokenLengths, seed: int, index: int, of: int
) -> tuple[list[float], list[tuple[int, int]], range]:
    """`share_of_schedule` for a token-stream run: each request keeps the (prompt,
    output) lengths it has in the single schedule."""
    every = draw_lengths(lengths, len(offsets), seed)
    positions = range(index, len(offsets), of)
    return [offsets[k] for k in positions], [every[k] for k in positions], positions


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
    waiting) and how long it waited, also added to the run's list of waits. A request that
    times out still waiting never reaches the end of its wait, which would otherwise be
    missing from the figures (see `gave_up`)."""

    __slots__ = ("queued_at", "waited_ms", "waits_ms")

    def __init__(self, waits_ms: list[float]) -> None:
        self.waits_ms = waits_ms
        self.queued_at: float | None = None
        self.waited_ms = 0.0

    def started(self, queued_at: float) -> None:
        self.queued_at = queued_at

    def ended(self, waited_ms: float) -> None:
        self.queued_at, self.waited_ms = None, waited_ms
        self.waits_ms.append(waited_ms)

    def gave_up(self, now: float) -> None:
        if self.queued_at is not None:
            self.ended((now - self.queued_at) * 1000.0)


class _HealthProbe:
    """The client's own health during a run: time requests wait for a free connection
    (reported by each request's `_SlotWait`), the event loop's stalls (a task that sleeps
    a fixed period and records how late it wakes) and the process's CPU share."""

    def __init__(self) -> None:
        self.conn_waits_ms: list[float] = []
        self.loop_delays_ms: list[float] = []
        self.cpu = 0.0

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


def _answered(status: int) -> str:
    """The outcome of a request the server answered with `status`."""
    return OK if 200 <= status < 300 else str(status)


def _failure(exc: BaseException) -> str:
    """The outcome of a request that raised `exc`."""
    if isinstance(exc, TimeoutError):
        return TIMEOUT
    if isinstance(exc, ssl.SSLError):
        # told apart from a refused connection: a missing CA bundle, not the server
        return TLS
    if isinstance(exc, OSError):
        return CONNECTION
    if isinstance(exc, BadResponseError):
        return type(exc).__name__
    raise exc


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
        request_at: Callable[[int], Prepared],
        timeout_s: float,
        streaming: bool = False,
        max_in_flight: int,
        stop: asyncio.Event | None,
        start_at: float | None = None,
        conn_waits_ms: list[float] | None = None,
        breach: BreachRule | None = None,
        measured_from: int = 0,
    ) -> None:
        n = len(offsets)
        # where the wait of a request that timed out waiting for a connection goes
        self.conn_waits_ms = conn_waits_ms if conn_waits_ms is not None else []
        self.slot_waits_ms = [0.0] * n  # each request's own wait for a connection
        self.start_at = start_at
        self.offsets = offsets
        self.request_at = request_at  # request i, ready to send
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.stop = stop
        self.outcomes: list[str | None] = [None] * n
        self.latencies_ms = [0.0] * n
        self.lags_ms = [math.nan] * n  # NaN until the request starts
        self.done_at = [0.0] * n
        # each request's token stream, in a token-stream run (None: not sent)
        self.streams: list[TokenStream | None] | None = [None] * n if streaming else None
        self.elapsed_s = 0.0
        self.interrupted = False
        self.breach = breach
        self.measured_from = measured_from  # requests before it are the warm-up's
        self.breach_stop: str | None = None  # why the breach rule stopped the run
        self._halted_at: float | None = None
        self._position = 0  # requests dispatched so far
        self._scan_from = 0  # the breach count's settled head ends here
        self._settled_over = 0  # and holds this many over the bound
        self._timed_out = [False] * n
        # (deadline, index, request's future or task) in dispatch order, hence in deadline
        # order
        self._pending: deque[tuple[float, int, asyncio.Future[Any]]] = deque()
        self._in_flight = 0
        self._t0 = 0.0

    async def execute(self, client: Http1Client, duration_s: float) -> float:
        """Run the schedule; returns the scheduling window actually covered (shorter than
        `duration_s` when stopped)."""
        loop = asyncio.get_running_loop()
        lead = _LEAD_S if self.start_at is None else max(self.start_at - time.time(), 0.0)
        self._t0 = t0 = loop.time() + lead
        window_s = duration_s
        reaper = loop.create_task(self._reap(loop))
        watcher = loop.create_task(self._watch(loop)) if self.breach is not None else None
        try:
            with Waker() as waker:
                stopped_at = await self._dispatch(client, loop, t0, waker)
            if stopped_at is not None:
                self.interrupted = True
                window_s = max(stopped_at - t0, 1e-3)
                self._cancel_pending()
            await self._wait_pending()
            if self._halted_at is not None:  # the breach rule, after the last send
                window_s = min(window_s, max(self._halted_at - t0, 1e-3))
        finally:
            reaper.cancel()
            if watcher is not None:
                watcher.cancel()
            if self._pending:  # cancelled from outside: leave nothing running
                self._cancel_pending()
                await self._wait_pending()
        self.elapsed_s = loop.time() - t0
        return window_s

    async def _dispatch(
        self,
        client: Http1Client,
        loop: asyncio.AbstractEventLoop,
        t0: float,
        waker: Waker,
    ) -> float | None:
        """Send every request at its time; returns the loop time of a stop, if any.

        The sends run in the waker's callback itself rather than in a task it wakes, and a
        request with an idle connection to go on is written there and then: each hop
        through the event loop would add its own delay to every request's latency."""
        offsets = self.offsets
        n = len(offsets)
        pending = self._pending
        timeout_s = self.timeout_s
        stop = self.stop
        finished: asyncio.Future[float | None] = loop.create_future()
        position = 0

        def wake() -> None:
            nonlocal position
            if finished.done():  # cancelled from outside
                return
            try:
                now = loop.time()
                if (stop is not None and stop.is_set()) or self._halted_at is not None:
                    finished.set_result(now)
                    return
                # Everything already due goes out now; if the generator is behind, the
                # waker fires again on the next pass, after responses ready meanwhile.
                i = position
                while i < n and (due := t0 + offsets[i]) <= now:
                    if self._in_flight >= self.max_in_flight:
                        self.outcomes[i] = OVERLOAD
                        self.lags_ms[i] = 0.0
                    else:
                        self._in_flight += 1
                        pending.append((due + timeout_s, i, self._launch(client, loop, i, due)))
                    i += 1
                position = self._position = i
                if i >= n:
                    finished.set_result(None)
                else:
                    waker.call_at(min(t0 + offsets[i], now + _MAX_SLEEP_S), wake)
            except BaseException as exc:  # never leave the run waiting on a dead callback
                finished.set_exception(exc)

        waker.call_at(t0, wake)
        return await finished

    def _launch(
        self, client: Http1Client, loop: asyncio.AbstractEventLoop, i: int, due: float
    ) -> asyncio.Future[Any]:
        """Send request i: at once on an idle connection, else in a task that connects or
        waits for one. What is returned ends when the request does; cancelling it is how
        the reaper times the request out."""
        sent = client.send_now(self.request_at(i), self._sink(i))
        if sent is None:
            return loop.create_task(self._fire(client, i, due))
        self.lags_ms[i] = (loop.time() - due) * 1000.0  # it has left
        sent.add_done_callback(lambda done: self._record(i, due, *self._outcome(i, done)))
        return sent

    def _outcome(self, i: int, sent: asyncio.Future[tuple[int, float]]) -> tuple[str, float | None]:
        """What a request sent without a task came to, and when its response completed."""
        if sent.cancelled():
            return (TIMEOUT if self._timed_out[i] else CANCELLED), None
        if (exc := sent.exception()) is not None:
            return _failure(exc), None
        status, done = sent.result()
        return _answered(status), done

    async def _fire(self, client: Http1Client, i: int, due: float) -> None:
        """A request that had to connect or wait for a free connection first."""
        self.lags_ms[i] = (asyncio.get_running_loop().time() - due) * 1000.0
        slot = _SlotWait(self.conn_waits_ms)
        outcome: str
        # the response is timed where it completed, not when this task next runs
        done: float | None = None
        try:
            status, done = await client.request(
                self.request_at(i), on_wait=slot.started, on_waited=slot.ended, sink=self._sink(i)
            )
            outcome = _answered(status)
        except asyncio.CancelledError:
            if not self._timed_out[i]:
                self._record(i, due, CANCELLED, None)
                raise
            outcome = TIMEOUT  # the reaper's cancellation: this request ran out of time
            slot.gave_up(asyncio.get_running_loop().time())  # if still waiting for a slot
        except Exception as exc:
            outcome = _failure(exc)
        finally:
            self.slot_waits_ms[i] = slot.waited_ms
        self._record(i, due, outcome, done)

    def _sink(self, i: int) -> TokenStream | None:
        """Where request i's body goes as it arrives: its token stream, in a token-stream
        run."""
        if self.streams is None:
            return None
        self.streams[i] = stream = TokenStream()
        return stream

    def measures(self, warmup_s: float) -> Iterable[StreamMeasure]:
        """The token figures of the measured window's successful streams."""
        for i, stream in enumerate(self.streams or ()):
            if stream is not None and self.outcomes[i] == OK and self.offsets[i] >= warmup_s:
                yield measure(stream, self._t0 + self.offsets[i])

    def _record(self, i: int, due: float, outcome: str, done: float | None) -> None:
        self._in_flight -= 1
        if outcome == OK and self.streams is not None and (stream := self.streams[i]) is not None:
            # answered, but a stream is only a success when it was whole
            outcome = stream.problem() or OK
        if outcome == CANCELLED:
            self.outcomes[i] = CANCELLED
            return
        now = asyncio.get_running_loop().time() if done is None else done
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

    async def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count the measured requests over the breach rule's bound until their p99 is
        certain to break it; then halt the run: no more sends, those in flight
        cancelled (they are over the bound already or would add to a known verdict)."""
        assert self.breach is not None
        bound_ms = self.breach.bound_ms
        planned = len(self.offsets) - self.measured_from
        while True:
            await asyncio.sleep(_BREACH_CHECK_S)
            now = loop.time()
            over = self._over_bound(now, bound_ms)
            if breaches.certain(over, planned):
                self.breach_stop = breaches.reason(over, planned, bound_ms, now - self._t0)
                self._halted_at = now
                self.interrupted = True
                self._cancel_pending()
                return

    def _over_bound(self, now: float, bound_ms: float) -> int:
        """Measured requests dispatched so far that are over `bound_ms`: answered slower,
        failed, or still waiting for longer. Requests settle about in schedule order, so
        the settled head is counted once and only the rest is looked at again."""
        outcomes, position = self.outcomes, self._position
        i = max(self._scan_from, self.measured_from)
        while i < position and outcomes[i] is not None:
            self._settled_over += self._settled_over_bound(i, bound_ms)
            i += 1
        self._scan_from = i
        over = self._settled_over
        latest_due = now - bound_ms / 1000.0 - self._t0  # due before it: waited longer
        for j in range(i, position):
            if outcomes[j] is None:
                over += self.offsets[j] < latest_due
            else:
                over += self._settled_over_bound(j, bound_ms)
        return over

    def _settled_over_bound(self, i: int, bound_ms: float) -> bool:
        outcome = self.outcomes[i]
        if outcome == OK:
            return self.latencies_ms[i] > bound_ms
        return outcome not in (CANCELLED, OVERLOAD)  # those two: the client's, not the server's

    async def _wait_pending(self) -> None:
        # The reaper keeps running meanwhile, so this ends by the last deadline at worst.
        while tasks := [task for _, _, task in self._pending if not task.done()]:
            await asyncio.wait(tasks)
        self._pending.clear()

    def _cancel_pending(self) -> None:
        for _, _, task in self._pending:
            task.cancel()
