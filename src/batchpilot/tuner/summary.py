"""The outcome of a tuning run as JSON first (docs/architecture.md, "How a configuration
flows"): the recommendation and the verdict that proves it, the reference configurations
measured in the same run, and the gains over them. Tables and plots are views of this."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, TypeVar

from pydantic import BaseModel

from batchpilot.models import SLA, BatchingConfig, CapacityResult
from batchpilot.tuner.config import TuneConfig
from batchpilot.tuner.edges import space_edges
from batchpilot.tuner.space import SearchSpace
from batchpilot.tuner.study import TrialRecord, Tuner
from batchpilot.tuner.verdict import Verdict

Label = Literal["baseline", "rule of thumb", "simulator", "sampler", "refine"]


class ConfigFigures(BaseModel):
    """A configuration and what it scored."""

    trial: int
    max_batch_size: int
    max_queue_time_ms: float
    effective_rps: float | None
    p99_ms: float | None
    state: str
    # a token-stream trial's tails and output tokens/s at its effective rate (its goodput)
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tokens_per_s: float | None = None


class RuntimeFigures(BaseModel):
    """The run's configurations in the tuned runtime's own knob names and units, and how
    to keep the recommendation (filled in by local mode from the runtime's adapter)."""

    name: str
    knobs: dict[str, str]  # canonical name -> native name and unit, e.g. "max_batch_time (s)"
    how_applied: str  # live, reload, restart or rollout
    baseline: dict[str, float] | None = None
    best: dict[str, float] | None = None
    recommended: dict[str, float] | None = None
    persist_kind: str | None = None  # env, configmap, ... for the recommendation
    persist_where: str | None = None
    persist_snippet: str | None = None
    verified_by: str | None = None  # how the last applied configuration was proven live


class LabelledTrial(TrialRecord):
    label: Label
    # batch size -> batches the server itself counted while the trial's configuration
    # was verified live (Triton's per-size counters); None where the server says nothing
    executed_batches: dict[int, int] | None = None
    # seconds from asking for the trial's configuration to its verification on the
    # server (a restart for vLLM, a reload or a live change elsewhere); None when the
    # change failed or was not made here
    change_s: float | None = None


def with_executed_batches(
    summary: TuneSummary,
    executed: Mapping[int, Mapping[int, int]],
    change_s: Mapping[int, float] | None = None,
) -> TuneSummary:
    """`summary` whose trials carry the batch sizes the server executed for them and
    what their change cost, by trial number."""
    changes = change_s or {}
    if not executed and not changes:
        return summary
    trials = []
    for t in summary.trials:
        update: dict[str, object] = {}
        if t.number in executed:
            update["executed_batches"] = dict(executed[t.number])
        if t.number in changes:
            update["change_s"] = changes[t.number]
        trials.append(t.model_copy(update=update) if update else t)
    return summary.model_copy(update={"trials": trials})


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
    # The finalists and the incumbent (the baseline) re-measured interleaved after the
    # study, and what that proves; None when the run was interrupted or confirmation is
    # off (then the recommendation is the study's best, unproven).
    verdict: Verdict | None = None
    recommended: BatchingConfig | None = None  # what to run: the verdict's choice
    recommendation: str = ""  # why, in a sentence with the figures
    runtime: RuntimeFigures | None = None  # local runs: the knobs in the runtime's terms
    # Finalists the confirmation left out because a rate below their capacity broke the
    # SLA, by label: the rate, where it comes from and the p99 measured there.
    light_load: dict[str, str] = {}
    # The study's best on an end of the searched range, with the way to widen it
    # (tuner.edges): there the optimum may lie outside what was searched.
    edges: list[str] = []


def finalists(
    records: Sequence[TrialRecord], incumbent: BatchingConfig, k: int
) -> list[BatchingConfig]:
    """The top `k` distinct configurations by the study's score (most effective req/s
    first, the earlier trial on a tie), never the incumbent: it is re-measured beside
    them anyway. Complete trials, and pruned ones whose partial figure (the highest
    rate they held before stopping) reached `NEAR_BEST_SHARE` of the best: one unlucky
    window pruned them, and the confirmation's rounds can tell."""
    chosen: list[BatchingConfig] = []
    for rec in finalist_candidates(records):
        config = rec.config()
        if config != incumbent and config not in chosen:
            chosen.append(config)
    return chosen[:k]


class Scored(Protocol):
    """A trial as the study scored it (a TrialRecord, or the operator's TrialEntry)."""

    @property
    def number(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def effective_rps(self) -> float | None: ...


S = TypeVar("S", bound=Scored)


def finalist_candidates(trials: Sequence[S]) -> list[S]:
    """The trials that may be finalists, best first (the earlier on a tie): the
    complete ones with a figure, and the pruned ones whose partial figure reached
    NEAR_BEST_SHARE of the best complete one."""
    complete = [t for t in trials if t.state == "Complete" and t.effective_rps]
    best = max((t.effective_rps or 0.0 for t in complete), default=0.0)
    near = [
        t
        for t in trials
        if t.state == "Pruned" and (t.effective_rps or 0.0) >= NEAR_BEST_SHARE * best > 0
    ]
    return sorted(complete + near, key=lambda t: (-(t.effective_rps or 0.0), t.number))


# A pruned trial whose partial figure reached this share of the best complete one may
# still be a finalist (see finalists).
NEAR_BEST_SHARE = 0.8


def with_verdict(
    summary: TuneSummary,
    verdict: Verdict,
    light_load: Mapping[BatchingConfig, str] | None = None,
) -> TuneSummary:
    """The summary recommending by the verdict's rule: the winner only when its gain's
    lower bound clears the margin, otherwise the incumbent, with the figures; and the
    finalists `light_load` left out, with why."""
    w = verdict.winner
    if verdict.significant:
        text = (
            f"{w.estimate:.0f} req/s, {verdict.gain_percent:+.1f} % over the incumbent "
            f"(lower bound {verdict.gain_low_percent:+.1f} % >= {verdict.min_gain_percent:g} %)"
        )
    else:
        text = f"keep the incumbent. {verdict.reason}"
    left_out = {c.label(): why for c, why in (light_load or {}).items()}
    if left_out:
        text += " Left out at light load: " + "; ".join(
            f"{label}: {why}" for label, why in left_out.items()
        )
    return summary.model_copy(
        update={
            "verdict": verdict,
            "recommended": verdict.chosen,
            "recommendation": text,
            "light_load": left_out,
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
        ttft_p99_ms=record.ttft_p99_ms,
        tpot_p99_ms=record.tpot_p99_ms,
        output_tokens_per_s=record.output_tokens_per_s,
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
        recommended=best.config() if best is not None else None,
        recommendation="the study's best, not re-measured" if best is not None else "",
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


def summary_of_study(
    tuner: Tuner,
    config: TuneConfig,
    *,
    space: SearchSpace,
    rules: Sequence[BatchingConfig],
    interrupted: bool,
    duration_s: float,
) -> TuneSummary:
    """The summary of a study as its tuner holds it, whatever ran the trials (local
    server, simulator)."""
    records = tuner.records()
    results = {r.number: res for r in records if (res := tuner.result(r.number)) is not None}
    best = tuner.best()
    summary = summarize(
        records,
        best=best,
        rules=rules,
        results=results,
        sla=config.sla,
        sampler=config.tuning.sampler,
        seed=config.tuning.seed,
        space=space.describe(),
        interrupted=interrupted,
        duration_s=duration_s,
    )
    if best is None:
        return summary
    return summary.model_copy(update={"edges": space_edges(best.config(), space)})
