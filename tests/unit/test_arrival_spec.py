"""load.arrival in the CRD and `arrival` in the tune configuration: the same processes
as the load generator's, with clear errors for what does not fit."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.loadgen.arrivals import MMPP, Constant, Poisson, Trace
from batchpilot.operator.spec import ArrivalSpec, LoadSpec
from batchpilot.tuner.cli import build_config, resolve_arrival
from batchpilot.tuner.config import TuneConfig


def test_load_arrival_defaults_to_poisson() -> None:
    load = LoadSpec.model_validate({"endpoint": {"port": 8000, "path": "/v1/predict"}})
    assert load.arrival.process_model() == Poisson()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"process": "Constant"}, Constant()),
        ({"process": "MMPP"}, MMPP()),
        (
            {"process": "MMPP", "burstFactor": 6, "burstFraction": 0.1, "meanBurstSeconds": 2},
            MMPP(burst_factor=6.0, high_fraction=0.1, mean_burst_s=2.0),
        ),
        ({"process": "Trace", "timestamps": [0, 0.5, 1.5]}, Trace(gaps_s=(0.5, 1.0))),
    ],
)
def test_load_arrival_names_the_generator_process(data: dict[str, Any], expected: object) -> None:
    assert ArrivalSpec.model_validate(data).process_model() == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"process": "Bursty"}, "Input should be 'Poisson', 'Constant', 'MMPP' or 'Trace'"),
        ({"process": "Poisson", "burstFactor": 3}, "apply to process MMPP only"),
        ({"process": "Trace"}, "timestamps is required for process Trace"),
        ({"process": "Constant", "timestamps": [0, 1]}, "allowed for it only"),
        ({"process": "Trace", "timestamps": [0, 2, 1]}, "must not decrease"),
        ({"process": "Trace", "timestamps": [1, 1]}, "must span a positive time"),
        ({"process": "MMPP", "burstFraction": 1.0}, "less than 1"),
    ],
)
def test_bad_load_arrival_says_what_is_wrong(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ArrivalSpec.model_validate(data)


def test_tune_arrival_from_the_file_or_the_flag() -> None:
    base = TuneConfig.model_validate({"arrival": "mmpp:4,0.2,0.5"})
    assert resolve_arrival(base) == MMPP()
    flagged = build_config(
        base, trials=None, sla_p99_ms=None, seed=None, sampler=None, mix=None, quick=False,
        arrival="constant",
    )  # fmt: skip
    assert resolve_arrival(flagged) == Constant()
    with pytest.raises(ValueError, match="arrival: arrival 'bursty' is not one of: poisson"):
        resolve_arrival(TuneConfig.model_validate({"arrival": "bursty"}))
