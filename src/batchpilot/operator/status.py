"""The InferenceService status as typed models. The status is the study's only
persistent state: after a restart the operator rebuilds the study from it
(docs/architecture.md, "Several operator replicas"), so it carries every trial that the
tuner needs, bounded in size.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel

from batchpilot.operator.spec import MAX_CONFIRM_ROUNDS_LIMIT, MAX_FINALISTS, MAX_TRIALS_LIMIT

Phase = Literal["Pending", "Baseline", "Tuning", "Confirming", "Converged", "Failed", "RolledBack"]
TrialState = Literal["Running", "Complete", "Pruned", "Infeasible", "Failed", "Interrupted"]
# The reason of an Interrupted trial: cut short by an operator restart or a change of
# leader, it is retried next and never counts toward tuning.maxFailures.
INTERRUPTED_REASON = (
    "interrupted: the operator restarted or lost leadership mid-trial; retried, "
    "not counted as a failure"
)
TrialSource = Literal["baseline", "warm-start", "sampler", "refine"]

# Trials kept in full. A study has at most MAX_TRIALS_LIMIT trials plus retried failures,
# so the kept window normally holds the whole study and a restart rebuilds it exactly;
# older entries only ever fall into the summary when a study fails over and over.
TRIALS_KEPT = MAX_TRIALS_LIMIT + 20
# Today's conditions, the kstatus ones (Ready, Reconciling, Stalled) and room for more.
MAX_CONDITIONS = 16

# Text from errors can be any size (a server's answer, a traceback). Each text is cut to its
# cap when the status is written, so that no message makes the object too large to store:
# then every later write, the cleanup's included, would be refused. Read back as written.
MAX_MESSAGE_CHARS = 8192
# per trial and per confirmation measurement: TRIALS_KEPT of them fit in a few hundred KiB
MAX_REASON_CHARS = 1024


def clipped(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    # the tail's length grows with the count it states: room for the largest count
    kept = limit - len(f" … ({len(text)} more characters)")
    return f"{text[:kept]} … ({len(text) - kept} more characters)"


def _clip_message(text: str) -> str:
    return clipped(text, MAX_MESSAGE_CHARS)


def _clip_reason(text: str) -> str:
    return clipped(text, MAX_REASON_CHARS)


Message = Annotated[
    str,
    PlainSerializer(_clip_message, return_type=str),
    Field(json_schema_extra={"maxLength": MAX_MESSAGE_CHARS}),
]
Reason = Annotated[
    str,
    PlainSerializer(_clip_reason, return_type=str),
    Field(json_schema_extra={"maxLength": MAX_REASON_CHARS}),
]


class _Status(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="ignore",
        frozen=True,
    )


class Condition(_Status):
    """A Kubernetes-style condition."""

    type: str = Field(description="Condition type, e.g. Ready, Measuring, TargetReady.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: Message = Field(default="", description="What is happening, for a person.")
    last_transition_time: datetime | None = Field(
        default=None, description="When status last changed."
    )
    observed_generation: int | None = Field(
        default=None, description="Spec generation the condition was set for."
    )


class TrialEntry(_Status):
    """One trial: the configuration tried and what it scored."""

    number: int = Field(description="Trial number in the study, from 0 (the baseline).")
    params: dict[str, float | int] = Field(description="Values tried, by parameter name.")
    source: TrialSource = Field(description="baseline, warm-start, sampler or refine.")
    state: TrialState = Field(
        description="Running, Complete, Pruned, Infeasible, Failed, or Interrupted (cut "
        "short by an operator restart or a change of leader: retried next, not counted "
        "toward tuning.maxFailures)."
    )
    effective_rps: float | None = Field(default=None, description="Effective throughput, req/s.")
    p99_ms: float | None = Field(default=None, description="p99 at the effective rate, ms.")
    error_rate: float | None = Field(default=None, description="Error rate at the effective rate.")
    reason: Reason = Field(default="", description="Why it was pruned, infeasible or failed.")
    started_at: datetime | None = Field(default=None, description="When the trial started.")
    finished_at: datetime | None = Field(default=None, description="When the trial finished.")
    client_lag_p99_ms: float | None = Field(
        default=None, description="Worst p99 lag of the load generator's sends, ms."
    )
    client_cpu: float | None = Field(
        default=None, description="Highest CPU share of the load generator (1.0 = one core)."
    )
    client_bound: bool = Field(
        default=False,
        description="The load generator was the limit: the score is a lower bound (ClientBound).",
    )
    ttft_p99_ms: float | None = Field(
        default=None,
        description="Token streams: time-to-first-token p99 at the effective rate, ms.",
    )
    tpot_p99_ms: float | None = Field(
        default=None,
        description="Token streams: time-per-output-token p99 at the effective rate, ms.",
    )
    output_tokens_per_s: float | None = Field(
        default=None, description="Token streams: output tokens per second at the effective rate."
    )


class TrialsSummary(_Status):
    """Counts of trials that no longer fit in status.trials."""

    count: int = Field(default=0, description="Trials summarised.")
    complete: int = Field(default=0, description="Of which complete.")
    failed: int = Field(default=0, description="Of which failed.")
    interrupted: int = Field(default=0, description="Of which interrupted (and retried).")
    last_number: int | None = Field(default=None, description="Highest trial number summarised.")


class Result(_Status):
    """A configuration and its score."""

    max_batch_size: int = Field(description="max_batch_size.")
    max_queue_time_ms: float = Field(description="max_queue_time_ms.")
    params: dict[str, float | int] = Field(
        default_factory=dict, description="All parameters, extras included."
    )
    effective_rps: float | None = Field(default=None, description="Effective throughput, req/s.")
    p99_ms: float | None = Field(default=None, description="p99 at the effective rate, ms.")
    error_rate: float | None = Field(default=None, description="Error rate at the effective rate.")
    ttft_p99_ms: float | None = Field(
        default=None,
        description="Token streams: time-to-first-token p99 at the effective rate, ms.",
    )
    tpot_p99_ms: float | None = Field(
        default=None,
        description="Token streams: time-per-output-token p99 at the effective rate, ms.",
    )
    trial: int | None = Field(default=None, description="Trial that measured it.")
    generation: int | None = Field(default=None, description="Spec generation of the study.")
    effective_rps_low: float | None = Field(
        default=None,
        description="Lower end of the interval on effectiveRps over the confirmation rounds "
        "(effectiveRps is then their geometric mean).",
    )
    effective_rps_high: float | None = Field(
        default=None, description="Upper end of that interval."
    )
    gain_percent: float | None = Field(
        default=None, description="Gain over the incumbent in the confirmation rounds, %."
    )
    gain_low_percent: float | None = Field(
        default=None, description="Lower bound of that gain (the written-back rule), %."
    )
    gain_high_percent: float | None = Field(
        default=None, description="Upper bound of that gain, %."
    )


class RoundMeasurement(_Status):
    """One measurement of the confirmation phase."""

    round: int = Field(description="Round, from 0.")
    params: dict[str, float | int] = Field(description="Values measured.")
    effective_rps: float = Field(description="Effective throughput, req/s (0: none met the SLA).")
    reason: Reason = Field(default="", description="Why it scored 0, when it failed.")


class Confirmation(_Status):
    """The finalists and the incumbent measured again, interleaved (A B C I, A B C I, ...),
    one measurement per step: a restarted operator resumes at the next one."""

    reason: Message = Field(description="Why the trials ended.")
    finalists: list[dict[str, float | int]] = Field(
        description="Finalists, best first.", max_length=MAX_FINALISTS
    )
    incumbent: dict[str, float | int] = Field(description="What ran before the study.")
    rounds: int = Field(description="Rounds to measure.")
    max_rounds: int | None = Field(
        default=None,
        description="Rounds at most: after `rounds`, more while the verdict is undecided "
        "(unset: exactly `rounds`).",
    )
    measurements: list[RoundMeasurement] = Field(
        default_factory=list,
        description="Measurements so far, in the order taken.",
        # every finalist and the incumbent, in every round
        max_length=(MAX_FINALISTS + 1) * MAX_CONFIRM_ROUNDS_LIMIT,
    )
    method: str = Field(default="", description="How the verdict was reached, once it was.")


class OriginalConfig(_Status):
    """The target's configuration before the study, restored on failure or deletion."""

    params: dict[str, float | int] = Field(
        default_factory=dict, description="Values in effect, by parameter name."
    )
    env: dict[str, str | None] = Field(
        default_factory=dict,
        description="Environment variables as they were (null: not set), method Env.",
    )
    recorded_at: datetime | None = Field(default=None, description="When it was recorded.")


