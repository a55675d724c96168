"""Each trial of a tune run carries the batch sizes the server counted while its change
was verified: only from the verification of that trial's own configuration."""

from __future__ import annotations

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import Verification
from batchpilot.tuner.localmode import verified_batches

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
