"""Several generator processes on one machine sending one schedule between them.

One Python process drives a few thousand requests a second before its event loop, not
the server, sets the figures. `run_load_workers` starts N processes (`python -m
batchpilot.loadgen.workers`), each sending its share i of N of ONE seeded schedule (see
`run_load`'s `share`), all from a common start time, and merges their results exactly
(`merge_results`: HDR histograms add, goodput over the union of completions), keeping
each process's client health.

The protocol with a worker is two lines in and one document out, so a worker is cheap
to start per step and the start time is set only once every worker is ready:
- stdin: a `ShareSpec` as one JSON line; the worker, its imports done, answers
  `ready` on stdout;
- stdin: the common start time (Unix seconds) as one line; the worker runs its share
  and writes its `LoadResult` as JSON on stdout.
A worker's lifetime is bounded (ready within READY_TIMEOUT_S, done within the run plus
its timeout plus DONE_GRACE_S), and every worker is killed when the run is cancelled or
one of them fails.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import sys
import time
from collections.abc import Sequence
from typing import Annotated

from pydantic import Field, field_validator

from batchpilot.loadgen.arrivals import ArrivalKind, ArrivalProcess, as_arrival, schedule
from batchpilot.loadgen.endpoints import normalise_urls
from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.protocols import (
    CA_BUNDLE,
    MAX_CA_BUNDLE_BYTES,
    RequestProtocol,
    in_force,
    speaking,
)
from batchpilot.loadgen.result import LoadResult, merge_results
from batchpilot.loadgen.streaming import OpenAIStream
from batchpilot.models import MAX_LOAD_WORKERS, Frozen, RequestMix
from batchpilot.tls import verifying_context

MAX_WORKERS = MAX_LOAD_WORKERS
# A worker imports aiohttp, numpy and pydantic and builds its schedule before it is
# ready: a second or two on a busy machine, far less than this.
READY_TIMEOUT_S = 60.0
# Sends start this long after the last worker said ready, so none of them starts late.
START_MARGIN_S = 0.05
# A worker must be done this long after its last request's deadline.
DONE_GRACE_S = 30.0
_READY = b"ready"


class WorkerError(RuntimeError):
    """A generator process failed, answered nonsense, or outlived its bound."""


class ShareSpec(Frozen):
    """One generator process's share of a run: everything needed to rebuild the single
    seeded schedule, and which requests of it (index, index + of, ...) to send."""

    urls: Annotated[list[str], Field(min_length=1)]
    rate: Annotated[float, Field(gt=0)]
    duration_s: Annotated[float, Field(gt=0)]
    mix: RequestMix
    arrival: ArrivalProcess
    timeout_s: Annotated[float, Field(gt=0)]
    seed: int
    path: str = "/v1/predict"
    warmup_s: Annotated[float, Field(ge=0)] = 0.0
    index: Annotated[int, Field(ge=0)] = 0
    of: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 1
    # The request protocol in force where the run was started, carried as what it
    # produces (its headers and the body of every size the schedule holds, base64)
    # because a protocol builds bodies with code a worker process cannot receive.
    headers: dict[str, str] | None = None
    bodies: dict[int, str] | None = None
    # A token-stream protocol travels as its spec instead: a worker builds each of its
    # requests' bodies from the lengths the request draws.
    stream: OpenAIStream | None = None
    # the connections the whole client may hold, split over the shares (share_connections)
    max_connections: Annotated[int, Field(ge=1)] | None = None
    # The protocol's CA bundle as PEM text (public certificates), so a worker on another
    # machine verifies the target as its sender would; kept out of reprs and errors.
    ca_pem: Annotated[str | None, Field(repr=False)] = None
    # the name the target's certificate is verified against (the URLs hold pod IPs)
    server_name: Annotated[str, Field(min_length=1, max_length=253)] | None = None

    @field_validator("ca_pem")
    @classmethod
    def _usable_ca_bundle(cls, pem: str | None) -> str | None:
        if pem is None:
            return None
        if len(pem) > MAX_CA_BUNDLE_BYTES:
            raise ValueError(
                f"{CA_BUNDLE} is {len(pem)} characters, at most {MAX_CA_BUNDLE_BYTES} are accepted"
            )
        verifying_context(ca_pem=pem, what=CA_BUNDLE)  # ValueError naming the problem
        return pem

    def protocol(self) -> RequestProtocol | None:
        if self.bodies is None and self.stream is None:
            return None
        decoded = {size: base64.b64decode(body) for size, body in (self.bodies or {}).items()}
        return RequestProtocol(
            "forwarded",
            self.path,
            decoded.__getitem__,
            self.headers or {},
            ca_pem=self.ca_pem,
            server_name=self.server_name,
            stream=self.stream,
        )


async def run_share(spec: ShareSpec, start_at: float | None = None) -> LoadResult:
    """Send share `spec.index` of `spec.of` of the schedule from `start_at` (Unix time;
    None: now) and measure it. The entry a worker process runs."""
    with speaking(spec.protocol()):
        return await _run_share(spec, start_at)


async def _run_share(spec: ShareSpec, start_at: float | None) -> LoadResult:
    return await run_load(
        spec.urls,
        rate=spec.rate,
        duration_s=spec.duration_s,
        mix=spec.mix,
        arrival=spec.arrival,
        timeout_s=spec.timeout_s,
        seed=spec.seed,
        path=spec.path,
        warmup_s=spec.warmup_s,
        share=(spec.index, spec.of),
        start_at=start_at,
        max_connections=share_connections(spec.max_connections, spec.index, spec.of),
    )


def share_connections(cap: int | None, index: int, of: int) -> int | None:
    """Share `index` of `of` of a client's connection cap: the cap split as evenly as
    whole connections go, and at least one (a process needs one to send at all)."""
    if cap is None:
        return None
    return max(1, cap // of + (1 if index < cap % of else 0))


def check_workers(workers: int) -> None:
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be 1 to {MAX_WORKERS}, got {workers}")


async def run_load_workers(
    urls: str | Sequence[str],
    *,
    workers: int,
    rate: float,
    duration_s: float,
    mix: RequestMix,
    arrival: ArrivalKind | str = "poisson",
    timeout_s: float = 10.0,
    seed: int = 0,
    path: str = "/v1/predict",
    warmup_s: float = 0.0,
    max_connections: int | None = None,
) -> LoadResult:
    """`run_load` sent by `workers` processes that split one schedule between them; the
    merged result has the one-process result's shape plus each worker's health in
    `worker_clients`. Raises ValueError for bad arguments and WorkerError when a worker
    fails; cancelling kills every worker."""
    check_workers(workers)
    bases = normalise_urls(urls)
    common = ShareSpec(
        urls=bases, rate=rate, duration_s=duration_s, mix=mix, arrival=as_arrival(arrival),
        timeout_s=timeout_s, seed=seed, path=path, warmup_s=warmup_s, of=workers,
        max_connections=max_connections,
    )  # fmt: skip
    if (protocol := in_force()) is not None:
        common = common.model_copy(update=forwarded_protocol(protocol, common))
    specs = [common.model_copy(update={"index": i}) for i in range(workers)]
    procs: list[asyncio.subprocess.Process] = []
    try:
        for spec in specs:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "batchpilot.loadgen.workers",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            procs.append(proc)
            _stdin(proc).write(spec.model_dump_json().encode() + b"\n")
        await asyncio.wait_for(
            asyncio.gather(*(_ready(p, i) for i, p in enumerate(procs))), READY_TIMEOUT_S
        )
        start_at = time.time() + START_MARGIN_S
        for proc in procs:
            stdin = _stdin(proc)
            stdin.write(f"{start_at!r}\n".encode())
            await stdin.drain()
            stdin.close()
        lifetime = START_MARGIN_S + duration_s + timeout_s + DONE_GRACE_S
        parts = await asyncio.wait_for(
            asyncio.gather(*(_result(p, i) for i, p in enumerate(procs))), lifetime
        )
    except TimeoutError:
        raise WorkerError(f"a generator process outlived its bound ({workers} workers)") from None
    finally:
        await _kill(procs)
    return merge_results(parts).model_copy(update={"urls": bases})


def forwarded_protocol(protocol: RequestProtocol, spec: ShareSpec) -> dict[str, object]:
    """The fields that carry `protocol` to the workers of `spec`'s schedule (its CA
    bundle as PEM text: a worker may run on another machine; a token-stream protocol as
    its spec). ValueError when the bundle's file cannot be sent."""
    common: dict[str, object] = {
        "path": protocol.path,
        "headers": dict(protocol.headers),
        "ca_pem": protocol.ca_bundle_pem(),
        "server_name": protocol.server_name,
    }
    if protocol.stream is not None:
        return {**common, "stream": protocol.stream}
    count = len(schedule(spec.rate, spec.duration_s, spec.arrival, spec.seed))
    sizes = spec.mix.sampler(spec.seed).draw(count)  # as run_load draws them
    bodies = {s: base64.b64encode(protocol.body(s)).decode() for s in set(sizes)}
    return {**common, "bodies": bodies}


