"""Edge-of-space notes (tuner.edges): when the best sits on a widenable end of the
searched range, and the MIN..MAX ranges of tune's flags."""

from __future__ import annotations

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.tuner.edges import parse_range, space_edges
from batchpilot.tuner.space import SearchSpace


def space(batch: tuple[int, int] = (1, 64), wait: tuple[float, float] = (0, 100)) -> SearchSpace:
    return SearchSpace.from_bounds(max_batch_size=batch, max_queue_time_ms=wait)


def best(batch: int, wait: float) -> BatchingConfig:
    return BatchingConfig(max_batch_size=batch, max_queue_time_ms=wait)


def test_the_top_of_the_batch_range_is_an_edge_with_the_flag_that_widens_it() -> None:
    (note,) = space_edges(best(64, 10), space())
    assert note.startswith("max_batch_size 64 is the top of the searched range 1..64")
    assert "--batch-range" in note
    assert "parameters.max_batch_size.max" in note


def test_the_top_of_the_wait_range_is_an_edge() -> None:
    (note,) = space_edges(best(8, 100), space())
    assert note.startswith("max_queue_time_ms 100 is the top of the searched range 0..100")
    assert "--wait-range-ms" in note


def test_both_knobs_on_edges_give_two_notes_and_the_operator_names_spec_fields() -> None:
    notes = space_edges(best(64, 100), space(), operator=True)
    assert len(notes) == 2
    assert "spec.parameters.maxBatchSize.max" in notes[0]
    assert "spec.parameters.maxQueueTimeMs.max" in notes[1]


def test_a_raised_floor_is_an_edge_but_the_knobs_own_floor_is_not() -> None:
    assert space_edges(best(1, 0), space()) == []  # batch 1 and no wait: nothing below
    (note,) = space_edges(best(4, 10), space(batch=(4, 64)))
    assert note.startswith("max_batch_size 4 is the bottom of the searched range 4..64")
    assert "parameters.max_batch_size.min" in note


def test_the_knobs_own_ceiling_cannot_be_widened() -> None:
    from batchpilot.models import MAX_BATCH_SIZE_LIMIT

    assert space_edges(best(MAX_BATCH_SIZE_LIMIT, 10), space(batch=(1, MAX_BATCH_SIZE_LIMIT))) == []


def test_inside_pinned_or_outside_the_range_is_no_edge() -> None:
    assert space_edges(best(16, 20), space()) == []
    assert space_edges(best(8, 5), space(batch=(8, 8), wait=(5, 5))) == []
    # a baseline the range left out is not the range's edge
    assert space_edges(best(128, 5), space()) == []


def test_ranges_parse_and_bad_ones_say_what_is_allowed() -> None:
    assert parse_range("1..128", "--batch-range", integer=True) == (1, 128)
    assert parse_range("0..2.5", "--wait-range-ms", integer=False) == (0.0, 2.5)
    for bad in ("128", "1-128", "a..b", "1.5..4"):
        with pytest.raises(ValueError, match=r"give MIN\.\.MAX"):
            parse_range(bad, "--batch-range", integer=True)
    with pytest.raises(ValueError, match="MIN 8 must be <= MAX 4"):
        parse_range("8..4", "--batch-range", integer=True)
