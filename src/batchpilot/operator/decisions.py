"""What the operator does next, as pure functions of (spec, status, observed world).

Nothing here talks to Kubernetes or the clock: the handlers and the study runner pass
`now` and the objects they read, and act on what comes back. That keeps every decision
unit-testable without a cluster (docs/architecture.md, "The parts"; its `operator-pure`
contract keeps it so).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from batchpilot.models import SLA, BatchingConfig
from batchpilot.operator import selectors
from batchpilot.operator.envknobs import MILLISECONDS, WaitEncoding
from batchpilot.operator.spec import (
    MAX_BATCH_SIZE,
    MAX_QUEUE_TIME_MS,
    InferenceServiceSpec,
    Params,
    batching_config,
)
from batchpilot.operator.specdiff import study_fingerprint
from batchpilot.operator.status import (
    MAX_CONDITIONS,
    TRIALS_KEPT,
    Condition,
    Confirmation,
    InferenceServiceStatus,
    OriginalConfig,
    Result,
    TrialEntry,
    TrialsSummary,
)

# backoff_delay lives with the retry helper; handlers and tests know it by this name too.
from batchpilot.retry import backoff_delay as backoff_delay
from batchpilot.tuner.confirm import looks_of
from batchpilot.tuner.runner import round_order
from batchpilot.tuner.study import INVALID, retried
from batchpilot.tuner.summary import finalist_candidates
from batchpilot.tuner.verdict import (
    Estimate,
    Verdict,
    decide,
    gain_over_incumbent,
    undecided,
)

PlanKind = Literal[
    "idle",
    "new-study",
    "adopt-spec",
    "record-original",
    "trial",
    "confirm",
    "finish",
    "write-back",
    "fail",
]
FINISHED_STATES = frozenset({"Complete", "Pruned", "Infeasible"})
ACTIVE_PHASES = frozenset({"Pending", "Baseline", "Tuning", "Confirming"})
# Round r of the confirmation offers every configuration the load of seed + this x (r + 1).
ROUND_SEED_STRIDE = 7919


@dataclass(frozen=True)
class Plan:
    kind: PlanKind
    reason: str = ""


def plan(spec: InferenceServiceSpec, status: InferenceServiceStatus, generation: int) -> Plan:
    """The next step of the study for this generation of the spec."""
    if status.observed_generation != generation:
        if (
            status.observed_generation is not None
            and status.phase not in ("Failed", "RolledBack")
            and status.study_fingerprint == study_fingerprint(spec)
        ):
            # an edit the study does not depend on (writeBack, maxTrials, ...): a failed
            # or rolled-back study is rerun instead, the edit being the user's way to
            # retry it
            return Plan("adopt-spec", f"spec generation {generation} keeps the study")
        return Plan("new-study", f"spec generation {generation} has no study yet")
    if write_back_action(spec, status) == "apply":
        # writeBack turned to Apply on a converged study: its result goes through the
        # same gates as a study's own end (suspend, window, verification, rollback)
        return Plan("write-back", "writeBack Apply on a converged study")
    if status.phase in ("Converged", "Failed", "RolledBack"):
        return Plan("idle", f"study of generation {generation} is {status.phase}")
    if status.stopping is not None:
        # a measurement met what retrying cannot cure, and the study had not ended on it
        # yet (an operator restart came in between)
        return Plan("fail", status.stopping)
    if status.original is None:
        return Plan("record-original", "the target's configuration is not recorded yet")
    confirmation = status.confirmation
    if confirmation is not None:
        if next_measurement(confirmation, spec) is None:
            return Plan("finish", confirmation.reason)
        return Plan("confirm", confirmation.reason)
    if len(status.trials) >= TRIALS_KEPT:
        # the tuner rebuilds from a gap-free history, so the study ends before any of
        # it would have to be summarised away
        return _trials_done(spec, status, f"the trial history is full ({TRIALS_KEPT} trials)")
    failures = consecutive_failures(status.trials)
    if failures >= spec.tuning.max_failures:
        return Plan("fail", f"{failures} trials in a row failed")
    finished = sum(1 for t in status.trials if t.state in FINISHED_STATES)
    finished += status.trials_summary.complete if status.trials_summary else 0
    if finished >= spec.tuning.max_trials:
        return _trials_done(spec, status, f"all {spec.tuning.max_trials} trials done")
    patience = spec.tuning.patience
    if patience is not None and trials_since_improvement(status.trials) >= patience:
        return _trials_done(spec, status, f"no improvement in the last {patience} trials")
    return Plan("trial")


def _trials_done(spec: InferenceServiceSpec, status: InferenceServiceStatus, reason: str) -> Plan:
    """After the trials: confirm when there is something to confirm, else finish."""
    if start_confirmation(spec, status.trials, reason) is not None:
        return Plan("confirm", reason)
    return Plan("finish", reason)


def start_confirmation(
    spec: InferenceServiceSpec, trials: Sequence[TrialEntry], reason: str
) -> Confirmation | None:
    """The confirmation phase for these trials: the top `tuning.finalists` distinct
    configurations by the study's score (Complete trials, and Pruned ones within
    NEAR_BEST_SHARE of the best; most req/s first, the earlier on a tie) and the
    incumbent, the baseline trial's configuration. None when there is no measured
    baseline or no finalist besides it (nothing to compare). Finalists are distinct in
    their batching knobs; one that differs from a better one only in extra parameters
    is left out."""
    baseline = baseline_trial(trials)
    if spec.tuning.finalists == 0 or baseline is None or baseline.state not in FINISHED_STATES:
        return None
    incumbent = batching_config(baseline.params)
    seen = {incumbent}
    finalists: list[dict[str, float | int]] = []
    for trial in finalist_candidates(trials):
        config = batching_config(trial.params)
        if config not in seen and len(finalists) < spec.tuning.finalists:
            seen.add(config)
            finalists.append(dict(trial.params))
    if not finalists:
        return None
    return Confirmation(
        reason=reason,
        finalists=finalists,
        incumbent=dict(baseline.params),
        rounds=spec.tuning.confirm_rounds,
        max_rounds=spec.tuning.max_confirm_rounds,
    )


def next_measurement(
    confirmation: Confirmation, spec: InferenceServiceSpec
) -> tuple[int, Params] | None:
    """(round, params) of the next measurement: the finalists and the incumbent, each
    round in its own order drawn from `tuning.seed` and the round
    (runner.round_order); None once every round is measured. After `rounds`
    rounds, another whole round while the verdict is undecided (`verdict.undecided`), up
    to `max_rounds`. Rebuilt from the measurements in status alone, so a restarted
    operator resumes where it stopped."""
    order = [*confirmation.finalists, confirmation.incumbent]
    done = len(confirmation.measurements)
    completed, within = divmod(done, len(order))
    this_round = round_order(order, completed, spec.tuning.seed)
    if within or completed < confirmation.rounds:
        return completed, dict(this_round[within])
    cap = confirmation.max_rounds if confirmation.max_rounds is not None else confirmation.rounds
    if completed >= cap or not undecided(verdict_of(confirmation, spec)):
        return None
    return completed, dict(this_round[0])


def verdict_of(confirmation: Confirmation, spec: InferenceServiceSpec) -> Verdict:
    """The verdict on the confirmation's complete rounds (tuner/verdict.py)."""
    rounds: dict[BatchingConfig, list[float]] = {}
    for m in confirmation.measurements:
        rounds.setdefault(batching_config(m.params), []).append(m.effective_rps)
    return decide(
        rounds,
        batching_config(confirmation.incumbent),
        min_gain_percent=spec.tuning.min_gain_percent,
        seed=spec.tuning.seed,
        looks=looks_of(confirmation.rounds, confirmation.max_rounds),
    )


