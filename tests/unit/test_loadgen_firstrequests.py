"""The first requests before any load: a 4xx about the request is a refusal carrying the
server's words, and so is a 5xx to every first request twice in a row (TorchServe's 503
"Prediction failed" for a handler that raises); an answer, a 408 or 429 about the
server's state, a 5xx that clears a moment later, or no server at all say nothing of the
request and are left to the measurement."""

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
    answer = {"status": 200, "after": 0, "then": 200}
    seen: list[bytes] = []

    async def infer(request: web.Request) -> web.Response:
        seen.append(await request.read())
        # `status` for the first `after` requests (0: all of them), `then` afterwards
        late = answer["after"] and len(seen) > answer["after"]
        status = answer["then"] if late else answer["status"]
        return web.json_response({"error": "unexpected input 'x'"}, status=status)

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


@pytest.mark.parametrize("status", [200, 408, 429])
async def test_answers_about_the_server_not_the_request_are_no_refusal(
    server: tuple[dict[str, int], list[bytes], str], status: int
) -> None:
    answer, seen, url = server
    answer["status"] = status
    assert await first_refusal(url, PROTOCOL, [1, 16], retry_after_s=0.01) is None
    # the smallest and the largest size of the mix were each sent once
    assert [json.loads(body)["inputs"][0]["shape"] for body in seen][:2] == [[1, 2], [16, 2]]


@pytest.mark.parametrize("status", [500, 503])
async def test_a_5xx_to_every_first_request_twice_is_a_refusal(
    server: tuple[dict[str, int], list[bytes], str], status: int
) -> None:
    answer, seen, url = server
    answer["status"] = status
    refusal = await first_refusal(url, PROTOCOL, [1, 16], retry_after_s=0.01)
    assert refusal is not None
    assert refusal.status == status
    assert "unexpected input 'x'" in str(refusal)
    assert "the server answered none of them" in str(refusal)
    assert len(seen) == 4  # both first requests, asked twice


async def test_a_5xx_that_clears_a_moment_later_is_no_refusal(
    server: tuple[dict[str, int], list[bytes], str],
) -> None:
    answer, seen, url = server
    answer.update(status=503, after=2, then=200)
    assert await first_refusal(url, PROTOCOL, [1, 16], retry_after_s=0.01) is None
    # and one answer among the 5xx is enough: the requests are not the problem
    seen.clear()
    answer.update(status=503, after=1, then=200)
    assert await first_refusal(url, PROTOCOL, [1, 16], retry_after_s=0.01) is None
    assert len(seen) == 2


async def test_no_server_is_no_refusal() -> None:
    assert await first_refusal("http://127.0.0.1:9", PROTOCOL, [1], timeout_s=5) is None


def test_one_sample_body_is_sent_once() -> None:
    sample = template_protocol('{"text": "hi"}', path="/p", require_size=False)
    assert first_bodies(sample, [1, 4, 16]) == [b'{"text": "hi"}']


async def test_a_4xx_after_an_answer_is_still_a_refusal(
    server: tuple[dict[str, int], list[bytes], str],
) -> None:
    # the smallest request is taken, the largest refused (a size above the model's cap)
    answer, seen, url = server
    answer.update(status=200, after=1, then=400)
    refusal = await first_refusal(url, PROTOCOL, [1, 16], retry_after_s=0.01)
    assert refusal is not None
    assert refusal.status == 400
    assert len(seen) == 2
