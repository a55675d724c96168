"""Two fidelities in a local study: trials screened with short steps and a coarse
bracket, the finalists' re-measurement at the full measurement."""

from __future__ import annotations

from batchpilot.models import SLA, RequestMix
from batchpilot.tuner.config import QUICK_MEASUREMENT, Measurement, TuneConfig, screening
from batchpilot.tuner.local import LocalProbe
from batchpilot.tuner.localmode import fidelity_note, trial_measurement


def config(**tuning: object) -> TuneConfig:
    return TuneConfig.model_validate({"tuning": tuning})


def test_the_default_study_screens_its_trials_and_confirms_at_the_full_measurement() -> None:
    cfg = config()
    screen = trial_measurement(cfg, source=None)
    assert screen == screening(cfg.measurement)
    assert (screen.step_duration_s, screen.warmup_s, screen.precision, screen.min_requests) == (
        1.2,
        0.5,
        0.15,
        500,
    )
    # what only the full measurement sets stays as it is
    assert (screen.timeout_s, screen.workers, screen.max_connections) == (None, 1, None)
    assert fidelity_note(screen, cfg) == (
        "; trials screened with 1.2 s steps at precision 0.15, finalists re-measured with "
        "4 s steps at 0.05"
    )


def test_screening_is_never_finer_nor_longer_than_the_measurement() -> None:
    coarse = Measurement(step_duration_s=1.0, warmup_s=0.2, precision=0.3, min_requests=100)
    assert screening(coarse) == coarse
    assert screening(QUICK_MEASUREMENT) == QUICK_MEASUREMENT


def test_no_screening_without_confirmation_nor_when_prometheus_decides_the_steps() -> None:
    unconfirmed = config(confirm=False)
    assert trial_measurement(unconfirmed, source=None) == unconfirmed.measurement
    off = config(screen=False)
    assert trial_measurement(off, source=None) == off.measurement
    assert fidelity_note(off.measurement, off) == ""
    cfg = config()
    prometheus = object()
    assert trial_measurement(cfg, source=prometheus) == cfg.measurement  # type: ignore[arg-type]


def test_a_probe_at_another_fidelity_keeps_everything_else() -> None:
    probe = LocalProbe(
        "http://127.0.0.1:1/",
        sla=SLA(p99_ms=100.0),
        mix=RequestMix.default(),
        precision=0.05,
        step_duration_s=4.0,
        warmup_s=1.5,
        seed=3,
        min_requests=2000,
    )
    probe.accepted = True
    fast = probe.at(step_duration_s=1.2, warmup_s=0.5, precision=0.15, min_requests=500)
    assert (fast.step_duration_s, fast.warmup_s, fast.precision, fast.min_requests) == (
        1.2,
        0.5,
        0.15,
        500,
    )
    assert (fast.url, fast.sla, fast.seed, fast.accepted) == (probe.url, probe.sla, 3, True)
    # the original is untouched
    assert (probe.step_duration_s, probe.precision, probe.min_requests) == (4.0, 0.05, 2000)
