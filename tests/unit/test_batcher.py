"""The dynamic batcher on looptime's virtual clock: every time asserted here is exact
virtual time, so nothing depends on how fast this machine is."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.server.batcher import (
    Batcher,
    BatcherClosed,
    BatchFailed,
    BatchRecord,
    QueueFull,
)

pytestmark = pytest.mark.looptime

COMPUTE_S = 0.010


class FakeModel:
    """Doubles its inputs after COMPUTE_S of virtual time; fails batches holding a
    negative number. Records when each batch started and what was in it."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append((asyncio.get_running_loop().time(), list(items)))
        await asyncio.sleep(COMPUTE_S)
        if any(i < 0 for i in items):
            raise ValueError("negative input")
        return [2 * i for i in items]

    @property
    def sizes(self) -> list[int]:
        return [len(items) for _, items in self.batches]

    @property
    def starts(self) -> list[float]:
        return [round(t, 6) for t, _ in self.batches]


class Recorder:
    def __init__(self) -> None:
        self.records: list[BatchRecord[int]] = []

    def batch_done(self, record: BatchRecord[int]) -> None:
        self.records.append(record)


def config(size: int, wait_ms: float) -> BatchingConfig:
    return BatchingConfig(max_batch_size=size, max_queue_time_ms=wait_ms)


async def started(
    model: FakeModel, cfg: BatchingConfig, queue_limit: int = 100, observer: Recorder | None = None
) -> Batcher[int, int]:
    batcher: Batcher[int, int] = Batcher(model, cfg, queue_limit=queue_limit, observer=observer)
    batcher.start()
    return batcher


def submit_all(batcher: Batcher[int, int], items: Sequence[int]) -> list[asyncio.Task[int]]:
    async def one(item: int) -> int:
        return (await batcher.submit(item)).value

    return [asyncio.create_task(one(i)) for i in items]


async def test_batch_closes_when_size_cap_is_reached() -> None:
    model = FakeModel()
    batcher = await started(model, config(4, 1000))
    results = await asyncio.gather(*submit_all(batcher, [1, 2, 3, 4]))
    assert results == [2, 4, 6, 8]
    assert model.sizes == [4]
    assert model.starts == [0.0]  # no waiting for the 1 s cap
    await batcher.close()


async def test_batch_closes_when_wait_cap_passes_since_first_request() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 50))
    first = submit_all(batcher, [1])
    await asyncio.sleep(0.030)
    second = submit_all(batcher, [2, 3])
    assert await asyncio.gather(*first, *second) == [2, 4, 6]
    assert model.sizes == [3]
    assert model.starts == [0.05]  # 50 ms after the first request, not the last
    await batcher.close()


async def test_overflow_waits_for_next_batch() -> None:
    model = FakeModel()
    batcher = await started(model, config(4, 50))
    tasks = submit_all(batcher, list(range(10)))
    assert await asyncio.gather(*tasks) == [2 * i for i in range(10)]
    assert model.sizes == [4, 4, 2]
    # Full batches run back to back; the remainder waits out its 50 ms cap.
    assert model.starts == [0.0, 0.01, 0.05]
    assert model.batches[0][1] == [0, 1, 2, 3]  # FIFO
    await batcher.close()


async def test_zero_wait_runs_each_request_alone_when_idle() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 0))
    assert await asyncio.gather(*submit_all(batcher, [5])) == [10]
    await asyncio.sleep(0.1)
    assert await asyncio.gather(*submit_all(batcher, [6])) == [12]
    assert model.sizes == [1, 1]
    await batcher.close()


async def test_requests_queued_during_compute_form_next_batch() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 0))
    first = submit_all(batcher, [1])
    await asyncio.sleep(0.002)  # batch [1] is computing until 0.010
    rest = submit_all(batcher, [2, 3, 4])
    await asyncio.gather(*first, *rest)
    assert model.sizes == [1, 3]
    assert model.starts == [0.0, 0.01]
    await batcher.close()


async def test_live_change_takes_effect_at_next_batch() -> None:
    model = FakeModel()
    batcher = await started(model, config(2, 1000))
    first = submit_all(batcher, [1, 2])  # a full batch, computing 0.000-0.010
    await asyncio.sleep(0.001)
    batcher.set_config(config(3, 1000))
    assert batcher.config == config(3, 1000)
    rest = submit_all(batcher, [3, 4, 5])
    await asyncio.gather(*first, *rest)
    assert model.sizes == [2, 3]
    assert model.starts == [0.0, 0.01]
    await batcher.close()


