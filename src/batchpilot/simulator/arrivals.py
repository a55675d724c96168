"""Arrival processes: when requests reach the service, as a sorted array of seconds.

Each process is asked for `n` arrivals at a mean rate; the same seed gives the same
array, so every configuration of a study is judged against the same traffic.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from batchpilot.models import Frozen

FloatArray = npt.NDArray[np.float64]


class Poisson(Frozen):
    kind: Literal["poisson"] = "poisson"

    def times(self, n: int, rate: float, rng: np.random.Generator) -> FloatArray:
        gaps = rng.exponential(1.0 / rate, size=n)
        return np.cumsum(gaps)


class MMPP(Frozen):
    """Two-state Markov-modulated Poisson process: bursts at `burst_factor` times the
    quiet rate, `high_fraction` of the time, each burst lasting `mean_burst_s` on average.
    The mean rate is the rate asked for; burst lengths stay in seconds whatever the rate,
    as a real traffic spike would."""

    kind: Literal["mmpp"] = "mmpp"
    burst_factor: Annotated[float, Field(ge=1.0, le=1000.0)] = 4.0
    high_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    mean_burst_s: Annotated[float, Field(gt=0.0)] = 0.5

    def times(self, n: int, rate: float, rng: np.random.Generator) -> FloatArray:
        low_rate = rate / (1.0 - self.high_fraction + self.high_fraction * self.burst_factor)
        high_rate = low_rate * self.burst_factor
        mean_quiet_s = self.mean_burst_s * (1.0 - self.high_fraction) / self.high_fraction
        # Alternate quiet and burst sojourns until they hold n arrivals; draw in chunks
        # sized from the expected need so one or two rounds usually suffice.
        starts: list[FloatArray] = []
        lengths: list[FloatArray] = []
        rates: list[FloatArray] = []
        clock = 0.0
        have = 0
        cycle_s = mean_quiet_s + self.mean_burst_s
        while have < n:
            cycles = max(8, math.ceil(1.3 * (n - have) / (rate * cycle_s)) + 8)
            quiet = rng.exponential(mean_quiet_s, size=cycles)
            burst = rng.exponential(self.mean_burst_s, size=cycles)
            seg_len = np.column_stack([quiet, burst]).ravel()
            seg_rate = np.tile([low_rate, high_rate], cycles)
            seg_start = clock + np.concatenate([[0.0], np.cumsum(seg_len)[:-1]])
            clock = float(seg_start[-1] + seg_len[-1])
            counts = rng.poisson(seg_rate * seg_len)
            have += int(counts.sum())
            starts.append(seg_start)
            lengths.append(seg_len)
            rates.append(counts.astype(np.float64))
        seg_start = np.concatenate(starts)
        seg_len = np.concatenate(lengths)
        counts = np.concatenate(rates).astype(np.int64)
        # Given its count, a Poisson segment's arrivals are uniform within it.
        offsets = np.repeat(seg_start, counts)
        spans = np.repeat(seg_len, counts)
        times = np.sort(offsets + rng.random(offsets.size) * spans)
        return times[:n]


class Trace(Frozen):
    """Recorded arrival timestamps, replayed with their gaps scaled so the mean rate is
    the rate asked for (and repeated if more arrivals are needed than recorded)."""

    kind: Literal["trace"] = "trace"
    gaps_s: Annotated[tuple[float, ...], Field(min_length=1)]

    @property
    def native_rate(self) -> float:
        return len(self.gaps_s) / sum(self.gaps_s)

    def times(self, n: int, rate: float, rng: np.random.Generator) -> FloatArray:
        gaps = np.asarray(self.gaps_s)
        # Start at a seeded offset in the trace so seeds differ, like windows of real traffic.
        start = int(rng.integers(gaps.size))
        reps = math.ceil((n + start) / gaps.size)
        tiled = np.tile(gaps, reps)[start : start + n]
        return np.cumsum(tiled * (self.native_rate / rate))


ArrivalProcess = Annotated[Poisson | MMPP | Trace, Field(discriminator="kind")]


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message says why."""


def load_trace(path: Path) -> Trace:
    """Timestamps in seconds: a JSON list, or one number per line (blank lines and lines
    starting with # are skipped). They must not decrease and must span a positive time."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            raw = json.loads(stripped)
            if not isinstance(raw, list):
                raise TraceError(f"trace {path}: expected a JSON list of numbers")
            values = [float(v) for v in raw]
        else:
            values = [
                float(line.split()[0])
                for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith("#")
            ]
    except (ValueError, TypeError) as exc:
        raise TraceError(
            f"trace {path}: not a list of timestamps in seconds ({exc}); "
            "expected a JSON list or one number per line"
        ) from None
    if len(values) < 2:
        raise TraceError(f"trace {path}: needs at least 2 timestamps, found {len(values)}")
    stamps = np.asarray(values)
    if not np.all(np.isfinite(stamps)):
        raise TraceError(f"trace {path}: timestamps must be finite numbers")
    gaps = np.diff(stamps)
    if np.any(gaps < 0):
        first = int(np.argmax(gaps < 0)) + 1
        raise TraceError(
            f"trace {path}: timestamps must not decrease (entry {first} goes back in time)"
        )
    if gaps.sum() <= 0:
        raise TraceError(f"trace {path}: timestamps must span a positive time")
    return Trace(gaps_s=tuple(float(g) for g in gaps))
