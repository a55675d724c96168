"""Robust trend statistics over a window's latency slices: how fast the queue grew."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept) of the Theil-Sen line: the median of pairwise slopes, robust to
    a few outlying points that a least-squares fit would follow."""
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    ]
    if not slopes:
        raise ValueError("a trend needs at least two points at different times")
    slope = statistics.median(slopes)
    intercept = statistics.median(y - slope * x for x, y in points)
    return slope, intercept


def mann_kendall_p(values: Sequence[float]) -> float:
    """One-sided p-value of an increasing trend in `values` taken in order (Mann-Kendall
    S with its normal approximation and continuity correction; ties count zero)."""
    n = len(values)
    if n < 3:
        return 1.0
    s = sum((b > a) - (b < a) for i, a in enumerate(values) for b in values[i + 1 :])
    if s <= 0:
        return 1.0
    variance = n * (n - 1) * (2 * n + 5) / 18.0
    z = (s - 1) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


# A rise of the slice medians counts as queue growth only when it is a trend at this
# one-sided level (Mann-Kendall): slices of a few dozen requests have noisy medians, and
# counting every chance rise would lower each configuration's goodput by its noise.
GROWTH_ALPHA = 0.05


def queue_growth_s(points: Sequence[tuple[float, float]], span_s: float) -> float:
    """Seconds by which the median latency (ms, against time in s) rose over `span_s` on
    its Theil-Sen line; 0 when it did not rise significantly (GROWTH_ALPHA) or there
    are fewer than three points. The requests of a window that a server served as they
    came complete over the window's span; one that fell behind needs this much longer
    to answer them."""
    ordered = sorted(points)
    if len(ordered) < 3 or mann_kendall_p([y for _, y in ordered]) >= GROWTH_ALPHA:
        return 0.0
    slope_ms_per_s, _ = theil_sen(ordered)
    return max(0.0, slope_ms_per_s * span_s / 1000.0)
