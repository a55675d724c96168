"""vLLM's CPU engine for real: a tiny random-weight Llama model written by the engine's
own environment, the server started at two batch caps, `batchpilot loadtest --protocol
openai-stream` measuring TTFT, ITL, TPOT and output tokens against it, and each cap
proven on the server: the peak of `vllm:num_requests_running` under a burst of more
concurrent streams than the cap is exactly the cap. Assertions are about behaviour,
never about speed (two shared cores)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from batchpilot.loadgen.result import LoadResult
from batchpilot.runtimes.vllm.knobs import VllmKnobs
from batchpilot.runtimes.vllm.process import (
    MODEL,
    VllmProcess,
    engine_dir,
    write_tiny_model,
)

from .support import require_engine

pytestmark = [
    pytest.mark.runtimes,
    # two starts of the engine, each a minute or more of two shared cores
    pytest.mark.timeout(1500),
    pytest.mark.asyncio(loop_scope="module"),
]

CAPS = (2, 5)
TOKEN_BUDGET = 256
PROMPT_TOKENS = 16
OUTPUT_TOKENS = 24
# a burst's answers are long enough that every stream is still running when the last
# one of the burst is admitted
BURST_OUTPUT_TOKENS = 96
_RUNNING = "vllm:num_requests_running"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_engine(engine_dir() / "bin" / "python")
    return await write_tiny_model(tmp_path_factory.mktemp("vllm") / MODEL)


def running(metrics: str) -> float:
    """The value of vllm:num_requests_running in a /metrics page (summed over engines)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(_RUNNING + "{") or line.startswith(_RUNNING + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def peak_running(url: str, stop: asyncio.Event) -> float:
    """The highest vllm:num_requests_running seen until `stop` is set."""
    peak = 0.0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.get(url) as response:
                peak = max(peak, running(await response.text()))
            await asyncio.sleep(0.02)
    return peak


async def stream(session: aiohttp.ClientSession, url: str, tokens: int) -> int:
    """One streamed completion of exactly `tokens` tokens; the tokens its usage chunk
    counts (a piece of text may hold more than one)."""
    body = {
        "model": MODEL,
        "prompt": "0 hello hello hello",
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    counted = 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    counted = int(usage["completion_tokens"])
    return counted


async def run_loadtest(url: str) -> LoadResult:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchpilot", "loadtest", url,
        "--protocol", "openai-stream", "--model", MODEL,
        "--rate", "3", "--duration", "4", "--timeout", "120",
        "--prompt-tokens", f"fixed:{PROMPT_TOKENS}",
        "--output-tokens", f"fixed:{OUTPUT_TOKENS}",
        "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, err.decode()
    return LoadResult.model_validate_json(out)


@pytest.mark.parametrize("cap", CAPS)
async def test_streamed_load_is_measured_and_the_batch_cap_holds(model_dir: Path, cap: int) -> None:
    knobs = VllmKnobs(max_num_seqs=cap, max_num_batched_tokens=TOKEN_BUDGET)
    async with VllmProcess(model_dir, knobs) as server:
        result = await run_loadtest(server.url)

        stop = asyncio.Event()
        poller = asyncio.create_task(peak_running(server.metrics_url, stop))
        async with aiohttp.ClientSession() as session:
            counted = await asyncio.gather(
                *(stream(session, server.url, BURST_OUTPUT_TOKENS) for _ in range(3 * cap))
            )
        stop.set()
        peak = await poller

    assert result.errors == {}
    assert result.ok > 0
    summary = result.stream
    assert summary is not None
    assert summary.streams == result.ok
    # ignore_eos and min_tokens make every answer exactly as long as asked
    assert summary.output_tokens == OUTPUT_TOKENS * summary.streams
    assert summary.output_tokens_per_s > 0
    assert summary.ttft.count == summary.streams
    assert 0 < summary.ttft.p50_ms <= summary.ttft.p99_ms
    assert summary.tpot.count == summary.streams
    assert 0 < summary.tpot.p50_ms <= summary.tpot.p99_ms
    # a gap per streamed piece after the first: vLLM may put two tokens in one piece
    # when the client reads slower than the engine decodes
    assert 0 < summary.itl.count <= summary.streams * (OUTPUT_TOKENS - 1)

    assert counted == [BURST_OUTPUT_TOKENS] * (3 * cap)
    # more streams than the cap at once: the engine runs exactly `cap` of them together
    assert peak == cap
