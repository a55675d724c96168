"""How close the reference server gets to its model's own throughput.

For each batch size b: the bound, b / t(b) with t(b) the pure-PyTorch forward time of a
batch of b one-row requests on one thread (the server's default on a 2-core machine),
beside the server's saturated throughput with `max_batch_size = b`: closed-loop clients
(2·b requests always in flight, so batches stay full) against one server, the batch
size changed live between windows (PUT /admin/batching). Target: ratio >= 0.8 for
b >= 8.

The clients run in this process and share the machine with the server: on 2 cores the
server's model process takes one core while its HTTP process and the clients share the
other, so the figures move from run to run; the ratios, measured in the same run, less.
The clients are bare asyncio protocols speaking keep-alive HTTP/1.1 rather than an HTTP
client library: a heavier client would take CPU from the server it measures. The server
CPU columns count the HTTP process and its model process together.

    python benchmarks/server_efficiency.py [--json] [--window-s 3] [--repeats 3]
        [--batch-sizes 1,2,4,8,16,32,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence

import aiohttp
import torch
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

import results
from batchpilot.server.process import ServerProcess
from batchpilot.server.workloads import MLPWorkload

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
TARGET_RATIO = 0.8
TARGET_FROM_BATCH = 8
THREADS = 1
TIMEOUT = aiohttp.ClientTimeout(total=10)


class Row(BaseModel):
    batch_size: int
    bound_rps: float
    server_rps: float
    ratio: float  # median of the per-repeat ratios
    mean_batch: float  # requests per batch the server actually ran
    forward_ms: float  # pure-PyTorch t(b), wall clock
    server_compute_ms: float  # the server's own mean compute time at batch size b
    # CPU seconds, which other processes on the machine disturb far less than wall time:
    # the model's CPU per request alone beside the server's CPU per request (its model
    # process and its HTTP process: HTTP, JSON, batching, metrics). Their ratio is the
    # share of the server's CPU that the model alone would need.
    model_cpu_us_per_request: float
    server_cpu_us_per_request: float
    http_cpu_us_per_request: float  # the HTTP process's part of server_cpu_us_per_request
    cpu_ratio: float


class Report(BaseModel):
    model: str
    threads: int
    window_s: float
    repeats: int
    target_ratio: float
    target_from_batch: int
    meets_target: bool
    # bound at batch 32 over bound at batch 1: the model must batch well (at least 4x)
    bound_gain_1_to_32: float | None  # None unless batch sizes 1 and 32 were both measured
    load_average: tuple[float, float]  # 1-minute load at start and end: how busy the machine was
    cpu_count: int
    rows: list[Row]


BOUND_SECONDS = 1.0
BOUND_MIN_ITERATIONS = 20


def forward_time_s(workload: MLPWorkload, batch_size: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of one forward pass of the model alone, over at least
    BOUND_SECONDS and BOUND_MIN_ITERATIONS passes. The median, not the mean: a pass
    that another process interrupted says nothing about the model, and leaving it out
    makes the bound, if anything, harder to reach."""
    batch = workload.synthetic(batch_size).clone()
    walls: list[float] = []
    cpus: list[float] = []
    with torch.inference_mode():
        for _ in range(3):
            workload.net(batch)
        started = time.perf_counter()
        while len(walls) < BOUND_MIN_ITERATIONS or time.perf_counter() - started < BOUND_SECONDS:
            wall, cpu = time.perf_counter(), time.thread_time()
            workload.net(batch)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def process_cpu_s(pid: int, descendants: bool = True) -> float:
    """User + system CPU seconds a process (and, by default, its live descendants) has
    used (Linux /proc): the server's HTTP process and its model process together."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    if descendants:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                total += sum(process_cpu_s(int(child)) for child in children.read().split())
    return total


SYNTHETIC_ONE_ROW = b'{"synthetic": {"size": 1}}'


class _ClosedLoopConnection(asyncio.Protocol):
    """One keep-alive connection that sends the next request as soon as the last answer
    is complete, until `deadline`. A bare protocol rather than an HTTP client library:
    the clients share the machine with the server they measure, so every microsecond
    they spend is taken from it."""

    def __init__(self, request: bytes, deadline: float, counts: list[int]) -> None:
        self._request = request
        self._deadline = deadline
        self._counts = counts
        self._buffer = b""
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head = self._buffer[:end].lower()
            start = head.index(b"content-length:") + len(b"content-length:")
            stop = head.find(b"\r\n", start)
            length = int(head[start : stop if stop >= 0 else len(head)])
            if len(self._buffer) < end + 4 + length:
                return  # the body is still coming
            self._counts[0 if head.startswith(b"http/1.1 200") else 1] += 1
            self._buffer = self._buffer[end + 4 + length :]
            assert self._transport is not None
            if self._loop.time() < self._deadline:
                self._transport.write(self._request)
            else:
                self._transport.close()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)


class ClosedLoopClients:
    """`concurrency` connections, each sending the next request as soon as the last one is
    answered; counts 200s and anything else."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.request = (
            f"POST /v1/predict HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(SYNTHETIC_ONE_ROW)}\r\n\r\n"
        ).encode() + SYNTHETIC_ONE_ROW

    async def rate(self, concurrency: int, duration_s: float) -> float:
        """Successful responses per second over `duration_s`; raises if any failed."""
        loop = asyncio.get_running_loop()
        counts = [0, 0]
        started = loop.time()
        deadline = started + duration_s
        connections = [
            (
                await asyncio.wait_for(
                    loop.create_connection(
                        lambda: _ClosedLoopConnection(self.request, deadline, counts),
                        self.host,
                        self.port,
                    ),
                    timeout=10,
                )
            )[1]
            for _ in range(concurrency)
        ]
        await asyncio.wait_for(
            asyncio.gather(*(c.done for c in connections)), timeout=duration_s + 10
        )
        if counts[1]:
            raise RuntimeError(f"{counts[1]} of {sum(counts)} requests failed")
        return counts[0] / (loop.time() - started)


