"""A real HTTP server streaming OpenAI-style tokens with known timing, for the tests of the
token-stream load: the first token TTFT_S after the request arrives, then one token
every ITL_S, exactly `max_tokens` of them, a usage chunk and `data: [DONE]`.

The model field picks a behaviour: `m` streams as above; `m-slow` answers the requests
whose position (the prompt's first word) is a multiple of SLOW_FIRST_EVERY with a late
first token (SLOW_TTFT_S) and those whose position is a multiple of SLOW_DECODE_EVERY
with slow tokens (SLOW_ITL_S), the rest as `m`; `m-batch` serves like a continuous
batcher whose every step grows with the streams it holds: the first token after
BATCH_TTFT_S and each next one after BATCH_ITL_S, both plus BATCH_PER_STREAM_S for every
stream in flight when it is due, so TTFT and TPOT rise with the offered rate and a
TTFT/TPOT target caps it. At most `max_batch_size` streams are held; one more waits for
a place, its wait added to its TTFT. The reference server's control endpoint
(GET/PUT /admin/batching) reads and sets that cap, so `tune --url --runtime reference`
can tune it; `m-nousage` sends no usage chunk;
`m-pairs` sends two tokens per chunk; `m-nodone`, `m-error`, `m-malformed`, `m-empty`
and `m-abort` (the connection dropped) break the stream; `m-400` and `m-500` answer
with that status.

GET /metrics exports what the server itself timed, in vLLM's metric names and labels
(model_name SERVED_MODEL whatever the behaviour asked for): time to first token, time per
output token per request and end-to-end latency histograms in seconds, on buckets of
FINE_BUCKETS_S, and finished requests by finished_reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import prometheus_client
from aiohttp import web

TTFT_S = 0.040
ITL_S = 0.010
SLOW_TTFT_S = 0.200
SLOW_ITL_S = 0.060
SLOW_FIRST_EVERY = 4
SLOW_DECODE_EVERY = 5
BATCH_TTFT_S = 0.020
BATCH_ITL_S = 0.010
BATCH_PER_STREAM_S = 0.004
SERVED_MODEL = "tiny"
# fine enough that histogram_quantile lands within 5 ms of a tail under 0.5 s
FINE_BUCKETS_S = (*(i / 200 for i in range(1, 101)), 1.0, 2.5, 5.0)


class VllmSeries:
    """The server's own timings in vLLM's metric names, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        labels = ["model_name"]

        def histogram(name: str) -> prometheus_client.Histogram:
            return prometheus_client.Histogram(
                name, name, labels, buckets=FINE_BUCKETS_S, registry=self.registry
            )

        self.ttft = histogram("vllm:time_to_first_token_seconds")
        self.tpot = histogram("vllm:request_time_per_output_token_seconds")
        self.e2e = histogram("vllm:e2e_request_latency_seconds")
        self.finished = prometheus_client.Counter(
            "vllm:request_success", "finished requests", [*labels, "finished_reason"],
            registry=self.registry,
        )  # fmt: skip

    def record(
        self, reason: str, start: float, first: float | None, end: float, tokens: int
    ) -> None:
        self.finished.labels(SERVED_MODEL, reason).inc()
        if reason not in ("stop", "length"):
            return
        self.e2e.labels(SERVED_MODEL).observe(end - start)
        if first is not None:
            self.ttft.labels(SERVED_MODEL).observe(first - start)
            if tokens > 1:
                self.tpot.labels(SERVED_MODEL).observe((end - first) / (tokens - 1))


