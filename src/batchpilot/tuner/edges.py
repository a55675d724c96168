"""Whether a study's best lies on the edge of the space it searched.

A best at the top of the batch range (64 of 1..64) says only that the optimum is 64 or
beyond: the sampler could not look further. The run says so, with the way to widen the
range, instead of presenting the edge as an optimum."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from batchpilot.models import MAX_BATCH_SIZE_LIMIT, MAX_QUEUE_TIME_MS_LIMIT, BatchingConfig
from batchpilot.tuner.space import BATCH, QUEUE, SearchSpace


@dataclass(frozen=True)
class Widen:
    """How a user widens one knob's range, per interface."""

    cli_flag: str  # tune's flag, MIN..MAX
    config_key: str  # the --config file's key (and the operator's spec, camelCase)
    spec_key: str


WIDEN: Mapping[str, Widen] = {
    BATCH: Widen("--batch-range", "parameters.max_batch_size", "spec.parameters.maxBatchSize"),
    QUEUE: Widen(
        "--wait-range-ms", "parameters.max_queue_time_ms", "spec.parameters.maxQueueTimeMs"
    ),
}

# the bounds past which no range can be widened: the knobs' own limits
_FLOOR: Mapping[str, float] = {BATCH: 1, QUEUE: 0.0}
_CEILING: Mapping[str, float] = {BATCH: MAX_BATCH_SIZE_LIMIT, QUEUE: MAX_QUEUE_TIME_MS_LIMIT}


def space_edges(best: BatchingConfig, space: SearchSpace, *, operator: bool = False) -> list[str]:
    """One sentence per knob of `best` at an end of its searched range that could be
    widened. Not an edge: a knob's own floor (a batch of 1, no wait), a knob pinned to
    one value (min = max), or a best outside the range (a baseline the range left out,
    which the sampler never proposed)."""
    if not space.contains(best):
        return []
    bounds = {BATCH: space.batch_bounds, QUEUE: space.queue_bounds}
    values: dict[str, float] = {BATCH: best.max_batch_size, QUEUE: best.max_queue_time_ms}
    notes = []
    for name, (low, high) in bounds.items():
        value = values[name]
        if low == high:
            continue
        widen = WIDEN[name]
        how = (
            f"raise {widen.spec_key}.max"
            if operator
            else f"widen it with {widen.cli_flag} (or {widen.config_key}.max in --config)"
        )
        if value >= high and high < _CEILING[name]:
            notes.append(
                f"{name} {value:g} is the top of the searched range {low:g}..{high:g}: the "
                f"best may lie above it; {how}, up to {_CEILING[name]:g}"
            )
        elif value <= low and low > _FLOOR[name]:
            lowered = (
                f"lower {widen.spec_key}.min"
                if operator
                else f"widen it with {widen.cli_flag} (or {widen.config_key}.min in --config)"
            )
            notes.append(
                f"{name} {value:g} is the bottom of the searched range {low:g}..{high:g}: "
                f"the best may lie below it; {lowered}"
            )
    return notes


def parse_range(text: str, what: str, *, integer: bool) -> tuple[float, float]:
    """'MIN..MAX' -> (min, max); ValueError says what is allowed."""
    low_text, sep, high_text = text.partition("..")
    try:
        if not sep:
            raise ValueError
        low = int(low_text) if integer else float(low_text)
        high = int(high_text) if integer else float(high_text)
    except ValueError:
        kind = "whole numbers" if integer else "numbers"
        raise ValueError(f"{what} {text!r}: give MIN..MAX with {kind}, e.g. 1..128") from None
    if low > high:
        raise ValueError(f"{what} {text!r}: MIN {low:g} must be <= MAX {high:g}")
    return low, high