async def _json(
    http: aiohttp.ClientSession, method: str, url: str, body: object = None
) -> dict[str, object]:
    async with http.request(method, url, json=body) as response:
        response.raise_for_status()
        result: dict[str, object] = await response.json()
        return result


class Window(BaseModel):
    rps: float
    mean_batch: float  # requests per batch the server ran
    compute_ms: float  # its mean compute time at the batch size asked for
    cpu_s_per_request: float  # HTTP process and model process
    http_cpu_s_per_request: float  # the HTTP process alone


async def server_window(
    server: ServerProcess, http: aiohttp.ClientSession, batch_size: int, window_s: float
) -> Window:
    await _json(http, "DELETE", f"{server.url}/admin/profile")
    cpu_before = process_cpu_s(server.pid)
    http_before = process_cpu_s(server.pid, descendants=False)
    rps = await ClosedLoopClients(server.host, server.port).rate(2 * batch_size, window_s)
    requests_served = max(rps * window_s, 1.0)
    cpu = process_cpu_s(server.pid) - cpu_before
    http_cpu = process_cpu_s(server.pid, descendants=False) - http_before
    profile = await _json(http, "GET", f"{server.url}/admin/profile")
    batches = profile["batches"]
    assert isinstance(batches, list)
    requests = sum(b["batch_size"] * b["count"] for b in batches)
    count = sum(b["count"] for b in batches)
    at_size = [b["mean_compute_ms"] for b in batches if b["batch_size"] == batch_size]
    return Window(
        rps=rps,
        mean_batch=requests / max(count, 1),
        compute_ms=at_size[0] if at_size else float("nan"),
        cpu_s_per_request=cpu / requests_served,
        http_cpu_s_per_request=http_cpu / requests_served,
    )


async def measure(window_s: float, repeats: int, batch_sizes: Sequence[int]) -> list[Row]:
    """Per batch size, `repeats` pairs of (bound, server window) taken back to back, so
    each ratio compares figures measured under the same load on the machine."""
    torch.set_num_threads(THREADS)
    workload = MLPWorkload(torch.device("cpu"))
    rows = []
    async with (
        ServerProcess(max_batch_size=max(batch_sizes), max_queue_time_ms=50.0, threads=THREADS)
        as server,
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):  # fmt: skip
        for batch_size in batch_sizes:
            await _json(http, "PUT", f"{server.url}/admin/batching", {"max_batch_size": batch_size})
            # A short closed-loop run settles the connections and the batch shapes.
            await ClosedLoopClients(server.host, server.port).rate(2 * batch_size, 1.0)
            bounds, model_cpu, windows = [], [], []
            for _ in range(repeats):
                # The server is idle meanwhile: its process only waits on its socket.
                wall, cpu = forward_time_s(workload, batch_size)
                bounds.append(batch_size / wall)
                model_cpu.append(cpu / batch_size)
                windows.append(await server_window(server, http, batch_size, window_s))
            ratios = [w.rps / bound for w, bound in zip(windows, bounds, strict=True)]

            def median_us(values: list[float]) -> float:
                return round(statistics.median(values) * 1e6, 1)

            rows.append(
                Row(
                    batch_size=batch_size,
                    bound_rps=round(statistics.median(bounds), 1),
                    server_rps=round(statistics.median(w.rps for w in windows), 1),
                    ratio=round(statistics.median(ratios), 3),
                    mean_batch=round(statistics.median(w.mean_batch for w in windows), 2),
                    forward_ms=round(1000 * batch_size / statistics.median(bounds), 3),
                    server_compute_ms=round(statistics.median(w.compute_ms for w in windows), 3),
                    model_cpu_us_per_request=median_us(model_cpu),
                    server_cpu_us_per_request=median_us([w.cpu_s_per_request for w in windows]),
                    http_cpu_us_per_request=median_us([w.http_cpu_s_per_request for w in windows]),
                    cpu_ratio=round(
                        statistics.median(
                            m / w.cpu_s_per_request for m, w in zip(model_cpu, windows, strict=True)
                        ),
                        3,
                    ),
                )
            )
    return rows


