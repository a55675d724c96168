"""The adapter seam: canonical <-> native knob conversion, the registry, the reference
adapter's description."""

from __future__ import annotations

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import Knob, from_native, representable, to_native
from batchpilot.runtimes.reference import ReferenceRuntime
from batchpilot.runtimes.registry import get_runtime, runtime_names

BATCH = Knob(
    canonical="max_batch_size",
    native="max_batch_size",
    unit="requests",
    integer=True,
    minimum=1,
    maximum=64,
)


def _wait(unit: str, integer: bool) -> Knob:
    return Knob.model_validate(
        {
            "canonical": "max_queue_time_ms",
            "native": "wait",
            "unit": unit,
            "integer": integer,
            "minimum": 0,
            "maximum": 1e9,
        }
    )


@pytest.mark.parametrize(
    ("unit", "integer", "ms", "native"),
    [
        ("ms", False, 2.5, 2.5),
        ("ms", True, 2.5, 2),  # round half to even, as round() does
        ("ms", True, 2.6, 3),
        ("us", True, 2.5, 2500),
        ("us", True, 0.0004, 0),
        ("s", False, 2.5, 0.0025),
    ],
)
def test_queue_wait_converts_to_native_units(
    unit: str, integer: bool, ms: float, native: float
) -> None:
    knob = _wait(unit, integer)
    assert knob.to_native(ms) == pytest.approx(native)
    assert isinstance(knob.to_native(ms), int) == integer


def test_native_seconds_come_back_as_milliseconds() -> None:
    assert _wait("s", False).to_canonical(0.0025) == pytest.approx(2.5)
    assert _wait("us", True).to_canonical(2500) == pytest.approx(2.5)


def test_out_of_bounds_value_is_refused_with_native_name_and_range() -> None:
    with pytest.raises(ValueError, match=r"max_batch_size=65 .* outside .*1\.\.64 requests"):
        BATCH.to_native(65)


def test_a_knob_with_inconsistent_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="counted in requests"):
        Knob(
            canonical="max_batch_size",
            native="b",
            unit="ms",
            integer=True,
            minimum=1,
            maximum=2,
        )


def test_round_trip_through_native_units() -> None:
    knobs = (BATCH, _wait("us", True))
    config = BatchingConfig(max_batch_size=8, max_queue_time_ms=1.23456)
    assert to_native(knobs, config) == {"max_batch_size": 8, "wait": 1235}
    assert representable(knobs, config) == BatchingConfig(max_batch_size=8, max_queue_time_ms=1.235)


def test_a_missing_native_value_is_named() -> None:
    with pytest.raises(ValueError, match="did not report wait"):
        from_native((BATCH, _wait("ms", False)), {"max_batch_size": 4})


def test_registry_finds_the_reference_runtime_and_lists_names_on_a_typo() -> None:
    assert isinstance(get_runtime("Reference"), ReferenceRuntime)
    assert "reference" in runtime_names()
    with pytest.raises(ValueError, match=r"unknown runtime 'tritn'; known: .*reference"):
        get_runtime("tritn")


def test_reference_runtime_keeps_todays_names_units_and_env() -> None:
    runtime = ReferenceRuntime()
    config = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.5)
    assert runtime.native(config) == {"max_batch_size": 16, "max_queue_time_ms": 2.5}
    assert runtime.protocol().path == "/v1/predict"
    assert runtime.protocol().body(3) == b'{"synthetic": {"size": 3}}'
    persisted = runtime.persistence(config)
    assert persisted.kind == "env"
    assert 'name: MAX_BATCH_SIZE\n  value: "16"' in persisted.snippet
    assert 'name: MAX_QUEUE_TIME_MS\n  value: "2.5"' in persisted.snippet
    assert runtime.metrics.latency_histogram == "batchpilot_request_latency_seconds"
