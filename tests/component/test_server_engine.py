"""The server's inference engine against real model processes (loopback socket pairs
only): answers, failing batches, a killed or vanished model process, cancellation, and
what happens to the model process when its server goes."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from batchpilot.server import engine as engine_module
from batchpilot.server.engine import InferenceEngine, ModelError
from batchpilot.server.inputs import (
    MLP_FEATURES,
    MLP_MAX_ROWS,
    EncoderInputs,
    MLPInputs,
    ModelInput,
)
from batchpilot.server.model_process import ModelInfo, Reply, Request, encode
from batchpilot.server.process import ServerProcess
from batchpilot.server.workloads import EncoderWorkload, MLPWorkload, Workload

pytestmark = [pytest.mark.component, pytest.mark.timeout(120)]

CPU = torch.device("cpu")
HEADER = struct.Struct("!Q")
# One thread takes about half a second per 4096-row input (measured on a 2-core VM):
# batches of a few of these compute long enough to act on them meanwhile.
BIG_INPUT = ModelInput(MLP_MAX_ROWS)


def real_rows(count: int, seed: int) -> list[list[float]]:
    generator = torch.Generator().manual_seed(seed)
    rows: list[list[float]] = torch.randn(count, MLP_FEATURES, generator=generator).tolist()
    return rows


def expected(workload: Workload, inputs: Sequence[ModelInput]) -> list[list[int]]:
    """The in-process answer, on one thread like the model processes here (a different
    thread count may sum in a different order)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            return workload.forward(inputs)
    finally:
        torch.set_num_threads(threads)


def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (state first), or None once reaped."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def has_exited(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (the test's own process reaps only its
    children)."""
    stat = proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def children_of(pid: int) -> list[int]:
    """The live children of `pid`, from each of its threads' list."""
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for task in tasks.iterdir() for c in (task / "children").read_text().split()]


