"""The first requests before any load: a 4xx about the request is a refusal carrying the
server's words; an answer, a 5xx, a 408 or 429 about the server's state, or no server at
all say nothing of the request and are left to the measurement."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from batchpilot.loadgen.firstrequests import first_bodies, first_refusal
from batchpilot.loadgen.protocols import kserve_v2, template_protocol

PROTOCOL = kserve_v2("m", input_name="x", features=2)


@pytest.fixture
async def server() -> AsyncIterator[tuple[dict[str, int], list[bytes], str]]:
    """A server answering every request with the status in its dict, and the bodies."""
    answer = {"status": 200}
    seen: list[bytes] = []

    async def infer(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"error": "unexpected input 'x'"}, status=answer["status"])

    app = web.Application()
    app.router.add_post("/v2/models/m/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield answer, seen, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_4xx_is_a_refusal_with_the_servers_own_words(
    server: tuple[dict[str, int], list[bytes], str],
) -> None:
    answer, seen, url = server
    answer["status"] = 400
    refusal = await first_refusal(url, PROTOCOL, [1, 16])
    assert refusal is not None
    assert str(refusal) == (f"POST {url}/v2/models/m/infer answered HTTP 400: unexpected input 'x'")
    assert len(seen) == 1  # the first refusal ends it


@pytest.mark.parametrize("status", [200, 408, 429, 500, 503])
async def test_answers_about_the_server_not_the_request_are_no_refusal(
    server: tuple[dict[str, int], list[bytes], str], status: int
) -> None:
    answer, seen, url = server
    answer["status"] = status
    assert await first_refusal(url, PROTOCOL, [1, 16]) is None
    # the smallest and the largest size of the mix were each sent once
    assert [json.loads(body)["inputs"][0]["shape"] for body in seen] == [[1, 2], [16, 2]]


async def test_no_server_is_no_refusal() -> None:
    assert await first_refusal("http://127.0.0.1:9", PROTOCOL, [1], timeout_s=5) is None


def test_one_sample_body_is_sent_once() -> None:
    sample = template_protocol('{"text": "hi"}', path="/p", require_size=False)
    assert first_bodies(sample, [1, 4, 16]) == [b'{"text": "hi"}']
