"""How long a Prometheus query window must be: a `rate()` over a window needs at least
two samples in it, and a step's figures are only worth having with several. A window
shorter than MIN_SCRAPES_PER_WINDOW scrape intervals is refused (never silently read from
one or two samples); the user lengthens the step or scrapes more often.

Pure functions: the interval comes from the caller's configuration or from the text of
Prometheus's own configuration (`GET /api/v1/status/config`)."""

from __future__ import annotations

import re
from typing import Any

import yaml

MIN_SCRAPES_PER_WINDOW = 4
# Prometheus's default when neither the job nor `global` sets an interval.
PROMETHEUS_DEFAULT_SCRAPE_S = 60.0

_UNITS_S = {
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
    "y": 365 * 86400.0,
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_JOB_MATCHER = re.compile(r'job\s*=\s*"([^"]*)"')


class ScrapeWindowError(ValueError):
    """A query window too short for the scrape interval; the message says what to do."""


def parse_duration_s(text: str) -> float:
    """A Prometheus duration ("15s", "1m30s", "500ms") in seconds."""
    stripped = text.strip()
    parts = _DURATION.findall(stripped)
    if not stripped or "".join(n + u for n, u in parts) != stripped:
        raise ValueError(f"{text!r} is not a Prometheus duration such as 15s, 1m30s or 500ms")
    return sum(float(n) * _UNITS_S[u] for n, u in parts)


def scrape_interval_from_config(config_yaml: str, selector: str = "") -> float:
    """The scrape interval that applies to the series `selector` picks, in seconds: the
    interval of the job named by a `job="..."` matcher, else the longest of all jobs (the
    safe choice when the target's job is not known)."""
    try:
        config: Any = yaml.safe_load(config_yaml) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"Prometheus's configuration is not YAML: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError("Prometheus's configuration is not a mapping")
    global_section = config.get("global") or {}
    default = (
        parse_duration_s(str(global_section["scrape_interval"]))
        if isinstance(global_section, dict) and "scrape_interval" in global_section
        else PROMETHEUS_DEFAULT_SCRAPE_S
    )
    jobs: dict[str, float] = {}
    for job in config.get("scrape_configs") or []:
        if isinstance(job, dict) and "job_name" in job:
            interval = job.get("scrape_interval")
            jobs[str(job["job_name"])] = (
                parse_duration_s(str(interval)) if interval is not None else default
            )
    named = _JOB_MATCHER.search(selector)
    if named is not None and named.group(1) in jobs:
        return jobs[named.group(1)]
    return max(jobs.values(), default=default)


def check_window(window_s: float, scrape_interval_s: float) -> None:
    """Refuse a query window shorter than MIN_SCRAPES_PER_WINDOW scrape intervals."""
    needed = MIN_SCRAPES_PER_WINDOW * scrape_interval_s
    if window_s < needed:
        raise ScrapeWindowError(
            f"a step of {window_s:g} s is shorter than {MIN_SCRAPES_PER_WINDOW} scrape "
            f"intervals of Prometheus ({scrape_interval_s:g} s each): the step would be "
            f"read from too few samples. Use steps of at least {needed:g} s, or scrape the "
            f"target at least every {window_s / MIN_SCRAPES_PER_WINDOW:g} s"
        )
