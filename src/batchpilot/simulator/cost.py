"""The batch cost model t(b, sizes): how long the worker is busy with one batch.

Linear in the batch's rows by default (`fixed_ms + per_row_ms * rows + per_request_ms * b`),
which is how a batched forward pass behaves until the accelerator saturates; a table of
measured points is allowed where the curve is not straight. `rows` is the sum of the
request sizes, or `b * max(size)` for a model that pads every request to the longest
(`rows_basis="padded"`).

Models are fitted from the reference server's `GET /admin/profile` JSON, whose `batches`
list gives, per batch size, how many batches ran, their mean compute time and their mean
rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from batchpilot.models import Frozen

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

RowsBasis = Literal["sum", "padded"]


def _calibrated_terms(per_request_ms: float, overhead_ms: float, handover_ms: float) -> str:
    """The label's tail for the terms calibration sets (empty when none is)."""
    return (
        (f" + {per_request_ms:.3g} ms/request" if per_request_ms else "")
        + (f" (+{overhead_ms:.3g} ms outside the worker)" if overhead_ms else "")
        + (f" ({handover_ms:.3g} ms of it hand-over)" if handover_ms else "")
    )


class LinearCost(Frozen):
    kind: Literal["linear"] = "linear"
    fixed_ms: Annotated[float, Field(ge=0.0)]
    per_row_ms: Annotated[float, Field(ge=0.0)]
    per_request_ms: Annotated[float, Field(ge=0.0)] = 0.0
    # Latency every request pays outside the worker (HTTP, JSON, scheduling): it adds to
    # latency but does not occupy the worker.
    overhead_ms: Annotated[float, Field(ge=0.0)] = 0.0
    # The part of each batch's time spent handing it to the model process and its reply
    # back (a server's profile times a batch from hand-over to reply). A batch handed over
    # ahead, while another computes, hides it (see `engine`).
    handover_ms: Annotated[float, Field(ge=0.0)] = 0.0
    rows_basis: RowsBasis = "sum"

    def batch_ms(self, batch_sizes: IntArray, rows: FloatArray) -> FloatArray:
        return self.fixed_ms + self.per_row_ms * rows + self.per_request_ms * batch_sizes

    def scalar_s(self) -> Callable[[int, float], float]:
        """t(b, rows) in seconds on plain floats, for the per-batch loop."""
        fixed, row, request = self.fixed_ms / 1e3, self.per_row_ms / 1e3, self.per_request_ms / 1e3
        return lambda b, rows: fixed + row * rows + request * b

    def label(self) -> str:
        return f"t = {self.fixed_ms:.3g} ms + {self.per_row_ms:.3g} ms/row" + _calibrated_terms(
            self.per_request_ms, self.overhead_ms, self.handover_ms
        )


class TableCost(Frozen):
    """Measured (rows, compute ms) points, interpolated linearly and extended past the last
    point along the last segment's slope."""

    kind: Literal["table"] = "table"
    rows: Annotated[tuple[float, ...], Field(min_length=2)]
    compute_ms: Annotated[tuple[float, ...], Field(min_length=2)]
    per_request_ms: Annotated[float, Field(ge=0.0)] = 0.0  # as LinearCost's, on top
    overhead_ms: Annotated[float, Field(ge=0.0)] = 0.0
    handover_ms: Annotated[float, Field(ge=0.0)] = 0.0  # as LinearCost's
    rows_basis: RowsBasis = "sum"

    @model_validator(mode="after")
    def _check(self) -> TableCost:
        if len(self.rows) != len(self.compute_ms):
            raise ValueError("rows and compute_ms must have the same length")
        if any(b <= a for a, b in zip(self.rows, self.rows[1:], strict=False)):
            raise ValueError("rows must be strictly increasing")
        if any(t < 0 for t in self.compute_ms):
            raise ValueError("compute_ms must be non-negative")
        return self

    def batch_ms(self, batch_sizes: IntArray, rows: FloatArray) -> FloatArray:
        xs = np.asarray(self.rows)
        ys = np.asarray(self.compute_ms)
        inside: FloatArray = np.interp(rows, xs, ys)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        beyond = ys[-1] + max(slope, 0.0) * (rows - xs[-1])
        computed: FloatArray = np.where(rows > xs[-1], beyond, inside)
        return computed + self.per_request_ms * batch_sizes

    def scalar_s(self) -> Callable[[int, float], float]:
        """t(b, rows) in seconds on plain floats, for the per-batch loop."""
        xs = list(self.rows)
        ys = [t / 1e3 for t in self.compute_ms]
        last_slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        request = self.per_request_ms / 1e3

        def compute(rows: float) -> float:
            if rows >= xs[-1]:
                return ys[-1] + last_slope * (rows - xs[-1])
            if rows <= xs[0]:
                return ys[0]
            j = bisect.bisect_right(xs, rows)
            frac = (rows - xs[j - 1]) / (xs[j] - xs[j - 1])
            return ys[j - 1] + frac * (ys[j] - ys[j - 1])

        return lambda b, rows: compute(rows) + request * b

    def label(self) -> str:
        return (
            f"table of {len(self.rows)} points, rows {self.rows[0]:g}..{self.rows[-1]:g}"
            + _calibrated_terms(self.per_request_ms, self.overhead_ms, self.handover_ms)
        )