class PersistAdvice(_Status):
    """How to keep a configuration written back live: a live change lasts until the pod
    restarts, so the snippet belongs in the model's configuration in Git."""

    runtime: str = Field(description="spec.runtime.kind the advice is for.")
    kind: str = Field(
        description="Where it goes: env, args, configmap, serve-config or recommend (a "
        "file of the model's own configuration)."
    )
    where: str = Field(description="Where to write the snippet, for a person.")
    snippet: str = Field(description="The exact text to commit.")


class LoadWorkersEntry(_Status):
    """The load workers that sent one trial's steps."""

    trial: int = Field(description="Trial number.")
    workers: int = Field(description="Worker pods the steps were split over (1: the operator).")
    ceiling_rps: float | None = Field(
        default=None,
        description="One worker's measured ceiling, req/s (its rate at the client CPU bound).",
    )
    job: str | None = Field(default=None, description="The worker Job, when pods sent it.")


class InferenceServiceStatus(_Status):
    """What the operator has found so far."""

    phase: Phase = Field(
        default="Pending",
        description="Pending, Baseline, Tuning, Confirming, Converged, Failed, or RolledBack "
        "(the write-back broke the target and the original configuration was restored).",
    )
    observed_generation: int | None = Field(
        default=None, description="Spec generation the study in status belongs to."
    )
    message: Message = Field(default="", description="The latest news, for a person.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Conditions.", max_length=MAX_CONDITIONS
    )
    original: OriginalConfig | None = Field(
        default=None, description="Configuration before the study."
    )
    canary: str | None = Field(default=None, description="Name of the canary workload, if any.")
    stopping: Message | None = Field(
        default=None,
        description="A problem met during a measurement that retrying cannot cure "
        "(reason: message): the study fails with it once that measurement is recorded, "
        "after an operator restart too.",
    )
    baseline: Result | None = Field(default=None, description="The original configuration's score.")
    best: Result | None = Field(default=None, description="The best configuration found.")
    trials: list[TrialEntry] = Field(
        default_factory=list, description="Trials, oldest first.", max_length=TRIALS_KEPT
    )
    trials_summary: TrialsSummary | None = Field(
        default=None, description="Trials older than those kept in trials."
    )
    confirmation: Confirmation | None = Field(
        default=None, description="The confirmation phase after the trials."
    )
    applied: bool = Field(
        default=False, description="The best configuration was written back to the target."
    )
    restored: bool = Field(
        default=False, description="The original configuration was put back on the target."
    )
    study_fingerprint: str | None = Field(
        default=None,
        description="Digest of the spec fields the study depends on: an edit that leaves it "
        "unchanged (writeBack, maxTrials, patience, ...) continues the study.",
    )
    trials_progress: str | None = Field(
        default=None, description="Finished trials / tuning.maxTrials, e.g. 7/20."
    )
    gain_percent: float | None = Field(
        default=None,
        description="Gain of the best over the baseline, %: the confirmation's when it ran, "
        "else the trials' own figures.",
    )
    measured_pods: int | None = Field(
        default=None, description="Ready pods the latest trial's load was spread over."
    )
    rate_scope: str | None = Field(
        default=None,
        description="What the req/s figures cover: per-pod (one pod measured) or fleet "
        "(measuredPods pods together).",
    )
    started_with: str | None = Field(
        default=None,
        description="What cleanup needs of the spec the study started with (target, "
        "runtime, apply, strategy), as JSON: after an edit or a restart the canary and the "
        "original configuration are undone where the study made them.",
        max_length=8192,
    )
    load_workers: list[LoadWorkersEntry] = Field(
        default_factory=list,
        description="Per trial with load.workers.max above 1: how many load workers sent "
        "its steps and their ceiling, oldest first.",
        max_length=TRIALS_KEPT,
    )
    persist: PersistAdvice | None = Field(
        default=None,
        description="For a runtime written back live: the snippet that keeps the "
        "configuration across pod restarts, to commit with the model's configuration.",
    )
    live_reapplied: int = Field(
        default=0,
        description="A winner written back live: pods found on other values (restarted, or "
        "new) and set to it again since the write-back, each with a LiveReapplied event.",
    )
    suspended: bool = Field(
        default=False,
        description="spec.suspend took effect: no trial runs, the canary is gone and an "
        "InPlace target runs its original configuration until suspend is false again.",
    )
    waiting_until: datetime | None = Field(
        default=None,
        description="Outside the maintenance window: when the next one opens.",
    )
    retunes: int = Field(default=0, description="Studies started over by tuning.retune.")
    last_retune_at: datetime | None = Field(
        default=None, description="When the latest re-tune started a new study."
    )
    last_retune_reason: Message = Field(default="", description="Why it did.")
    next_retune_at: datetime | None = Field(
        default=None,
        description="A Converged study with tuning.retune: the next SLA check (OnSLABreach) "
        "or schedule tick.",
    )
    retune_key: str | None = Field(
        default=None, description="The tuning.retune setting nextRetuneAt was computed for."
    )
    retune_held: Message = Field(
        default="",
        description="OnSLABreach with strategy InPlace: the SLA breach that calls for a "
        "re-tune, held until production keeps the SLA over a whole retuneWindow (an InPlace "
        "trial adds load to the target itself, never to one that breaches).",
    )
    previous_best: Result | None = Field(
        default=None, description="The best of the study the latest re-tune replaced."
    )
