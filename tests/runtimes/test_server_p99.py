"""Server-side p99 from each runtime's own metrics through a real Prometheus, against
the client's: the runtime started on loopback, Prometheus scraping its metrics endpoint
every half second, a fixed-rate load in the runtime's protocol. What must hold: both
p99s are there, the server's is no later than the client's plus the width of the bucket
it was interpolated in (the server times a part of what the client times), and the
server counted exactly the requests the client completed. No timing thresholds.

Ray exports its figures about 10 s late: the counts are awaited (with a deadline)
before anything is read, and the p99 is read over a window that takes the delay in."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp
import pytest

from batchpilot.capacity.prometheus import PrometheusStepSource
from batchpilot.capacity.promql import MS_PER_UNIT, with_matchers
from batchpilot.capacity.steps import step_from_load
from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.protocols import speaking
from batchpilot.models import SLA, BatchingConfig, RequestMix
from batchpilot.runtimes.base import Runtime
from batchpilot.runtimes.mlserver import VENV as MLSERVER_VENV
from batchpilot.runtimes.rayserve.process import VENV as RAY_VENV
from batchpilot.runtimes.registry import get_runtime
from batchpilot.runtimes.triton.install import VENV_NAME as TRITON_VENV
from support.prometheus_process import PrometheusProcess

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(240)]

START = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
SLA_LOOSE = SLA(p99_ms=2000.0, max_error_rate=0.01)
SCRAPE_S = 0.5
RATE = 25.0
LOAD_S = 4.0
# how long the server's counters may take to show the whole load (Ray: ~10 s export)
COUNT_DEADLINE_S = 45.0
# environment and program per runtime, for require_runtime
INSTALLED = {
    "mlserver": (MLSERVER_VENV, "mlserver"),
    "ray": (RAY_VENV, "ray"),
    "triton": (TRITON_VENV, "python"),
}


async def _query(prometheus: str, query: str, at_unix: float) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session,
        session.get(
            f"{prometheus}/api/v1/query", params={"query": query, "time": f"{at_unix:.3f}"}
        ) as response,
    ):
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def _count(prometheus: str, counter: str, at_unix: float) -> float:
    result = await _query(prometheus, f"sum({counter})", at_unix)
    return float(result[0]["value"][1]) if result else 0.0


async def _settled(prometheus: str, counter: str, at_least: float, quiet_s: float) -> float:
    """The server's count once it holds `at_least` and has not moved for `quiet_s` (a
    runtime that exports late shows a load in pieces), or what it holds at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + COUNT_DEADLINE_S
    last, since = math.nan, loop.time()
    while True:
        seen = await _count(prometheus, counter, time.time())
        if seen != last:
            last, since = seen, loop.time()
        if (seen >= at_least and loop.time() - since >= quiet_s) or loop.time() > deadline:
            return seen
        await asyncio.sleep(SCRAPE_S)


async def _bucket_width_ms(prometheus: str, buckets: str, p99_native: float, unit: str) -> float:
    """The width (ms) of the histogram bucket `p99_native` lies in."""
    result = await _query(prometheus, f"count by (le) ({buckets})", time.time())
    bounds = sorted(float(r["metric"]["le"]) for r in result)
    upper = next(b for b in bounds if b >= p99_native)
    lower = max((b for b in bounds if b < p99_native), default=0.0)
    return (upper - lower) * MS_PER_UNIT[unit]


def _metrics_base(server: object) -> str:
    url = str(getattr(server, "metrics_url"))  # noqa: B009 - every launcher here has one
    return url.removesuffix("/metrics")


@pytest.mark.parametrize("name", sorted(INSTALLED))
async def test_server_p99_through_prometheus_against_the_clients(name: str) -> None:
    require_runtime(*INSTALLED[name])
    runtime: Runtime = get_runtime(name)
    metrics = runtime.metrics_for(runtime.default_model)
    protocol = runtime.protocol(runtime.default_model)
    assert metrics.latency_histogram is not None or metrics.latency_summary is not None
    async with (
        runtime.launcher(START) as server,
        PrometheusProcess([_metrics_base(server)], scrape_interval_s=SCRAPE_S) as prometheus,
    ):
        await prometheus.wait_for_scrape()
        job = f'job="{prometheus.job}"'
        quiet = metrics.export_delay_s + 2 * SCRAPE_S
        total = with_matchers(metrics.total_requests, job)
        with speaking(protocol):
            # the series exist (and the model is warm) before the measured load
            warm = await run_load(
                [server.url], rate=RATE, duration_s=1.0, mix=RequestMix.default(),
                arrival="constant", seed=1, timeout_s=5.0,
            )  # fmt: skip
            assert warm.ok == warm.requests > 0, warm.errors
            # (a launcher may have sent a request of its own while it waited)
            before = await _settled(prometheus.url, total, warm.requests, quiet)
            start_unix = time.time()
            load = await run_load(
                [server.url], rate=RATE, duration_s=LOAD_S, mix=RequestMix.default(),
                arrival="constant", seed=2, timeout_s=5.0,
            )  # fmt: skip
            end_unix = time.time()
        assert load.ok == load.requests > 0, load.errors
        after = await _settled(prometheus.url, total, before + load.requests, quiet)
        assert after - before == load.requests
        read_at = time.time()
        ok_count = await _count(prometheus.url, with_matchers(metrics.ok_requests, job), read_at)
        client = step_from_load(load, SLA_LOOSE)
        if metrics.latency_histogram is not None:
            source = PrometheusStepSource.for_runtime(
                prometheus.url, runtime, model=runtime.default_model, selector=job
            )
            # the whole load and nothing else: idle before and after it
            window_s = read_at - start_unix + SCRAPE_S
            p99_native = await source.query_scalar(source.queries(window_s)["p99"], at_unix=read_at)
            buckets = with_matchers(
                f"{metrics.latency_histogram}_bucket", job, metrics.latency_matchers
            )
            width_ms = await _bucket_width_ms(
                prometheus.url, buckets, p99_native, metrics.latency_unit
            )
            client_p99_ms = client.p99_ms
            if metrics.export_delay_s == 0:
                step = await source.step_result(
                    load=load, start_unix=start_unix, end_unix=end_unix, sla=SLA_LOOSE
                )
                assert step.passed, step.reason
                assert step.error_rate == 0.0
        else:
            # a summary: quantiles over the runtime's own sliding window, which holds the
            # warm-up too; the p99 of the two together is at most the larger of theirs
            assert metrics.latency_summary is not None
            quantile = with_matchers(
                metrics.latency_summary, job, metrics.latency_matchers, 'quantile="0.99"'
            )
            result = await _query(prometheus.url, f"max({quantile})", read_at)
            p99_native = float(result[0]["value"][1]) if result else math.nan
            width_ms = 0.0
            client_p99_ms = max(client.p99_ms, step_from_load(warm, SLA_LOOSE).p99_ms)
    server_p99_ms = p99_native * MS_PER_UNIT[metrics.latency_unit]
    assert math.isfinite(server_p99_ms)
    assert server_p99_ms > 0
    assert math.isfinite(client.p99_ms)
    assert client.p99_ms > 0
    assert server_p99_ms <= client_p99_ms + width_ms
    assert ok_count - before == load.requests
    print(
        f"{runtime.title}: server p99 {server_p99_ms:.1f} ms (bucket {width_ms:g} ms wide), "
        f"client p99 {client_p99_ms:.1f} ms, {load.requests} requests counted by both"
    )
