"""`batchpilot loadtest` and `batchpilot capacity` as a user runs them: JSON out, one-line
errors, Ctrl-C printing the partial result."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time

import pytest

from batchpilot.server.process import free_port
from support.stub_server import StubServerProcess

pytestmark = [pytest.mark.component, pytest.mark.timeout(120)]


async def run_cli(*args: str, timeout_s: float = 60.0) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchpilot", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_loadtest_prints_json_with_percentiles_and_timeline() -> None:
    async with StubServerProcess(delay_ms=5) as stub:
        code, out, err = await run_cli(
            "loadtest", stub.url, "--rate", "50", "--duration", "1", "--mix", "8:16,2:256",
            "--arrival", "constant", "--json",
        )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] == 50
    assert data["offered_rps"] == pytest.approx(50)
    assert data["latency"]["p99_ms"] >= 5.0
    assert data["timeline"][0]["scheduled"] == 50
    assert isinstance(data["histogram"], str)


async def test_loadtest_human_table() -> None:
    async with StubServerProcess() as stub:
        code, out, _ = await run_cli("loadtest", stub.url, "--rate", "20", "--duration", "0.5")
    assert code == 0
    assert "latency p99" in out
    assert "achieved" in out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["loadtest", "URL", "--rate", "0", "--duration", "1"], "'--rate'"),
        (["loadtest", "URL", "--rate", "-3", "--duration", "1"], "'--rate'"),
        (["loadtest", "URL", "--rate", "abc", "--duration", "1"], "'--rate'"),
        (["loadtest", "URL", "--rate", "5", "--duration", "0"], "'--duration'"),
        (["loadtest", "URL", "--rate", "5", "--duration", "1", "--mix", "8:x"], "'8:x'"),
        (["loadtest", "URL", "--rate", "5", "--duration", "1", "--mix", "no.yaml"], "no.yaml"),
        (["loadtest", "URL", "--rate", "5", "--duration", "1", "--arrival", "x"], "'--arrival'"),
        (["loadtest", "notaurl", "--rate", "5", "--duration", "1"], "not valid"),
        (["loadtest", "DEAD", "--rate", "5", "--duration", "1"], "connection refused"),
        (["capacity", "URL", "--p99-ms", "0"], "'--p99-ms'"),
        (["capacity", "URL", "--p99-ms", "100", "--max-error-rate", "1.5"], "'--max-error-rate'"),
        (["capacity", "URL", "--p99-ms", "100", "--precision", "0"], "'--precision'"),
        (["capacity", "URL", "--p99-ms", "100", "--replicas", "0"], "'--replicas'"),
        (["capacity", "URL", "--p99-ms", "100", "--plot", "x.txt"], "--plot"),
        (["capacity", "DEAD", "--p99-ms", "100"], "connection refused"),
        (["capacity", "URL", "--p99-ms", "100", "--prometheus", "DEAD"], "connection refused"),
        (["capacity", "URL", "--p99-ms", "100", "--workers", "0"], "'--workers'"),
        (["loadtest", "URL", "--rate", "5", "--duration", "1", "--worker", "2/2"], "I/N"),
        (["loadtest", "URL", "--rate", "5", "--duration", "1", "--worker", "x"], "I/N"),
    ],
)
async def test_bad_input_is_one_line_and_a_non_zero_exit(args: list[str], fragment: str) -> None:
    # Parameter errors must come before any network check, so most cases point at a port
    # where nothing listens; only the check of the Prometheus URL needs a live target.
    dead = f"http://127.0.0.1:{free_port()}"
    async with contextlib.AsyncExitStack() as stack:
        live = dead
        if "--prometheus" in args:
            live = (await stack.enter_async_context(StubServerProcess())).url
        argv = [{"URL": live, "DEAD": dead}.get(a, a) for a in args]
        code, out, err = await run_cli(*argv)
    assert code != 0
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: ")
    assert fragment in lines[0]
    assert "Traceback" not in err


async def test_ctrl_c_prints_the_partial_loadtest_result() -> None:
    async with StubServerProcess(delay_ms=5) as stub:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "batchpilot", "loadtest", stub.url, "--rate", "50",
            "--duration", "60", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await _wait_until_served(stub, 10)
        process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 130, err
    data = json.loads(out)
    assert data["interrupted"] is True
    assert data["ok"] >= 10
    assert data["duration_s"] < 60


async def test_ctrl_c_prints_the_capacity_steps_so_far() -> None:
    async with StubServerProcess(capacity_rps=200) as stub:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "batchpilot", "capacity", stub.url, "--p99-ms", "100",
            "--step-seconds", "30", "--warmup-seconds", "0", "--start-rps", "20", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await _wait_until_served(stub, 10)
        process.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 130, err
    data = json.loads(out)
    assert data["interrupted"] is True
    assert data["steps"] == []
    assert data["effective_rps"] == 0.0


async def _wait_until_served(stub: StubServerProcess, requests: int) -> None:
    for _ in range(1200):
        if await stub.served() >= requests:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the stub did not serve {requests} requests in a minute")


async def test_capacity_with_two_workers_finds_what_one_worker_finds() -> None:
    # The stub's virtual clock serves exactly 200 req/s: both answers lie in the last
    # bracket below it, so they agree within the search precision.
    precision = 0.25
    results = {}
    for workers in (1, 2):
        async with StubServerProcess(capacity_rps=200, queue_limit=100_000) as stub:
            code, out, err = await run_cli(
                "capacity", stub.url, "--p99-ms", "250", "--step-seconds", "1",
                "--warmup-seconds", "0", "--start-rps", "50", "--arrival", "constant",
                "--precision", str(precision), "--min-requests", "0",
                "--workers", str(workers), "--json",
                timeout_s=100,
            )  # fmt: skip
        assert code == 0, err
        results[workers] = json.loads(out)
    one, two = results[1], results[2]
    assert two["workers"] == 2
    assert one["effective_rps"] > 0
    assert two["effective_rps"] > 0
    low, high = sorted((one["effective_rps"], two["effective_rps"]))
    assert high / low <= 1 + precision
    for step in two["steps"]:
        health = step["worker_clients"]
        assert len(health) == 2, "each worker's own client health"
        assert step["client"]["workers"] == 2
        assert step["client"]["cpu"] == pytest.approx(sum(h["cpu"] for h in health), abs=1e-9)
    assert all(step["worker_clients"] == [] for step in one["steps"])


async def test_cancelling_a_multi_worker_step_kills_its_workers() -> None:
    from batchpilot.loadgen.workers import run_load_workers
    from batchpilot.models import RequestMix

    async with StubServerProcess(delay_ms=1) as stub:
        run = asyncio.create_task(
            run_load_workers(
                stub.url, workers=2, rate=50, duration_s=60.0, mix=RequestMix.default()
            )
        )
        await _wait_until_served(stub, 20)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        served = await stub.served()
        await asyncio.sleep(0.5)  # 25 more requests were due by now, had a worker lived
        assert await stub.served() == served


async def test_loadtest_workers_with_one_start_time_send_the_schedule_between_them() -> None:
    # Issue 13's remote worker: each share reports its own histogram, errors, timeline
    # and client health, and the shares merge into the one run.
    from batchpilot.loadgen.result import LoadResult, merge_results

    async with StubServerProcess(delay_ms=2) as stub:
        start_at = time.time() + 8.0  # both processes started and ready by then
        common = ["loadtest", stub.url, "--rate", "100", "--duration", "2", "--seed", "5"]
        runs = await asyncio.gather(
            *(
                run_cli(*common, "--worker", f"{i}/2", "--start-at", repr(start_at), "--json")
                for i in range(2)
            )
        )
        served = await stub.served()
    parts = []
    for code, out, err in runs:
        assert code == 0, err
        parts.append(LoadResult.model_validate_json(out))
    assert [p.target_rps for p in parts] == [50.0, 50.0]
    merged = merge_results(parts)
    assert merged.ok == 200  # every request of the one schedule, once
    assert served >= 200
    assert merged.client.workers == 2
    assert merged.latency.count == 200