async def test_lowered_wait_closes_batch_being_collected() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 10_000))
    tasks = submit_all(batcher, [1, 2])
    await asyncio.sleep(0.020)
    assert model.batches == []  # still collecting under the 10 s cap
    batcher.set_config(config(8, 5))
    assert await asyncio.gather(*tasks) == [2, 4]
    assert model.starts == [0.02]  # its 5 ms deadline had already passed
    await batcher.close()


async def test_lowered_size_cap_splits_queued_requests() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 10_000))
    tasks = submit_all(batcher, [1, 2, 3, 4, 5])
    await asyncio.sleep(0.001)
    batcher.set_config(config(2, 10_000))
    await asyncio.sleep(0.1)
    assert model.sizes == [2, 2]  # the fifth waits for a partner or the 10 s cap
    batcher.set_config(config(2, 0))
    await asyncio.gather(*tasks)
    assert model.sizes == [2, 2, 1]
    await batcher.close()


async def test_failing_batch_fails_only_its_requests() -> None:
    model = FakeModel()
    recorder = Recorder()
    batcher = await started(model, config(2, 1000), observer=recorder)
    bad = submit_all(batcher, [1, -1])
    good = submit_all(batcher, [3, 4])
    results = await asyncio.gather(*bad, *good, return_exceptions=True)
    assert isinstance(results[0], BatchFailed)
    assert isinstance(results[1], BatchFailed)
    assert "ValueError: negative input" in str(results[0])
    assert results[2:] == [6, 8]
    assert [r.error is None for r in recorder.records] == [False, True]
    assert batcher.stats.failed_batches == 1
    # The batcher is still alive after a failure.
    assert await asyncio.gather(*submit_all(batcher, [7, 8])) == [14, 16]
    await batcher.close()


async def test_wrong_number_of_outputs_fails_the_batch() -> None:
    async def short(items: Sequence[int]) -> list[int]:
        return list(items)[:-1]

    batcher: Batcher[int, int] = Batcher(short, config(2, 0), queue_limit=10)
    batcher.start()
    results = await asyncio.gather(*submit_all(batcher, [1, 2]), return_exceptions=True)
    assert all(isinstance(r, BatchFailed) for r in results)
    assert "returned 1 results for 2 requests" in str(results[0])
    await batcher.close()


async def test_cancelled_request_is_dropped_before_compute() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 50))
    gone, stays = submit_all(batcher, [1, 2])
    await asyncio.sleep(0.010)
    assert batcher.depth == 2
    gone.cancel()
    await asyncio.sleep(0)
    assert batcher.depth == 1
    assert await stays == 4
    assert gone.cancelled()
    assert model.sizes == [1]
    assert model.batches[0][1] == [2]
    assert batcher.stats.dropped_cancelled == 1
    await batcher.close()


async def test_cancelling_first_request_moves_deadline_to_next() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 50))
    (gone,) = submit_all(batcher, [1])
    await asyncio.sleep(0.030)
    (stays,) = submit_all(batcher, [2])
    await asyncio.sleep(0)
    gone.cancel()
    assert await stays == 4
    assert model.starts == [0.08]  # 50 ms after the request that is still there


async def test_full_queue_refuses_and_recovers() -> None:
    model = FakeModel()
    batcher = await started(model, config(8, 100), queue_limit=3)
    tasks = submit_all(batcher, [1, 2, 3])
    await asyncio.sleep(0)
    with pytest.raises(QueueFull, match="3 requests waiting"):
        await batcher.submit(4)
    assert await asyncio.gather(*tasks) == [2, 4, 6]
    assert (await batcher.submit(4)).value == 8  # room again once the batch left
    await batcher.close()


async def test_close_runs_queued_requests_at_once_then_refuses() -> None:
    model = FakeModel()
    batcher = await started(model, config(4, 10_000))
    tasks = submit_all(batcher, [1, 2, 3, 4, 5, 6])
    await asyncio.sleep(0)
    await batcher.close()
    assert [t.result() for t in tasks] == [2, 4, 6, 8, 10, 12]
    assert model.sizes == [4, 2]
    assert model.starts == [0.0, 0.01]  # the remainder did not wait out its 10 s cap
    with pytest.raises(BatcherClosed):
        await batcher.submit(7)


async def test_completed_reports_wait_and_batch() -> None:
    model = FakeModel()
    batcher = await started(model, config(2, 50))

    async def timed(item: int, delay: float) -> tuple[int, float, float]:
        await asyncio.sleep(delay)
        done = await batcher.submit(item)
        return done.batch_size, round(done.queue_wait_s, 6), round(done.compute_s, 6)

    first, second = await asyncio.gather(timed(1, 0.0), timed(2, 0.02))
    assert first == (2, 0.02, COMPUTE_S)
    assert second == (2, 0.0, COMPUTE_S)
    await batcher.close()


