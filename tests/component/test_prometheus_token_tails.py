"""A token-stream step decided on the server's own TTFT and TPOT histograms through a real
Prometheus: the operator's source for runtime.kind VLLM reads the series in vLLM's names
that the token server exports (its own timings), so production's requests beside the
load count in the tails the step is judged on, as the client alone cannot see them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from batchpilot.capacity.http import measure_step
from batchpilot.capacity.steps import step_from_load
from batchpilot.loadgen.lengths import Fixed, TokenLengths
from batchpilot.loadgen.protocols import openai_stream, speaking
from batchpilot.loadgen.tokens import TokenSla
from batchpilot.models import SLA, RequestMix
from batchpilot.operator.promsource import prometheus_source
from batchpilot.operator.spec import parse_spec
from support.prometheus_process import PrometheusProcess
from support.tokenserver import (
    SERVED_MODEL,
    SLOW_ITL_S,
    SLOW_TTFT_S,
    TokenServer,
    serving_in_thread,
)

pytestmark = [pytest.mark.component, pytest.mark.timeout(180)]

SLA_TOKENS = SLA(ttft_p99_ms=150.0, tpot_p99_ms=20.0, max_error_rate=0.01)
PRODUCTION_RPS = 10.0  # slow answers the load's client never sees


@contextlib.asynccontextmanager
async def production(url: str) -> AsyncIterator[list[int]]:
    """Live traffic beside the load: streams whose first token comes SLOW_TTFT_S late and
    each next one SLOW_ITL_S after (the token server's `m-slow` at position 0). Yields the
    statuses of the answers so far."""
    statuses: list[int] = []
    body = {"model": "m-slow", "prompt": "0 live", "max_tokens": 4, "stream": True}

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            await response.read()
            statuses.append(response.status)

    async def send(stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session, asyncio.TaskGroup() as tg:
            while not stop.is_set():
                tg.create_task(one(session))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0 / PRODUCTION_RPS)

    stop = asyncio.Event()
    task = asyncio.create_task(send(stop))
    try:
        yield statuses
    finally:
        stop.set()  # the streams in flight are answered whole
        await task


async def test_a_step_is_judged_on_the_servers_tails_with_production_in_them() -> None:
    server = TokenServer()
    lengths = TokenLengths(prompt=Fixed(tokens=8), output=Fixed(tokens=4))
    protocol = openai_stream("m", lengths=lengths, sla=TokenSla(ttft_ms=150.0, tpot_ms=20.0))
    with serving_in_thread(server.app()) as url:
        async with PrometheusProcess([url], scrape_interval_s=0.5) as prometheus:
            await prometheus.wait_for_scrape()
            spec = parse_spec(
                {
                    "target": {"name": "llm"},
                    "runtime": {"kind": "VLLM", "model": SERVED_MODEL},
                    "apply": {"method": "Env"},
                    "sla": {"ttftP99Ms": 150, "tpotP99Ms": 20, "maxErrorRate": 0.01},
                    "load": {
                        "endpoint": {"port": 8000},
                        "protocol": "OpenAIStream",
                        "source": "prometheus",
                        "prometheus": {
                            "url": prometheus.url,
                            "selector": f'job="{prometheus.job}"',
                            "scrapeIntervalSeconds": 0.5,
                        },
                    },
                }
            )
            source = prometheus_source(spec)
            assert source is not None
            assert source.reads_token_tails
            async with production(url) as statuses:
                with speaking(protocol):
                    step, load = await measure_step(
                        [url], rate=20.0, sla=SLA_TOKENS, mix=RequestMix.default(),
                        duration_s=4.0, timeout_s=5.0, seed=1, arrival="constant",
                        source=source, path="/v1/completions",
                    )  # fmt: skip
    assert statuses
    assert set(statuses) == {200}
    assert step.source == "prometheus"
    # the server's tails hold production's slow answers: a third of its requests
    assert step.ttft_p99_ms is not None
    assert step.ttft_p99_ms >= 0.95 * SLOW_TTFT_S * 1000
    assert step.tpot_p99_ms is not None
    assert step.tpot_p99_ms >= 0.95 * SLOW_ITL_S * 1000
    assert not step.passed
    assert f"TTFT p99 {step.ttft_p99_ms:.1f} ms > SLA 150 ms" in step.reason, step.reason
    assert "TPOT p99" in step.reason
    # the load's own streams were answered fast: the client saw none of that
    client = step_from_load(load, SLA_TOKENS)
    assert client.ttft_p99_ms is not None
    assert client.ttft_p99_ms < step.ttft_p99_ms
    # every request of the load asked for four tokens, streamed
    loaded = [b for b in server.bodies if b["model"] == "m"]
    assert loaded
    assert all(b["stream"] and b["max_tokens"] == 4 for b in loaded)
