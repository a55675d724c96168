"""When a window's p99 is certain to break its bound before the window ends: the rule
that lets a step on production pods stop as soon as its verdict is known instead of
loading them to its end (InPlace trials, docs/production-safety.md).

The SLA's p99 counts every failed request as infinitely slow (`capacity.steps`), so a
request answered slower than the bound, one that failed, and one still in flight past
the bound (it can only end slow or failed) all count against it. Of `planned` measured
requests, nearest-rank p99 stays within the bound only while at most
planned - ceil(0.99 * planned) of them are over it: one more, and no answer to the rest
can bring the p99 back."""

from __future__ import annotations

import math
from dataclasses import dataclass

QUANTILE = 0.99


@dataclass(frozen=True)
class BreachRule:
    """Stop a run once its p99 over the `planned` measured requests must exceed
    `bound_ms`."""

    bound_ms: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bound_ms) and self.bound_ms > 0):
            raise ValueError(f"the p99 bound must be > 0 ms, got {self.bound_ms:g}")


def allowance(planned: int) -> int:
    """How many of `planned` requests may be over the bound with the p99 still within it."""
    return planned - math.ceil(QUANTILE * planned)


def certain(over: int, planned: int) -> bool:
    """Whether `over` requests over the bound already put the p99 of `planned` above it."""
    return planned > 0 and over > allowance(planned)


def reason(over: int, planned: int, bound_ms: float, after_s: float) -> str:
    """Why a run stopped early, for the step's verdict."""
    return (
        f"stopped after {after_s:.2f} s: {over} of its {planned} measured requests were "
        f"already over {bound_ms:g} ms (answered slower, failed or still waiting), more "
        f"than the {allowance(planned)} a p99 within the SLA allows"
    )