def cpu_ticks(pid: int) -> int:
    stat = proc_stat(pid)
    assert stat is not None, f"process {pid} is gone"
    return int(stat[11]) + int(stat[12])  # utime + stime, all threads


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll `condition` (bounded): another process changes on its own schedule."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def until_computing(pid: int) -> None:
    """Until the model process has spent a tenth of a second of CPU since the call: only
    a big batch does that, so it has been received and is being computed."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    start = cpu_ticks(pid)
    await until(lambda: cpu_ticks(pid) >= start + ticks_per_s // 10)


@pytest.fixture(scope="module")
def mlp() -> MLPWorkload:
    return MLPWorkload(CPU)


@pytest.fixture(scope="module")
def engine() -> Iterator[InferenceEngine]:
    """Shared by the tests that leave its model process alive."""
    engine = InferenceEngine("mlp", "cpu", threads=1)
    yield engine
    engine.close()


@pytest.fixture
def fresh_engine() -> Iterator[InferenceEngine]:
    """For tests that kill or close the model process."""
    engine = InferenceEngine("mlp", "cpu", threads=1)
    yield engine
    engine.close()


async def test_answers_equal_the_in_process_model(
    engine: InferenceEngine, mlp: MLPWorkload
) -> None:
    info = await engine.start()
    assert info == ModelInfo("mlp", "cpu", 1)
    assert engine.info == info
    assert engine.device == "cpu"
    assert engine.model == "mlp"
    assert engine.pid is not None
    batch = [
        ModelInput(3),
        MLPInputs.parse(real_rows(5, seed=1)),
        MLPInputs.synthetic_input(1),
        MLPInputs.parse(real_rows(2, seed=2)),
        ModelInput(40),
    ]
    answers = await engine.run_batch(batch)
    assert [len(a) for a in answers] == [3, 5, 1, 2, 40]
    assert answers == expected(mlp, batch)
    # Not a constant answer, so a mix-up of rows would show.
    assert len({c for a in answers for c in a}) > 1


async def test_failing_batch_keeps_the_same_model_process(
    engine: InferenceEngine, mlp: MLPWorkload
) -> None:
    await engine.start()
    pid = engine.pid
    # Bypasses the input rules: the synthetic table has only MLP_MAX_ROWS rows.
    with pytest.raises(ModelError) as info:
        await engine.run_batch([ModelInput(1), ModelInput(MLP_MAX_ROWS + 904)])
    assert str(info.value).startswith("IndexError: ")
    assert f"out of bounds for dimension 0 with size {MLP_MAX_ROWS}" in str(info.value)
    batch = [MLPInputs.parse(real_rows(4, seed=3))]
    assert await engine.run_batch(batch) == expected(mlp, batch)
    assert engine.pid == pid


async def test_cancelled_batch_leaves_the_protocol_in_step(
    engine: InferenceEngine, mlp: MLPWorkload
) -> None:
    await engine.start()
    pid = engine.pid
    assert pid is not None
    big = asyncio.create_task(engine.run_batch([BIG_INPUT] * 3))
    await until_computing(pid)
    big.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big
    # The big batch's answer (three lists of 4096) is still to come; it must not be taken
    # for the answer to this one.
    batch = [MLPInputs.parse(real_rows(3, seed=4)), ModelInput(2)]
    assert await asyncio.wait_for(engine.run_batch(batch), 30) == expected(mlp, batch)
    batch = [ModelInput(7)]
    assert await engine.run_batch(batch) == expected(mlp, batch)
    assert engine.pid == pid


async def test_concurrent_batches_each_get_their_own_answer(
    engine: InferenceEngine, mlp: MLPWorkload
) -> None:
    await engine.start()
    pid = engine.pid
    assert pid is not None
    batches = [
        [BIG_INPUT] * 3,
        [ModelInput(1)],
        [ModelInput(5)],
        [MLPInputs.parse(real_rows(4, seed=7)), ModelInput(2)],
        [ModelInput(3), ModelInput(1)],
    ]
    tasks = [asyncio.create_task(engine.run_batch(b)) for b in batches]
    await until_computing(pid)
    tasks[2].cancel()  # waiting behind the big batch
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    assert isinstance(done[2], asyncio.CancelledError)
    big = done[0]
    assert isinstance(big, list)
    assert [len(a) for a in big] == [MLP_MAX_ROWS] * 3
    assert big[0][:16] == expected(mlp, [ModelInput(16)])[0]  # synthetic rows come first
    for index in (1, 3, 4):
        assert done[index] == expected(mlp, batches[index]), index
    assert engine.pid == pid


async def test_sigkill_while_idle_restarts_and_rewarms(
    fresh_engine: InferenceEngine, mlp: MLPWorkload, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = fresh_engine
    await engine.start()
    await engine.warm_up(4)
    sent: list[object] = []

    def spy(message: object) -> bytes:
        sent.append(message)
        return encode(message)

    monkeypatch.setattr(engine_module, "encode", spy)
    first = engine.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await until(lambda: has_exited(first))
    with pytest.raises(ModelError, match="was killed by SIGKILL") as info:
        await engine.run_batch([ModelInput(1)])
    assert "a new one starts with the next batch" in str(info.value)
    assert engine.pid is None
    assert proc_stat(first) is None  # reaped, not left a zombie
    sent.clear()
    batch = [ModelInput(2), MLPInputs.parse(real_rows(1, seed=5))]
    assert await engine.run_batch(batch) == expected(mlp, batch)
    second = engine.pid
    assert second is not None
    assert second != first
    assert engine.info == ModelInfo("mlp", "cpu", 1)
    # The replacement ran its predecessor's warm-up before the batch.
    assert [m.kind for m in sent if isinstance(m, Request)] == ["warm_up", "forward"]
    assert sent[0] == Request("warm_up", max_batch_size=4)
    # Already warm: a warm-up to the same size sends nothing.
    await engine.warm_up(4)
    assert len(sent) == 2


async def test_sigkill_during_a_batch_fails_that_batch(
    fresh_engine: InferenceEngine, mlp: MLPWorkload
) -> None:
    engine = fresh_engine
    await engine.start()
    pid = engine.pid
    assert pid is not None
    running = asyncio.create_task(engine.run_batch([BIG_INPUT] * 16))
    await until_computing(pid)
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ModelError, match="was killed by SIGKILL"):
        await asyncio.wait_for(running, 10)
    assert time.monotonic() - started < 5  # not after the batch would have finished
    batch = [ModelInput(3)]
    assert await engine.run_batch(batch) == expected(mlp, batch)
    assert engine.pid not in (None, pid)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
async def test_cuda_without_a_device_fails_to_start() -> None:
    engine = InferenceEngine("mlp", "cuda", threads=1)
    try:
        with pytest.raises(ModelError, match="no CUDA device is available") as info:
            await engine.start()
        assert "could not load mlp" in str(info.value)
        assert engine.pid is None
        assert engine.info is None
        assert engine.device == "cuda"
    finally:
        engine.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
async def test_cuda_device_starts_and_answers(mlp: MLPWorkload) -> None:
    engine = InferenceEngine("mlp", "cuda", threads=1)
    try:
        info = await engine.start()
        assert info.device == "cuda:0"
        assert engine.device == "cuda:0"
        batch = [ModelInput(8), MLPInputs.parse(real_rows(2, seed=6))]
        answers = await engine.run_batch(batch)
        assert [len(a) for a in answers] == [8, 2]
        assert all(0 <= c < 16 for a in answers for c in a)
    finally:
        engine.close()


async def test_close_ends_the_model_process_and_is_idempotent(
    fresh_engine: InferenceEngine,
) -> None:
    engine = fresh_engine
    await engine.start()
    pid = engine.pid
    assert pid is not None
    started = time.monotonic()
    engine.close()
    # Well under the close's 5 s grace: it exited on its own, it was not killed.
    assert time.monotonic() - started < engine_module.STOP_TIMEOUT_S - 1
    assert engine.pid is None
    assert proc_stat(pid) is None  # exited and reaped
    engine.close()
    assert engine.pid is None


async def test_close_during_a_batch_fails_that_batch(fresh_engine: InferenceEngine) -> None:
    engine = fresh_engine
    await engine.start()
    pid = engine.pid
    assert pid is not None
    running = asyncio.create_task(engine.run_batch([BIG_INPUT]))
    try:
        await until_computing(pid)
        engine.close()  # returns once the model process has exited
        with pytest.raises(ModelError, match="stopped"):
            await asyncio.wait_for(running, 2)
    finally:
        running.cancel()


def _read_message(sock: socket.socket) -> object:
    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            assert chunk, "the model process closed its socket"
            data += chunk
        return data

    (length,) = HEADER.unpack(exactly(HEADER.size))
    return pickle.loads(exactly(length))


def test_model_process_ignores_sigterm_and_exits_when_its_socket_closes() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "batchpilot.server.model_process",
                    f"--fd={theirs.fileno()}",
                    "--model=mlp",
                    "--device=cpu",
                    "--threads=1",
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        try:
            ours.settimeout(60)
            assert _read_message(ours) == Reply(ModelInfo("mlp", "cpu", 1))
            # The server decides when it stops, not a signal to the process group.
            process.send_signal(signal.SIGTERM)
            ours.sendall(encode(Request("forward", inputs=(ModelInput(2),))))
            reply = _read_message(ours)
            assert isinstance(reply, Reply)
            assert reply.error is None
            assert isinstance(reply.value, list)
            assert [len(a) for a in reply.value] == [2]
            ours.sendall(encode("not a request"))
            assert _read_message(ours) == Reply(error="expected a Request, got str")
        except BaseException:
            process.kill()
            process.wait()
            raise
    assert process.wait(timeout=10) == 0


async def test_killed_server_leaves_no_model_process() -> None:
    async with ServerProcess(max_batch_size=2, threads=1) as server:
        children = children_of(server.pid)
        assert len(children) == 1, children
        (model_pid,) = children
        assert not has_exited(model_pid)
        server.send_signal(signal.SIGKILL)
        await until(lambda: has_exited(model_pid), timeout_s=10)
    assert server.returncode == -signal.SIGKILL


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
async def test_encoder_answers_one_class_per_sequence() -> None:
    engine = InferenceEngine("encoder", "cpu", threads=1)
    try:
        info = await engine.start()
        assert info == ModelInfo("encoder", "cpu", 1)
        batch = [
            EncoderInputs.parse([5, 17, 300]),
            EncoderInputs.synthetic_input(200),
            ModelInput(1),
            EncoderInputs.parse(list(range(1, 65))),
        ]
        answers = await engine.run_batch(batch)
        assert [len(a) for a in answers] == [1, 1, 1, 1]
        assert all(0 <= a[0] < 16 for a in answers)
        assert answers == expected(EncoderWorkload(CPU), batch)
    finally:
        engine.close()