def _stdin(proc: asyncio.subprocess.Process) -> asyncio.StreamWriter:
    assert proc.stdin is not None  # created with a pipe
    return proc.stdin


async def _ready(proc: asyncio.subprocess.Process, index: int) -> None:
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    if line.strip() != _READY:
        raise WorkerError(f"generator process {index} did not start: {await _stderr(proc)}")


async def _result(proc: asyncio.subprocess.Process, index: int) -> LoadResult:
    assert proc.stdout is not None
    out, err = await asyncio.gather(proc.stdout.read(), _stderr(proc))
    code = await proc.wait()
    if code != 0:
        raise WorkerError(f"generator process {index} exited with status {code}: {err}")
    return LoadResult.model_validate_json(out)


async def _stderr(proc: asyncio.subprocess.Process) -> str:
    assert proc.stderr is not None
    return (await proc.stderr.read()).decode(errors="replace").strip()[-2000:]


async def _kill(procs: Sequence[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    for proc in procs:
        await proc.wait()


async def _worker_main() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    spec = ShareSpec.model_validate_json(await reader.readline())
    sys.stdout.buffer.write(_READY + b"\n")
    sys.stdout.buffer.flush()
    start_at = float(await reader.readline())
    if not math.isfinite(start_at):
        raise ValueError(f"start time must be a finite Unix time, got {start_at}")
    result = await run_share(spec, start_at)
    sys.stdout.buffer.write(result.model_dump_json().encode())
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_worker_main()))
