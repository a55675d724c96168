"""The simulator fed by a real reference server: its GET /admin/profile fits a cost model
that `batchpilot simulate --profile-url` uses. (How close the prediction comes to the
measured capacity is a benchmark, benchmarks/simulator_validation.py, not a test.)"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from click.testing import CliRunner

from batchpilot.cli import main
from batchpilot.server.process import ServerProcess
from batchpilot.simulator.cost import LinearCost, fit_cost_model
from batchpilot.simulator.profile import fetch_profile

pytestmark = pytest.mark.component

TIMEOUT = aiohttp.ClientTimeout(total=30)


async def _burst(http: aiohttp.ClientSession, url: str, sizes: list[int]) -> None:
    """Concurrent requests, so the batcher sees many at once and forms large batches."""

    async def one(size: int) -> None:
        async with http.post(f"{url}/v1/predict", json={"synthetic": {"size": size}}) as r:
            assert r.status == 200

    await asyncio.gather(*(one(s) for s in sizes))


async def test_profile_of_a_live_server_fits_and_drives_simulate() -> None:
    async with (
        ServerProcess(max_batch_size=16, max_queue_time_ms=20.0, threads=1) as server,
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):
        async with http.delete(f"{server.url}/admin/profile") as response:
            assert response.status == 200
        # Batches of one, then full batches of 16: two very different row counts.
        for size in (1, 4, 1, 4):
            await _burst(http, server.url, [size])
        await _burst(http, server.url, [1, 4] * 24)
        profile = await fetch_profile(server.url)
        assert {b["batch_size"] for b in profile["batches"]} >= {1}
        assert max(b["batch_size"] for b in profile["batches"]) > 1
        model = fit_cost_model(profile)
        assert isinstance(model, LinearCost)
        assert model.fixed_ms + model.per_row_ms > 0

        # The CLI fetches the same profile itself (in a thread: it runs its own loop).
        result = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            [
                "simulate", "--p99-ms", "200", "--max-batch-size", "8",
                "--max-queue-time-ms", "5", "--profile-url", server.url,
                "--requests", "1000", "--json",
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["source"] == "simulator"
        assert data["cost_model"]["kind"] == "linear"
        assert data["feasible"] is True