def params_of(confirmation: Confirmation, config: BatchingConfig) -> Params:
    """The full parameters (extras included) of a configuration in the confirmation."""
    for params in [*confirmation.finalists, confirmation.incumbent]:
        if batching_config(params) == config:
            return dict(params)
    raise ValueError(f"{config.label()} is not part of this confirmation")


def estimate_result(
    verdict: Verdict,
    estimate: Estimate,
    params: Mapping[str, float | int],
    generation: int | None,
    trial: int | None,
) -> Result:
    """A status result from the confirmation: the rounds' estimate and interval, and
    the gain over the incumbent with its interval."""
    gain, low, high = gain_over_incumbent(verdict, estimate)
    return Result(
        max_batch_size=estimate.config.max_batch_size,
        max_queue_time_ms=estimate.config.max_queue_time_ms,
        params=dict(params),
        effective_rps=round(estimate.estimate, 1),
        effective_rps_low=round(estimate.low, 1),
        effective_rps_high=round(estimate.high, 1),
        gain_percent=round(gain, 1),
        gain_low_percent=round(low, 1),
        gain_high_percent=round(high, 1),
        trial=trial,
        generation=generation,
    )


def trial_of(trials: Iterable[TrialEntry], params: Mapping[str, float | int]) -> int | None:
    """The first finished trial that measured exactly these parameters."""
    for trial in trials:
        if trial.state in FINISHED_STATES and dict(trial.params) == dict(params):
            return trial.number
    return None


