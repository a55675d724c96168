"""The reference server as a real process (`python -m batchpilot serve`), started and
stopped by each test on 127.0.0.1: the CLI, live reconfiguration, the encoder model, and
a graceful SIGTERM with requests in flight."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import aiohttp
import pytest

from batchpilot.models import BatchingConfig
from batchpilot.server.process import ModelCrashes, ServerProcess, ServerStartError, free_port
from batchpilot.tuner.interfaces import ServerDied
from batchpilot.tuner.watch import Watch

pytestmark = pytest.mark.component

TIMEOUT = aiohttp.ClientTimeout(total=30)


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the exposition")


async def until(condition: Callable[[], object], timeout_s: float = 20.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if await condition():  # type: ignore[misc]
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def test_serve_predict_and_reconfigure_live() -> None:
    async with (
        ServerProcess(max_batch_size=4, max_queue_time_ms=2.0, threads=1) as server,
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert server.pid > 0
        async with http.get(f"{server.url}/readyz") as response:
            ready = await response.json()
        assert ready["status"] == "ready"
        assert ready["max_batch_size"] == 4
        async with http.post(
            f"{server.url}/v1/predict", json={"synthetic": {"size": 2}}
        ) as response:
            assert response.status == 200
            assert len((await response.json())["classes"]) == 2

        async with http.put(
            f"{server.url}/admin/batching", json={"max_batch_size": 32, "max_queue_time_ms": 7}
        ) as response:
            assert await response.json() == {"max_batch_size": 32, "max_queue_time_ms": 7.0}
        async with http.get(f"{server.url}/admin/batching") as response:
            assert await response.json() == {"max_batch_size": 32, "max_queue_time_ms": 7.0}
        async with http.get(f"{server.url}/metrics") as response:
            text = await response.text()
        assert metric_value(text, "batchpilot_max_batch_size") == 32
        assert metric_value(text, "batchpilot_max_queue_time_seconds") == pytest.approx(0.007)
        assert metric_value(text, "batchpilot_config_changes_total") == 1

        # The new cap is used: 32 concurrent requests can share one batch.
        async def one() -> int:
            async with http.post(
                f"{server.url}/v1/predict", json={"synthetic": {"size": 1}}
            ) as response:
                size: int = (await response.json())["batch_size"]
                return size

        sizes = await asyncio.gather(*(one() for _ in range(32)))
        assert max(sizes) > 4
    assert server.returncode == 0
    assert "batching changed: batch=4 wait=2ms -> batch=32 wait=7ms" in server.stderr_tail()


async def test_env_vars_configure_and_flags_win() -> None:
    env = {**os.environ, "MAX_BATCH_SIZE": "12", "MAX_QUEUE_TIME_MS": "3.5", "PORT": "1"}
    port = free_port()
    # The environment sets the batching; the --port flag wins over PORT.
    command = [sys.executable, "-m", "batchpilot", "serve", "--port", str(port), "--threads", "1"]
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:

            async def batching() -> dict[str, float] | None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/admin/batching") as r:
                        body: dict[str, float] = await r.json()
                        return body
                except aiohttp.ClientError:
                    return None

            await until(batching)
            assert await batching() == {"max_batch_size": 12, "max_queue_time_ms": 3.5}

            async def ready() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            # The server listens while the model loads; the SIGTERM below is for a
            # server that is serving (one that is loading is the next test's).
            await until(ready)
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0


async def test_sigterm_while_the_model_loads_exits_cleanly() -> None:
    port = free_port()
    command = [sys.executable, "-m", "batchpilot", "serve", "--port", str(port), "--threads", "1"]
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:

            async def readiness() -> str | None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        status: str = (await r.json())["status"]
                        return status
                except aiohttp.ClientError:
                    return None

            await until(readiness)
            if await readiness() == "ready":
                pytest.skip("the model loaded before the signal could be sent")
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
    assert code == 0


async def test_encoder_model_takes_token_sequences() -> None:
    server = ServerProcess(model="encoder", max_batch_size=8, max_queue_time_ms=5, threads=1)
    # Someone else takes the chosen port before the server binds it: it moves to another.
    taken_port = server.port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", taken_port))
        taken.listen()
        await server.start()
    assert server.port != taken_port
    assert server.url == f"http://127.0.0.1:{server.port}"
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(server.stop)
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=TIMEOUT))

        async def predict(body: object) -> tuple[int, dict[str, object]]:
            async with http.post(f"{server.url}/v1/predict", json=body) as response:
                return response.status, await response.json()

        results = await asyncio.gather(
            predict({"inputs": [5, 17, 300]}),
            predict({"synthetic": {"size": 200}}),
            predict({"synthetic": {"size": 1}}),
        )
        assert [status for status, _ in results] == [200, 200, 200]
        assert [body["size"] for _, body in results] == [3, 200, 1]
        assert all(len(body["classes"]) == 1 for _, body in results)  # type: ignore[arg-type]
        status, error = await predict({"inputs": [5, 0, 3]})
        assert status == 400
        assert "token ids run from 1 to 999" in str(error["error"])
        status, error = await predict({"synthetic": {"size": 513}})
        assert status == 400
        assert "1 to 512 tokens" in str(error["error"])
        async with http.get(f"{server.url}/admin/profile") as response:
            profile = await response.json()
        assert profile["model"] == "encoder"
        assert sum(b["count"] for b in profile["batches"]) >= 1


async def test_sigterm_drains_requests_in_flight() -> None:
    # A long wait cap keeps the requests queued until the signal arrives.
    server = ServerProcess(max_batch_size=64, max_queue_time_ms=30_000, threads=1)
    async with server, aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def predict() -> int:
            async with http.post(
                f"{server.url}/v1/predict", json={"synthetic": {"size": 1}}
            ) as response:
                await response.read()
                return response.status

        async def queued() -> bool:
            async with http.get(f"{server.url}/metrics") as response:
                return metric_value(await response.text(), "batchpilot_queue_depth") == 10

        requests = [asyncio.create_task(predict()) for _ in range(10)]
        await until(queued)
        server.send_signal(signal.SIGTERM)
        assert await asyncio.gather(*requests) == [200] * 10
        assert await server.wait(30) == 0
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(f"{server.url}/healthz"):
                pass
    log = server.stderr_tail()
    assert "draining 10 queued request(s)" in log
    assert "drained" in log


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchpilot", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-batch-size", "0"], "'--max-batch-size': 0 is not in the range 1<=x<=4096"),
        (["--max-queue-time-ms", "-1"], "'--max-queue-time-ms': -1.0 is not in the range"),
        (["--model", "resnet"], "'resnet' is not one of 'mlp', 'encoder'"),
        (["--port", "70000"], "'--port': 70000 is not in the range 1<=x<=65535"),
        (["--threads", "zero"], "'zero' is not a valid integer"),
        (["--bogus"], "No such option '--bogus'"),
    ],
)
def test_cli_rejects_bad_flags_in_one_line(args: list[str], expected: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_cli_names_the_bad_env_var() -> None:
    env = {**os.environ, "MAX_QUEUE_TIME_MS": "soon"}
    result = run_cli(env=env)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "environment variable MAX_QUEUE_TIME_MS" in line


def test_port_in_use_is_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--port", str(port), "--threads", "1", "--log-level", "error")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert f"cannot listen on 127.0.0.1:{port}" in line


async def test_start_failure_reports_stderr() -> None:
    with pytest.raises(ServerStartError, match="exited with code 2") as info:
        async with ServerProcess(extra_args=["--bogus"]):
            pass
    assert "No such option '--bogus'" in str(info.value)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


async def test_a_killed_server_reports_its_exit_code_and_restarts() -> None:
    # what local tuning does when a trial kills the server (see tuner.watch)
    async with ServerProcess(max_batch_size=4) as server:
        assert await server.exit_code() is None
        first_pid = server.pid
        server.send_signal(signal.SIGKILL)
        assert await server.exit_code(grace_s=10.0) == -signal.SIGKILL
        await server.restart()
        assert server.pid != first_pid
        assert await server.exit_code() is None
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.get(f"{server.url}/admin/batching") as response,
        ):
            assert response.status == 200
            assert (await response.json())["max_batch_size"] == 4


class _Answering:
    """The target of the watch: the server's own admin endpoint answers."""

    async def current(self) -> BatchingConfig:
        return BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)

    async def apply(self, config: BatchingConfig) -> None:
        return None


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as listing:
        return [int(p) for p in listing.read().split()]


async def test_a_model_process_killed_under_the_server_is_reported_as_a_crash() -> None:
    # The server lives on, answers 500 and starts a new model process: without the
    # report a tuner would score the configuration as slow, not as one that crashed.
    config = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)
    async with (
        ServerProcess(max_batch_size=4, max_queue_time_ms=2.0, threads=1) as server,
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):
        watch = Watch(server, _Answering())
        await watch.check(config, suspect=False)  # nothing died yet
        assert await server.model_crashes() == ModelCrashes(deaths=0, last="")
        [model_process] = _children(server.pid)
        os.kill(model_process, signal.SIGKILL)
        async with http.post(
            f"{server.url}/v1/predict", json={"synthetic": {"size": 1}}
        ) as response:
            assert response.status in (200, 500)  # the batch in flight, or the next one
        crashes = await server.model_crashes()
        assert crashes == ModelCrashes(deaths=1, last="was killed by SIGKILL")
        with pytest.raises(ServerDied, match="the model process was killed by SIGKILL at"):
            await watch.check(config, suspect=False)
        await watch.check(config, suspect=False)  # reported once
        assert await server.exit_code() is None  # the server itself lives on
