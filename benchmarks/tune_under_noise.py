"""Does `tune --local --quick` write back a false gain while a neighbour steals the CPU?

A check against the real reference server under real load. A second process (the
*stealer*) spins in irregular bursts for the whole benchmark: idle and busy periods
drawn uniformly from 0.5-5 s, each burst spinning 1..N processes (`--burst-threads`,
default: every core), all from `--seed`, so the pattern of the noise is reproducible
(what it hits depends on what else the machine runs). Under that noise:

1. `batchpilot tune --local --quick --json --seed S+i` runs as a user runs it (a
   subprocess of the CLI), `--runs` times (default 3);
2. after each run, a fresh reference server (the same start, 8 / 5 ms) measures that
   run's recommendation and the baseline again, interleaved (`remeasure_interleaved`,
   R B, R B, ... for `--rounds` rounds, each round offering both the same schedule from
   seeds the tune run never used), and `verdict.decide` estimates the gain of the
   recommendation over the baseline with its two-sided 95 % interval. A run that kept
   the baseline has nothing written to check; its best finalist (the verdict's winner)
   is re-measured instead, to show what keeping it cost.

**Written**: the run recommended a configuration other than the baseline, i.e. what
the product would write back (its verdict proved a gain; or, with no verdict, the
study's best unproven).

**False gain** (the rule this check applies): a run was *written* and the independent
re-measurement's gain estimate for what it wrote is 0 % or less, i.e. measured side by
side with the baseline, under the same noise, the written configuration is no better
than what ran before. The point estimate, not the upper bound: a user who applied a
"proven" gain and measures none calls it false, and with a few rounds under noise the
upper bound is almost never below 0, so a check on it would pass whatever the verdict
did. A written configuration that misses the SLA in a re-measured round counts that
round at 1 % of the best (the verdict's rule) and so shows a loss.

Prints one JSON object, `{runs: [{recommended, baseline, gain_lcb_pct, written, ...}],
false_gain_runs, false_gain_rule, settings, noise, durations}`, and exits 1 when
`false_gain_runs` > 0, 2 when a run could not be checked (tune failed or timed out).
Every subprocess has a timeout; the stealer is stopped on every exit (SIGINT, SIGTERM,
errors), and its workers also stop on their own when the benchmark process is gone
or the longest possible benchmark has passed.

    python benchmarks/tune_under_noise.py [--json] [--runs 3] [--seed 0] [--burst-threads N]
        [--tune-max-rounds N] [--rounds 3] [--step-s 2] [--warmup-s 0.5] [--precision 0.1]
        [--tune-timeout-s 1200] [--remeasure-timeout-s 1800]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import copy
import multiprocessing
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.context import ForkProcess
from types import FrameType

from pydantic import BaseModel

import results
from batchpilot.models import BatchingConfig, CapacityResult, RequestMix
from batchpilot.processes import stop_process
from batchpilot.runtimes.reference import ReferenceControl
from batchpilot.server.process import ServerProcess
from batchpilot.tuner.confirm import bracket_start
from batchpilot.tuner.local import LocalProbe
from batchpilot.tuner.localmode import ROUND_SEED_STRIDE
from batchpilot.tuner.runner import RoundDone, remeasure_interleaved
from batchpilot.tuner.summary import TuneSummary
from batchpilot.tuner.verdict import decide, gain_over_incumbent

FALSE_GAIN_RULE = (
    "written (the run recommended a configuration other than the baseline) and the "
    "independent interleaved re-measurement's gain estimate of it over the baseline "
    "is <= 0 %"
)
BUSY_S = (0.5, 5.0)
IDLE_S = (0.5, 5.0)
# Re-measurement seeds: far from the tune run's (seed + 7919 (r + 1)), so its schedules
# are fresh arrivals, not a replay of the verdict's.
REMEASURE_SEED_OFFSET = 1_000_003
TUNE_GRACE_S = 20.0  # SIGTERM lets the tune run stop its server; then SIGKILL
SPIN_SLICE_S = 0.05  # a worker looks at the schedule (and its parent) this often
STOP_GRACE_S = 2.0


# ---------------------------------------------------------------- pure parts


class Burst(BaseModel):
    """`threads` processes spin from `start_s` for `duration_s` (seconds from the start
    of the noise)."""

    start_s: float
    duration_s: float
    threads: int


def burst_schedule(
    seed: int,
    total_s: float,
    max_threads: int,
    *,
    busy_s: tuple[float, float] = BUSY_S,
    idle_s: tuple[float, float] = IDLE_S,
) -> list[Burst]:
    """Alternating idle and busy periods over [0, total_s), idle first, each duration
    uniform in its range, each burst's thread count uniform in 1..max_threads: the same
    seed gives the same pattern."""
    if max_threads < 1:
        raise ValueError(f"max_threads must be >= 1, got {max_threads}")
    if total_s < 0:
        raise ValueError(f"total_s must be >= 0, got {total_s}")
    for name, (low, high) in (("busy_s", busy_s), ("idle_s", idle_s)):
        if not 0 < low <= high:
            raise ValueError(f"{name} must be 0 < low <= high, got ({low}, {high})")
    rng = random.Random(seed)
    bursts: list[Burst] = []
    t = rng.uniform(*idle_s)
    while t < total_s:
        duration = rng.uniform(*busy_s)
        threads = rng.randint(1, max_threads)
        bursts.append(Burst(start_s=t, duration_s=min(duration, total_s - t), threads=threads))
        t += duration + rng.uniform(*idle_s)
    return bursts


def threads_at(schedule: Sequence[Burst], t: float) -> int:
    """How many processes spin at time t (0 between bursts) of a schedule in start
    order, as `burst_schedule` makes it."""
    index = bisect.bisect_right(schedule, t, key=lambda b: b.start_s) - 1
    if index < 0:
        return 0
    burst = schedule[index]
    return burst.threads if t < burst.start_s + burst.duration_s else 0


class NoiseSummary(BaseModel):
    seed: int
    max_threads: int
    busy_s_range: tuple[float, float]
    idle_s_range: tuple[float, float]
    elapsed_s: float
    bursts: int  # bursts begun within elapsed_s
    busy_share: float  # share of elapsed_s with at least one process spinning
    mean_threads_busy: float  # spinning processes on average while busy


def noise_summary(
    schedule: Sequence[Burst], elapsed_s: float, *, seed: int, max_threads: int
) -> NoiseSummary:
    """What the stealer did over the first `elapsed_s` seconds of its schedule."""
    busy = 0.0
    thread_s = 0.0
    begun = 0
    for burst in schedule:
        if burst.start_s >= elapsed_s:
            break
        begun += 1
        spun = min(burst.duration_s, elapsed_s - burst.start_s)
        busy += spun
        thread_s += spun * burst.threads
    return NoiseSummary(
        seed=seed,
        max_threads=max_threads,
        busy_s_range=BUSY_S,
        idle_s_range=IDLE_S,
        elapsed_s=round(elapsed_s, 1),
        bursts=begun,
        busy_share=round(busy / elapsed_s, 3) if elapsed_s > 0 else 0.0,
        mean_threads_busy=round(thread_s / busy, 2) if busy > 0 else 0.0,
    )


def is_false_gain(written: bool, gain_pct: float | None) -> bool:
    """The rule of the module docstring: written, and re-measured no better than the
    baseline. A written run without a re-measured gain is not judged here; the caller
    reports it as a run that could not be checked."""
    return written and gain_pct is not None and gain_pct <= 0.0


def written(summary: TuneSummary) -> bool:
    """Whether the run tells the user to change the configuration."""
    baseline = baseline_of(summary)
    return summary.recommended is not None and summary.recommended != baseline


def baseline_of(summary: TuneSummary) -> BatchingConfig:
    if summary.verdict is not None:
        return summary.verdict.incumbent.config
    if summary.baseline is None:
        raise ValueError("the tune run measured no baseline")
    return BatchingConfig(
        max_batch_size=summary.baseline.max_batch_size,
        max_queue_time_ms=summary.baseline.max_queue_time_ms,
    )


def candidate_of(summary: TuneSummary) -> BatchingConfig | None:
    """What to re-measure against the baseline: what the run wrote; when it kept the
    baseline, its best finalist (None when it had none)."""
    baseline = baseline_of(summary)
    if written(summary):
        return summary.recommended
    if summary.verdict is not None and summary.verdict.winner.config != baseline:
        return summary.verdict.winner.config
    ranked = [e.config for e in summary.verdict.ranking] if summary.verdict else []
    return next((c for c in ranked if c != baseline), None)


def figure_of(summary: TuneSummary, config: BatchingConfig) -> float | None:
    """The run's own figure for `config`: its interleaved estimate when the verdict has
    one, else its latest complete trial's effective req/s (where a bracketed
    re-measurement starts)."""
    if summary.verdict is not None:
        for estimate in summary.verdict.ranking:
            if estimate.config == config and estimate.estimate > 0:
                return estimate.estimate
    for trial in reversed(summary.trials):
        if trial.state == "Complete" and trial.effective_rps and trial.config() == config:
            return trial.effective_rps
    return None


class RunResult(BaseModel):
    run: int
    tune_seed: int
    recommended: BatchingConfig | None  # what the run recommended (the baseline if kept)
    baseline: BatchingConfig | None
    written: bool
    # the tune run's own verdict on its choice (None without a verdict)
    tune_gain_pct: float | None
    tune_gain_low_pct: float | None
    tune_reason: str
    # the independent re-measurement: what was measured against the baseline
    remeasured: BatchingConfig | None
    remeasured_rounds_rps: list[float]
    baseline_rounds_rps: list[float]
    gain_pct: float | None
    gain_lcb_pct: float | None
    gain_ucb_pct: float | None
    false_gain: bool
    # the run finished and, if it wrote, what it wrote was re-measured
    checked: bool
    error: str | None = None  # what went wrong (a run kept may still carry one)
    tune_s: float
    remeasure_s: float


class Settings(BaseModel):
    runs: int
    seed: int
    burst_threads: int
    rounds: int
    step_s: float
    warmup_s: float
    precision: float
    level: float
    tune_command: list[str]
    tune_timeout_s: float
    remeasure_timeout_s: float


class Report(BaseModel):
    runs: list[RunResult]
    false_gain_runs: int
    unchecked_runs: int  # runs that could not be checked (see RunResult.checked)
    false_gain_rule: str
    settings: Settings
    noise: NoiseSummary
    duration_s: float
    load_average_1m: tuple[float, float]  # before, after


def run_result(
    run: int,
    tune_seed: int,
    summary: TuneSummary,
    *,
    remeasured: BatchingConfig | None,
    rounds: dict[BatchingConfig, list[float]],
    gain: tuple[float, float, float] | None,
    tune_s: float,
    remeasure_s: float,
    error: str | None = None,
) -> RunResult:
    """One run's row from the tune run's summary and its re-measurement (`error`: why
    the re-measurement has no gain)."""
    baseline = baseline_of(summary)
    was_written = written(summary)
    verdict = summary.verdict
    gain_pct = gain[0] if gain is not None else None
    if was_written and gain is None and error is None:
        error = "the written configuration was not re-measured"
    return RunResult(
        run=run,
        tune_seed=tune_seed,
        recommended=summary.recommended,
        baseline=baseline,
        written=was_written,
        tune_gain_pct=_round(verdict.gain_percent) if verdict else None,
        tune_gain_low_pct=_round(verdict.gain_low_percent) if verdict else None,
        tune_reason=verdict.reason if verdict else summary.recommendation,
        remeasured=remeasured,
        remeasured_rounds_rps=[round(v, 1) for v in rounds.get(remeasured, [])]
        if remeasured is not None
        else [],
        baseline_rounds_rps=[round(v, 1) for v in rounds.get(baseline, [])],
        gain_pct=_round(gain_pct),
        gain_lcb_pct=_round(gain[1]) if gain is not None else None,
        gain_ucb_pct=_round(gain[2]) if gain is not None else None,
        false_gain=is_false_gain(was_written, gain_pct),
        checked=not was_written or gain is not None,
        error=error,
        tune_s=round(tune_s, 1),
        remeasure_s=round(remeasure_s, 1),
    )


def failed_run(run: int, tune_seed: int, error: str, tune_s: float) -> RunResult:
    return RunResult(
        run=run,
        tune_seed=tune_seed,
        recommended=None,
        baseline=None,
        written=False,
        tune_gain_pct=None,
        tune_gain_low_pct=None,
        tune_reason="",
        remeasured=None,
        remeasured_rounds_rps=[],
        baseline_rounds_rps=[],
        gain_pct=None,
        gain_lcb_pct=None,
        gain_ucb_pct=None,
        false_gain=False,
        checked=False,
        error=error,
        tune_s=round(tune_s, 1),
        remeasure_s=0.0,
    )


def exit_code(report: Report) -> int:
    """1 when a run wrote back a false gain, else 2 when a run could not be checked."""
    if report.false_gain_runs > 0:
        return 1
    if report.unchecked_runs > 0:
        return 2
    return 0


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


# ---------------------------------------------------------------- the stealer


def _spin(index: int, schedule: list[Burst], t0: float, deadline: float, parent: int) -> None:
    """Worker `index` spins while the schedule has more than `index` processes busy."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    x = 0
    while True:
        now = time.monotonic()
        if now >= deadline or os.getppid() != parent:
            return
        if threads_at(schedule, now - t0) > index:
            until = now + SPIN_SLICE_S
            while time.monotonic() < until:
                x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        else:
            time.sleep(SPIN_SLICE_S)


