"""The outcome of a tuning run as JSON first (DESIGN.md §6): the recommendation, the
reference configurations measured in the same run, and the gains over them. Tables
and plots are views of this."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel

from batchpilot.models import SLA, BatchingConfig, CapacityResult
from batchpilot.tuner.study import TrialRecord

Label = Literal["baseline", "rule of thumb", "simulator", "sampler", "refine"]


class ConfigFigures(BaseModel):
    """A configuration and what it scored."""

    trial: int
    max_batch_size: int
    max_queue_time_ms: float
    effective_rps: float | None
    p99_ms: float | None
    state: str


class LabelledTrial(TrialRecord):
    label: Label


class TuneSummary(BaseModel):
    sla: SLA
    sampler: str
    seed: int
    space: str
    best: ConfigFigures | None
    baseline: ConfigFigures | None
    rule_of_thumb: ConfigFigures | None
    gain_over_baseline: float | None  # (best / baseline) - 1; None when not comparable
    gain_over_rule_of_thumb: float | None
    interrupted: bool
    duration_s: float
    trials: list[LabelledTrial]
    measurements: dict[str, CapacityResult]  # best, baseline, rule of thumb: every step
    # The same three re-measured back to back after the study (tuning.confirm): on a
    # shared machine capacity drifts over minutes, so these gains compare like with like.
    confirmed: dict[str, ConfigFigures] = {}
    confirmed_gain_over_baseline: float | None = None
    confirmed_gain_over_rule_of_thumb: float | None = None


ROLES = ("best", "baseline", "rule_of_thumb")


def roles_to_confirm(summary: TuneSummary) -> list[tuple[str, BatchingConfig]]:
    """Configurations to re-measure, best first, each once even when two roles share
    it (the baseline may be the best)."""
    chosen: list[tuple[str, BatchingConfig]] = []
    for role in ROLES:
        fig = getattr(summary, role)
        if fig is None or (role != "best" and summary.best is None):
            continue
        config = BatchingConfig(
            max_batch_size=fig.max_batch_size, max_queue_time_ms=fig.max_queue_time_ms
        )
        if all(config != c for _, c in chosen):
            chosen.append((role, config))
    return chosen


def with_confirmation(
    summary: TuneSummary, remeasured: Mapping[BatchingConfig, CapacityResult]
) -> TuneSummary:
    """The summary with the back-to-back re-measurements of its three configurations."""
    confirmed: dict[str, ConfigFigures] = {}
    for role in ROLES:
        fig = getattr(summary, role)
        if fig is None:
            continue
        config = BatchingConfig(
            max_batch_size=fig.max_batch_size, max_queue_time_ms=fig.max_queue_time_ms
        )
        result = remeasured.get(config)
        if result is not None:
            confirmed[role] = fig.model_copy(
                update={
                    "effective_rps": result.effective_rps,
                    "p99_ms": result.p99_ms,
                    "state": "Complete" if result.feasible else "Infeasible",
                }
            )

    def ratio(reference: str) -> float | None:
        best, ref = confirmed.get("best"), confirmed.get(reference)
        if best is None or ref is None or not best.effective_rps or not ref.effective_rps:
            return None
        return best.effective_rps / ref.effective_rps - 1.0

    return summary.model_copy(
        update={
            "confirmed": confirmed,
            "confirmed_gain_over_baseline": ratio("baseline"),
            "confirmed_gain_over_rule_of_thumb": ratio("rule_of_thumb"),
        }
    )


def label_of(record: TrialRecord, rules: Sequence[BatchingConfig]) -> Label:
    """Where a trial's configuration came from, in the words of the report."""
    if record.source == "baseline":
        return "baseline"
    if record.source == "warm-start":
        return "rule of thumb" if record.config() in rules else "simulator"
    if record.source == "refine":
        return "refine"
    return "sampler"


def figures(record: TrialRecord) -> ConfigFigures:
    config = record.config()
    return ConfigFigures(
        trial=record.number,
        max_batch_size=config.max_batch_size,
        max_queue_time_ms=config.max_queue_time_ms,
        effective_rps=record.effective_rps,
        p99_ms=record.p99_ms,
        state=record.state,
    )


def _measured(records: Sequence[TrialRecord], config: BatchingConfig) -> TrialRecord | None:
    """The finished, unpruned measurement of `config`, if the run has one."""
    for rec in records:
        if rec.state in ("Complete", "Infeasible") and rec.config() == config:
            return rec
    return None


def gain(best: TrialRecord | None, reference: TrialRecord | None) -> float | None:
    """Relative gain in effective throughput. An infeasible reference has no finite
    gain to quote, so None, as when either is missing."""
    if best is None or reference is None:
        return None
    if not best.effective_rps or not reference.effective_rps:
        return None
    return best.effective_rps / reference.effective_rps - 1.0


def summarize(
    records: Sequence[TrialRecord],
    *,
    best: TrialRecord | None,
    rules: Sequence[BatchingConfig],
    results: Mapping[int, CapacityResult],
    sla: SLA,
    sampler: str,
    seed: int,
    space: str,
    interrupted: bool,
    duration_s: float,
) -> TuneSummary:
    baseline_rec = next((r for r in records if r.source == "baseline"), None)
    baseline = (
        _measured(records, baseline_rec.config()) if baseline_rec is not None else None
    ) or baseline_rec
    rule = _measured(records, rules[0]) if rules else None
    measurements: dict[str, CapacityResult] = {}
    for name, rec in (("best", best), ("baseline", baseline), ("rule_of_thumb", rule)):
        if rec is not None and rec.number in results:
            measurements[name] = results[rec.number]
    return TuneSummary(
        sla=sla,
        sampler=sampler,
        seed=seed,
        space=space,
        best=figures(best) if best is not None else None,
        baseline=figures(baseline) if baseline is not None else None,
        rule_of_thumb=figures(rule) if rule is not None else None,
        gain_over_baseline=gain(best, baseline),
        gain_over_rule_of_thumb=gain(best, rule),
        interrupted=interrupted,
        duration_s=round(duration_s, 1),
        trials=[LabelledTrial(**r.model_dump(), label=label_of(r, rules)) for r in records],
        measurements=measurements,
    )
