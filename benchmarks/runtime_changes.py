"""Live batching changes of real inference runtimes, measured through the adapter seam.

For each runtime: start it on this machine with its bundled model (`Runtime.launcher`),
measure the capacity of the starting configuration, then change the knobs back and forth
`--changes` times while closed-loop clients keep `--clients` requests in flight in the
runtime's own protocol, counting every request that did not answer 2xx during a change,
and finally measure the capacity of the changed configuration. Each change is the
adapter's `apply`: the runtime's own change path and its verification (read-back and
the batch sizes it executed), whose `change_s` is reported.

    python benchmarks/runtime_changes.py [--json] [--runtime triton --runtime mlserver]
        [--changes 10] [--clients 16]   (runtimes: triton, mlserver, torchserve)

A runtime whose environment is missing (scripts/runtimes) is left out with a note.
Figures move with whatever else runs on the machine: the capacities are one capacity
search each, not a verdict."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from types import TracebackType

import aiohttp
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

import results
from batchpilot.loadgen.protocols import RequestProtocol
from batchpilot.models import SLA, BatchingConfig, RequestMix
from batchpilot.runtimes import mlserver
from batchpilot.runtimes.base import LaunchError, Runtime
from batchpilot.runtimes.rayserve import process as rayserve
from batchpilot.runtimes.registry import get_runtime
from batchpilot.runtimes.torchserve import process as torchserve
from batchpilot.runtimes.triton.install import TRITON_VERSION
from batchpilot.tuner.local import LocalProbe

RUNTIMES = ("triton", "mlserver", "ray", "torchserve")
START = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
# The two configurations a change alternates between; the last change lands on TUNED.
TUNED = BatchingConfig(max_batch_size=16, max_queue_time_ms=10.0)
OTHER = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)
SLA_P99_MS = 100.0


class Row(BaseModel):
    runtime: str
    changes: int
    change_s: float  # median of the changes, verification included
    change_s_max: float
    requests_during_change: int  # in flight at some point during a change
    errors_during_change: int
    # how long the slowest of those took, and the median: a change may hold requests up
    slowest_during_change_s: float
    median_during_change_s: float
    errors_by_kind: dict[str, int]
    verified_by: str
    baseline: dict[str, float]  # the starting configuration in the runtime's own terms
    tuned: dict[str, float]
    baseline_rps: float
    tuned_rps: float


class Report(BaseModel):
    rows: list[Row]
    left_out: dict[str, str]
    clients: int
    sla_p99_ms: float


class ClosedLoop:
    """Clients that each keep one request in flight until the block ends, recording
    (time sent, time answered, outcome) for every request; the outcome is "ok", an HTTP
    status or an error name."""

    def __init__(self, base_url: str, protocol: RequestProtocol, clients: int) -> None:
        self.url = base_url + protocol.path
        self.body = protocol.body(1)
        self.headers = dict(protocol.headers)
        self.clients = clients
        self.answers: list[tuple[float, float, str]] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ClosedLoop:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self._session.close()

    async def _client(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                async with self._session.post(
                    self.url, data=self.body, headers=self.headers
                ) as response:
                    await response.read()
                    outcome = "ok" if 200 <= response.status < 300 else str(response.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcome = type(exc).__name__
            self.answers.append((sent, time.monotonic(), outcome))

    def across(self, windows: list[tuple[float, float]]) -> list[tuple[float, float, str]]:
        """The requests in flight at some point of one of the windows."""
        return [r for r in self.answers if any(r[0] <= b and r[1] >= a for a, b in windows)]


async def measure_runtime(runtime: Runtime, changes: int, clients: int) -> Row:
    async with runtime.launcher(START) as server:
        control = runtime.control(server.url, model=runtime.default_model, server=server)
        protocol = runtime.protocol(runtime.default_model)
        probe = LocalProbe(
            server.url,
            sla=SLA(p99_ms=SLA_P99_MS),
            mix=RequestMix.default(),
            precision=0.1,
            step_duration_s=2.0,
            warmup_s=1.0,
            protocol=protocol,
        )
        baseline = await probe.measure(START, must_beat=None)
        windows: list[tuple[float, float]] = []
        seconds: list[float] = []
        verified_by = ""
        async with ClosedLoop(server.url, protocol, clients) as load:
            await asyncio.sleep(0.5)
            for i in range(changes):
                config = TUNED if (changes - i) % 2 == 1 else OTHER
                started = time.monotonic()
                await control.apply(config)
                windows.append((started, time.monotonic()))
                verification = control.last_verification
                if verification is not None:
                    seconds.append(verification.change_s)
                    verified_by = verification.verified_by
                await asyncio.sleep(0.3)
        during = load.across(windows)
        errors = [outcome for _, _, outcome in during if outcome != "ok"]
        took = [answered - sent for sent, answered, _ in during]
        tuned = await probe.measure(TUNED, must_beat=None)
    return Row(
        runtime=runtime.name,
        changes=changes,
        change_s=statistics.median(seconds) if seconds else float("nan"),
        change_s_max=max(seconds, default=float("nan")),
        requests_during_change=len(during),
        errors_during_change=len(errors),
        errors_by_kind={kind: errors.count(kind) for kind in sorted(set(errors))},
        slowest_during_change_s=max(took, default=float("nan")),
        median_during_change_s=statistics.median(took) if took else float("nan"),
        verified_by=verified_by,
        baseline={k: float(v) for k, v in runtime.native(START).items()},
        tuned={k: float(v) for k, v in runtime.native(TUNED).items()},
        baseline_rps=baseline.effective_rps,
        tuned_rps=tuned.effective_rps,
    )


async def run(names: list[str], changes: int, clients: int, console: Console) -> Report:
    rows: list[Row] = []
    left_out: dict[str, str] = {}
    for name in names:
        runtime = get_runtime(name)
        console.print(f"{runtime.title}: {changes} changes under {clients} clients ...")
        try:
            rows.append(await measure_runtime(runtime, changes, clients))
        except LaunchError as exc:
            left_out[runtime.name] = str(exc).splitlines()[0]
            console.print(f"[yellow]{runtime.name} left out: {left_out[runtime.name]}[/]")
    return Report(rows=rows, left_out=left_out, clients=clients, sla_p99_ms=SLA_P99_MS)


def table(report: Report) -> Table:
    out = Table(title=f"Live changes under {report.clients} closed-loop clients")
    for column in (
        "runtime",
        "changes",
        "change s (median / max)",
        "failed / requests during changes",
        "their time s (median / max)",
        "verified by",
        f"baseline req/s (p99 <= {report.sla_p99_ms:g} ms)",
        "changed req/s",
    ):
        out.add_column(column)
    for row in report.rows:
        out.add_row(
            row.runtime,
            str(row.changes),
            f"{row.change_s:.2f} / {row.change_s_max:.2f}",
            f"{row.errors_during_change} / {row.requests_during_change}",
            f"{row.median_during_change_s:.3f} / {row.slowest_during_change_s:.2f}",
            row.verified_by,
            f"{row.baseline_rps:.0f} at {_native(row.baseline)}",
            f"{row.tuned_rps:.0f} at {_native(row.tuned)}",
        )
    return out


def runtime_versions(runtimes: list[str]) -> dict[str, str]:
    """The version of each runtime measured: the one its environment (scripts/runtimes)
    installs."""
    known = {
        "triton": f"triton-{TRITON_VERSION}",
        "mlserver": mlserver.VENV,
        "ray": rayserve.VENV,
        "torchserve": torchserve.VENV,
    }
    return {name: known[name] for name in runtimes if name in known}


def _native(values: dict[str, float]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in values.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--runtime",
        action="append",
        choices=RUNTIMES,
        help=f"a runtime to measure (repeatable; default: {', '.join(RUNTIMES)})",
    )
    parser.add_argument("--changes", type=int, default=10, help="live changes (1-100)")
    parser.add_argument("--clients", type=int, default=16, help="requests in flight (1-256)")
    results.add_options(parser)
    args = parser.parse_args()
    if not 1 <= args.changes <= 100 or not 1 <= args.clients <= 256:
        parser.error("--changes takes 1 to 100, --clients 1 to 256")
    console = Console(stderr=True)
    runtimes = args.runtime or list(RUNTIMES)
    recorder = results.start("runtime_changes", args, runtimes=runtime_versions(runtimes))
    report = asyncio.run(run(runtimes, args.changes, args.clients, console))
    if report.rows:
        recorder.save(report.model_dump(mode="json"))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        Console().print(table(report))
    if not report.rows:
        sys.exit(1)


if __name__ == "__main__":
    main()
