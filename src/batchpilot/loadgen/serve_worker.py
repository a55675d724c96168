"""A long-lived load worker (`batchpilot load-worker`) and the client that drives a fleet
of them: the transport of the operator's load-worker pods (docs/operator/load-workers.md).

A worker listens on one port. The operator POSTs each step's share to every worker at
once, `{"spec": ShareSpec, "startAt": UNIX_S}` with `Authorization: Bearer TOKEN` (the
study's token, from a Secret); the worker waits for `startAt`, sends its share of the one
seeded schedule, and answers with its `LoadResult`. One HTTP exchange per worker per
step: nothing is written to the API server while steps run.

Timing: the operator sets `startAt` DISPATCH_LEAD_S after it sends, so every worker
holds the share before the schedule's zero. A worker that receives it more than
MAX_LATE_S after `startAt` refuses it (409): its first requests would leave late, in a
burst, and the merged window would not be the schedule. Every other lateness shows in
its client health (send lag) and is judged by the step rule as on one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

import aiohttp
from aiohttp import web
from pydantic import ConfigDict, Field, ValidationError

from batchpilot.loadgen.result import LoadResult, merge_results
from batchpilot.loadgen.workers import DONE_GRACE_S, ShareSpec, WorkerError, run_share
from batchpilot.models import Frozen

SHARE_PATH = "/v1/share"
HEALTH_PATH = "/healthz"
DEFAULT_PORT = 8070
TOKEN_ENV = "BATCHPILOT_WORKER_TOKEN"
# Sends to a few dozen pods take well under a second even on a loaded node; the lead
# keeps a worker's share in its hands before the schedule's zero.
DISPATCH_LEAD_S = 2.0
# A worker may hold its share this long after the schedule's zero and still run it:
# about one send-lag tolerance; later, the first second's requests would leave as a burst.
MAX_LATE_S = 0.5
CONNECT_TIMEOUT_S = 5.0
IDLE_POLL_S = 1.0


# Sends one step's schedule (`ShareSpec` with index 0 of 1: the whole of it) over remote
# workers and returns the merged result; raises WorkerError when it has none.
ShareSender = Callable[[ShareSpec], Awaitable[LoadResult]]


class ShareRequest(Frozen):
    """What the operator sends a worker for one step."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True
    )

    spec: ShareSpec
    start_at: Annotated[float, Field(alias="startAt")]


def lateness_s(start_at: float, now: float) -> float:
    """How late a share arrived against its schedule's zero (≤ 0: in time)."""
    return now - start_at


def validation_problems(exc: ValidationError) -> str:
    """What was wrong with a share, field by field, without the values sent: a share
    carries headers (perhaps credentials) and a CA bundle that errors must not echo."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False)
    )


class Activity:
    """When the worker last held a share, for its idle exit."""

    def __init__(self) -> None:
        self.busy = asyncio.Lock()
        self.last = time.monotonic()

    def idle_s(self) -> float:
        return 0.0 if self.busy.locked() else time.monotonic() - self.last


def worker_app(token: str, activity: Activity | None = None) -> web.Application:
    """The worker's HTTP application: one share at a time, each authorised by `token`."""
    if not token:
        raise ValueError(f"a load worker needs a token (environment variable {TOKEN_ENV})")
    state = activity or Activity()
    busy = state.busy

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"busy": busy.locked()})

    async def share(request: web.Request) -> web.Response:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return web.json_response({"error": "bad or missing bearer token"}, status=401)
        try:
            body = ShareRequest.model_validate_json(await request.read())
        except ValidationError as exc:
            return web.json_response(
                {"error": f"not a share request: {validation_problems(exc)}"}, status=400
            )
        if not math.isfinite(body.start_at):
            return web.json_response({"error": "startAt must be a Unix time"}, status=400)
        late = lateness_s(body.start_at, time.time())
        if late > MAX_LATE_S:
            return web.json_response(
                {"error": f"share arrived {late:.3f} s after its start (at most {MAX_LATE_S} s)"},
                status=409,
            )
        if busy.locked():
            return web.json_response({"error": "a share is already running"}, status=409)
        async with busy:
            try:
                result = await run_share(body.spec, body.start_at)
            finally:
                state.last = time.monotonic()
        return web.Response(text=result.model_dump_json(), content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get(HEALTH_PATH, health)
    app.router.add_post(SHARE_PATH, share)
    return app


async def serve_worker(
    token: str, host: str, port: int, stop: asyncio.Event, max_idle_s: float | None = None
) -> None:
    """Serve `worker_app` on host:port until `stop` is set or, with `max_idle_s`, until
    no share has run for that long (a worker its operator forgot ends by itself)."""
    activity = Activity()
    # the operator gone (a step abandoned) cancels the share, so the worker is free again
    runner = web.AppRunner(worker_app(token, activity), handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        while not stop.is_set():
            if max_idle_s is not None and activity.idle_s() >= max_idle_s:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), IDLE_POLL_S)
    finally:
        await runner.cleanup()


def share_deadline_s(spec: ShareSpec) -> float:
    """How long a worker may take to answer a share: the lead, the window, the last
    request's timeout and the same grace a local worker process gets."""
    return DISPATCH_LEAD_S + MAX_LATE_S + spec.duration_s + spec.timeout_s + DONE_GRACE_S


async def run_remote_shares(addresses: Sequence[str], token: str, common: ShareSpec) -> LoadResult:
    """Send `common`'s schedule split over the workers at `addresses` (host:port, one
    share each, index by position) from one common start, and merge their results
    exactly. Raises WorkerError when any worker is unreachable, refuses, fails or does
    not answer within its deadline: the step then has no valid figures."""
    count = len(addresses)
    if count < 1:
        raise WorkerError("no load workers to send the step to")
    start_at = time.time() + DISPATCH_LEAD_S
    specs = [common.model_copy(update={"index": i, "of": count}) for i in range(count)]
    deadline = share_deadline_s(common)
    timeout = aiohttp.ClientTimeout(total=deadline, connect=CONNECT_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:

        async def one(index: int, address: str) -> LoadResult:
            payload = ShareRequest(spec=specs[index], start_at=start_at)
            url = f"http://{address}{SHARE_PATH}"
            try:
                async with session.post(
                    url,
                    data=payload.model_dump_json(by_alias=True),
                    headers={"Content-Type": "application/json"},
                ) as response:
                    text = await response.text()
                    if response.status != 200:
                        raise WorkerError(
                            f"load worker {index} ({address}) answered {response.status}: "
                            f"{text[:300]}"
                        )
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise WorkerError(f"load worker {index} ({address}): {exc!r}") from exc
            try:
                return LoadResult.model_validate_json(text)
            except ValidationError as exc:
                raise WorkerError(f"load worker {index} ({address}) sent no result") from exc

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(i, a)) for i, a in enumerate(addresses)]
        except* WorkerError as failed:
            # the first failure names the step's problem; the other shares were cancelled
            raise failed.exceptions[0] from None
        parts = [task.result() for task in tasks]
    return merge_results(parts).model_copy(update={"urls": list(common.urls)})
