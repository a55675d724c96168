"""The search space: which knobs the tuner turns, their bounds, and how each is encoded
for Optuna.

`max_batch_size` is an integer on a log scale: going from 1 to 2 matters as much as
going from 32 to 64. `max_queue_time_ms` must include 0 (no waiting at all is a real
and often good setting), which rules out a plain log scale. It is sampled as
u = ln(1 + q) with q in milliseconds: one continuous dimension (TPE and GP model it
with one kernel, no conditional "zero or not" branch), close to logarithmic above a
few milliseconds where the seed's rules of thumb live (5-15, 10-50, >= 100 ms), close
to linear below 1 ms where differences drown in scheduler jitter, and 0 is the lower
bound itself. Decoded values are rounded to 0.01 ms; `snap` maps any sampled u onto
that grid so that a value written to a trial record re-encodes to exactly the same u,
which is what lets a study be rebuilt from its records bit for bit.

Further named parameters (e.g. vLLM's `max_num_seqs`) come from configuration as
`ParameterSpec`s and are sampled as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from pydantic import model_validator
from pydantic.dataclasses import dataclass

from batchpilot.models import MAX_BATCH_SIZE_LIMIT, MAX_QUEUE_TIME_MS_LIMIT, BatchingConfig

BATCH = "max_batch_size"
QUEUE = "max_queue_time_ms"
QUEUE_INTERNAL = "log1p_max_queue_time_ms"  # the Optuna parameter behind QUEUE
QUEUE_RESOLUTION_DECIMALS = 2  # 0.01 ms

Params = dict[str, float | int]


@dataclass(frozen=True)
class ParameterSpec:
    """One extra named parameter: an int or float in [low, high], optionally log-scaled."""

    name: str
    kind: Literal["int", "float"]
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> ParameterSpec:
        if not self.name.isidentifier():
            raise ValueError(
                f"parameter name {self.name!r} must be an identifier (letters, digits, _)"
            )
        if self.name in (BATCH, QUEUE, QUEUE_INTERNAL):
            raise ValueError(f"parameter name {self.name!r} is reserved for a built-in knob")
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"parameter {self.name}: bounds must be finite numbers")
        if self.low > self.high:
            raise ValueError(
                f"parameter {self.name}: low {self.low:g} must be <= high {self.high:g}"
            )
        if self.log and self.low <= 0:
            raise ValueError(f"parameter {self.name}: a log scale needs low > 0, got {self.low:g}")
        if self.kind == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError(f"parameter {self.name}: an int parameter needs integer bounds")
        return self

    def distribution(self) -> BaseDistribution:
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(self.low, self.high, log=self.log)


def _round_queue(q: float) -> float:
    return round(q, QUEUE_RESOLUTION_DECIMALS)


class SearchSpace:
    """The knobs and their bounds; converts between knob values ("params", what records
    and users see) and Optuna's internal parameters."""

    def __init__(
        self,
        batch_bounds: tuple[int, int],
        queue_bounds: tuple[float, float],
        extra: Sequence[ParameterSpec] = (),
    ) -> None:
        self.batch_bounds = batch_bounds
        self.queue_bounds = queue_bounds
        self.extra = tuple(extra)

    @classmethod
    def from_bounds(
        cls,
        *,
        max_batch_size: tuple[int, int],
        max_queue_time_ms: tuple[float, float],
        extra: Sequence[ParameterSpec] = (),
    ) -> SearchSpace:
        """Validated construction. Queue-time bounds are moved inwards onto the 0.01 ms
        grid so every decodable value lies on it."""
        b_lo, b_hi = max_batch_size
        if int(b_lo) != b_lo or int(b_hi) != b_hi:
            raise ValueError(f"max_batch_size bounds must be integers, got {max_batch_size}")
        if not 1 <= b_lo <= b_hi <= MAX_BATCH_SIZE_LIMIT:
            raise ValueError(
                f"max_batch_size bounds must satisfy 1 <= min <= max <= {MAX_BATCH_SIZE_LIMIT},"
                f" got min={b_lo} max={b_hi}"
            )
        q_lo, q_hi = (float(v) for v in max_queue_time_ms)
        if not (math.isfinite(q_lo) and math.isfinite(q_hi)):
            raise ValueError("max_queue_time_ms bounds must be finite numbers")
        if not 0.0 <= q_lo <= q_hi <= MAX_QUEUE_TIME_MS_LIMIT:
            raise ValueError(
                "max_queue_time_ms bounds must satisfy 0 <= min <= max <= "
                f"{MAX_QUEUE_TIME_MS_LIMIT:g}, got min={q_lo:g} max={q_hi:g}"
            )
        scale = 10**QUEUE_RESOLUTION_DECIMALS
        q_lo_grid = math.ceil(round(q_lo * scale, 6)) / scale
        q_hi_grid = math.floor(round(q_hi * scale, 6)) / scale
        if q_lo_grid > q_hi_grid:
            raise ValueError(
                f"max_queue_time_ms bounds {q_lo:g}..{q_hi:g} contain no multiple of 0.01 ms"
            )
        names = [p.name for p in extra]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"extra parameters named more than once: {', '.join(duplicates)}")
        return cls((int(b_lo), int(b_hi)), (q_lo_grid, q_hi_grid), extra)

    @property
    def names(self) -> tuple[str, ...]:
        """Knob names, built-ins first."""
        return (BATCH, QUEUE, *(p.name for p in self.extra))

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna's parameters (internal names and encodings)."""
        dists: dict[str, BaseDistribution] = {
            BATCH: IntDistribution(*self.batch_bounds, log=True),
            QUEUE_INTERNAL: FloatDistribution(
                math.log1p(self.queue_bounds[0]), math.log1p(self.queue_bounds[1])
            ),
        }
        for spec in self.extra:
            dists[spec.name] = spec.distribution()
        return dists

    def distributions_for(self, internal: Mapping[str, float | int]) -> dict[str, BaseDistribution]:
        """The distributions to record a trial under: the space's, widened where a fixed
        configuration (a baseline outside the bounds) lies beyond them, so the trial
        stays valid when it is re-added to a rebuilt study."""
        dists = self.distributions()
        for name, value in internal.items():
            dist = dists[name]
            if isinstance(dist, IntDistribution) and not dist.low <= value <= dist.high:
                dists[name] = IntDistribution(
                    min(dist.low, int(value)), max(dist.high, int(value)), log=dist.log
                )
            elif isinstance(dist, FloatDistribution) and not dist.low <= value <= dist.high:
                dists[name] = FloatDistribution(
                    min(dist.low, float(value)), max(dist.high, float(value)), log=dist.log
                )
        return dists

    def encode_queue(self, q_ms: float) -> float:
        return math.log1p(q_ms)

    def decode_queue(self, u: float) -> float:
        lo, hi = self.queue_bounds
        return min(max(_round_queue(math.expm1(u)), lo), hi)

    def snap(self, name: str, value: float | int) -> float | int:
        """Map a sampled internal value onto the grid its decoded knob value lives on."""
        if name == QUEUE_INTERNAL:
            return self.encode_queue(self.decode_queue(float(value)))
        return value

    def to_internal(self, params: Mapping[str, float | int]) -> Params:
        """Knob values -> Optuna parameters. Knobs not in the space are rejected."""
        unknown = sorted(set(params) - set(self.names))
        if unknown:
            raise ValueError(
                f"unknown parameters {', '.join(unknown)}; the space has {', '.join(self.names)}"
            )
        internal: Params = {}
        for name, value in params.items():
            if name == QUEUE:
                internal[QUEUE_INTERNAL] = self.encode_queue(float(value))
            else:
                internal[name] = value
        return internal

    def from_internal(self, internal: Mapping[str, float | int]) -> Params:
        """Optuna parameters -> knob values, in the order of `names`."""
        params: Params = {}
        for name in self.names:
            if name == QUEUE:
                if QUEUE_INTERNAL in internal:
                    params[QUEUE] = self.decode_queue(float(internal[QUEUE_INTERNAL]))
            elif name in internal:
                value = internal[name]
                params[name] = int(value) if self._is_int(name) else float(value)
        return params

    def _is_int(self, name: str) -> bool:
        if name == BATCH:
            return True
        return any(p.name == name and p.kind == "int" for p in self.extra)

    @staticmethod
    def params_of(config: BatchingConfig) -> Params:
        return {BATCH: config.max_batch_size, QUEUE: config.max_queue_time_ms}

    @staticmethod
    def config_of(params: Mapping[str, float | int]) -> BatchingConfig:
        return BatchingConfig(
            max_batch_size=int(params[BATCH]), max_queue_time_ms=float(params[QUEUE])
        )

    def contains(self, config: BatchingConfig) -> bool:
        b_lo, b_hi = self.batch_bounds
        q_lo, q_hi = self.queue_bounds
        return b_lo <= config.max_batch_size <= b_hi and q_lo <= config.max_queue_time_ms <= q_hi

    def describe(self) -> str:
        parts = [
            f"{BATCH} {self.batch_bounds[0]}..{self.batch_bounds[1]} (int, log)",
            f"{QUEUE} {self.queue_bounds[0]:g}..{self.queue_bounds[1]:g} (log1p)",
        ]
        parts += [
            f"{p.name} {p.low:g}..{p.high:g} ({p.kind}{', log' if p.log else ''})"
            for p in self.extra
        ]
        return "; ".join(parts)
