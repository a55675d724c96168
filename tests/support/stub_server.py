"""A stand-in inference endpoint with known behaviour, for calibrating and testing the
load generator and the capacity search.

It speaks the reference server's protocol (POST /v1/predict with the synthetic form,
503 + Retry-After when its queue is full, the same Prometheus metric names) but its
performance is set on the command line:

- `--delay-ms D`: every request takes D ms, with unlimited concurrency (a slow server).
- `--capacity-rps C`: a single FIFO server of C requests per second (each takes 1/C s
  of a virtual clock, so its capacity is exactly C whatever the host's CPU does), plus
  D ms each; beyond `--queue-limit` waiting requests it answers 503.
- neither: answers at once (a trivial endpoint).
- `--v2-model NAME`: also a KServe v2 model of that name, not one the project ships:
  `GET /v2/models/NAME` declares one FP32 input `x` of shape [-1, 3], and
  `POST /v2/models/NAME/infer` refuses with 400 (Triton's and MLServer's way) any request
  that is not that tensor, and is served like /v1/predict otherwise.

Run it with `python tests/support/stub_server.py --port 0`; it prints
`listening on http://127.0.0.1:PORT` once it accepts connections."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from batchpilot.processes import ChildProcess, stop_process

_LATENCY_BUCKETS = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip
_OK_BODY = b'{"outputs": []}'
V2_INPUT = "x"
V2_WIDTH = 3
# the stub's process runs this file by its path: it is not in the installed package
_SCRIPT = str(Path(__file__).resolve())


class StubService:
    """The stub's request handling, separate from the process so it can be embedded."""

    def __init__(
        self,
        *,
        delay_ms: float = 0.0,
        capacity_rps: float | None = None,
        queue_limit: int = 1000,
        v2_model: str | None = None,
    ) -> None:
        if delay_ms < 0:
            raise ValueError(f"delay must be ≥ 0 ms, got {delay_ms:g}")
        if capacity_rps is not None and capacity_rps <= 0:
            raise ValueError(f"capacity must be > 0 req/s, got {capacity_rps:g}")
        if queue_limit < 1:
            raise ValueError(f"queue limit must be ≥ 1, got {queue_limit}")
        self._delay_s = delay_ms / 1000.0
        self._service_s = 1.0 / capacity_rps if capacity_rps else 0.0
        self._queue_limit = queue_limit
        self._v2_model = v2_model
        self._next_free = 0.0
        self.registry = CollectorRegistry()
        self._latency = Histogram(
            "batchpilot_request_latency_seconds",
            "Server end-to-end latency of successful requests",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._requests = Counter(
            "batchpilot_requests_total", "Requests by outcome", ["outcome"], registry=self.registry
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/predict", self.predict)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/", self.index)
        if self._v2_model is not None:
            app.router.add_get(f"/v2/models/{self._v2_model}", self.v2_metadata)
            app.router.add_post(f"/v2/models/{self._v2_model}/infer", self.v2_infer)
        return app

    async def v2_metadata(self, request: web.Request) -> web.Response:
        tensor = {"name": V2_INPUT, "datatype": "FP32", "shape": [-1, V2_WIDTH]}
        return web.json_response(
            {"name": self._v2_model, "platform": "stub", "inputs": [tensor], "outputs": []}
        )

    async def v2_infer(self, request: web.Request) -> web.Response:
        arrived = asyncio.get_running_loop().time()
        why = _v2_refusal(await request.read())
        if why:
            self._requests.labels(outcome="bad_request").inc()
            return web.json_response({"error": f"model {self._v2_model!r}: {why}"}, status=400)
        return await self._serve(arrived)

    async def index(self, request: web.Request) -> web.Response:
        return web.json_response({"service": "batchpilot stub"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def predict(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        try:
            payload = json.loads(await request.read())
            size = payload["synthetic"]["size"]
            if not isinstance(size, int) or size < 1:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            self._requests.labels(outcome="bad_request").inc()
            return web.json_response(
                {"error": 'expected {"synthetic": {"size": N}} with N ≥ 1'}, status=400
            )
        return await self._serve(arrived)

    async def _serve(self, arrived: float) -> web.Response:
        """Answer a well-formed request that arrived at loop time `arrived`, as the
        server's delay, capacity and queue limit say."""
        loop = asyncio.get_running_loop()
        finish = arrived + self._delay_s
        if self._service_s:
            start = max(arrived, self._next_free)
            if (start - arrived) / self._service_s > self._queue_limit:
                self._requests.labels(outcome="rejected").inc()
                return web.json_response(
                    {"error": "queue full"}, status=503, headers={"Retry-After": "1"}
                )
            self._next_free = start + self._service_s
            finish = self._next_free + self._delay_s
        if finish > arrived:
            await asyncio.sleep(finish - arrived)
        self._latency.observe(loop.time() - arrived)
        self._requests.labels(outcome="ok").inc()
        return web.Response(body=_OK_BODY, content_type="application/json")


def _v2_refusal(raw: bytes) -> str:
    """Why a v2 infer request is not one FP32 tensor `x` of shape [n, V2_WIDTH], "" when it
    is."""
    try:
        inputs = json.loads(raw)["inputs"]
        names = [tensor["name"] for tensor in inputs]
    except (ValueError, KeyError, TypeError):
        return 'expected {"inputs": [...]}'
    if names != [V2_INPUT]:
        return f"unexpected inference input {names!r}, expected [{V2_INPUT!r}]"
    (tensor,) = inputs
    shape = tensor.get("shape")
    if tensor.get("datatype") != "FP32" or not (
        isinstance(shape, list) and len(shape) == 2 and shape[1] == V2_WIDTH and shape[0] >= 1
    ):
        return f"input {V2_INPUT!r} must be FP32 [-1, {V2_WIDTH}], got {shape!r}"
    if len(tensor.get("data") or []) != shape[0] * V2_WIDTH:
        return f"input {V2_INPUT!r} data does not match its shape {shape!r}"
    return ""


async def serve(service: StubService, host: str, port: int) -> None:
    runner = web.AppRunner(service.app(), access_log=None, handle_signals=False)
    await runner.setup()
    # In-flight requests get a second to finish on shutdown, not the default minute.
    site = web.TCPSite(runner, host, port, shutdown_timeout=1.0)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    print(f"listening on http://{bound_host}:{bound_port}", flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await stopped.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--capacity-rps", type=float, default=None)
    parser.add_argument("--queue-limit", type=int, default=1000)
    parser.add_argument("--v2-model", default=None)
    args = parser.parse_args(argv)
    try:
        service = StubService(
            delay_ms=args.delay_ms,
            capacity_rps=args.capacity_rps,
            queue_limit=args.queue_limit,
            v2_model=args.v2_model,
        )
    except ValueError as e:
        parser.error(str(e))
    asyncio.run(serve(service, args.host, args.port))


class StubServerProcess(ChildProcess):
    """Runs the stub in its own process for the duration of an `async with`; `.url` is its
    base URL. `cpus` pins the process to those CPUs (benchmarks keep generator and server
    apart)."""

    def __init__(
        self,
        *,
        delay_ms: float = 0.0,
        capacity_rps: float | None = None,
        queue_limit: int = 1000,
        cpus: set[int] | None = None,
        start_timeout_s: float = 30.0,
        v2_model: str | None = None,
    ) -> None:
        self._args = ["--port", "0", "--delay-ms", str(delay_ms), "--queue-limit", str(queue_limit)]
        if capacity_rps is not None:
            self._args += ["--capacity-rps", str(capacity_rps)]
        if v2_model is not None:
            self._args += ["--v2-model", v2_model]
        self._cpus = cpus
        self._start_timeout_s = start_timeout_s
        self._process: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            _SCRIPT,
            *self._args,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        try:
            if self._cpus is not None:
                os.sched_setaffinity(self._process.pid, self._cpus)
            assert self._process.stdout is not None
            line = await asyncio.wait_for(
                self._process.stdout.readline(), timeout=self._start_timeout_s
            )
            text = line.decode().strip()
            if not text.startswith("listening on "):
                raise RuntimeError(f"stub server did not start (said {text!r})")
            self.url = text.removeprefix("listening on ")
        except BaseException:
            await self.stop()
            raise

    async def served(self, outcome: str = "ok") -> int:
        """How many requests the stub has answered with `outcome`, from its metrics."""
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session,
            session.get(f"{self.url}/metrics") as response,
        ):
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (
                    sample.name == "batchpilot_requests_total"
                    and sample.labels.get("outcome") == outcome
                ):
                    return int(sample.value)
        return 0

    async def stop(self) -> None:
        if self._process is not None:
            await stop_process(self._process, grace_s=10.0)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when its parent dies, so a
    killed test or benchmark leaves no stub behind. Elsewhere this does nothing."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


if __name__ == "__main__":
    main()