CostModel = Annotated[LinearCost | TableCost, Field(discriminator="kind")]
_COST_ADAPTER: TypeAdapter[LinearCost | TableCost] = TypeAdapter(CostModel)


class ProfileError(ValueError):
    """A profile from which no cost model can be fitted; the message says why."""


def parse_cost_model(data: Any) -> LinearCost | TableCost:
    """A cost model from its JSON form (what `model_dump(mode="json")` wrote)."""
    try:
        return _COST_ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "cost model"
        raise ProfileError(
            f"invalid cost model at {where}: {first['msg']} "
            '(expected {"kind": "linear", "fixed_ms", "per_row_ms"} or '
            '{"kind": "table", "rows": [...], "compute_ms": [...]})'
        ) from None


def _profile_points(profile: Mapping[str, Any]) -> list[tuple[float, float, float, float]]:
    """(batch_size, rows, mean compute ms, count) per profiled batch size."""
    batches = profile.get("batches")
    if not isinstance(batches, Sequence) or isinstance(batches, str):
        raise ProfileError('profile has no "batches" list (expected GET /admin/profile JSON)')
    points = []
    for i, entry in enumerate(batches):
        if not isinstance(entry, Mapping):
            raise ProfileError(f"profile batches[{i}] is not an object")
        try:
            b = float(entry["batch_size"])
            count = float(entry["count"])
            ms = float(entry["mean_compute_ms"])
            rows = float(entry.get("mean_rows", b))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(
                f"profile batches[{i}] needs numeric batch_size, count, mean_compute_ms "
                f"(and optionally mean_rows): {exc}"
            ) from None
        if count > 0 and ms >= 0 and b >= 1:
            points.append((b, rows, ms, count))
    return points


def _nonneg_line(x: FloatArray, y: FloatArray, w: FloatArray) -> tuple[float, float]:
    """Weighted least squares y = c0 + c1 x with c0, c1 >= 0 (a negative fixed cost or a
    negative per-row cost is noise, not physics)."""
    sw = np.sqrt(w)
    design = np.column_stack([np.ones_like(x), x]) * sw[:, None]
    (c0, c1), *_ = np.linalg.lstsq(design, y * sw, rcond=None)
    if c0 >= 0 and c1 >= 0:
        return float(c0), float(c1)
    if c1 < 0:  # flat: the weighted mean
        return float(max(np.average(y, weights=w), 0.0)), 0.0
    through_origin = float(np.sum(w * x * y) / np.sum(w * x * x))
    return 0.0, max(through_origin, 0.0)


def fit_cost_model(
    profile: Mapping[str, Any],
    *,
    kind: Literal["linear", "table"] = "linear",
    overhead_ms: float = 0.0,
    rows_basis: RowsBasis = "sum",
) -> LinearCost | TableCost:
    """A cost model from the server's `/admin/profile` JSON.

    Linear: count-weighted least squares of mean compute time on mean rows (batch sizes
    with many batches are measured better). Table: one point per distinct mean rows.
    Needs at least two distinct row counts: one point cannot separate the fixed cost of a
    batch from its per-row cost, which is exactly what decides the best batch size."""
    points = _profile_points(profile)
    distinct_rows = {round(p[1], 9) for p in points}
    if len(distinct_rows) < 2:
        raise ProfileError(
            f"profile has {len(points)} usable batch size(s) with {len(distinct_rows)} distinct "
            "row count(s); fitting needs batches of at least two sizes "
            "(run load at several batch sizes first)"
        )
    rows = np.array([p[1] for p in points])
    ms = np.array([p[2] for p in points])
    counts = np.array([p[3] for p in points])
    if kind == "linear":
        c0, c1 = _nonneg_line(rows, ms, counts)
        return LinearCost(
            fixed_ms=c0, per_row_ms=c1, overhead_ms=overhead_ms, rows_basis=rows_basis
        )
    order = np.argsort(rows, kind="stable")
    xs: list[float] = []
    ys: list[float] = []
    weights: list[float] = []
    for i in order:  # merge points with equal rows, weighted by count
        if xs and abs(xs[-1] - rows[i]) < 1e-9:
            total = weights[-1] + counts[i]
            ys[-1] = (ys[-1] * weights[-1] + ms[i] * counts[i]) / total
            weights[-1] = total
        else:
            xs.append(float(rows[i]))
            ys.append(float(ms[i]))
            weights.append(float(counts[i]))
    return TableCost(
        rows=tuple(xs),
        compute_ms=tuple(ys),
        overhead_ms=overhead_ms,
        rows_basis=rows_basis,
    )
