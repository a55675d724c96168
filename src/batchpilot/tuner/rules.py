"""The rules of thumb for dynamic batching as concrete configurations: what a careful
person would try first without a tuner. They are measured in every run, so the gain
the tuner reports over "doing it by the book" is measured, not assumed."""

from __future__ import annotations

import math

from batchpilot.models import SLA, BatchingConfig
from batchpilot.tuner.space import SearchSpace

# Waiting may take at most this share of the latency budget: the rest is for the batch
# to run and for queueing behind the batch before it.
WAIT_SHARE_OF_SLA = 0.25


def _power_of_two_at_most(n: float) -> int:
    return 1 if n < 2 else 2 ** math.floor(math.log2(n))


def _clamp(space: SearchSpace, batch: int, wait_ms: float, sla: SLA) -> BatchingConfig:
    b_lo, b_hi = space.batch_bounds
    q_lo, q_hi = space.queue_bounds
    wait = min(wait_ms, sla.scale_ms() * WAIT_SHARE_OF_SLA)
    return BatchingConfig(
        max_batch_size=min(max(batch, b_lo), b_hi),
        max_queue_time_ms=round(min(max(wait, q_lo), q_hi), 2),
    )


def rule_of_thumb(space: SearchSpace, sla: SLA) -> BatchingConfig:
    """The rule of thumb: a batch cap at half of what fits safely (the space's upper
    bound is what the user declared safe), rounded down to a power of two because that
    is what people pick, and a 10 ms wait, the low end of the general 10-50 ms band
    since a p99 SLA is what is being defended."""
    return _clamp(space, _power_of_two_at_most(space.batch_bounds[1] / 2), 10.0, sla)


def short_request_rule(space: SearchSpace, sla: SLA) -> BatchingConfig:
    """The seed's rule for short, high-rate requests (the reference mix is mostly
    single rows): batch 8-16, wait 10-30 ms; the middle of both bands."""
    return _clamp(space, 12, 20.0, sla)


def rules_of_thumb(space: SearchSpace, sla: SLA) -> list[BatchingConfig]:
    """Both rules, the general one first (it is the one gains are quoted against);
    one when they coincide after clamping."""
    general, short = rule_of_thumb(space, sla), short_request_rule(space, sla)
    return [general] if short == general else [general, short]
