"""Arrival processes: when the requests of an open-loop run are due. One traffic model
for the load generator and the simulator, so a service is measured and simulated under
the same traffic.

Every process is asked for `count` arrivals at a mean rate and a seed; `arrival_times`
turns that into send offsets from 0 whose mean rate over the counted window is exactly
the rate asked for (a free count or span would stray by about 1/sqrt(n), enough to fail
or pass capacity steps by luck). The whole schedule is computed before a run so the
generator's hot loop only compares clocks.

How a process follows the rate of each step of a capacity search:
- poisson, constant: time is divided by the rate;
- mmpp: the mean rate is the step's rate; the burst factor, the share of time in bursts
  and the mean burst length (seconds) stay as given, as a real traffic spike would;
- trace: the recorded gaps are scaled by (recorded rate / step rate), so the recorded
  shape plays faster or slower, and repeats from the start when it runs out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, ValidationError

from batchpilot.models import Frozen

FloatArray = npt.NDArray[np.float64]


class Poisson(Frozen):
    """The memoryless traffic of many independent users: exponential gaps."""

    kind: Literal["poisson"] = "poisson"
    scale_free: ClassVar[bool] = True

    def times(self, n: int, rate: float, rng: np.random.Generator) -> FloatArray:
        gaps = rng.exponential(1.0 / rate, size=n)
        return np.cumsum(gaps)


class Constant(Frozen):
    """One request every 1/rate seconds: no burstiness at all (a best case)."""

    kind: Literal["constant"] = "constant"
    scale_free: ClassVar[bool] = True

    def times(self, n: int, rate: float, rng: np.random.Generator) -> FloatArray:
        return np.arange(n, dtype=np.float64) / rate


class MMPP(Frozen):
    """Two-state Markov-modulated Poisson process: bursts at `burst_factor` times the
    quiet rate, `high_fraction` of the time, each burst lasting `mean_burst_s` on average.
    The mean rate is the rate asked for; burst lengths stay in seconds whatever the rate,
    as a real traffic spike would."""

    kind: Literal["mmpp"] = "mmpp"
    # Burst lengths are seconds whatever the rate: the schedule at rate 2r is not the one
    # at rate r played twice as fast.
    scale_free: ClassVar[bool] = False
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
    scale_free: ClassVar[bool] = True
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


ArrivalProcess = Annotated[Poisson | Constant | MMPP | Trace, Field(discriminator="kind")]
ArrivalKind = Poisson | Constant | MMPP | Trace


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
    return trace_from_timestamps(values, f"trace {path}")


def trace_from_timestamps(values: Sequence[float], where: str) -> Trace:
    """A trace from recorded timestamps (seconds); `where` names them in errors."""
    if len(values) < 2:
        raise TraceError(f"{where}: needs at least 2 timestamps, found {len(values)}")
    stamps = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(stamps)):
        raise TraceError(f"{where}: timestamps must be finite numbers")
    gaps = np.diff(stamps)
    if np.any(gaps < 0):
        first = int(np.argmax(gaps < 0)) + 1
        raise TraceError(f"{where}: timestamps must not decrease (entry {first} goes back in time)")
    if gaps.sum() <= 0:
        raise TraceError(f"{where}: timestamps must span a positive time")
    return Trace(gaps_s=tuple(float(g) for g in gaps))


SIMPLE_ARRIVALS = ("poisson", "constant")
ARRIVAL_SYNTAX = (
    "poisson, constant, mmpp, mmpp:FACTOR,FRACTION,BURST_S, "
    "mmpp:factor=F,fraction=H,burst_s=S (any of the three) or trace:FILE"
)


def arrival_times(
    process: ArrivalKind, count: int, rate: float, seed: int, *, window_from: int = 0
) -> FloatArray:
    """`count` send offsets in seconds, ascending, the first at 0, scaled so that
    arrivals `window_from` .. count-1 come at exactly `rate` per second (`window_from`
    is where the measured window begins; the simulator leaves out a warm-up share)."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if not 0 <= window_from < count:
        raise ValueError(f"window_from must be in [0, {count}), got {window_from}")
    raw = process.times(count, rate, np.random.default_rng([seed, 2]))
    times: FloatArray = raw - raw[0]
    span = float(times[-1] - times[window_from])
    if span > 0:
        times = times * ((count - 1 - window_from) / rate / span)
    return times


