"""Which steps are judged on their p99's upper bound: those whose window could not be
stretched to hold the minimum of requests, not those a random schedule left a few short."""

from __future__ import annotations

import pytest

from batchpilot.capacity.http import judged_min_requests, step_warmup_s, step_window_s


@pytest.mark.parametrize(
    ("rate", "step_s", "min_requests", "judged"),
    [
        (100.0, 1.0, 200, 157),  # stretched to 2.5 s: 200 on average, 200 - 3 x 14.1
        (400.0, 5.0, 2000, 1865),  # stretched to 5.56 s: 2000 on average
        (1000.0, 5.0, 2000, 2000),  # 4,500 on average: short of 2,000 only by a fault
        (20.0, 1.0, 200, 200),  # capped at 6 s: 108 on average, judged on the bound
        (50.0, 1.0, 0, 0),
    ],
)
def test_judged_minimum(rate: float, step_s: float, min_requests: int, judged: int) -> None:
    window = step_window_s(rate, step_s, min_requests)
    assert judged_min_requests(rate, window, min_requests) == judged


def test_a_capped_window_keeps_the_whole_minimum() -> None:
    window = step_window_s(20.0, 1.0, 200)
    assert window == 6.0
    assert 20.0 * (window - step_warmup_s(window)) < 200
    assert judged_min_requests(20.0, window, 200) == 200