@dataclass
class Stealer:
    """Worker processes that follow `schedule` from `start()` until `stop()` or
    `lifetime_s`, whichever comes first."""

    schedule: list[Burst]
    threads: int
    lifetime_s: float

    def __post_init__(self) -> None:
        self._workers: list[ForkProcess] = []
        self.t0 = 0.0

    def start(self) -> None:
        # fork before any event loop or thread exists in this process
        ctx = multiprocessing.get_context("fork")
        self.t0 = time.monotonic()
        deadline = self.t0 + self.lifetime_s
        for index in range(self.threads):
            worker = ctx.Process(
                target=_spin,
                args=(index, self.schedule, self.t0, deadline, os.getpid()),
                name=f"cpu-stealer-{index}",
                daemon=True,
            )
            worker.start()
            self._workers.append(worker)

    def stop(self) -> None:
        for worker in self._workers:
            if worker.is_alive():
                worker.terminate()
        for worker in self._workers:
            worker.join(STOP_GRACE_S)
            if worker.is_alive():
                worker.kill()
                worker.join()
        self._workers.clear()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0


# ---------------------------------------------------------------- the runs


class RunError(Exception):
    pass


def tune_command(seed: int, max_rounds: int | None = None) -> list[str]:
    """The run's command; `max_rounds` lets the quick run's fixed 3 rounds grow while its
    verdict is undecided, as a default run's do."""
    rounds = [] if max_rounds is None else ["--max-rounds", str(max_rounds)]
    return [
        *(sys.executable, "-m", "batchpilot", "tune", "--local", "--quick", "--json"),
        *rounds,
        *("--seed", str(seed)),
    ]