def schedule(rate: float, duration_s: float, arrival: ArrivalKind | str, seed: int) -> list[float]:
    """The load generator's schedule: round(rate x duration) send offsets in
    [0, duration_s), ascending, at exactly `rate` on average over the window."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration must be a positive number of seconds, got {duration_s}")
    process = as_arrival(arrival)
    count = max(1, round(rate * duration_s))
    offsets: list[float] = arrival_times(process, count, rate, seed).tolist()
    return offsets


def as_arrival(arrival: ArrivalKind | str) -> ArrivalKind:
    """A process, or one named by `parse_arrival`'s syntax."""
    if isinstance(arrival, str):
        return parse_arrival(arrival)
    return arrival


def parse_arrival(text: str) -> ArrivalKind:
    """poisson | constant | mmpp | mmpp:FACTOR,FRACTION,BURST_S |
    mmpp:factor=F,fraction=H,burst_s=S | trace:FILE. Raises ValueError saying what is
    allowed (TraceError for a trace file that cannot be replayed)."""
    kind, sep, rest = text.strip().partition(":")
    if kind in SIMPLE_ARRIVALS and not sep:
        return Poisson() if kind == "poisson" else Constant()
    if kind == "trace" and rest:
        return load_trace(Path(rest))
    if kind == "mmpp":
        return _parse_mmpp(text, rest)
    raise ValueError(f"arrival {text!r} is not one of: {ARRIVAL_SYNTAX}")


_MMPP_KEYS = {"factor": "burst_factor", "fraction": "high_fraction", "burst_s": "mean_burst_s"}


def _parse_mmpp(text: str, rest: str) -> MMPP:
    if not rest:
        return MMPP()
    parts = [p.strip() for p in rest.split(",")]
    fields: dict[str, float] = {}
    try:
        if all("=" in p for p in parts):
            for part in parts:
                key, _, value = part.partition("=")
                if key.strip() not in _MMPP_KEYS:
                    raise ValueError(
                        f"arrival {text!r}: unknown mmpp key {key.strip()!r}; "
                        f"the keys are {', '.join(_MMPP_KEYS)}"
                    )
                fields[_MMPP_KEYS[key.strip()]] = float(value)
        elif len(parts) == 3 and not any("=" in p for p in parts):
            fields = dict(zip(_MMPP_KEYS.values(), (float(p) for p in parts), strict=True))
        else:
            raise ValueError(
                f"arrival {text!r}: mmpp takes three numbers FACTOR,FRACTION,BURST_S "
                "or keys factor=, fraction=, burst_s="
            )
        return MMPP.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_key_of(str(e['loc'][0]))} {e['msg'].lower()}" for e in exc.errors()
        )
        raise ValueError(
            f"arrival {text!r}: {problems} (factor in [1, 1000], fraction in (0, 1), burst_s > 0)"
        ) from None
    except ValueError as exc:
        if str(exc).startswith("arrival "):
            raise
        raise ValueError(
            f"arrival {text!r}: mmpp values must be numbers, e.g. mmpp:4,0.2,0.5"
        ) from None


def _key_of(field_name: str) -> str:
    return next((k for k, v in _MMPP_KEYS.items() if v == field_name), field_name)


def describe_arrival(process: ArrivalKind) -> str:
    """A short label for reports, in `parse_arrival`'s syntax where it can be."""
    if isinstance(process, MMPP):
        return (
            f"mmpp:factor={process.burst_factor:g},fraction={process.high_fraction:g},"
            f"burst_s={process.mean_burst_s:g}"
        )
    if isinstance(process, Trace):
        return f"trace ({len(process.gaps_s) + 1} arrivals, {process.native_rate:.4g} req/s)"
    return process.kind
