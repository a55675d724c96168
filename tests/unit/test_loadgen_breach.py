"""The breach rule's arithmetic: how many of a window's planned requests may be over
the bound with its nearest-rank p99 still within it."""

from __future__ import annotations

import pytest

from batchpilot.loadgen.breach import BreachRule, allowance, certain, reason


@pytest.mark.parametrize(
    ("planned", "allowed"), [(1, 0), (50, 0), (99, 0), (100, 1), (199, 1), (200, 2), (1000, 10)]
)
def test_allowance_is_what_nearest_rank_p99_leaves_above_it(planned: int, allowed: int) -> None:
    assert allowance(planned) == allowed
    # the p99 of `planned` values with `allowed` of them huge is still a small one
    values = sorted([1.0] * (planned - allowed) + [1e9] * allowed)
    rank = -(-99 * planned // 100)  # ceil(0.99 * planned)
    assert values[rank - 1] == 1.0
    if allowed < planned:
        worse = sorted([1.0] * (planned - allowed - 1) + [1e9] * (allowed + 1))
        assert worse[rank - 1] == 1e9


def test_certain_only_past_the_allowance() -> None:
    assert not certain(1, 100)
    assert certain(2, 100)
    assert certain(1, 50)
    assert not certain(0, 50)
    assert not certain(3, 0)  # nothing planned: nothing to judge


def test_the_reason_names_the_counts_and_the_bound() -> None:
    assert reason(13, 600, 250.0, 0.31) == (
        "stopped after 0.31 s: 13 of its 600 measured requests were already over 250 ms "
        "(answered slower, failed or still waiting), more than the 6 a p99 within the SLA "
        "allows"
    )


@pytest.mark.parametrize("bound", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bound_must_be_a_positive_number(bound: float) -> None:
    with pytest.raises(ValueError, match="p99 bound must be > 0 ms"):
        BreachRule(bound)
