"""The dynamic batcher: requests queue up and leave as one batch when `max_batch_size` of
them are waiting or `max_queue_time` has passed since the oldest one arrived.

It knows nothing of HTTP or PyTorch: it is handed an async `run_batch` function, so
tests drive it with fake models on looptime's virtual clock. Every timestamp comes from
the running loop's clock for that reason.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, Protocol, TypeVar

from batchpilot.models import BatchingConfig

ItemT = TypeVar("ItemT")
OutT = TypeVar("OutT")
I_co = TypeVar("I_co", covariant=True)
I_contra = TypeVar("I_contra", contravariant=True)

log = logging.getLogger(__name__)

# A deadline closer than this counts as reached: float rounding in `deadline - now` must
# not leave the collector re-arming timers of a few attoseconds.
_DEADLINE_SLACK_S = 1e-6


class QueueFull(Exception):
    """The bounded queue has no room; the caller should retry later."""


class BatcherClosed(Exception):
    """The batcher is draining for shutdown and takes no new requests."""


class BatchFailed(Exception):
    """The batch this request was part of failed; the other batches are unaffected."""


class Completed(NamedTuple, Generic[OutT]):
    """A request's result and how it was served (a named tuple: one per request, and
    cheaper to make than a frozen dataclass)."""

    value: OutT
    batch_size: int
    queue_wait_s: float
    compute_s: float


@dataclass(frozen=True)
class BatchRecord(Generic[I_co]):
    """What an observer learns about each batch that reached the model."""

    items: Sequence[I_co]
    queue_waits_s: Sequence[float]
    compute_s: float
    error: str | None


class BatchObserver(Protocol[I_contra]):
    def batch_done(self, record: BatchRecord[I_contra]) -> None: ...


@dataclass(eq=False)
class _Entry(Generic[ItemT, OutT]):
    item: ItemT
    enqueued_at: float
    future: asyncio.Future[Completed[OutT]]
    taken: bool = False
    cancelled: bool = False


@dataclass
class BatcherStats:
    batches: int = 0
    failed_batches: int = 0
    dropped_cancelled: int = 0
    sizes: collections.Counter[int] = field(default_factory=collections.Counter)


class Batcher(Generic[ItemT, OutT]):
    """Collects submitted items into batches and hands them to `run_batch`.

    The model runs one batch at a time. A batch that is not full waits for the model to
    be free (it may still fill up meanwhile) and closes then if its wait is over. With
    `ahead` > 0, up to that many full batches are handed over while another still runs:
    `run_batch` must then run batches in the order it was given them (the model process
    does), and the next batch starts the moment the previous one ends instead of after
    a round trip through the event loop. Waiting for more requests could not change a
    full batch, so this changes no batch's contents.

    A configuration change is picked up by the next batch to close, including one that
    is being collected (nothing of it has been computed yet); a batch is always formed
    under one configuration, never half of each.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[ItemT]], Awaitable[Sequence[OutT]]],
        config: BatchingConfig,
        *,
        queue_limit: int,
        observer: BatchObserver[ItemT] | None = None,
        ahead: int = 0,
    ) -> None:
        if queue_limit < 1:
            raise ValueError(f"queue_limit must be at least 1, got {queue_limit}")
        if ahead < 0:
            raise ValueError(f"ahead must be at least 0, got {ahead}")
        self._ahead = ahead
        self._in_flight = 0  # batches handed to run_batch and not back yet
        self._last_done_at = float("-inf")  # when the model last finished a batch
        self._run_batch = run_batch
        self._config = config
        self._queue_limit = queue_limit
        self._observer = observer
        self._queue: collections.deque[_Entry[ItemT, OutT]] = collections.deque()
        self._live = 0  # queued entries whose caller is still waiting
        self._wakeup = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.stats = BatcherStats()

    @property
    def config(self) -> BatchingConfig:
        return self._config

    @property
    def depth(self) -> int:
        """Requests waiting for a batch (not those being computed)."""
        return self._live

    @property
    def queue_limit(self) -> int:
        return self._queue_limit

    @property
    def closing(self) -> bool:
        return self._closing

    def set_config(self, config: BatchingConfig) -> None:
        self._config = config
        self._wakeup.set()

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the batcher is already running")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def close(self) -> None:
        """Stop taking requests, run what is queued without waiting for batches to
        fill, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def submit(self, item: ItemT) -> Completed[OutT]:
        """Queue `item` and wait for its result. Raises QueueFull, BatcherClosed or
        BatchFailed; cancelling the caller drops the item if it has not been taken."""
        if self._closing:
            raise BatcherClosed("the server is shutting down")
        if self._live >= self._queue_limit:
            raise QueueFull(f"the queue is full ({self._queue_limit} requests waiting)")
        loop = asyncio.get_running_loop()
        entry: _Entry[ItemT, OutT] = _Entry(item, loop.time(), loop.create_future())
        self._queue.append(entry)
        self._live += 1
        # Wake the collector only when its decision can change: the first request sets
        # the deadline, a full batch closes it. Waking on every request costs CPU.
        if self._live == 1 or self._live >= self._config.max_batch_size:
            self._wakeup.set()
        try:
            return await entry.future
        except asyncio.CancelledError:
            if not entry.taken:
                entry.cancelled = True
                self._live -= 1
                self.stats.dropped_cancelled += 1
            raise

    async def _loop(self) -> None:
        running: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            if batch is None:
                break
            self._in_flight += 1  # counted now: the next _collect must see it
            task = loop.create_task(self._execute(batch))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)

    async def _collect(self) -> list[_Entry[ItemT, OutT]] | None:
        loop = asyncio.get_running_loop()
        while True:
            while self._queue and self._queue[0].cancelled:
                self._queue.popleft()
            if not self._queue and self._closing and not self._in_flight:
                return None
            timeout: float | None = None
            if self._queue and self._in_flight <= self._ahead:
                config = self._config
                deadline = self._queue[0].enqueued_at + config.max_queue_time_ms / 1000.0
                remaining = deadline - loop.time()
                model_free = not self._in_flight
                if (
                    self._closing
                    or self._live >= config.max_batch_size
                    or (model_free and remaining <= _DEADLINE_SLACK_S)
                ):
                    return self._take(config.max_batch_size)
                if model_free:
                    timeout = remaining
            # Otherwise wait for a request, a configuration change, a batch to come
            # back, or (model free) the oldest request's deadline.
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    def _take(self, limit: int) -> list[_Entry[ItemT, OutT]]:
        batch: list[_Entry[ItemT, OutT]] = []
        while self._queue and len(batch) < limit:
            entry = self._queue.popleft()
            if entry.cancelled:
                continue
            entry.taken = True
            batch.append(entry)
        self._live -= len(batch)
        return batch

    async def _execute(self, batch: list[_Entry[ItemT, OutT]]) -> None:
        try:
            await self._run(batch)
        finally:
            self._in_flight -= 1
            self._wakeup.set()

    async def _run(self, batch: list[_Entry[ItemT, OutT]]) -> None:
        loop = asyncio.get_running_loop()
        # A caller may have gone between the batch closing and now: drop it before compute.
        live = [e for e in batch if not e.future.done()]
        self.stats.dropped_cancelled += len(batch) - len(live)
        if not live:
            return
        items = [e.item for e in live]
        error: str | None = None
        outputs: Sequence[OutT] = ()
        handed_over = loop.time()
        try:
            outputs = await self._run_batch(items)
            if len(outputs) != len(items):
                raise RuntimeError(
                    f"the model returned {len(outputs)} results for {len(items)} requests"
                )
        except Exception as exc:  # a failing batch must fail only its own requests
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.exception("batch of %d requests failed", len(items))
        done = loop.time()
        # Batches run in order: this one started when it was handed over or when the
        # one before it came back, whichever was later. Until then it was queueing.
        started = max(handed_over, self._last_done_at)
        self._last_done_at = done
        compute_s = done - started
        waits = [started - e.enqueued_at for e in live]
        self.stats.batches += 1
        self.stats.sizes[len(live)] += 1
        if error is not None:
            self.stats.failed_batches += 1
            for entry in live:
                if not entry.future.done():
                    entry.future.set_exception(BatchFailed(f"the batch failed: {error}"))
        else:
            for entry, value, wait in zip(live, outputs, waits, strict=True):
                if not entry.future.done():
                    entry.future.set_result(Completed(value, len(live), wait, compute_s))
        if self._observer is not None:
            self._observer.batch_done(BatchRecord(items, waits, compute_s, error))
