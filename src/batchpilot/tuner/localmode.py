"""`tune --local`: tune a server on this machine, the bundled reference server by default
or another runtime through its adapter (`--runtime`, `batchpilot.runtimes`).

Start the server (subprocess, loopback, free port), take its starting configuration as
the baseline, measure the rules of thumb, add the simulator's proposals once the batch
cost curve is known from the baseline's traffic, then let the sampler work. Ctrl-C or
SIGTERM stops the trial in flight, keeps the best so far, and stops the server."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optuna.storages import BaseStorage
from rich.console import Console

from batchpilot.loadgen.arrivals import ArrivalKind, Poisson
from batchpilot.loadgen.protocols import RequestProtocol
from batchpilot.loadgen.streaming import OpenAIStream
from batchpilot.models import SLA, BatchingConfig, CapacityResult, RequestMix
from batchpilot.runtimes.base import (
    PersistsAsRun,
    Profiled,
    ShapesRequests,
    Verification,
    wait_pinned,
)
from batchpilot.runtimes.http import DIRECT
from batchpilot.runtimes.registry import DEFAULT_RUNTIME, get_runtime
from batchpilot.tuner.attached import Attached, check_attached, leave_attached
from batchpilot.tuner.config import Measurement, TuneConfig, screening
from batchpilot.tuner.confirm import (
    Confirmed,
    bracket_start,
    confirm_study,
    probes_light_load,
    study_figures,
)
from batchpilot.tuner.figures import runtime_figures
from batchpilot.tuner.interfaces import Probe, ServerDied, Target
from batchpilot.tuner.local import LocalProbe
from batchpilot.tuner.progress import TrialProgress
from batchpilot.tuner.rules import rules_of_thumb
from batchpilot.tuner.runner import RoundDone, TrialDone, TrialStart, run_trials
from batchpilot.tuner.space import SearchSpace
from batchpilot.tuner.study import Tuner
from batchpilot.tuner.summary import (
    TuneSummary,
    label_of,
    summary_of_study,
    with_executed_batches,
    with_verdict,
)
from batchpilot.tuner.watch import Watch, WatchedProbe, WatchedTarget, answered_nothing, crashed

if TYPE_CHECKING:
    from batchpilot.capacity.http import StepSource

log = logging.getLogger(__name__)

STUDY_NAME = "batchpilot-local"


@dataclass(frozen=True)
class LocalRun:
    config: TuneConfig
    space: SearchSpace
    mix: RequestMix
    storage: str | BaseStorage | None = None  # an opened storage or a URL
    # every trial is measured (and the warm start simulated) under this process
    arrival: ArrivalKind = field(default_factory=Poisson)
    runtime: str = DEFAULT_RUNTIME  # a name in batchpilot.runtimes.registry
    # tune a server already running there (`tune --url`) instead of starting one
    attach: Attached | None = None
    # steps decided on the server's own metrics (`tune --url --prometheus`)
    source: StepSource | None = None
    # the user's own request body (`tune --body-template`) in place of the runtime's
    requests: RequestProtocol | None = None
    # the user's own model the runtime serves: a folder (`tune --local --model-dir`) or
    # TorchServe's archive (`--model-archive`)
    model_dir: Path | None = None
    # vLLM's max_num_batched_tokens in every trial (`--token-budget`; None: its default)
    token_budget: int | None = None


class SimulatorWarmStart:
    """Adds the simulator's proposals once: when a measured trial has left a batch-cost
    profile in the server. The profile's fit is calibrated against the baseline's
    measured capacity first (see `warmstart`). Skipped, with the reason logged, when
    the simulator is not installed or the profile cannot be fitted yet (too few
    distinct batch sizes)."""

    def __init__(
        self, tuner: Tuner, target: Target | Profiled, run: LocalRun, rules: list[BatchingConfig]
    ) -> None:
        self.tuner = tuner
        self.target = target
        self.run = run
        self.rules = rules
        wanted = run.config.tuning.simulator_warm_starts
        already = any(label_of(r, rules) == "simulator" for r in tuner.records())
        self.done = wanted == 0 or already
        self.skipped: str = ""

    async def maybe(self) -> list[BatchingConfig]:
        if self.done or not any(r.state == "Complete" for r in self.tuner.records()):
            return []
        requests = self.run.requests
        if requests is not None and requests.stream is not None:
            return await self._token_proposals(requests.stream)
        if not isinstance(self.target, Profiled):
            return self._skip(f"the {self.run.runtime} runtime reports no batch-cost profile")
        try:
            from batchpilot.simulator.cost import ProfileError, fit_cost_model
            from batchpilot.simulator.propose import propose_configs
            from batchpilot.simulator.scenario import REFERENCE_AHEAD, REFERENCE_QUEUE_LIMIT
            from batchpilot.tuner.warmstart import calibrated_cost
        except ImportError as exc:
            return self._skip(f"the simulator is not available ({exc})")
        profile = await self.target.profile()
        try:
            profiled = fit_cost_model(profile)
        except ProfileError as exc:
            log.info("simulator warm start waits for a better profile: %s", exc)
            return []
        cfg = self.run.config
        # The baseline is always measured in full (never pruned), first: the one
        # capacity of this run the profile-fitted model can be calibrated against.
        base = next((r for r in self.tuner.records() if r.source == "baseline"), None)
        measured = self.tuner.result(base.number) if base is not None else None
        cost, note = profiled, "not calibrated: no baseline measurement"
        # Every other configuration measured so far calibrates too: two fix the model in
        # both directions (per-request work down, hidden hand-over up).
        more = [
            (r.config(), result)
            for r in self.tuner.records()
            if r.state == "Complete"
            and (base is None or r.number != base.number)
            and (result := self.tuner.result(r.number)) is not None
        ]
        if base is not None and measured is not None:
            cost, note = await asyncio.to_thread(
                calibrated_cost,
                profiled,
                mix=self.run.mix,
                sla=cfg.sla,
                baseline=base.config(),
                measured=measured,
                seed=cfg.tuning.seed,
                arrival=self.run.arrival,
                more=more,
                ahead=REFERENCE_AHEAD,
                queue_limit=REFERENCE_QUEUE_LIMIT,
            )
        log.info("simulator cost model %s", note)
        configs = await asyncio.to_thread(
            propose_configs,
            cost,
            self.run.mix,
            cfg.sla,
            self.run.space,
            cfg.tuning.simulator_warm_starts,
            arrival=self.run.arrival,
            seed=cfg.tuning.seed,
            ahead=REFERENCE_AHEAD,
            queue_limit=REFERENCE_QUEUE_LIMIT,
        )
        self.done = True
        queued = self.tuner.add_warm_starts(configs)
        log.info("simulator (%s) proposed %s", cost.label(), [c.label() for c in queued])
        return queued

    async def _token_proposals(self, stream: OpenAIStream) -> list[BatchingConfig]:
        """The token-level simulator fitted to the measured baseline ranks batch caps
        (`tokenwarm`); only for a runtime with a token budget (vLLM)."""
        if not wait_pinned(get_runtime(self.run.runtime).knobs):
            return self._skip(
                f"the {self.run.runtime} runtime batches whole requests: the token-level "
                "simulator models a continuous-batching engine"
            )
        base = next((r for r in self.tuner.records() if r.source == "baseline"), None)
        measured = self.tuner.result(base.number) if base is not None else None
        if base is None or measured is None or not measured.feasible:
            return self._skip("the baseline met the SLA at no rate: nothing to fit to")
        from batchpilot.loadgen.lengths import draw_lengths
        from batchpilot.runtimes.vllm.knobs import DEFAULT_TOKEN_BUDGET
        from batchpilot.tuner.tokenwarm import propose_token_configs

        cfg = self.run.config
        try:
            configs, note = await asyncio.to_thread(
                propose_token_configs,
                measured,
                base.config(),
                stream,
                cfg.sla,
                self.run.space.batch_bounds,
                token_budget=self.run.token_budget or DEFAULT_TOKEN_BUDGET,
                arrival=self.run.arrival,
                seed=cfg.tuning.seed,
                count=cfg.tuning.simulator_warm_starts,
                lengths_sample=draw_lengths(stream.lengths, 1000, cfg.tuning.seed),
                # measured, or queued as rules of thumb: the proposal is a new cap
                measured_caps={r.config().max_batch_size for r in self.tuner.records()}
                | {rule.max_batch_size for rule in self.rules},
            )
        except ValueError as exc:
            return self._skip(f"the token-level simulator could not be fitted: {exc}")
        self.done = True
        queued = self.tuner.add_warm_starts(configs)
        log.info("token-level simulator: %s; proposed %s", note, [c.label() for c in queued])
        return queued

    def _skip(self, reason: str) -> list[BatchingConfig]:
        self.done = True
        self.skipped = reason
        log.warning("simulator warm start skipped: %s", reason)
        return []


def trial_measurement(cfg: TuneConfig, source: StepSource | None) -> Measurement:
    """How the study's trials are measured: screened (`config.screening`) when the
    finalists are confirmed at the full measurement afterwards, else at the full
    measurement. Steps a Prometheus source decides keep their length: its scrapes need
    it."""
    if cfg.tuning.confirm and cfg.tuning.screen and source is None:
        return screening(cfg.measurement)
    return cfg.measurement


def fidelity_note(screen: Measurement, cfg: TuneConfig) -> str:
    """What the header says of a study screened at another fidelity than its finalists."""
    full = cfg.measurement
    if screen == full:
        return ""
    return (
        f"; trials screened with {screen.step_duration_s:g} s steps at precision "
        f"{screen.precision:g}, finalists re-measured with {full.step_duration_s:g} s steps "
        f"at {full.precision:g}"
    )


async def tune_local(run: LocalRun, console: Console) -> TuneSummary:
    cfg = run.config
    started = time.monotonic()
    sla: SLA = cfg.sla
    rules = rules_of_thumb(run.space, sla) if cfg.tuning.rule_of_thumb else []
    runtime = get_runtime(run.runtime)
    if run.token_budget is not None:
        runtime = runtime.with_token_budget(run.token_budget)
    start = BatchingConfig(
        max_batch_size=cfg.server.max_batch_size, max_queue_time_ms=cfg.server.max_queue_time_ms
    )
    reference = runtime.name == DEFAULT_RUNTIME
    attach = run.attach
    model = attach.model if attach is not None and attach.model else runtime.default_model
    if run.model_dir is not None:
        model = runtime.user_model(run.model_dir)
        console.print(
            f"Starting the {runtime.title} (model {model} from {run.model_dir}, at the "
            "batching values of its own settings) ...",
            highlight=False,
        )
    elif attach is None:
        console.print(
            f"Starting the {runtime.title}"
            + (f" ({cfg.server.model}, " if reference else f" ({runtime.default_model}, ")
            + f"{start.label()}) ...",
            highlight=False,
        )
    async with (
        contextlib.nullcontext(None)
        if attach is not None
        else runtime.launcher(
            start,
            threads=cfg.server.threads,
            workload=cfg.server.model if reference else None,
            model_dir=run.model_dir,
        )
    ) as server:
        if server is not None:
            url = server.url
        else:
            assert attach is not None  # no server started: one was given
            url = attach.url
        access = attach.access if attach is not None else DIRECT
        target = runtime.control(
            url,
            model=model,
            server=server,
            control_url=attach.control_url if attach is not None else None,
            access=access,
        )
        requests = None if run.requests is None else access.applied_to(run.requests)
        protocol = requests or access.applied_to(runtime.protocol(model))
        if isinstance(target, ShapesRequests):
            protocol = await target.request_protocol(requests)
        baseline = (
            await check_attached(target, runtime, model, console, control_url=attach.control_url)
            if attach is not None
            else await target.current()
        )
        if run.model_dir is not None:
            # a model of the user's own: its requests are tried (and its control) before
            # the study, so a model that refuses them stops the run with the server's words
            await target.apply(baseline)
        tuner = Tuner(
            run.space,
            sampler=cfg.tuning.sampler,
            seed=cfg.tuning.seed,
            baseline=baseline,
            warm_start=rules,
            storage=run.storage,
            study_name=STUDY_NAME,
            max_trials=cfg.tuning.trials,
        )
        probe = LocalProbe(
            url,
            sla=sla,
            mix=run.mix,
            precision=cfg.measurement.precision,
            step_duration_s=cfg.measurement.step_duration_s,
            warmup_s=cfg.measurement.warmup_s,
            timeout_s=cfg.measurement.timeout_s,
            seed=cfg.tuning.seed,
            arrival=run.arrival,
            protocol=protocol,
            workers=cfg.measurement.workers,
            source=run.source,
            max_connections=cfg.measurement.max_connections,
            min_requests=cfg.measurement.min_requests,
        )
        screen = trial_measurement(cfg, run.source)
        screen_probe = probe.at(
            step_duration_s=screen.step_duration_s,
            warmup_s=screen.warmup_s,
            precision=screen.precision,
            min_requests=screen.min_requests,
        )
        warm = SimulatorWarmStart(tuner, target, run, rules)
        progress = TrialProgress(console, cfg.tuning.trials)
        console.print(
            f"Server on {url}; SLA {sla.describe('<=')}, errors <= "
            f"{sla.max_error_rate:g}; space {run.space.describe()}; "
            f"{cfg.tuning.trials} trials ({cfg.tuning.sampler}, seed {cfg.tuning.seed})"
            f"{fidelity_note(screen, cfg)}",
            highlight=False,
        )
        if wait_pinned(runtime.knobs):
            console.print(
                f"{runtime.server_name} batches continuously: it has no queue wait, so "
                "max_queue_time_ms stays 0 in every trial; "
                + ", ".join(f"{k}={v:g}" for k, v in runtime.native(baseline).items())
                + " at the baseline",
                highlight=False,
            )
        if tuner.measured_count():
            console.print(f"Resuming: {tuner.measured_count()} trials already in the storage")

        def on_start(event: TrialStart) -> None:
            progress.start(event, label_of(tuner.records()[event.number], rules))

        # batch sizes the server counted while each trial's change was verified, and
        # what each change cost
        executed: dict[int, dict[int, int]] = {}
        change_s: dict[int, float] = {}

        async def on_done(event: TrialDone) -> None:
            progress.done(event, label_of(event.record, rules), tuner.measured_count())
            verification = target.last_verification
            batches = verified_batches(verification, event.record.config())
            if batches is not None:
                executed[event.record.number] = batches
            if verification is not None and verification.requested == event.record.config():
                change_s[event.record.number] = round(verification.change_s, 3)
            await warm.maybe()

        study_started = time.monotonic()

        def out_of_time() -> bool:
            spent = time.monotonic() - study_started
            if spent < cfg.tuning.time_budget_s:
                return False
            console.print(
                f"Time budget of {cfg.tuning.time_budget_s:g} s spent after "
                f"{tuner.measured_count()} trials; no new trial starts.",
                highlight=False,
            )
            return True

        # a trial that kills the server is told as such and the server started again;
        # one BatchPilot did not start is not its to restart
        trial_target: Target = target
        trial_probe: Probe = screen_probe
        watch: Watch | None = None
        if server is not None:
            watch = Watch(server, target)
            trial_target = WatchedTarget(target, watch)
            trial_probe = WatchedProbe(screen_probe, watch)
        summary: TuneSummary | None = None
        try:
            interrupted = await _until_signal(
                run_trials(
                    tuner,
                    trial_target,
                    trial_probe,
                    trials=cfg.tuning.trials,
                    full=rules,
                    on_start=on_start,
                    on_done=on_done,
                    out_of_time=out_of_time,
                )
            )
            progress.stop()
            probe.accepted = probe.accepted or screen_probe.accepted
            summary = with_executed_batches(
                _summary(tuner, run, rules, interrupted, started), executed, change_s
            )
            if not interrupted and cfg.tuning.confirm:
                summary = await _confirm(
                    summary, tuner, cfg, target, probe, console, started, watch=watch
                )
        finally:
            progress.stop()
            if attach is not None:
                await leave_attached(target, attach, baseline, summary, console)
        persisted = None
        if summary.recommended is not None:
            persisted = (
                await target.persistence(summary.recommended)
                if isinstance(target, PersistsAsRun)
                else runtime.persistence(summary.recommended, model=model)
            )
        figures = runtime_figures(runtime, summary, target.last_verification, persisted=persisted)
        return summary.model_copy(update={"runtime": figures})


def verified_batches(
    verification: Verification | None, config: BatchingConfig
) -> dict[int, int] | None:
    """The batch sizes the server executed while `config` was verified live; None when
    the last verification was of another configuration (a change that failed) or the
    server says nothing of its batches."""
    if verification is None or verification.requested != config:
        return None
    return None if verification.batch_sizes is None else dict(verification.batch_sizes)


# Round r offers every configuration the schedule of seed + ROUND_SEED_STRIDE * (r + 1):
# the same arrivals for all of a round, fresh ones each round, none shared with a trial.
ROUND_SEED_STRIDE = 7919


async def _confirm(
    summary: TuneSummary,
    tuner: Tuner,
    cfg: TuneConfig,
    target: Target,
    probe: LocalProbe,
    console: Console,
    started: float,
    *,
    watch: Watch | None = None,
) -> TuneSummary:
    """Re-measure the finalists and the incumbent interleaved (tuner/confirm.py), and
    recommend by the verdict (tuner/verdict.py). With `watch`, the rounds are watched as
    the trials are: a round during which the server or its model process died scores
    0 req/s (the configuration cannot win) and the server is started again."""
    incumbent = next((r.config() for r in tuner.records() if r.source == "baseline"), None)
    if incumbent is None:
        return summary
    study_figure = study_figures(tuner.records())
    tuning = cfg.tuning

    def announce(chosen: list[BatchingConfig]) -> None:
        names = ", ".join(c.label() for c in chosen)
        more = (
            f" (up to {tuning.max_rounds} while undecided)"
            if tuning.max_rounds > tuning.rounds
            else ""
        )
        console.print(
            f"Re-measuring the finalists ({names}) and the incumbent {incumbent.label()} "
            f"interleaved, {tuning.rounds} rounds{more} ...",
            highlight=False,
        )

    async def measure(config: BatchingConfig, round_index: int) -> CapacityResult:
        round_probe = copy.copy(probe)
        round_probe.seed = tuning.seed + ROUND_SEED_STRIDE * (round_index + 1)
        figure = study_figure.get(config)
        result = await round_probe.measure(
            config,
            must_beat=None,
            start_rps=bracket_start(figure, config, round_index, tuning.seed) if figure else None,
            light_load=probes_light_load(config, incumbent, round_index),
        )
        if watch is None:
            return result
        try:
            await watch.check(config, suspect=answered_nothing(result))
        except ServerDied as died:
            console.print(
                f"[yellow]{config.label()} crashed in round {round_index + 1}: {died}[/]",
                highlight=False,
            )
            return crashed(result)
        return result

    def done(event: RoundDone) -> None:
        of = f"/{tuning.rounds}" if event.round < tuning.rounds else " (undecided, extra)"
        console.print(
            f"  round {event.round + 1}{of} {event.config.label():<24} "
            f"{event.result.effective_rps:.0f} req/s",
            highlight=False,
        )

    holder: list[Confirmed | None] = []

    async def run() -> None:
        holder.append(
            await confirm_study(
                tuner.records(),
                incumbent,
                target,
                measure,
                finalists_wanted=tuning.finalists,
                rounds=tuning.rounds,
                max_rounds=tuning.max_rounds,
                min_gain_percent=tuning.min_gain_percent,
                seed=tuning.seed,
                on_start=announce,
                on_done=done,
            )
        )

    stopped = await _until_signal(run())
    timing = {"duration_s": round(time.monotonic() - started, 1)}
    if stopped or not holder:
        return summary.model_copy(update={"interrupted": True, **timing})
    confirmed = holder[0]
    if confirmed is None:
        return summary  # nothing met the SLA besides, perhaps, the incumbent
    for config, why in confirmed.remeasured.refused.items():
        console.print(f"[yellow]{config.label()} left out: {why}[/]", highlight=False)
    light_load = confirmed.remeasured.light_load()
    for config, why in light_load.items():
        console.print(f"[yellow]{config.label()} cannot win: {why}[/]", highlight=False)
    return with_verdict(summary, confirmed.verdict, light_load).model_copy(update=timing)


def _summary(
    tuner: Tuner, run: LocalRun, rules: list[BatchingConfig], interrupted: bool, started: float
) -> TuneSummary:
    return summary_of_study(
        tuner,
        run.config,
        space=run.space,
        rules=rules,
        interrupted=interrupted,
        duration_s=time.monotonic() - started,
    )


async def _until_signal(work: Coroutine[Any, Any, object]) -> bool:
    """Run `work`; SIGINT/SIGTERM cancel it. True when it was stopped that way."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        task.cancel()

    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    if not stopped and task.cancelled():
        raise asyncio.CancelledError
    return stopped