async def run_tune(seed: int, timeout_s: float, max_rounds: int | None) -> TuneSummary:
    """`tune --local --quick --json` as a subprocess; its progress goes to our stderr."""
    process = await asyncio.create_subprocess_exec(
        *tune_command(seed, max_rounds),
        stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        stdout, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        raise RunError(f"tune --seed {seed} did not finish within {timeout_s:g} s") from None
    finally:
        # on a timeout or cancellation: SIGTERM (the run stops its server), then SIGKILL
        await stop_process(process, TUNE_GRACE_S)
    if process.returncode != 0:
        raise RunError(f"tune --seed {seed} exited with {process.returncode}")
    try:
        return TuneSummary.model_validate_json(stdout)
    except ValueError as exc:
        raise RunError(f"tune --seed {seed} printed no tune summary: {exc}") from None


async def remeasure(
    summary: TuneSummary,
    candidate: BatchingConfig,
    *,
    rounds: int,
    step_s: float,
    warmup_s: float,
    precision: float,
    seed: int,
) -> tuple[dict[BatchingConfig, list[float]], tuple[float, float, float]]:
    """The candidate and the baseline interleaved on a fresh server started as the tune
    run's was; their rounds and the candidate's gain (estimate, low, high) in percent."""
    baseline = baseline_of(summary)
    async with ServerProcess(
        max_batch_size=baseline.max_batch_size, max_queue_time_ms=baseline.max_queue_time_ms
    ) as server:
        target = ReferenceControl(server.url)
        probe = LocalProbe(
            server.url,
            sla=summary.sla,
            mix=RequestMix.default(),  # what tune --local measures without --mix
            precision=precision,
            step_duration_s=step_s,
            warmup_s=warmup_s,
            seed=seed,
        )

        async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
            round_probe = copy.copy(probe)
            round_probe.seed = seed + ROUND_SEED_STRIDE * (round_index + 1)
            figure = figure_of(summary, config)
            return await round_probe.measure(
                config,
                must_beat=None,
                start_rps=bracket_start(figure, config, round_index, seed) if figure else None,
            )

        def progress(event: RoundDone) -> None:
            print(
                f"  re-measured round {event.round + 1}/{rounds} {event.config.label():<24} "
                f"{event.result.effective_rps:.0f} req/s",
                file=sys.stderr,
                flush=True,
            )

        result = await remeasure_interleaved(
            target, measure, [candidate], baseline, rounds=rounds, on_done=progress
        )
    if candidate in result.refused:
        raise RunError(f"the server refused {candidate.label()}: {result.refused[candidate]}")
    table = result.rounds()
    verdict = decide(table, baseline, min_gain_percent=0.0)
    estimate = next(e for e in verdict.ranking if e.config == candidate)
    return table, gain_over_incumbent(verdict, estimate)


async def one_run(run: int, args: argparse.Namespace) -> RunResult:
    tune_seed = args.seed + run
    print(f"run {run + 1}/{args.runs}: tune --local --quick --seed {tune_seed}", file=sys.stderr)
    started = time.monotonic()
    try:
        summary = await run_tune(tune_seed, args.tune_timeout_s, args.tune_max_rounds)
    except RunError as exc:
        return failed_run(run, tune_seed, str(exc), time.monotonic() - started)
    tune_s = time.monotonic() - started
    candidate = candidate_of(summary)
    rounds: dict[BatchingConfig, list[float]] = {}
    gain = None
    error = None
    started = time.monotonic()
    if candidate is not None:
        print(
            f"run {run + 1}: re-measuring {candidate.label()} against the baseline, "
            f"{args.rounds} rounds",
            file=sys.stderr,
        )
        try:
            rounds, gain = await asyncio.wait_for(
                remeasure(
                    summary,
                    candidate,
                    rounds=args.rounds,
                    step_s=args.step_s,
                    warmup_s=args.warmup_s,
                    precision=args.precision,
                    seed=tune_seed + REMEASURE_SEED_OFFSET,
                ),
                args.remeasure_timeout_s,
            )
        except TimeoutError:
            error = f"the re-measurement did not finish within {args.remeasure_timeout_s:g} s"
        except RunError as exc:
            error = str(exc)
    return run_result(
        run,
        tune_seed,
        summary,
        remeasured=candidate,
        rounds=rounds,
        gain=gain,
        tune_s=tune_s,
        remeasure_s=time.monotonic() - started,
        error=error,
    )


async def run_all(args: argparse.Namespace) -> list[RunResult]:
    return [await one_run(run, args) for run in range(args.runs)]


def report_of(
    runs: list[RunResult],
    args: argparse.Namespace,
    noise: NoiseSummary,
    duration_s: float,
    load: tuple[float, float],
) -> Report:
    return Report(
        runs=runs,
        false_gain_runs=sum(r.false_gain for r in runs),
        unchecked_runs=sum(not r.checked for r in runs),
        false_gain_rule=FALSE_GAIN_RULE,
        settings=Settings(
            runs=args.runs,
            seed=args.seed,
            burst_threads=args.burst_threads,
            rounds=args.rounds,
            step_s=args.step_s,
            warmup_s=args.warmup_s,
            precision=args.precision,
            level=0.95,
            tune_command=[
                "batchpilot",
                *tune_command(args.seed, args.tune_max_rounds)[3:-1],
                "<seed + run>",
            ],
            tune_timeout_s=args.tune_timeout_s,
            remeasure_timeout_s=args.remeasure_timeout_s,
        ),
        noise=noise,
        duration_s=round(duration_s, 1),
        load_average_1m=load,
    )


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds through asyncio.run (its tasks are cancelled, the tune run and
    # the server stopped) and through the finally that stops the stealer
    raise SystemExit(128 + signum)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=3, help="tune runs (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="noise and tune seeds (default 0)")
    parser.add_argument(
        "--burst-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="most processes a burst spins (default: the cores)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="re-measured rounds (3-20)")
    parser.add_argument(
        "--tune-max-rounds",
        type=int,
        help="passed to each tune run as --max-rounds (3-20; default the quick run's 3)",
    )
    parser.add_argument("--step-s", type=float, default=2.0, help="re-measurement step seconds")
    parser.add_argument("--warmup-s", type=float, default=0.5)
    parser.add_argument("--precision", type=float, default=0.1)
    parser.add_argument("--tune-timeout-s", type=float, default=1200.0)
    parser.add_argument("--remeasure-timeout-s", type=float, default=1800.0)
    results.add_options(parser)
    args = parser.parse_args(argv)
    problems = [
        text
        for bad, text in (
            (args.runs < 1, "--runs must be >= 1"),
            (args.burst_threads < 1, "--burst-threads must be >= 1"),
            (not 3 <= args.rounds <= 20, "--rounds must be 3-20"),
            (
                args.tune_max_rounds is not None and not 3 <= args.tune_max_rounds <= 20,
                "--tune-max-rounds must be 3-20",
            ),
            (args.step_s <= 0, "--step-s must be > 0"),
            (args.warmup_s < 0, "--warmup-s must be >= 0"),
            (not 0 < args.precision < 1, "--precision must be between 0 and 1"),
            (args.tune_timeout_s <= 0, "--tune-timeout-s must be > 0"),
            (args.remeasure_timeout_s <= 0, "--remeasure-timeout-s must be > 0"),
        )
        if bad
    ]
    if problems:
        parser.error("; ".join(problems))
    return args


def main() -> None:
    args = parse_args()
    # the longest the benchmark can take: the stealer never outlives it
    lifetime_s = args.runs * (args.tune_timeout_s + TUNE_GRACE_S + args.remeasure_timeout_s) + 60
    schedule = burst_schedule(args.seed, lifetime_s, args.burst_threads)
    stealer = Stealer(schedule, args.burst_threads, lifetime_s)
    recorder = results.start("tune_under_noise", args)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    stealer.start()
    try:
        runs = asyncio.run(run_all(args))
        elapsed = stealer.elapsed_s()
    finally:
        stealer.stop()
    noise = noise_summary(schedule, elapsed, seed=args.seed, max_threads=args.burst_threads)
    report = report_of(
        runs, args, noise, time.monotonic() - started, (load_before, os.getloadavg()[0])
    )
    recorder.save(report.model_dump(mode="json"))
    if args.json:
        print(report.model_dump_json())
    else:
        _print_table(report)
    sys.exit(exit_code(report))


def _print_table(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tune --local --quick under CPU bursts, re-measured interleaved")
    for column in ("run", "recommended", "written", "tune gain (low)", "re-measured gain [95%]"):
        table.add_column(column)
    for r in report.runs:
        tune = (
            f"{r.tune_gain_pct:+.0f} % ({r.tune_gain_low_pct:+.0f} %)"
            if r.tune_gain_pct is not None and r.tune_gain_low_pct is not None
            else ""
        )
        again = (
            f"{r.gain_pct:+.0f} % [{r.gain_lcb_pct:+.0f}, {r.gain_ucb_pct:+.0f}]"
            if r.gain_pct is not None
            else (r.error or "")
        )
        label = r.recommended.label() if r.recommended else "-"
        table.add_row(str(r.run), label, str(r.written), tune, again)
    console = Console()
    console.print(table)
    console.print(
        f"false gains: {report.false_gain_runs} ({report.false_gain_rule}); "
        f"unchecked: {report.unchecked_runs}; {report.duration_s:.0f} s",
        highlight=False,
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
