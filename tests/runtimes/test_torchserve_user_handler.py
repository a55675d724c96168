"""TorchServe 0.12 serving a handler written here, not shipped in `src/`, whose answers
say nothing about its batches: configurations applied as new model versions and verified
by the management API alone, the handler answering throughout."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from batchpilot.loadgen.protocols import JSON_HEADERS
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.torchserve.adapter import TorchServeRuntime
from batchpilot.runtimes.torchserve.control import TorchServeControl, request_body
from batchpilot.runtimes.torchserve.process import VENV, TorchServeProcess

from .support import require_runtime

pytestmark = [
    pytest.mark.runtimes,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]

HANDLER = b"""
import json


def handle(data, context):
    if data is None:
        return None
    answers = []
    for request in data:
        body = request.get("body") or request.get("data")
        if isinstance(body, (bytes, bytearray)):
            body = json.loads(body)
        answers.append(json.dumps({"doubled": 2 * int(body["size"])}))
    return answers
"""
MODEL = "doubler"
START = BatchingConfig(max_batch_size=2, max_queue_time_ms=1.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def torchserve() -> AsyncIterator[tuple[TorchServeProcess, TorchServeControl]]:
    require_runtime(VENV, "torchserve")
    async with TorchServeProcess(START, model=MODEL, handler=HANDLER) as server:
        yield server, TorchServeRuntime().control(server.url, model=MODEL, server=server)


async def test_a_handler_that_does_not_report_its_batches_is_changed_and_verified(
    torchserve: tuple[TorchServeProcess, TorchServeControl],
) -> None:
    server, control = torchserve
    assert await control.current() == START
    url = f"{server.url}/predictions/{MODEL}"
    for config in (
        BatchingConfig(max_batch_size=8, max_queue_time_ms=20.0),
        BatchingConfig(max_batch_size=4, max_queue_time_ms=5.0),
    ):
        await control.apply(config)
        assert await control.current() == config
        assert len(await control.versions()) == 1
        verification = control.last_verification
        assert verification is not None
        assert verification.live == config
        assert verification.batch_sizes is None
        described = await control.describe()
        assert verification.verified_by == (
            f"management describe (version {described['modelVersion']}: batchSize "
            f"{config.max_batch_size}, maxBatchDelay {int(config.max_queue_time_ms)} ms, "
            "1 worker(s) READY)"
        )
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.post(url, data=request_body(3), headers=JSON_HEADERS) as response,
        ):
            assert response.status == 200
            answer = json.loads(await response.text())
        assert answer == {"doubled": 6}, "the handler reports nothing else"