def consecutive_failures(trials: Sequence[TrialEntry]) -> int:
    """Failed trials at the end of the history; a Running or Interrupted one (cut short
    by a restart or a change of leader, not by its configuration) ends no streak and
    adds nothing to it, nor does a Failed one that is asked again because something
    outside disturbed it (tuner `retried`: an autoscaler)."""
    count = 0
    for trial in reversed(trials):
        if trial.state in ("Running", "Interrupted") or (
            trial.state == "Failed" and retried(trial.reason)
        ):
            continue
        if trial.state != "Failed":
            break
        count += 1
    return count


# Trials an autoscaler may disturb in one study and have measured again; each one after
# that counts as a failed trial (towards maxFailures and maxTrials), so an HPA that
# answers every InPlace trial's load by scaling ends the study instead of having
# production loaded again and again until the trial history fills.
MAX_DISTURBED_TRIALS = 3


def disturbed_trial_is_retried(earlier_reasons: Iterable[str]) -> bool:
    """Whether a trial an autoscaler disturbed is measured again with no verdict, given
    the reasons of the study's other trials: while fewer than MAX_DISTURBED_TRIALS were."""
    disturbed = sum(1 for reason in earlier_reasons if reason.startswith(INVALID))
    return disturbed < MAX_DISTURBED_TRIALS


def disturbed_trial_failure(message: str) -> str:
    """The reason of a disturbed trial past MAX_DISTURBED_TRIALS: the disturbance and
    what to do about it."""
    return (
        f"ScaledDuringTrial: {message}; {MAX_DISTURBED_TRIALS} trials of this study were "
        "already measured again after an autoscaler changed the replicas, so this one "
        "counts as failed: hold the replicas still while tuning (the autoscaler's "
        "minReplicas = maxReplicas) or tune a canary (tuning.strategy Canary)"
    )


def trials_since_improvement(trials: Sequence[TrialEntry]) -> int:
    """Finished trials after the one that set the best so far."""
    best = 0.0
    since = 0
    for trial in trials:
        if trial.state not in FINISHED_STATES:
            continue
        rps = trial.effective_rps or 0.0
        if trial.state == "Complete" and rps > best:
            best, since = rps, 0
        else:
            since += 1
    return since


def phase_for(trials: Sequence[TrialEntry]) -> Literal["Baseline", "Tuning"]:
    """Baseline until the first trial has a result, Tuning afterwards."""
    if any(t.source == "baseline" and t.state not in ("Running", "Interrupted") for t in trials):
        return "Tuning"
    if any(t.source == "baseline" for t in trials):
        return "Baseline"
    return "Tuning" if trials else "Baseline"


def new_study(previous: InferenceServiceStatus, generation: int) -> InferenceServiceStatus:
    """A fresh status for a new generation. Conditions carry over so their transition
    times stay true; results of the old generation do not."""
    return InferenceServiceStatus(
        phase="Pending",
        observed_generation=generation,
        message=f"new study for spec generation {generation}",
        conditions=previous.conditions,
    )


WriteBackAction = Literal["apply", "withhold"]


