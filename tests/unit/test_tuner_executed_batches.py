"""Each trial of a tune run carries the batch sizes the server counted while its change
was verified, and what the change cost: only from the verification of that trial's own
configuration."""

from __future__ import annotations

from batchpilot.models import SLA, BatchingConfig
from batchpilot.runtimes.base import Verification
from batchpilot.tuner.localmode import verified_batches
from batchpilot.tuner.summary import LabelledTrial, TuneSummary, with_executed_batches

CONFIG = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.0)


def verification(requested: BatchingConfig, batches: dict[int, int] | None) -> Verification:
    return Verification(
        requested=requested,
        live=requested,
        native={"max_batch_size": requested.max_batch_size},
        batch_sizes=batches,
        verified_by="config read-back",
        change_s=1.0,
    )


def test_the_batches_of_this_trials_own_verification_are_kept() -> None:
    assert verified_batches(verification(CONFIG, {4: 2, 16: 3}), CONFIG) == {4: 2, 16: 3}


def test_a_verification_of_another_configuration_says_nothing_of_this_trial() -> None:
    # the trial's change failed: the last verification is the previous trial's
    before = BatchingConfig(max_batch_size=8, max_queue_time_ms=2.0)
    assert verified_batches(verification(before, {8: 4}), CONFIG) is None


def test_a_server_that_does_not_count_batches_gives_none() -> None:
    assert verified_batches(verification(CONFIG, None), CONFIG) is None
    assert verified_batches(None, CONFIG) is None


def summary_of(trials: int) -> TuneSummary:
    return TuneSummary(
        sla=SLA(p99_ms=100.0),
        sampler="TPE",
        seed=0,
        space="",
        best=None,
        baseline=None,
        rule_of_thumb=None,
        gain_over_baseline=None,
        gain_over_rule_of_thumb=None,
        interrupted=False,
        duration_s=1.0,
        trials=[
            LabelledTrial(
                number=i,
                params={"max_batch_size": 8 * (i + 1), "max_queue_time_ms": 0.0},
                source="baseline" if i == 0 else "sampler",
                state="Complete",
                label="baseline" if i == 0 else "sampler",
            )
            for i in range(trials)
        ],
        measurements={},
    )


def test_each_trial_carries_its_own_batches_and_the_cost_of_its_change() -> None:
    summary = with_executed_batches(summary_of(3), {1: {16: 2}}, {0: 0.01, 1: 37.5})
    assert [t.executed_batches for t in summary.trials] == [None, {16: 2}, None]
    # trial 2's change failed: no cost of its own, not the previous trial's
    assert [t.change_s for t in summary.trials] == [0.01, 37.5, None]
    assert with_executed_batches(summary_of(2), {}).trials == summary_of(2).trials