async def test_observer_sees_every_batch() -> None:
    model = FakeModel()
    recorder = Recorder()
    batcher = await started(model, config(3, 0), observer=recorder)
    await asyncio.gather(*submit_all(batcher, [1, 2, 3]))
    await batcher.close()
    assert len(recorder.records) == 1
    record = recorder.records[0]
    assert list(record.items) == [1, 2, 3]
    assert [round(w, 6) for w in record.queue_waits_s] == [0.0, 0.0, 0.0]
    assert round(record.compute_s, 6) == COMPUTE_S
    assert record.error is None


def test_queue_limit_must_be_positive() -> None:
    async def run(items: Sequence[int]) -> list[int]:
        return list(items)

    with pytest.raises(ValueError, match="queue_limit"):
        Batcher(run, config(1, 0), queue_limit=0)


class SerialModel(FakeModel):
    """One device: batches handed over while another computes wait their turn, in the
    order they came. Records when each was handed over; `batches` holds start times."""

    def __init__(self) -> None:
        super().__init__()
        self.handed_over: list[float] = []
        self._device = asyncio.Lock()  # FIFO, like the model process's socket

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.handed_over.append(round(asyncio.get_running_loop().time(), 6))
        async with self._device:
            return await super().__call__(items)


async def ahead_batcher(
    model: SerialModel, cfg: BatchingConfig, observer: Recorder | None = None
) -> Batcher[int, int]:
    batcher: Batcher[int, int] = Batcher(model, cfg, queue_limit=100, observer=observer, ahead=1)
    batcher.start()
    return batcher


async def test_full_batch_is_handed_over_while_another_computes() -> None:
    model, recorder = SerialModel(), Recorder()
    batcher = await ahead_batcher(model, config(4, 50), recorder)
    tasks = submit_all(batcher, list(range(10)))
    assert await asyncio.gather(*tasks) == [2 * i for i in range(10)]
    assert model.sizes == [4, 4, 2]
    # The second full batch waits at the model, not in the batcher; the partial one
    # still waits out its 50 ms cap.
    assert model.handed_over == [0.0, 0.0, 0.05]
    assert model.starts == [0.0, 0.01, 0.05]
    # Its time at the model's door counts as queueing, not compute.
    second = recorder.records[1]
    assert [round(w, 6) for w in second.queue_waits_s] == [0.01] * 4
    assert round(second.compute_s, 6) == COMPUTE_S
    await batcher.close()


async def test_no_more_than_ahead_batches_wait_at_the_model() -> None:
    model = SerialModel()
    batcher = await ahead_batcher(model, config(4, 1000))
    tasks = submit_all(batcher, list(range(16)))
    assert await asyncio.gather(*tasks) == [2 * i for i in range(16)]
    assert model.sizes == [4, 4, 4, 4]
    assert model.handed_over == [0.0, 0.0, 0.01, 0.02]
    assert model.starts == [0.0, 0.01, 0.02, 0.03]
    await batcher.close()


async def test_partial_batch_keeps_filling_while_the_model_is_busy() -> None:
    model = SerialModel()
    batcher = await ahead_batcher(model, config(4, 5))
    first = submit_all(batcher, [1])  # alone: handed over at its 5 ms cap
    await asyncio.sleep(0.006)
    second = submit_all(batcher, [2])  # its cap passes at 0.011, the model is busy
    await asyncio.sleep(0.006)
    third = submit_all(batcher, [3])  # joins it at 0.012
    assert await asyncio.gather(*first, *second, *third) == [2, 4, 6]
    assert model.sizes == [1, 2]
    assert model.handed_over == [0.005, 0.015]
    await batcher.close()


async def test_close_waits_for_batches_handed_over() -> None:
    model = SerialModel()
    batcher = await ahead_batcher(model, config(2, 1000))
    tasks = submit_all(batcher, [1, 2, 3, 4, 5])
    await asyncio.sleep(0)
    await batcher.close()
    assert [t.result() for t in tasks] == [2, 4, 6, 8, 10]
    assert model.sizes == [2, 2, 1]


def test_ahead_must_not_be_negative() -> None:
    async def never(items: Sequence[int]) -> list[int]:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="ahead must be at least 0"):
        Batcher(never, config(1, 0), queue_limit=1, ahead=-1)