def chosen_params(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> Params | None:
    """The configuration the finished study would write back: the confirmed winner when
    its gain was proven, the best trial when nothing was confirmed and it measured
    minGainPercent above the incumbent, else None (also when that best trial is the
    incumbent's own configuration: writing it would only take the target's fields over)."""
    confirmation = status.confirmation
    if confirmation is not None:
        verdict = verdict_of(confirmation, spec)
        return params_of(confirmation, verdict.chosen) if verdict.significant else None
    best = best_trial(status.trials)
    if (
        best is None
        or incumbent_unbeaten(spec, status.trials, best)
        or study_gain_shortfall(spec, status.trials, best) is not None
    ):
        return None
    return dict(best.params)


def write_back_action(
    spec: InferenceServiceSpec, status: InferenceServiceStatus
) -> WriteBackAction | None:
    """For a converged study under an edited writeBack: `apply` the chosen configuration
    now (Recommend → Apply), `withhold` it by putting the original back (Apply →
    Recommend after it was written), or nothing."""
    if status.phase != "Converged":
        return None
    if spec.tuning.write_back == "Apply" and not status.applied:
        return "apply" if chosen_params(spec, status) is not None else None
    if spec.tuning.write_back == "Recommend" and status.applied:
        return "withhold" if status.original is not None else None
    return None


def rolling_back(status: InferenceServiceStatus) -> bool:
    """A rollback of a write-back that broke the target has started and not finished."""
    return status.phase != "RolledBack" and any(
        c.type == "Degraded" and c.reason == "RollingBack" for c in status.conditions
    )


def needs_cleanup(status: InferenceServiceStatus, strategy: str) -> tuple[bool, bool]:
    """(delete the canary, restore the original) for a study that stops before its end:
    deletion of the resource, a spec change, or a failure. A rollback under way is
    finished whatever the strategy: the target runs the values that broke it."""
    delete_canary = status.canary is not None
    restore = status.original is not None and (
        rolling_back(status)
        or (
            strategy == "InPlace"
            and not status.restored
            and not status.applied
            and status.phase in ACTIVE_PHASES
        )
    )
    return delete_canary, restore


def cleanup_left(status: InferenceServiceStatus, spec: InferenceServiceSpec) -> str:
    """What a cleanup that gave up leaves behind, for the event a person reads."""
    delete_canary, restore = needs_cleanup(status, spec.tuning.strategy)
    left: list[str] = []
    if delete_canary:
        left.append(f"canary Deployment {status.canary} (garbage-collected with its owner)")
    if restore and status.original is not None:
        shown = status.original.env or status.original.params
        running = (
            "the written-back configuration that broke it"
            if rolling_back(status)
            else "the trial's configuration"
        )
        left.append(
            f"{spec.target.kind} {spec.target.name} still runs {running}; its original was {shown}"
        )
    return "; ".join(left) or "nothing"


# measure_capacity's own ceiling when no load budget is set
UNCAPPED_RPS = 1e6


def load_ceiling(max_rps_per_pod: float | None, pods: int) -> float:
    """The highest rate a trial may offer: the per-pod budget times the pods it is
    spread over."""
    if max_rps_per_pod is None:
        return UNCAPPED_RPS
    return max_rps_per_pod * max(pods, 1)


def set_condition(
    conditions: Sequence[Condition],
    *,
    type: str,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Conditions with `type` set; lastTransitionTime moves only when status changes."""
    result: list[Condition] = []
    previous: Condition | None = None
    for condition in conditions:
        if condition.type == type:
            previous = condition
        else:
            result.append(condition)
    changed = previous is None or previous.status != status
    transition = now if changed or previous is None else previous.last_transition_time
    result.append(
        Condition(
            type=type,
            status=status,
            reason=reason,
            message=message[:1024],
            last_transition_time=transition,
            observed_generation=generation,
        )
    )
    return sorted(result, key=lambda c: c.type)[-MAX_CONDITIONS:]


def bound_trials(
    trials: Sequence[TrialEntry], summary: TrialsSummary | None
) -> tuple[list[TrialEntry], TrialsSummary | None]:
    """Keep the newest TRIALS_KEPT trials; fold older ones into the summary."""
    if len(trials) <= TRIALS_KEPT:
        return list(trials), summary
    old, kept = trials[: len(trials) - TRIALS_KEPT], trials[len(trials) - TRIALS_KEPT :]
    base = summary or TrialsSummary()
    folded = TrialsSummary(
        count=base.count + len(old),
        complete=base.complete + sum(1 for t in old if t.state in FINISHED_STATES),
        failed=base.failed + sum(1 for t in old if t.state == "Failed"),
        interrupted=base.interrupted + sum(1 for t in old if t.state == "Interrupted"),
        last_number=max(t.number for t in old),
    )
    return list(kept), folded


def result_of(trial: TrialEntry, generation: int | None) -> Result:
    return Result(
        max_batch_size=int(trial.params[MAX_BATCH_SIZE]),
        max_queue_time_ms=float(trial.params[MAX_QUEUE_TIME_MS]),
        params=dict(trial.params),
        effective_rps=trial.effective_rps,
        p99_ms=trial.p99_ms,
        error_rate=trial.error_rate,
        ttft_p99_ms=trial.ttft_p99_ms,
        tpot_p99_ms=trial.tpot_p99_ms,
        trial=trial.number,
        generation=generation,
    )


def best_trial(trials: Iterable[TrialEntry]) -> TrialEntry | None:
    """The Complete trial with the highest effective throughput (first wins a tie)."""
    best: TrialEntry | None = None
    for trial in trials:
        if trial.state != "Complete" or not trial.effective_rps:
            continue
        if best is None or trial.effective_rps > (best.effective_rps or 0.0):
            best = trial
    return best


def incumbent_unbeaten(
    spec: InferenceServiceSpec, trials: Sequence[TrialEntry], best: TrialEntry
) -> bool:
    """With a confirmation asked for (`tuning.finalists` > 0), whether the study's best is
    the incumbent itself (every challenger measured lower or was pruned below it): then
    there is no finalist to confirm and nothing to write back."""
    baseline = baseline_trial(trials)
    return (
        spec.tuning.finalists > 0
        and baseline is not None
        and batching_config(best.params) == batching_config(baseline.params)
    )


def study_gain_shortfall(
    spec: InferenceServiceSpec, trials: Sequence[TrialEntry], best: TrialEntry
) -> str | None:
    """With the confirmation off (`tuning.finalists` 0) the study's best is unproven, so
    the gain gate applies to the study's own figures: the best is written back (or
    recommended) only when it measured at least `minGainPercent` above the incumbent.
    The reason it is not, or None when it may be. An incumbent that met the SLA nowhere
    (or was never measured) is beaten by any best."""
    if spec.tuning.finalists > 0:
        return None
    baseline = baseline_trial(trials)
    if baseline is None or not baseline.effective_rps:
        return None
    best_rps = best.effective_rps or 0.0
    gain = 100.0 * (best_rps / baseline.effective_rps - 1.0)
    minimum = spec.tuning.min_gain_percent
    if gain >= minimum:
        return None
    return (
        f"the study's best {describe_params(best.params)} measured {best_rps:.0f} req/s, "
        f"{gain:+.1f} % over the incumbent {describe_params(baseline.params)} "
        f"({baseline.effective_rps:.0f} req/s), below minGainPercent {minimum:g} % "
        "(unconfirmed: finalists 0)"
    )


def baseline_trial(trials: Iterable[TrialEntry]) -> TrialEntry | None:
    finished = [
        t for t in trials if t.source == "baseline" and t.state not in ("Running", "Interrupted")
    ]
    return finished[-1] if finished else None


def _fmt(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def describe_params(params: Mapping[str, float | int]) -> str:
    parts = [f"batch={int(params[MAX_BATCH_SIZE])}", f"wait={_fmt(params[MAX_QUEUE_TIME_MS])}ms"]
    parts += [
        f"{k}={_fmt(v)}" for k, v in params.items() if k not in (MAX_BATCH_SIZE, MAX_QUEUE_TIME_MS)
    ]
    return " ".join(parts)


def trial_message(trial: TrialEntry, sla: SLA) -> str:
    """The event text of a finished trial, e.g.
    `Trial 7: batch=8 wait=30ms → 620 req/s, p99 287 ms ≤ 300 ms`."""
    head = f"Trial {trial.number}: {describe_params(trial.params)}"
    if trial.state == "Complete" and trial.effective_rps is not None:
        p99 = ""
        if trial.p99_ms is not None and sla.p99_ms is not None:
            p99 = f", p99 {trial.p99_ms:.0f} ms ≤ {sla.p99_ms:g} ms"
        if trial.client_bound:
            # the score is a lower bound: the event says so, and why the client stopped
            return f"{head} → ≥ {trial.effective_rps:.0f} req/s{p99}; {trial.reason}"
        return f"{head} → {trial.effective_rps:.0f} req/s{p99}"
    if trial.state == "Pruned":
        return f"{head} → pruned: cannot beat the best so far ({trial.reason or 'stopped early'})"
    if trial.state == "Infeasible":
        return f"{head} → no rate met the SLA ({trial.reason or sla.describe()})"
    if trial.state == "Failed":
        return f"{head} → failed: {trial.reason or 'unknown error'}"
    if trial.state == "Interrupted":
        return f"{head} → {trial.reason}"
    return f"{head} → running"


def clamp_params(params: Mapping[str, float | int], spec: InferenceServiceSpec) -> Params:
    """Values moved into the search space (a baseline outside it is still a start)."""
    space = spec.parameters
    result: Params = dict(params)
    result[MAX_BATCH_SIZE] = min(
        max(int(params[MAX_BATCH_SIZE]), space.max_batch_size.min), space.max_batch_size.max
    )
    low, high = spec.queue_bounds()
    result[MAX_QUEUE_TIME_MS] = min(max(float(params.get(MAX_QUEUE_TIME_MS, low)), low), high)
    for extra in space.extra:
        if extra.name in params:
            value = min(max(float(params[extra.name]), extra.min), extra.max)
            result[extra.name] = round(value) if extra.kind == "int" else value
    return result


def rule_of_thumb(spec: InferenceServiceSpec) -> Params:
    """The rule-of-thumb starting point (as `tuner.rules`): batch at about 2/3 of the largest
    allowed, wait 10-30 ms, inside the search space."""
    space = spec.parameters
    batch = max(space.max_batch_size.min, round(space.max_batch_size.max * 2 / 3))
    low, high = spec.queue_bounds()
    wait = min(max(20.0, low), high)
    return {MAX_BATCH_SIZE: batch, MAX_QUEUE_TIME_MS: wait}


# --- the observed world: workloads and pods -------------------------------------------


def find_container(workload: Mapping[str, Any], name: str | None) -> Mapping[str, Any] | None:
    containers = workload.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    if not containers:
        return None
    if name is None:
        first: Mapping[str, Any] = containers[0]
        return first
    for container in containers:
        if container.get("name") == name:
            found: Mapping[str, Any] = container
            return found
    return None


def env_values(container: Mapping[str, Any], names: Iterable[str]) -> dict[str, str | None]:
    """Plain values of the named variables (None: unset or set from a reference)."""
    present = {e.get("name"): e.get("value") for e in container.get("env", []) or []}
    return {name: present.get(name) for name in names}


def params_from_env(
    env: Mapping[str, str | None],
    env_names: Mapping[str, str],
    wait: WaitEncoding = MILLISECONDS,
) -> Params | None:
    """Parameter values read from the environment, the wait converted from `wait`'s unit;
    None when a batching knob is unset (the server then runs its built-in default, which
    the operator cannot see)."""
    params: Params = {}
    for param, variable in env_names.items():
        raw = env.get(variable)
        if raw is None:
            if param in (MAX_BATCH_SIZE, MAX_QUEUE_TIME_MS):
                return None
            continue
        try:
            number = float(raw)
        except ValueError:
            return None
        if param == MAX_BATCH_SIZE:
            params[param] = int(number)
        else:
            params[param] = wait.from_env(number) if param == MAX_QUEUE_TIME_MS else number
    return params


def original_config(
    workload: Mapping[str, Any],
    spec: InferenceServiceSpec,
    now: datetime,
    wait: WaitEncoding = MILLISECONDS,
) -> OriginalConfig:
    container = find_container(workload, spec.target.container) or {}
    names = spec.env_names()
    env = env_values(container, names.values())
    params = with_pinned_wait(params_from_env(env, names, wait) or {}, spec)
    return OriginalConfig(params=params, env=env, recorded_at=now)


def with_pinned_wait(params: Params, spec: InferenceServiceSpec) -> Params:
    """`params` read from the variables, the queue wait at 0 where the runtime has none
    (no variable carries it)."""
    if params and spec.wait_pinned:
        return {**params, MAX_QUEUE_TIME_MS: 0.0}
    return params


def format_env_value(param: str, value: float | int) -> str:
    if param == MAX_BATCH_SIZE or float(value).is_integer():
        return str(int(value))
    return f"{float(value):g}"


def env_apply_patch(
    workload: Mapping[str, Any], container: str, env: Mapping[str, str | None]
) -> dict[str, Any]:
    """A server-side apply body that sets exactly these variables on one container.
    Variables given as None are left out, so an apply releases them: fields only the
    `batchpilot` manager owned disappear, which restores an originally unset variable."""
    meta = workload.get("metadata", {})
    entries = [{"name": k, "value": v} for k, v in sorted(env.items()) if v is not None]
    return {
        "apiVersion": workload.get("apiVersion", "apps/v1"),
        "kind": workload.get("kind", "Deployment"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {"template": {"spec": {"containers": [{"name": container, "env": entries}]}}},
    }


def env_for_params(
    params: Mapping[str, float | int],
    env_names: Mapping[str, str],
    wait: WaitEncoding = MILLISECONDS,
) -> dict[str, str]:
    """The variables carrying `params`, the wait written in `wait`'s unit."""
    return {
        env_names[name]: (
            wait.to_env(value) if name == MAX_QUEUE_TIME_MS else format_env_value(name, value)
        )
        for name, value in params.items()
        if name in env_names
    }


@dataclass(frozen=True)
class Rollout:
    done: bool
    message: str
    # the controller gave up (ReplicaFailure, progress deadline): waiting will not help
    failed: bool = False
    reason: str = ""


def _rollout_failure(status: Mapping[str, Any]) -> Rollout | None:
    """What the workload controller itself reports as failed: pods it cannot create
    (quota, admission: ReplicaFailure) or no progress within the Deployment's
    progressDeadlineSeconds (Progressing=False, ProgressDeadlineExceeded)."""
    for condition in status.get("conditions", []) or []:
        kind, state = condition.get("type"), condition.get("status")
        message = str(condition.get("message") or "").strip()
        if kind == "ReplicaFailure" and state == "True":
            why = condition.get("reason") or "ReplicaFailure"
            return Rollout(
                False, f"replicas cannot be created: {why}: {message}", True, "ReplicaFailure"
            )
        if (
            kind == "Progressing"
            and state == "False"
            and condition.get("reason") == "ProgressDeadlineExceeded"
        ):
            return Rollout(
                False,
                f"the rollout made no progress within progressDeadlineSeconds: {message}",
                True,
                "ProgressDeadlineExceeded",
            )
    return None


def rollout_status(workload: Mapping[str, Any]) -> Rollout:
    """Whether a Deployment or StatefulSet runs its current template on every replica."""
    meta = workload.get("metadata", {})
    spec = workload.get("spec", {})
    status = workload.get("status", {}) or {}
    want = spec.get("replicas", 1)
    generation = meta.get("generation", 0)
    if status.get("observedGeneration", 0) < generation:
        return Rollout(False, "the controller has not seen the new template yet")
    stuck = _rollout_failure(status)
    if stuck is not None:
        return stuck
    updated = status.get("updatedReplicas", 0)
    ready = status.get("readyReplicas", 0)
    total = status.get("replicas", 0)
    if updated < want:
        return Rollout(False, f"{updated} of {want} replicas updated")
    if total > want:
        return Rollout(False, f"{total - want} old replicas still terminating")
    if ready < want:
        return Rollout(False, f"{ready} of {want} replicas ready")
    if workload.get("kind") == "StatefulSet":
        if status.get("updateRevision") and status.get("currentRevision") != status.get(
            "updateRevision"
        ):
            return Rollout(False, "the StatefulSet is still rolling to its new revision")
    elif status.get("availableReplicas", 0) < want:
        return Rollout(False, f"{status.get('availableReplicas', 0)} of {want} replicas available")
    return Rollout(True, f"{want} replicas updated and ready")


@dataclass(frozen=True)
class PodProblem:
    reason: str  # CamelCase, for conditions and events
    message: str
    fatal: bool  # waiting longer will not help
    # since when, by the pod's own condition (the API server's clock), where it says
    since: datetime | None = None


_FATAL_WAITING = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
        "InvalidImageName",
        "CreateContainerError",
    }
)