@dataclass
class TokenServer:
    """The application and what it was asked."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    running: int = 0  # streams held, `m-batch`
    batching: dict[str, Any] = field(
        default_factory=lambda: {"max_batch_size": 64, "max_queue_time_ms": 0.0}
    )
    _freed: asyncio.Condition | None = None  # a place among the streams held came free
    series: VllmSeries = field(default_factory=VllmSeries)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/admin/batching", self.get_batching)
        app.router.add_put("/admin/batching", self.put_batching)
        app.router.add_get("/metrics", self.get_metrics)
        return app

    async def get_metrics(self, request: web.Request) -> web.Response:
        text = prometheus_client.generate_latest(self.series.registry)
        return web.Response(body=text, content_type="text/plain", charset="utf-8")

    async def get_batching(self, request: web.Request) -> web.Response:
        return web.json_response(self.batching)

    async def put_batching(self, request: web.Request) -> web.Response:
        self.batching = dict(await request.json())
        if self._freed is not None:
            async with self._freed:
                self._freed.notify_all()  # a higher cap lets the waiting in
        return web.json_response(self.batching)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request)

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        """A place among the streams held, waited for while they are at the cap."""
        if self._freed is None:
            self._freed = asyncio.Condition()
        freed = self._freed
        async with freed:
            await freed.wait_for(lambda: self.running < int(self.batching["max_batch_size"]))
            self.running += 1
        try:
            yield
        finally:
            async with freed:
                self.running -= 1
                freed.notify_all()

    def _batch_s(self, base_s: float) -> float:
        return base_s + BATCH_PER_STREAM_S * self.running

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        started = asyncio.get_running_loop().time()
        body = await request.json()
        self.bodies.append(body)
        model: str = body["model"]
        chat = request.path.endswith("/chat/completions")
        prompt: str = body["messages"][0]["content"] if chat else body["prompt"]
        # the load generator's prompts start with the request's position; another
        # instrument's prompts (AIPerf, guidellm) are served as position 0
        first_word = (prompt.split() or ["0"])[0]
        position = int(first_word) if first_word.isdigit() else 0
        if model in ("m-400", "m-500"):
            return web.json_response({"error": "no"}, status=int(model[2:]))
        slow, batch = model == "m-slow", model == "m-batch"
        ttft = SLOW_TTFT_S if slow and position % SLOW_FIRST_EVERY == 0 else TTFT_S
        itl = SLOW_ITL_S if slow and position % SLOW_DECODE_EVERY == 0 else ITL_S
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if batch:
            async with self._held():
                return await self._stream(request, response, body, chat, 0.0, 0.0, started)
        return await self._stream(request, response, body, chat, ttft, itl, started)

    async def _stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        body: dict[str, Any],
        chat: bool,
        ttft: float,
        itl: float,
        started: float,
    ) -> web.StreamResponse:
        """The answer's chunks; `m-batch` times them by the streams held."""
        model: str = body["model"]
        prompt: str = body["messages"][0]["content"] if chat else body["prompt"]
        batch = model == "m-batch"
        if batch:
            ttft = self._batch_s(BATCH_TTFT_S)
        tokens = 0 if model == "m-empty" else int(body["max_tokens"])
        per_chunk = 2 if model == "m-pairs" else 1
        loop = asyncio.get_running_loop()
        first: float | None = None
        await asyncio.sleep(ttft)
        sent = 0
        while sent < tokens:
            if sent:
                await asyncio.sleep(self._batch_s(BATCH_ITL_S) if batch else itl * per_chunk)
            if model == "m-error" and sent >= 2:
                await response.write(b'data: {"error": {"message": "engine died"}}\n\n')
                self.series.record("error", started, first, loop.time(), sent)
                return await _end(response)
            if model == "m-abort" and sent >= 2:
                assert request.transport is not None
                request.transport.abort()  # the connection drops mid-stream
                self.series.record("abort", started, first, loop.time(), sent)
                return response
            if model == "m-malformed" and sent >= 2:
                await response.write(b"data: {not json\n\n")
                return await _end(response)
            count = min(per_chunk, tokens - sent)
            await response.write(_event(_chunk(" hello" * count, chat)))
            first = loop.time() if first is None else first
            sent += count
        self.series.record("length", started, first, loop.time(), sent)
        if model != "m-nousage":
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": sent}
            await response.write(_event({"choices": [], "usage": usage}))
        if model != "m-nodone":
            await response.write(b"data: [DONE]\n\n")
        return await _end(response)


def _chunk(text: str, chat: bool) -> dict[str, Any]:
    # the object type as OpenAI and vLLM name it (other instruments, AIPerf, read it)
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    return {"object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _end(response: web.StreamResponse) -> web.StreamResponse:
    await response.write_eof()
    return response


@contextlib.contextmanager
def serving_in_thread(app: web.Application) -> Iterator[str]:
    """`app` on 127.0.0.1 at a free port, served by its own event loop in a thread, for a
    command that runs its own loop (a CLI under test); its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _serve_until_stopped() -> None:
    runner = web.AppRunner(TokenServer().app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"listening on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await stopped.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    # a process of its own (a benchmark's server): `python tokenserver.py` prints
    # "listening on URL" once it accepts connections, and stops on SIGTERM
    asyncio.run(_serve_until_stopped())