def run(window_s: float, repeats: int, batch_sizes: Sequence[int]) -> Report:
    load_before = os.getloadavg()[0]
    rows = asyncio.run(measure(window_s, repeats, batch_sizes))
    load_after = os.getloadavg()[0]
    meets = all(r.ratio >= TARGET_RATIO for r in rows if r.batch_size >= TARGET_FROM_BATCH)
    by_size = {r.batch_size: r for r in rows}
    return Report(
        model="mlp",
        threads=THREADS,
        window_s=window_s,
        repeats=repeats,
        target_ratio=TARGET_RATIO,
        target_from_batch=TARGET_FROM_BATCH,
        meets_target=meets,
        bound_gain_1_to_32=(
            round(by_size[32].bound_rps / by_size[1].bound_rps, 2)
            if 1 in by_size and 32 in by_size
            else None
        ),
        load_average=(round(load_before, 2), round(load_after, 2)),
        cpu_count=os.cpu_count() or 1,
        rows=rows,
    )


def render(report: Report) -> None:
    table = Table(title=f"reference server vs. model bound ({report.model}, 1 torch thread)")
    columns = ("batch", "bound req/s", "server req/s", "ratio", "mean batch", "t(b) ms",
               "server compute ms", "model CPU µs/req", "server CPU µs/req",
               "of which HTTP", "CPU ratio")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in report.rows:
        table.add_row(
            str(r.batch_size),
            f"{r.bound_rps:.0f}",
            f"{r.server_rps:.0f}",
            f"{r.ratio:.2f}",
            f"{r.mean_batch:.1f}",
            f"{r.forward_ms:.2f}",
            f"{r.server_compute_ms:.2f}",
            f"{r.model_cpu_us_per_request:.0f}",
            f"{r.server_cpu_us_per_request:.0f}",
            f"{r.http_cpu_us_per_request:.0f}",
            f"{r.cpu_ratio:.2f}",
        )
    console = Console()
    console.print(table)
    verdict = "meets" if report.meets_target else "misses"
    ratio = report.bound_gain_1_to_32
    gain = "not measured" if ratio is None else f"{ratio:g}x"
    console.print(
        f"{verdict} the target ratio >= {report.target_ratio} for batch >= "
        f"{report.target_from_batch}; bound gain from batch 1 to 32: {gain}; "
        f"load average {report.load_average[0]:g} -> "
        f"{report.load_average[1]:g} on {report.cpu_count} CPUs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--window-s", type=float, default=3.0, help="seconds per window")
    parser.add_argument("--repeats", type=int, default=3, help="windows per batch size")
    parser.add_argument(
        "--batch-sizes",
        default=",".join(map(str, BATCH_SIZES)),
        help="comma-separated batch sizes, each 1 to 1024 (default: %(default)s)",
    )
    results.add_options(parser)
    args = parser.parse_args()
    try:
        batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    except ValueError:
        batch_sizes = []
    problems = []
    if args.window_s <= 0:
        problems.append(f"--window-s must be > 0 (got {args.window_s:g})")
    if args.repeats < 1:
        problems.append(f"--repeats must be >= 1 (got {args.repeats})")
    if not batch_sizes or not all(1 <= b <= 1024 for b in batch_sizes):
        problems.append(
            f"--batch-sizes must be integers 1 to 1024 separated by commas (got "
            f"{args.batch_sizes!r})"
        )
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        sys.exit(2)
    recorder = results.start("server_efficiency", args)
    report = run(args.window_s, args.repeats, batch_sizes)
    recorder.save(report.model_dump(mode="json"))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        render(report)


if __name__ == "__main__":
    main()
