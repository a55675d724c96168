"""A trial that kills the server: the watched target and probe of local mode report it
as ServerDied (and start the server again), and the trial loop records it so that the
tuner leaves that batch size and every larger one out. Fakes for the server, target and
probe; the real process is covered by the server-process component tests."""

from __future__ import annotations

import pytest

from batchpilot.errors import TargetError
from batchpilot.models import SLA, BatchingConfig, CapacityResult, StepResult
from batchpilot.tuner.interfaces import ServerDied
from batchpilot.tuner.runner import run_trial
from batchpilot.tuner.study import SearchSpace, Tuner
from batchpilot.tuner.watch import (
    Watch,
    WatchedProbe,
    WatchedTarget,
    answered_nothing,
    crashed,
)

SLA_ = SLA(p99_ms=100.0)
BIG = BatchingConfig(max_batch_size=96, max_queue_time_ms=5.0)


class FakeServer:
    def __init__(self) -> None:
        self.code: int | None = None
        self.restarts = 0
        self.answers = True

    async def exit_code(self, grace_s: float) -> int | None:
        return self.code

    async def restart(self) -> None:
        self.restarts += 1
        self.code = None
        self.answers = True

    def stderr_tail(self, limit: int = 300) -> str:
        return "starting\nRuntimeError: out of memory\n"


class FakeTarget:
    def __init__(self, server: FakeServer, *, kill_at: int | None = None) -> None:
        self.server = server
        self.kill_at = kill_at

    async def current(self) -> BatchingConfig:
        if not self.server.answers:
            raise TargetError("GET /admin/batching failed 4 times: connection refused")
        return BIG

    async def apply(self, config: BatchingConfig) -> None:
        if self.kill_at is not None and config.max_batch_size >= self.kill_at:
            self.server.code = -9
            self.server.answers = False
            raise TargetError("PUT /admin/batching failed 4 times: connection refused")


def step(achieved: float, errors: float) -> StepResult:
    return StepResult(
        offered_rps=50.0,
        achieved_rps=achieved,
        p50_ms=5.0,
        p99_ms=10.0 if errors == 0 else 1e4,
        error_rate=errors,
        requests=100,
        passed=errors == 0,
        reason="" if errors == 0 else "errors",
        duration_s=2.0,
    )


def result(achieved: float, errors: float) -> CapacityResult:
    feasible = errors == 0
    return CapacityResult(
        effective_rps=achieved if feasible else 0.0,
        p99_ms=10.0 if feasible else None,
        sla=SLA_,
        feasible=feasible,
        precision=0.05,
        steps=[step(achieved, errors)],
    )


class FakeProbe:
    def __init__(self, server: FakeServer, outcome: CapacityResult, *, dies: bool) -> None:
        self.server = server
        self.outcome = outcome
        self.dies = dies

    async def measure(self, config: BatchingConfig, *, must_beat: float | None) -> CapacityResult:
        if self.dies:
            self.server.code = 137
            self.server.answers = False
        return self.outcome


def test_answered_nothing_means_every_request_of_the_lowest_step_failed() -> None:
    assert answered_nothing(result(0.0, 1.0))
    assert not answered_nothing(result(3.0, 0.9))
    assert not answered_nothing(result(50.0, 0.0))


async def test_a_process_that_exits_during_the_measurement_is_server_died() -> None:
    server = FakeServer()
    target = FakeTarget(server)
    probe = WatchedProbe(FakeProbe(server, result(0.0, 1.0), dies=True), Watch(server, target))
    with pytest.raises(ServerDied, match=r"exited with code 137 .*out of memory"):
        await probe.measure(BIG, must_beat=None)
    assert server.restarts == 1


async def test_a_server_that_stops_answering_is_server_died() -> None:
    server = FakeServer()
    target = FakeTarget(server)
    inner = FakeProbe(server, result(0.0, 1.0), dies=False)
    server.answers = False  # hung, its process still there
    with pytest.raises(ServerDied, match="stopped answering"):
        await WatchedProbe(inner, Watch(server, target)).measure(BIG, must_beat=None)


async def test_an_infeasible_configuration_of_a_live_server_is_an_ordinary_trial() -> None:
    server = FakeServer()
    target = FakeTarget(server)
    probe = WatchedProbe(FakeProbe(server, result(0.0, 1.0), dies=False), Watch(server, target))
    assert not (await probe.measure(BIG, must_beat=None)).feasible
    assert server.restarts == 0


async def test_apply_that_kills_the_server_is_server_died_and_a_refusal_is_not() -> None:
    server = FakeServer()
    watched = WatchedTarget(FakeTarget(server, kill_at=64), Watch(server, FakeTarget(server)))
    with pytest.raises(ServerDied, match="exited with code -9"):
        await watched.apply(BIG)

    class Refusing(FakeTarget):
        async def apply(self, config: BatchingConfig) -> None:
            raise TargetError("the server refused PUT /admin/batching with HTTP 422")

    server = FakeServer()
    refusing = WatchedTarget(Refusing(server), Watch(server, FakeTarget(server)))
    with pytest.raises(TargetError, match="HTTP 422") as caught:
        await refusing.apply(BIG)
    assert not isinstance(caught.value, ServerDied)


async def test_the_trial_loop_records_the_death_and_the_tuner_avoids_its_batch_size() -> None:
    space = SearchSpace.from_bounds(max_batch_size=(1, 128), max_queue_time_ms=(0, 50))
    tuner = Tuner(
        space, seed=3, warm_start=[BIG, BatchingConfig(max_batch_size=128, max_queue_time_ms=1.0)]
    )
    server = FakeServer()
    watch = Watch(server, FakeTarget(server))
    target = WatchedTarget(FakeTarget(server, kill_at=64), watch)
    probe = WatchedProbe(FakeProbe(server, result(40.0, 0.0), dies=False), watch)
    done = await run_trial(tuner, target, probe)
    assert done.record.state == "Failed"
    assert done.record.reason.startswith("ServerDied at max_batch_size 96: ")
    retry = await run_trial(tuner, target, probe)  # a death is confirmed by its retry
    assert retry.record.config() == done.record.config()
    assert retry.record.reason.startswith("ServerDied at max_batch_size 96: ")
    assert tuner.batch_limit() == 96
    for _ in range(8):
        done = await run_trial(tuner, target, probe)
        assert done.record.config().max_batch_size < 96
    assert server.restarts == 2


def test_a_crashed_round_cannot_win_the_confirmation() -> None:
    measured = result(50.0, 0.0)
    assert measured.effective_rps > 0
    round_ = crashed(measured)
    assert (round_.effective_rps, round_.feasible, round_.p99_ms) == (0.0, False, None)
    assert round_.steps == measured.steps  # what was measured before it died stays
