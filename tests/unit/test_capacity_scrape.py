"""The scrape-interval rule: a Prometheus query window of fewer than four scrape
intervals is refused, with the interval from the configuration or from Prometheus."""

from __future__ import annotations

import pytest

from batchpilot.capacity.prometheus import PrometheusStepSource
from batchpilot.capacity.scrape import (
    ScrapeWindowError,
    check_window,
    parse_duration_s,
    scrape_interval_from_config,
)

CONFIG = """
global:
  scrape_interval: 15s
scrape_configs:
  - job_name: fast
    scrape_interval: 500ms
  - job_name: slow
    scrape_interval: 1m30s
  - job_name: default
"""


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15.0), ("500ms", 0.5), ("1m30s", 90.0), ("2h", 7200.0)]
)
def test_prometheus_durations(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15", "fast", "1.5 s", "s15"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Prometheus duration"):
        parse_duration_s(text)


@pytest.mark.parametrize(
    ("selector", "seconds"),
    [
        ('job="fast"', 0.5),
        ('namespace="prod", job = "default"', 15.0),
        ('job="slow"', 90.0),
        ("", 90.0),  # the target's job is unknown: the longest interval is the safe one
        ('job="elsewhere"', 90.0),
    ],
)
def test_interval_of_the_selected_job(selector: str, seconds: float) -> None:
    assert scrape_interval_from_config(CONFIG, selector) == pytest.approx(seconds)


def test_interval_defaults_as_prometheus_does() -> None:
    assert scrape_interval_from_config("scrape_configs: []\n") == 60.0
    assert scrape_interval_from_config("global: {scrape_interval: 5s}\n") == 5.0
    with pytest.raises(ValueError, match="not a mapping"):
        scrape_interval_from_config("- a\n- b\n")


def test_a_window_of_four_intervals_passes_and_a_shorter_one_is_refused() -> None:
    check_window(4.0, 1.0)
    check_window(60.0, 15.0)
    with pytest.raises(ScrapeWindowError) as refused:
        check_window(5.0, 15.0)
    message = str(refused.value)
    assert "a step of 5 s is shorter than 4 scrape intervals of Prometheus (15 s each)" in message
    assert "Use steps of at least 60 s, or scrape the target at least every 1.25 s" in message


async def test_configured_interval_is_checked_without_asking_prometheus() -> None:
    # Port 9 on loopback answers nothing: a configured interval must not need it.
    source = PrometheusStepSource("http://127.0.0.1:9", scrape_interval_s=2.0)
    assert await source.check_step(8.0) == 2.0
    with pytest.raises(ScrapeWindowError, match="at least 8 s"):
        await source.check_step(5.0)


def test_configured_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="scrape interval must be > 0 s"):
        PrometheusStepSource("http://127.0.0.1:9", scrape_interval_s=0.0)