def pod_problem(pods: Sequence[Mapping[str, Any]]) -> PodProblem | None:
    """The first reason in these pods' status that a person must act on."""
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        status = pod.get("status", {}) or {}
        for condition in status.get("conditions", []) or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                return PodProblem(
                    "Unschedulable",
                    f"pod {name} cannot be scheduled: {condition.get('message', '')}".strip(),
                    fatal=False,
                    since=_parse_time(condition.get("lastTransitionTime")),
                )
        for container in status.get("containerStatuses", []) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in _FATAL_WAITING:
                detail = waiting.get("message") or f"restarted {container.get('restartCount', 0)}x"
                return PodProblem(
                    str(reason),
                    f"pod {name} container {container.get('name')}: {reason}: {detail}",
                    fatal=True,
                )
    return None


@dataclass(frozen=True)
class ProductionVerdict:
    """What Prometheus showed of production's traffic over a window: `breach` says how
    it broke the SLA, None that it kept it."""

    breach: str | None


def sla_breach(
    *,
    p99_ms: float,
    ok_rps: float,
    total_rps: float,
    sla: SLA,
    ttft_p99_ms: float = math.nan,
    tpot_p99_ms: float = math.nan,
) -> str | None:
    """How production traffic over a window broke the SLA: p99, error rate, and the
    TTFT and TPOT p99 where the server's histograms gave them (NaN: not read); None
    when it kept it, or when there was no traffic to judge."""
    if not (math.isfinite(total_rps) and total_rps > 0):
        return None
    ok = ok_rps if math.isfinite(ok_rps) else 0.0
    error_rate = max(0.0, 1.0 - ok / total_rps)
    broken: list[str] = []
    tails = (
        ("p99", p99_ms, sla.p99_ms),
        ("TTFT p99", ttft_p99_ms, sla.ttft_p99_ms),
        ("TPOT p99", tpot_p99_ms, sla.tpot_p99_ms),
    )
    for what, value, bound in tails:
        if bound is not None and math.isfinite(value) and value > bound:
            broken.append(f"{what} {value:.0f} ms > {bound:g} ms")
    if error_rate > sla.max_error_rate:
        broken.append(f"error rate {error_rate:.2%} > {sla.max_error_rate:.2%}")
    if not broken:
        return None
    return f"{', '.join(broken)} at {total_rps:.0f} req/s"


