"""Cost models: fitting from the server's profile JSON, tables, and bad profiles."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from batchpilot.simulator.cost import (
    LinearCost,
    ProfileError,
    TableCost,
    fit_cost_model,
    parse_cost_model,
)


def _profile(points: list[tuple[int, int, float, float]]) -> dict[str, Any]:
    """(batch_size, count, mean_compute_ms, mean_rows) -> /admin/profile JSON."""
    return {
        "model": "mlp",
        "device": "cpu",
        "batches": [
            {"batch_size": b, "count": c, "mean_compute_ms": ms, "mean_rows": rows}
            for b, c, ms, rows in points
        ],
    }


def test_linear_fit_recovers_known_coefficients_exactly() -> None:
    points = [(b, 10, 2.5 + 0.3 * (2 * b), float(2 * b)) for b in (1, 2, 4, 8, 16, 32)]
    model = fit_cost_model(_profile(points))
    assert isinstance(model, LinearCost)
    assert model.fixed_ms == pytest.approx(2.5)
    assert model.per_row_ms == pytest.approx(0.3)


def test_linear_fit_recovers_coefficients_from_noisy_means() -> None:
    rng = np.random.default_rng(0)
    points = []
    for b in range(1, 65):
        rows = b * 3.1
        # Noise on a mean of `count` batches shrinks with the count; the fit weights by it.
        count = int(rng.integers(50, 500))
        noise = rng.normal(0.0, 0.4 / np.sqrt(count))
        points.append((b, count, 1.2 + 0.045 * rows + noise, rows))
    model = fit_cost_model(_profile(points))
    assert isinstance(model, LinearCost)
    assert model.fixed_ms == pytest.approx(1.2, abs=0.02)
    assert model.per_row_ms == pytest.approx(0.045, rel=0.02)


def test_fit_never_returns_negative_coefficients() -> None:
    # Compute time falling with rows is noise; the model must not predict negative time.
    model = fit_cost_model(_profile([(1, 5, 3.0, 1.0), (2, 5, 2.0, 2.0), (4, 5, 1.0, 4.0)]))
    assert isinstance(model, LinearCost)
    assert model.per_row_ms == 0.0
    assert model.fixed_ms == pytest.approx(2.0)
    # A line through negative intercept is pulled through the origin instead.
    model = fit_cost_model(_profile([(1, 5, 0.5, 1.0), (2, 5, 2.5, 2.0), (4, 5, 6.5, 4.0)]))
    assert isinstance(model, LinearCost)
    assert model.fixed_ms == 0.0
    assert model.per_row_ms > 0.0


def test_table_fit_interpolates_and_extends_along_the_last_slope() -> None:
    profile = _profile([(1, 3, 2.0, 1.0), (4, 3, 3.0, 4.0), (8, 3, 5.0, 8.0), (8, 1, 9.0, 8.0)])
    model = fit_cost_model(profile, kind="table")
    assert isinstance(model, TableCost)
    # equal rows merge, weighted by count: (3*5 + 1*9)/4 = 6
    assert model.rows == (1.0, 4.0, 8.0)
    assert model.compute_ms == pytest.approx((2.0, 3.0, 6.0))
    rows = np.array([0.5, 2.5, 8.0, 12.0])
    sizes = np.ones(4, dtype=np.int64)
    assert model.batch_ms(sizes, rows).tolist() == pytest.approx([2.0, 2.5, 6.0, 9.0])
    scalar = model.scalar_s()
    assert [scalar(1, r) * 1000 for r in rows.tolist()] == pytest.approx([2.0, 2.5, 6.0, 9.0])


def test_linear_vector_and_scalar_forms_agree() -> None:
    model = LinearCost(fixed_ms=1.5, per_row_ms=0.2, per_request_ms=0.1)
    b = np.array([1, 4, 16], dtype=np.int64)
    rows = np.array([1.0, 10.0, 100.0])
    scalar = model.scalar_s()
    assert model.batch_ms(b, rows).tolist() == pytest.approx(
        [scalar(int(x), float(r)) * 1000 for x, r in zip(b, rows, strict=True)]
    )


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"model": "mlp"}, 'no "batches" list'),
        ({"batches": "nope"}, 'no "batches" list'),
        ({"batches": [7]}, r"batches\[0\] is not an object"),
        ({"batches": [{"batch_size": 1}]}, r"batches\[0\] needs numeric"),
        (_profile([(4, 10, 2.0, 4.0)]), "at least two sizes"),
        (_profile([(4, 10, 2.0, 4.0), (8, 0, 3.0, 8.0)]), "at least two sizes"),
    ],
)
def test_unusable_profiles_are_rejected_with_the_reason(
    profile: dict[str, Any], message: str
) -> None:
    with pytest.raises(ProfileError, match=message):
        fit_cost_model(profile)


def test_cost_model_json_round_trips_and_bad_json_says_what_is_expected() -> None:
    for model in (
        LinearCost(fixed_ms=1.0, per_row_ms=0.1, overhead_ms=0.5),
        TableCost(rows=(1.0, 2.0), compute_ms=(1.0, 1.5)),
    ):
        assert parse_cost_model(model.model_dump(mode="json")) == model
    with pytest.raises(ProfileError, match="expected"):
        parse_cost_model({"kind": "linear", "fixed_ms": -1, "per_row_ms": 0})
    with pytest.raises(ProfileError, match="rows must be strictly increasing"):
        parse_cost_model({"kind": "table", "rows": [2, 1], "compute_ms": [1, 2]})
