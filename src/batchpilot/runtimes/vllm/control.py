"""The control of a vLLM server BatchPilot started (`tune --local --runtime vllm`), and
the burst check (`peak_running`) that verifies any vLLM server's cap by its own gauge.

vLLM reads its scheduler's limits only at start, so a change is a restart with the new
command line. It counts as applied only when the server itself says so, twice: its
configuration read back (GET /server_info: `scheduler_config`), and its behaviour: a
burst of more concurrent streams than the cap, during which the engine's own gauge
`vllm:num_requests_running` may never exceed `max_num_seqs` (and reaches it when the
streams outlast their admission). Every stream of the burst must also come back whole,
so requests the served model refuses stop the run at the first change."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from batchpilot.errors import RequestShapeError, TargetError
from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, text_capped
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import LaunchError, NativeValues, Verification
from batchpilot.runtimes.http import ControlClient
from batchpilot.runtimes.vllm.knobs import VllmKnobs, knobs_for
from batchpilot.runtimes.vllm.process import VllmProcess

SERVER_INFO = "/server_info?config_format=json"
RUNNING = "vllm:num_requests_running"
# a verification stream's answer: long enough that the first streams still run when the
# last of the burst is admitted, short enough to cost a second or two of the tiny model
VERIFY_OUTPUT_TOKENS = 64
VERIFY_PROMPT = "0 hello hello hello"
# how often the gauge is read during a burst
_POLL_S = 0.02
# a burst's streams, beyond the cap: enough that the cap binds
_BEYOND_CAP_MIN = 2


def native_values(knobs: VllmKnobs) -> NativeValues:
    """The knobs in vLLM's names (chunked prefill is a switch, not a number: left out)."""
    return {
        "max_num_seqs": knobs.max_num_seqs,
        "max_num_batched_tokens": knobs.max_num_batched_tokens,
    }