def ready_pod_ips(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """IPs of pods that are Running, Ready and not being deleted."""
    return sorted(ip for _, ip in ready_pods(pods))


def ready_pods(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(name, IP) of the pods that are Running, Ready and not being deleted, by name."""
    found: list[tuple[str, str]] = []
    for pod in pods:
        meta = pod.get("metadata", {}) or {}
        if meta.get("deletionTimestamp"):
            continue
        status = pod.get("status", {}) or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions", []) or []
        )
        if status.get("phase") == "Running" and ready and status.get("podIP"):
            found.append((str(meta.get("name", "?")), str(status["podIP"])))
    return sorted(found)


def keeps_live_winner(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> bool:
    """Whether the study's winner lives only in the target's processes: written back
    live through the runtime's API (status.persist says how to commit it), with nothing
    in the pod template that a restarted or new pod would start from."""
    return (
        status.phase == "Converged"
        and status.applied
        and not status.restored
        and spec.tuning.write_back == "Apply"
        and status.persist is not None
    )


def label_selector(workload: Mapping[str, Any]) -> str:
    """The query listing a workload's pods: `matchLabels` and `matchExpressions`.
    SelectorError when it has none (as a query, "" would list every pod)."""
    selector = selectors.from_label_selector(workload.get("spec", {}).get("selector"))
    if selector is None:
        raise selectors.SelectorError("the workload has no selector")
    return selector.query()


def _restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status", {}) or {}).get("containerStatuses", []) or []
    return sum(int(c.get("restartCount", 0)) for c in statuses)


# The client probe of a verification window without Prometheus (load.source client):
# light load on the target's pods beside production's, its p99 and errors judged
# against the SLA. Light, because it runs on production; at light load a batcher's wait
# shows whole in the p99, which is what a written-back configuration most often breaks.
PROBE_RPS_PER_POD = 2.0
# at most this share of load.maxRps per pod, when a budget is set
PROBE_BUDGET_SHARE = 0.1
# fewer requests than this in the window give no p99 worth a rollback: no verdict
PROBE_MIN_REQUESTS = 100


def probe_rate(spec: InferenceServiceSpec, pods: int, per_pod: float = PROBE_RPS_PER_POD) -> float:
    """The rate, req/s over all `pods`, of the verification window's client probe."""
    rate = per_pod * pods
    if spec.load.max_rps is not None:
        rate = min(rate, PROBE_BUDGET_SHARE * spec.load.max_rps * pods)
    return rate


def restarted_pods(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], scaled_in: int = 0
) -> str:
    """Which of the pods measured (`before`) restarted or went away by `after`; empty
    when none did. `scaled_in`: replicas the workload was scaled down by meanwhile (an
    autoscaler's scale-in): that many pods going away is the scale-in, not a failure."""
    now = {p.get("metadata", {}).get("uid"): p for p in after}
    restarted: list[str] = []
    gone: list[str] = []
    for pod in before:
        if not ready_pod_ips([pod]):
            continue  # not measured
        meta = pod.get("metadata", {})
        name = meta.get("name", "?")
        later = now.get(meta.get("uid"))
        if later is None:
            gone.append(f"pod {name} is gone")
        elif _restarts(later) > _restarts(pod):
            restarted.append(
                f"pod {name} restarted ({_restarts(pod)} → {_restarts(later)} restarts)"
            )
    if len(gone) <= scaled_in:
        gone = []
    elif scaled_in:
        gone.append(f"{scaled_in} of them by a scale-in")
    return "; ".join(restarted + gone)


def _parse_time(value: Any) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339, e.g. 2026-12-01T12:27:27Z); None when absent,
    unreadable or without a zone (it could not be compared with one that has)."""
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else None


def crashed_since(pods: Sequence[Mapping[str, Any]], since: datetime) -> str:
    """Containers of these pods whose last run ended at or after `since` (a crash, an
    OOM kill): during a trial that means its figures, or its configuration, are bad."""
    crashes: list[str] = []
    # finishedAt is written in whole seconds: a crash in the trial's first second reads as
    # before its start, so the start is taken down to its second too
    since = since.replace(microsecond=0)
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        for container in (pod.get("status", {}) or {}).get("containerStatuses", []) or []:
            ended = ((container.get("lastState") or {}).get("terminated")) or {}
            finished = _parse_time(ended.get("finishedAt"))
            if finished is not None and finished >= since:
                why = ended.get("reason") or f"exit code {ended.get('exitCode', '?')}"
                crashes.append(f"container {container.get('name')} of pod {name} exited ({why})")
    return "; ".join(crashes)
