"""run_load and measure_capacity reject bad arguments before touching the network."""

from __future__ import annotations

from typing import Any

import pytest

from batchpilot.capacity.http import default_timeout_s, measure_capacity, step_window_s
from batchpilot.loadgen.generator import run_load
from batchpilot.models import SLA, RequestMix

URL = "http://127.0.0.1:9"
MIX = RequestMix.default()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 0.0}, "rate must be > 0"),
        ({"rate": float("nan")}, "rate must be > 0"),
        ({"duration_s": -1.0}, "duration must be > 0"),
        ({"timeout_s": 0.0}, "timeout must be a positive"),
        ({"arrival": "bursty"}, "arrival .bursty. is not one of"),
        ({"rate": 1e6, "duration_s": 3600.0}, "split it into shorter runs"),
        ({"urls": "ftp://127.0.0.1"}, "is not valid"),
        ({"urls": []}, "no target URL"),
        ({"path": "v1/predict"}, "must start with '/'"),
    ],
)
async def test_run_load_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"urls": URL, "rate": 10.0, "duration_s": 1.0, "mix": MIX}
    arguments.update(kwargs)
    urls = arguments.pop("urls")
    with pytest.raises(ValueError, match=message):
        await run_load(urls, **arguments)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_duration_s": 0.0}, "step duration must be > 0"),
        ({"warmup_s": -1.0}, "warm-up must be ≥ 0"),
        ({"start_rps": 0.0}, "start rate must be > 0"),
        ({"min_requests": -1}, "min requests per step"),
    ],
)
async def test_measure_capacity_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await measure_capacity(URL, sla=SLA(p99_ms=100), mix=MIX, **kwargs)


def test_default_timeout_is_well_above_the_sla() -> None:
    assert default_timeout_s(SLA(p99_ms=100)) == 1.0
    assert default_timeout_s(SLA(p99_ms=2000)) == 10.0


def test_steps_stretch_to_hold_enough_requests_within_a_bound() -> None:
    assert step_window_s(1000.0, 5.0, 500) == 5.0
    assert step_window_s(200.0, 5.0, 500) == 5.0  # 2.5 s + 0.5 s warm-up fit
    assert step_window_s(50.0, 5.0, 500) == pytest.approx(10.0 / 0.9)  # 10 % warm-up
    assert step_window_s(1.0, 5.0, 500) == 30.0
    assert step_window_s(50.0, 5.0, 0) == 5.0