def scheduler_knobs(info: Any) -> VllmKnobs:
    """The knobs in a GET /server_info?config_format=json answer; TargetError when it
    holds none."""
    try:
        scheduler = info["vllm_config"]["scheduler_config"]
        return VllmKnobs(
            max_num_seqs=int(scheduler["max_num_seqs"]),
            max_num_batched_tokens=int(scheduler["max_num_batched_tokens"]),
            enable_chunked_prefill=bool(scheduler["enable_chunked_prefill"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TargetError(
            f"GET {SERVER_INFO} answered no scheduler configuration ({type(exc).__name__}: "
            f"{exc}); is the server in vLLM's development mode (VLLM_SERVER_DEV_MODE=1)?"
        ) from None


def running(page: str) -> float:
    """vllm:num_requests_running in a /metrics page for the busiest engine (summed over
    its models): each engine of a data-parallel server schedules up to max_num_seqs of
    its own, so the cap bounds one engine's count, not their sum."""
    per_engine: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        if family.name == RUNNING:
            for sample in family.samples:
                engine = sample.labels.get("engine", "")
                per_engine[engine] = per_engine.get(engine, 0.0) + sample.value
    return max(per_engine.values(), default=0.0)


def burst_streams(cap: int) -> int:
    """How many concurrent streams a verification sends for a cap of `cap`."""
    return cap + max(_BEYOND_CAP_MIN, cap // 4)


class VllmControl:
    """A vLLM server this process started (`server`), serving `model`. `token_budget`
    is the `max_num_batched_tokens` every configuration runs with (a study turns the
    batch cap; the queue wait does not exist in continuous batching and stays 0)."""

    def __init__(
        self,
        url: str,
        *,
        server: VllmProcess,
        model: str,
        token_budget: int,
        timeout_s: float = 30.0,
        burst_timeout_s: float = 300.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.server = server
        self.model = model
        self.token_budget = token_budget
        self._client = ControlClient(self.url, timeout_s=timeout_s)
        self._burst_timeout_s = burst_timeout_s
        self.last_verification: Verification | None = None

    async def running_knobs(self) -> VllmKnobs:
        """What the engine runs, read back from it."""
        return scheduler_knobs(await self._client.call("GET", SERVER_INFO))

    async def current(self) -> BatchingConfig:
        knobs = await self.running_knobs()
        return BatchingConfig(max_batch_size=knobs.max_num_seqs, max_queue_time_ms=0.0)

    async def native(self) -> NativeValues:
        return native_values(await self.running_knobs())

    def knobs_for(self, config: BatchingConfig) -> VllmKnobs:
        """The engine's knobs for `config`; TargetError when vLLM cannot run it."""
        if config.max_queue_time_ms != 0:
            raise TargetError(
                f"vLLM batches continuously and has no queue wait: {config.label()} cannot "
                "be run (the queue-time axis is pinned at 0)"
            )
        try:
            knobs = knobs_for(config, self.token_budget)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        return knobs.model_copy(
            update={"enable_chunked_prefill": self.server.knobs.enable_chunked_prefill}
        )

    async def apply(self, config: BatchingConfig) -> None:
        knobs = self.knobs_for(config)
        started = time.monotonic()
        if knobs == self.server.knobs and await self.server.exit_code(0.0) is None:
            # the engine runs these already (the baseline, a confirmation round measuring
            # one configuration twice in a row): a restart would cost a minute for nothing
            live = await self.running_knobs()
            if live.max_num_seqs == knobs.max_num_seqs and (
                live.max_num_batched_tokens == knobs.max_num_batched_tokens
            ):
                self.last_verification = Verification(
                    requested=config,
                    live=BatchingConfig(max_batch_size=live.max_num_seqs, max_queue_time_ms=0.0),
                    native=native_values(live),
                    verified_by="already running, read-back (GET /server_info)",
                    change_s=time.monotonic() - started,
                )
                return
        self.server.knobs = knobs
        try:
            await self.server.restart()
        except LaunchError as exc:
            first = str(exc).splitlines()[0]
            raise TargetError(f"vLLM did not start with {knobs.label()}: {first}") from None
        restarted_s = time.monotonic() - started
        live = await self.running_knobs()
        if (live.max_num_seqs, live.max_num_batched_tokens) != (
            knobs.max_num_seqs,
            knobs.max_num_batched_tokens,
        ):
            raise TargetError(f"asked vLLM for {knobs.label()}, it runs {live.label()}")
        streams = burst_streams(knobs.max_num_seqs)
        peak = await peak_running(self.url, self.model, streams, timeout_s=self._burst_timeout_s)
        if peak > knobs.max_num_seqs:
            raise TargetError(
                f"vLLM ran {peak:g} sequences at once with max_num_seqs={knobs.max_num_seqs} "
                f"({RUNNING} under {streams} concurrent streams)"
            )
        how = (
            "reached the cap"
            if peak == knobs.max_num_seqs
            else f"peaked at {peak:g}, below the cap: streams ended before more were admitted"
        )
        self.last_verification = Verification(
            requested=config,
            live=BatchingConfig(max_batch_size=live.max_num_seqs, max_queue_time_ms=0.0),
            native=native_values(live),
            verified_by=(
                f"restart ({restarted_s:.1f} s), read-back (GET /server_info), {RUNNING} "
                f"under {streams} concurrent streams {how}"
            ),
            change_s=time.monotonic() - started,
        )


async def peak_running(url: str, model: str, streams: int, *, timeout_s: float) -> float:
    """The highest vllm:num_requests_running of the vLLM server at `url` while `streams`
    concurrent streams of VERIFY_OUTPUT_TOKENS tokens of `model` are answered; every one
    must come back whole (TargetError otherwise; RequestShapeError on a 4xx)."""
    url = url.rstrip("/")
    done = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        poller = asyncio.create_task(_poll_running(session, url, done))
        try:
            counted = await asyncio.gather(*(_stream(session, url, model) for _ in range(streams)))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise TargetError(
                f"a verification stream to {url} failed: {exc or type(exc).__name__}"
            ) from None
        finally:
            done.set()
            peak = await poller
    short = [n for n in counted if n != VERIFY_OUTPUT_TOKENS]
    if short:
        raise TargetError(
            f"{len(short)} of {streams} verification streams came back with other than "
            f"{VERIFY_OUTPUT_TOKENS} tokens (e.g. {short[0]}): the server did not honour "
            "max_tokens, min_tokens and ignore_eos"
        )
    return peak


async def _poll_running(session: aiohttp.ClientSession, url: str, done: asyncio.Event) -> float:
    peak = 0.0
    metrics = f"{url}/metrics"
    while not done.is_set():
        try:
            async with session.get(metrics) as response:
                page = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=metrics)
            peak = max(peak, running(page))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass  # one missed reading; the burst decides whether the server is gone
        await asyncio.sleep(_POLL_S)
    return peak


async def _stream(session: aiohttp.ClientSession, url: str, model: str) -> int:
    """One streamed completion; the tokens its usage chunk counts."""
    body = {
        "model": model,
        "prompt": VERIFY_PROMPT,
        "max_tokens": VERIFY_OUTPUT_TOKENS,
        "min_tokens": VERIFY_OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
            error = RequestShapeError if 400 <= response.status < 500 else TargetError
            raise error(f"POST /v1/completions answered HTTP {response.status}: {text[:300]}")
        return await _usage_tokens(response.content)


async def _usage_tokens(content: aiohttp.StreamReader) -> int:
    """The completion tokens the stream's usage chunk counts (0 without one)."""
    counted = 0
    async for raw in content:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk: Mapping[str, Any] = json.loads(line[len("data: ") :])
        usage = chunk.get("usage")
        if isinstance(usage, Mapping) and "completion_tokens" in usage:
            counted = int(usage["completion_tokens"])
    return counted
