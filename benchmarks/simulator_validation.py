"""Does the simulator predict the real server? Predicted against measured effective
throughput of the reference server, for several batching configurations.

One run: start the reference server (loopback, free port, one torch thread) and measure
two calibration configurations with the real capacity search (`measure_capacity`); the
first leaves the server's batch profile (GET /admin/profile) full of batches of many
sizes. From the calibrations alone:

- the batch compute model t(b) = fixed + per_row * rows is fitted to the profile;
- the simulator models the reference server's batcher (one full batch handed over
  ahead, queue limit 1024);
- `batchpilot.simulator.calibrate.calibrate_cost` fits, in both directions, the
  per-request cost outside the forward pass (HTTP parsing, JSON: Python work that
  competes with the model for the CPU; lowers predictions) and the hand-over round trip
  inside each profiled batch time that full batches handed over ahead hide (raises
  them), to the median measured capacity of both calibration configurations, and the
  latency outside the worker.

Then every validated configuration (none of them a calibration one) is applied live
(PUT /admin/batching), measured `--repeats` times in rounds (each round measures every
configuration once, so a busy spell on a shared machine hits all of them) and
simulated. Reported per configuration: the median measured rate of the repeats (and
every repeat), the calibrated prediction and, for comparison, the compute-only
prediction (the profile's model, nothing calibrated, every batch paying its hand-over).
Target: |predicted / median measured - 1| <= 15%.

The load generator shares the machine with the server, and on a shared machine so do
other processes: the measured figures move by tens of percent between runs when the
machine is busy. The JSON carries every repeat, not only the median.

    python benchmarks/simulator_validation.py [--json] [--p99-ms 100] [--step-s 3] [--repeats 2]
        [--save FILE | --replay FILE]

`--save` keeps every measurement and profile; `--replay` fits and predicts from such a
file without a server (the same --p99-ms and --precision), so a change to the model is
judged on the same measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ValidationError

import results
from batchpilot.capacity.http import measure_capacity
from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.server.process import ServerProcess
from batchpilot.simulator.calibrate import calibrate_cost
from batchpilot.simulator.capacity import simulate_capacity
from batchpilot.simulator.cost import LinearCost, TableCost, fit_cost_model
from batchpilot.simulator.profile import fetch_profile
from batchpilot.simulator.scenario import (
    REFERENCE_AHEAD,
    REFERENCE_QUEUE_LIMIT,
    Scenario,
    Traffic,
)

CostKind = Literal["linear", "table"]
TOLERANCE = 0.15
HTTP_TIMEOUT_S = 10.0
SIM_REQUESTS = 8_000
# Two calibrations far apart: big batches (where per-request work shows) and small full
# batches handed over back to back (where the hidden hand-over shows).
CALIBRATION = BatchingConfig(max_batch_size=64, max_queue_time_ms=10.0)
SECOND_CALIBRATION = BatchingConfig(max_batch_size=4, max_queue_time_ms=0.0)
CALIBRATIONS = [CALIBRATION, SECOND_CALIBRATION]
VALIDATED = [
    BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0),
    BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0),
    BatchingConfig(max_batch_size=16, max_queue_time_ms=2.0),
    BatchingConfig(max_batch_size=32, max_queue_time_ms=20.0),
]


class Calibration(BaseModel):
    config: BatchingConfig
    measured_rps: float  # the median of the repeats
    measured_repeats_rps: list[float]


class Runs(BaseModel):
    config: BatchingConfig
    results: list[CapacityResult]


class Measured(BaseModel):
    """Everything the server gave: `--save` writes it, `--replay` fits it again."""

    load_average_1m_before: float
    measure_s: float
    runs: list[Runs]
    profiles: list[dict[str, Any]]  # GET /admin/profile after each anchor calibration run


class Row(BaseModel):
    config: BatchingConfig
    measured_rps: float  # the median of the repeats
    measured_repeats_rps: list[float]
    predicted_rps: float
    ratio: float  # predicted / measured
    within_tolerance: bool
    compute_only_rps: float  # the profile's model without the calibrated per-request cost
    compute_only_ratio: float
    measured_p99_ms: float | None
    predicted_p99_ms: float | None


class Report(BaseModel):
    model: str
    sla: SLA
    mix: RequestMix
    load_average_1m_before: float
    cost_model: LinearCost | TableCost
    calibrations: list[Calibration]
    tolerance: float
    rows: list[Row]
    within_tolerance: int
    all_within_tolerance: bool
    max_abs_error: float
    elapsed_s: float


async def put_batching(url: str, config: BatchingConfig) -> None:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.put(f"{url}/admin/batching", json=config.model_dump()) as response,
    ):
        if response.status != 200:
            raise RuntimeError(f"PUT /admin/batching answered {response.status}")


async def reset_profile(url: str) -> None:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.delete(f"{url}/admin/profile") as response,
    ):
        if response.status != 200:
            raise RuntimeError(f"DELETE /admin/profile answered {response.status}")


def median_run(runs: list[CapacityResult]) -> CapacityResult:
    """The repeat whose capacity is the median (the lower middle one for an even count):
    the measurement a configuration is judged on, neither its luckiest nor its unluckiest
    window on a shared machine."""
    ordered = sorted(runs, key=lambda r: r.effective_rps)
    return ordered[(len(ordered) - 1) // 2]


async def run(
    sla: SLA,
    mix: RequestMix,
    step_s: float,
    warmup_s: float,
    precision: float,
    repeats: int,
) -> Measured:
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    async with ServerProcess(
        model="mlp",
        max_batch_size=CALIBRATION.max_batch_size,
        max_queue_time_ms=CALIBRATION.max_queue_time_ms,
        threads=1,
    ) as server:

        async def measure(config: BatchingConfig) -> CapacityResult:
            await put_batching(server.url, config)
            return await measure_capacity(
                [server.url],
                sla=sla,
                mix=mix,
                precision=precision,
                step_duration_s=step_s,
                warmup_s=warmup_s,
            )

        # Rounds, each measuring every configuration once: a busy spell on the machine
        # then hits all configurations alike instead of all repeats of one.
        measured: dict[BatchingConfig, list[CapacityResult]] = {
            c: [] for c in [*CALIBRATIONS, *VALIDATED]
        }
        profiles: list[dict[str, Any]] = []
        for _ in range(repeats):
            for config in measured:
                if config == CALIBRATION:
                    await reset_profile(server.url)
                measured[config].append(await measure(config))
                if config == CALIBRATION:
                    # The batches of this calibration run alone.
                    profiles.append(await fetch_profile(server.url))

    return Measured(
        load_average_1m_before=round(load_before, 2),
        measure_s=round(time.monotonic() - started, 1),
        runs=[Runs(config=c, results=r) for c, r in measured.items()],
        profiles=profiles,
    )


def analyse(
    raw: Measured, sla: SLA, mix: RequestMix, precision: float, cost_kind: CostKind
) -> Report:
    """The fit and the predictions from the measurements alone (no server)."""
    started = time.monotonic()
    measured = {r.config: list(r.results) for r in raw.runs}
    profiles = raw.profiles
    anchor_runs = measured.pop(CALIBRATION)
    anchor = median_run(anchor_runs)
    second_runs = measured.pop(SECOND_CALIBRATION)
    # compute times from the calibration run the anchor's figure comes from
    profile = profiles[anchor_runs.index(anchor)]
    compute = fit_cost_model(profile, kind=cost_kind)
    base = Scenario(
        cost=compute,
        mix=mix,
        requests=SIM_REQUESTS,
        ahead=REFERENCE_AHEAD,
        queue_limit=REFERENCE_QUEUE_LIMIT,
    )
    cost = calibrate_cost(
        base, CALIBRATION, anchor, sla, more=[(SECOND_CALIBRATION, median_run(second_runs))]
    )
    calibrated = Traffic(base.model_copy(update={"cost": cost}))
    compute_only = Traffic(base.model_copy(update={"cost": compute, "ahead": 0}))
    rows = []
    for config in VALIDATED:
        runs = measured[config]
        middle = median_run(runs)
        rps = statistics.median(r.effective_rps for r in runs)
        predicted = simulate_capacity(calibrated, config, sla, precision=precision)
        bare = simulate_capacity(compute_only, config, sla, precision=precision)
        ratio = predicted.effective_rps / rps if rps else 0.0
        rows.append(
            Row(
                config=config,
                measured_rps=round(rps, 1),
                measured_repeats_rps=[round(r.effective_rps, 1) for r in runs],
                predicted_rps=round(predicted.effective_rps, 1),
                ratio=round(ratio, 3),
                within_tolerance=abs(ratio - 1) <= TOLERANCE,
                compute_only_rps=round(bare.effective_rps, 1),
                compute_only_ratio=round(bare.effective_rps / rps if rps else 0.0, 3),
                measured_p99_ms=middle.p99_ms,
                predicted_p99_ms=predicted.p99_ms,
            )
        )
    return Report(
        model=str(profile.get("model", "mlp")),
        sla=sla,
        mix=mix,
        load_average_1m_before=raw.load_average_1m_before,
        cost_model=cost,
        calibrations=[
            Calibration(
                config=config,
                measured_rps=round(statistics.median(r.effective_rps for r in runs), 1),
                measured_repeats_rps=[round(r.effective_rps, 1) for r in runs],
            )
            for config, runs in ((CALIBRATION, anchor_runs), (SECOND_CALIBRATION, second_runs))
        ],
        tolerance=TOLERANCE,
        rows=rows,
        within_tolerance=sum(r.within_tolerance for r in rows),
        all_within_tolerance=all(r.within_tolerance for r in rows),
        max_abs_error=round(max(abs(r.ratio - 1) for r in rows), 3),
        elapsed_s=round(raw.measure_s + time.monotonic() - started, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--p99-ms", type=float, default=100.0)
    parser.add_argument("--step-s", type=float, default=3.0, help="seconds per capacity step")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--precision", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3, help="measurements per configuration")
    parser.add_argument(
        "--cost-kind",
        choices=["linear", "table"],
        default="linear",
        help="the compute model fitted to the profile: a line, or its points",
    )
    parser.add_argument("--save", type=Path, help="also write every measurement to this file")
    parser.add_argument(
        "--replay", type=Path, help="fit and predict from a --save file instead of measuring"
    )
    results.add_options(parser)
    args = parser.parse_args()
    if (
        args.p99_ms <= 0
        or args.step_s <= 0
        or args.warmup_s < 0
        or not 0 < args.precision < 1
        or args.repeats < 1
    ):
        parser.error(
            "need --p99-ms > 0, --step-s > 0, --warmup-s >= 0, 0 < --precision < 1, --repeats >= 1"
        )
    recorder = results.start("simulator_validation", args)
    sla, mix = SLA(p99_ms=args.p99_ms), RequestMix.default()
    if args.replay is not None:
        try:
            raw = Measured.model_validate_json(args.replay.read_text())
        except (OSError, ValidationError) as exc:
            parser.error(f"--replay {args.replay}: not a file --save wrote ({exc})")
    else:
        raw = asyncio.run(run(sla, mix, args.step_s, args.warmup_s, args.precision, args.repeats))
        if args.save is not None:
            args.save.write_text(raw.model_dump_json())
    report = analyse(raw, sla, mix, args.precision, args.cost_kind)
    recorder.save(report.model_dump(mode="json"))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"simulator vs reference server, SLA p99 {args.p99_ms:g} ms")
    for column in ("config", "measured req/s", "predicted", "ratio", "compute-only ratio"):
        table.add_column(column)
    for row in report.rows:
        table.add_row(
            row.config.label(),
            f"{row.measured_rps:.0f} ({', '.join(f'{r:.0f}' for r in row.measured_repeats_rps)})",
            f"{row.predicted_rps:.0f}",
            f"{row.ratio:.2f}",
            f"{row.compute_only_ratio:.2f}",
        )
    console = Console()
    console.print(table)
    calibrated_on = ", ".join(
        f"{c.config.label()} ({c.measured_rps:.0f} req/s)" for c in report.calibrations
    )
    console.print(
        f"cost model {report.cost_model.label()}; calibrated on {calibrated_on}; "
        f"{report.within_tolerance}/{len(report.rows)} within {TOLERANCE:.0%}; "
        f"load average before {report.load_average_1m_before}"
    )


if __name__ == "__main__":
    main()
