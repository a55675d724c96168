"""The tuner: an Optuna study over the batching knobs, driven by ask/tell so that the
trials can be run by someone else (the local CLI, the operator's daemon).

Order of trials: the baseline (the configuration live before tuning), then the warm
starts (rules of thumb, simulator proposals), then the sampler. Scoring: effective
req/s, maximised; a configuration that breaks the SLA even at the lowest rate is
infeasible, recorded through Optuna's constraint API so it is never the best.

State lives in `TrialRecord`s. A tuner built from a list of them (`history`) holds the
same Optuna study as the one that produced them, and since every trial's sampler is
seeded from (seed, trial number) (see `samplers`), it suggests what the original would
have. A trial still `Running` in the history was cut short by a crash: it is recorded
as Failed ("interrupted") and its configuration is asked again before anything new.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, create_trial
from optuna.trial import TrialState as OptunaState
from pydantic import BaseModel, ConfigDict

from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.tuner.outcome import (
    SLA_CONSTRAINT,
    TrialState,
    client_bound_reason,
    client_figures,
    figures_of,
    light_load_violation,
    repeated_step_reason,
    state_of,
    unmeasured_reason,
    violation_of,
)
from batchpilot.tuner.refine import (
    CONFIRMED_DEATHS,
    SERVER_DIED,
    batch_limit,
    deaths_by_batch,
    next_refinement,
    server_died_reason,
)
from batchpilot.tuner.samplers import make_sampler
from batchpilot.tuner.space import BATCH, ParameterSpec, Params, SearchSpace

__all__ = ["ParameterSpec", "SearchSpace", "TrialRecord", "Tuner", "open_storage"]

log = logging.getLogger(__name__)

Source = Literal["baseline", "warm-start", "sampler", "refine"]
INTERRUPTED = "interrupted"
# How the reason of a trial starts when what it measured was disturbed from outside (an
# autoscaler changed the replicas under it): no verdict on its configuration, so it is
# asked again like an interrupted one and counts neither as a failure nor as a trial.
INVALID = "invalid: "


def retried(reason: str) -> bool:
    """Whether a failed trial with this reason is asked again rather than scored."""
    return reason == INTERRUPTED or reason.startswith(INVALID)


RECORD_ATTR = "batchpilot.record"  # the TrialRecord, kept with the Optuna trial for resume
RESULT_ATTR = "batchpilot.result"  # the CapacityResult with its steps, for reports


# How far below the best score so far a trial's search may fall before it is pruned.
# The best score is the highest of several noisy measurements, biased upwards by about
# 1.5 standard deviations among ten trials: at 10 % per-window noise a challenger truly
# 10 % better was pruned about a quarter of the time against it
# (benchmarks/decision_quality.py, "pruning" rows). 15 % keeps most of the pruning's
# saving (a trial far below the best still stops at its first failing step).
PRUNE_MARGIN = 0.15


class TrialRecord(BaseModel):
    """One trial as the outside world sees it (status of the custom resource, reports)."""

    model_config = ConfigDict(extra="forbid")

    number: int
    params: dict[str, float | int]
    source: Source
    state: TrialState
    effective_rps: float | None = None
    p99_ms: float | None = None
    error_rate: float | None = None
    reason: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    client_lag_p99_ms: float | None = None  # worst p99 send lag of the load generator
    client_cpu: float | None = None  # highest CPU share (cores) of the load generator
    client_bound: bool = False  # the score is a lower bound: the client was the limit
    # a token-stream trial's tails and output tokens/s at its effective rate (its goodput)
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tokens_per_s: float | None = None

    def config(self) -> BatchingConfig:
        return SearchSpace.config_of(self.params)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def open_storage(spec: str) -> str | BaseStorage:
    """An Optuna storage URL (sqlite:///tune.db, ...) as it is; anything without a scheme
    is a journal file, which needs no database and survives a killed process."""
    if "://" in spec:
        return spec
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(spec))


def _optuna_trial(space: SearchSpace, rec: TrialRecord) -> FrozenTrial:
    """The Optuna trial a finished record stands for, exactly as ask/tell left it."""
    internal = space.to_internal(rec.params)
    common: dict[str, Any] = {
        "params": internal,
        "distributions": space.distributions_for(internal),
        "user_attrs": {RECORD_ATTR: rec.model_dump(mode="json")},
    }
    value = rec.effective_rps if rec.effective_rps is not None else 0.0
    constraints = {SLA_CONSTRAINT: violation_of(rec.state)}
    if rec.state == "Failed" and rec.reason.startswith(SERVER_DIED):
        # told as tell_server_died told it: a point that violates the constraint
        return create_trial(value=0.0, constraints={SLA_CONSTRAINT: 1.0}, **common)
    if rec.state in ("Complete", "Infeasible"):
        return create_trial(value=value, constraints=constraints, **common)
    if rec.state == "Pruned":
        # ask/tell reports the partial result as step 0 and Optuna copies the last
        # intermediate value into the value of a pruned trial
        return create_trial(
            state=OptunaState.PRUNED,
            value=value,
            intermediate_values={0: value},
            constraints=constraints,
            **common,
        )
    return create_trial(state=OptunaState.FAIL, **common)


def _study_batch_limit(study: optuna.Study) -> int | None:
    """The batch limit of `refine.batch_limit`, from the records kept with the trials."""
    records = []
    for trial in study.get_trials(deepcopy=False, states=(OptunaState.FAIL, OptunaState.COMPLETE)):
        raw = trial.user_attrs.get(RECORD_ATTR)
        if raw is not None:
            records.append(TrialRecord.model_validate(raw))
    return batch_limit(records)


def replay_queue(
    fixed: Sequence[tuple[Params, Source]], records: Iterable[TrialRecord]
) -> deque[tuple[Params, Source]]:
    """What is still to be asked before the sampler: the fixed configurations the records
    have not consumed, with interrupted trials' retries in front. Replays the order in
    which `ask` hands them out, so a resumed run neither skips nor repeats one."""
    queue: deque[tuple[Params, Source]] = deque(fixed)
    seen: list[TrialRecord] = []
    for rec in sorted(records, key=lambda r: r.number):
        seen.append(rec)
        for i, (params, source) in enumerate(queue):
            if params == rec.params and source == rec.source:
                del queue[i]
                break
        if (rec.state == "Failed" and retried(rec.reason)) or crash_retried(seen):
            queue.appendleft((dict(rec.params), rec.source))
    return queue


def crash_retried(records: Sequence[TrialRecord]) -> bool:
    """Whether the last of `records` is a crash asked again at once: the first death at
    its batch size that counts (`refine.deaths_by_batch`, over the records up to it)."""
    last = records[-1]
    if not last.reason.startswith(SERVER_DIED):
        return False
    batch = int(last.params[BATCH])
    return deaths_by_batch(records).get(batch, 0) < CONFIRMED_DEATHS


class Tuner:
    def __init__(
        self,
        space: SearchSpace,
        *,
        sampler: str = "TPE",
        seed: int = 0,
        baseline: BatchingConfig | None = None,
        warm_start: Sequence[BatchingConfig] = (),
        history: Sequence[TrialRecord] = (),
        storage: str | BaseStorage | None = None,
        study_name: str = "batchpilot",
        clock: Callable[[], datetime] = _utcnow,
        refine: bool = True,
        max_trials: int | None = None,
    ) -> None:
        self.space = space
        self._clock = clock
        self._refine = refine
        self._max_trials = max_trials
        self._study = optuna.create_study(
            study_name=study_name,
            storage=storage,
            sampler=make_sampler(sampler, seed, space, batch_limit=_study_batch_limit),
            direction="maximize",
            load_if_exists=True,
        )
        self._running: dict[int, optuna.Trial] = {}
        self._records: dict[int, TrialRecord] = {}
        self._load_stored()
        self._add_history(history)
        self._queue = replay_queue(self._fixed(baseline, warm_start), self._records.values())

    # -- construction ---------------------------------------------------------------

    @staticmethod
    def _fixed(
        baseline: BatchingConfig | None, warm_start: Sequence[BatchingConfig]
    ) -> list[tuple[Params, Source]]:
        fixed: list[tuple[Params, Source]] = []
        if baseline is not None:
            fixed.append((SearchSpace.params_of(baseline), "baseline"))
        seen = [p for p, _ in fixed]
        for config in warm_start:
            params = SearchSpace.params_of(config)
            if params in seen:
                continue  # the same configuration twice teaches the sampler nothing
            seen.append(params)
            fixed.append((params, "warm-start"))
        return fixed

    def _load_stored(self) -> None:
        """Records of a study that already lives in `storage` (a resumed run)."""
        for trial in self._study.get_trials(deepcopy=False):
            raw = trial.user_attrs.get(RECORD_ATTR)
            if raw is None:
                raise ValueError(
                    f"the study {self._study.study_name!r} in this storage has trial "
                    f"{trial.number} that batchpilot did not write; use another study name"
                )
            rec = TrialRecord.model_validate(raw)
            if trial.state == OptunaState.RUNNING:
                self._study.tell(trial.number, state=OptunaState.FAIL)
                rec = self._interrupted(rec)
            elif trial.state == OptunaState.FAIL and rec.state == "Running":
                rec = self._interrupted(rec)
            self._records[trial.number] = rec

    def _add_history(self, history: Sequence[TrialRecord]) -> None:
        for rec in sorted(history, key=lambda r: r.number):
            if rec.number in self._records:
                continue  # the storage already holds it
            expected = len(self._study.get_trials(deepcopy=False))
            if rec.number != expected:
                raise ValueError(
                    f"trial history must be numbered 0, 1, 2, ... without gaps: expected "
                    f"trial {expected}, got {rec.number}"
                )
            if rec.state == "Running":
                rec = self._interrupted(rec)
            self._study.add_trial(_optuna_trial(self.space, rec))
            self._records[rec.number] = rec

    def _interrupted(self, rec: TrialRecord) -> TrialRecord:
        log.info("trial %d was interrupted; its configuration will be retried", rec.number)
        return rec.model_copy(
            update={
                "state": "Failed",
                "reason": INTERRUPTED,
                "finished_at": rec.finished_at or self._clock(),
            }
        )

    # -- ask / tell -----------------------------------------------------------------

    def _next_fixed(self) -> tuple[Params, Source] | None:
        """The next configuration chosen here rather than by the sampler: queued ones
        first (warm starts at or above a batch size that killed the server are dropped),
        then a refinement when the sampler has stalled. A pure function of the records
        and the queue, which a rebuilt tuner replays identically."""
        finished = [r for r in self.records() if r.state != "Running"]
        limit = batch_limit(finished)
        while self._queue:
            params, source = self._queue.popleft()
            if source == "warm-start" and limit is not None and int(params[BATCH]) >= limit:
                log.info(
                    "skipping warm start %s: batch size at or above %d killed the server",
                    params,
                    limit,
                )
                continue
            return params, source
        if not self._refine:
            return None
        remaining = None
        if self._max_trials is not None:
            remaining = self._max_trials - self.measured_count()
        refinement = next_refinement(finished, self.space, remaining=remaining)
        return None if refinement is None else (refinement, "refine")

    def ask(self) -> tuple[int, BatchingConfig, dict[str, float | int]]:
        """The next trial: its number, the batching configuration to apply and every
        parameter value (extras included)."""
        source: Source = "sampler"
        chosen = self._next_fixed()
        if chosen is not None:
            fixed, source = chosen
            internal = self.space.to_internal(fixed)
            self._study.enqueue_trial(internal)
            dists = self.space.distributions()
            dists.update(self.space.distributions_for(internal))
            trial = self._study.ask(dists)
            params = dict(fixed)
            params.update(
                {k: v for k, v in self.space.from_internal(trial.params).items() if k not in fixed}
            )
        else:
            trial = self._study.ask(self.space.distributions())
            params = self.space.from_internal(trial.params)
        rec = TrialRecord(
            number=trial.number,
            params=params,
            source=source,
            state="Running",
            started_at=self._clock(),
        )
        trial.set_user_attr(RECORD_ATTR, rec.model_dump(mode="json"))
        self._running[trial.number] = trial
        self._records[trial.number] = rec
        return trial.number, rec.config(), dict(params)

    def _take(self, number: int) -> optuna.Trial:
        trial = self._running.pop(number, None)
        if trial is None:
            raise ValueError(f"trial {number} is not running in this tuner (ask it first)")
        return trial

    def tell(self, number: int, result: CapacityResult) -> TrialRecord:
        """Record a measurement: Complete, Pruned or Infeasible. A configuration that
        breaks the SLA at light load (`light_load_violation`) is Infeasible whatever
        the heavy-load search measured: it can never be the best nor a finalist. One
        whose measured low rates broke the SLA (`CapacityResult.light_load`) keeps the
        capped figure, Infeasible when nothing below the failing rate passed, and says
        why in its reason."""
        light = light_load_violation(self._records[number].config(), result.sla)
        unmeasured = unmeasured_reason(result)
        if unmeasured and not light:
            # no verdict on the configuration: neither a score nor a constraint violation
            return self.tell_failed(number, unmeasured, result)
        trial = self._take(number)
        state = state_of(result)
        rps, p99, errors = figures_of(result)
        lag, cpu = client_figures(result)
        reason = "" if state == "Complete" else self._reason(state, result)
        if result.client_bound and state == "Complete":
            reason = client_bound_reason(result)
        elif result.short_of_precision and state == "Complete":
            reason = f"ShortOfPrecision: a lower bound, {result.short_of_precision}"
        elif state == "Complete":
            reason = repeated_step_reason(result)
        if result.light_load:
            # a low rate broke the SLA: that, not the heavy load, set the figure
            reason = result.light_load
        # last, so it wins over whatever heavy load measured
        if light:
            state, reason = "Infeasible", light
        rec = self._records[number].model_copy(
            update={
                "state": state,
                "effective_rps": rps,
                "p99_ms": p99,
                "error_rate": errors,
                "finished_at": self._clock(),
                "reason": reason,
                "client_lag_p99_ms": lag,
                "client_cpu": cpu,
                "client_bound": result.client_bound,
                "ttft_p99_ms": result.ttft_p99_ms,
                "tpot_p99_ms": result.tpot_p99_ms,
                "output_tokens_per_s": result.output_tokens_per_s,
            }
        )
        trial.set_user_attr(RECORD_ATTR, rec.model_dump(mode="json"))
        trial.set_user_attr(RESULT_ATTR, result.model_dump(mode="json"))
        trial.set_constraint(SLA_CONSTRAINT, violation_of(state))
        if state == "Pruned":
            trial.report(rps, 0)
            self._study.tell(trial, state=OptunaState.PRUNED)
        else:
            self._study.tell(trial, rps)
        self._records[number] = rec
        return rec

    @staticmethod
    def _reason(state: TrialState, result: CapacityResult) -> str:
        failing = [s for s in result.steps if not s.passed]
        why = min(failing, key=lambda s: s.offered_rps).reason if failing else ""
        if state == "Pruned":
            return "stopped early: cannot beat the best so far" + (f" ({why})" if why else "")
        if result.unjudged:
            lowest = f" (at the lowest rate measured: {why})" if why else ""
            return f"no rate shown to meet the SLA{lowest}; {result.unjudged}"
        return "breaks the SLA at the lowest rate" + (f": {why}" if why else "")

    def tell_failed(
        self, number: int, reason: str, result: CapacityResult | None = None
    ) -> TrialRecord:
        """The trial could not be measured (the target refused the configuration, the
        client limited every step of `result`, ...)."""
        trial = self._take(number)
        rec = self._records[number].model_copy(
            update={"state": "Failed", "reason": reason, "finished_at": self._clock()}
        )
        trial.set_user_attr(RECORD_ATTR, rec.model_dump(mode="json"))
        if result is not None:
            trial.set_user_attr(RESULT_ATTR, result.model_dump(mode="json"))
        self._study.tell(trial, state=OptunaState.FAIL)
        self._records[number] = rec
        return rec

    def tell_server_died(self, number: int, detail: str) -> TrialRecord:
        """The trial killed the server (it exited, stopped answering at all, or its model
        process or container died, e.g. out of memory at a large batch). Failed, and told
        to the sampler as a point that violates the SLA constraint with a score of 0
        (a failed trial it would ignore, and ask about the same region again). The first
        death at a batch size is retried at once; once the retry dies too, that batch
        size and every larger one are out of this study (`refine.batch_limit`)."""
        trial = self._take(number)
        batch = int(self._records[number].params[BATCH])
        rec = self._records[number].model_copy(
            update={
                "state": "Failed",
                "reason": server_died_reason(batch, detail),
                "finished_at": self._clock(),
            }
        )
        trial.set_user_attr(RECORD_ATTR, rec.model_dump(mode="json"))
        trial.set_constraint(SLA_CONSTRAINT, 1.0)
        self._study.tell(trial, 0.0)
        self._records[number] = rec
        if crash_retried([r for r in self.records() if r.number <= number]):
            # asked again at once, before the sampler goes anywhere near it
            self._queue.appendleft((dict(rec.params), rec.source))
        return rec

    def batch_limit(self) -> int | None:
        """The smallest batch size that killed the server in this study, or None."""
        return batch_limit(r for r in self.records() if r.state != "Running")

    # -- results --------------------------------------------------------------------

    @property
    def study(self) -> optuna.Study:
        """The underlying Optuna study (for dashboards and plots; drive it through the
        tuner, not directly)."""
        return self._study

    def records(self) -> list[TrialRecord]:
        return [self._records[n] for n in sorted(self._records)]

    def best(self) -> TrialRecord | None:
        """The feasible trial with the most effective req/s; the earlier one on a tie."""
        done = [r for r in self.records() if r.state == "Complete" and r.effective_rps]
        return max(done, key=lambda r: (r.effective_rps or 0.0, -r.number), default=None)

    def must_beat(self) -> float | None:
        """A lower bound of the best effective req/s so far, which a trial's search must
        be able to exceed or stop early (pruned). Not the best score itself: that is
        the highest of several noisy windows, and pruning against it stops a better
        challenger whenever one of its decisive windows is unlucky (`PRUNE_MARGIN`)."""
        best = self.best()
        if best is None or best.effective_rps is None:
            return None
        return best.effective_rps * (1.0 - PRUNE_MARGIN)

    def result(self, number: int) -> CapacityResult | None:
        """The full measurement of a trial told to this study (also one resumed from
        storage); None for failed trials and trials rebuilt from records alone."""
        trials = self._study.get_trials(deepcopy=False)
        if not 0 <= number < len(trials):
            return None
        raw = trials[number].user_attrs.get(RESULT_ATTR)
        return CapacityResult.model_validate(raw) if raw is not None else None

    def add_warm_starts(self, configs: Sequence[BatchingConfig]) -> list[BatchingConfig]:
        """Queue more fixed configurations (e.g. the simulator's proposals once the
        batch-cost curve is known), skipping any already tried or queued. Returns those
        queued. Not replayed on a rebuild: a resumed run that needs them asks again."""
        taken = [r.params for r in self._records.values()] + [p for p, _ in self._queue]
        queued: list[BatchingConfig] = []
        for config in configs:
            params = SearchSpace.params_of(config)
            if any(all(t.get(k) == v for k, v in params.items()) for t in taken):
                continue
            taken.append(params)
            self._queue.append((params, "warm-start"))
            queued.append(config)
        return queued

    def pending_fixed(self) -> int:
        """Baseline, warm-start and retry configurations not yet asked."""
        return len(self._queue)

    def measured_count(self) -> int:
        """Trials that count against a budget: interrupted ones do not, their retry does."""
        return sum(1 for r in self._records.values() if not retried(r.reason))
