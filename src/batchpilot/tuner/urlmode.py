"""`tune --url URL --runtime NAME`: the checks that come before tuning a server
BatchPilot did not start, each with a one-line error saying what was wrong."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from batchpilot.loadgen.endpoints import (
    UnreachableError,
    base_of,
    check_reachable,
    normalise_urls,
)
from batchpilot.runtimes.base import Runtime
from batchpilot.runtimes.http import DIRECT, HttpAccess
from batchpilot.tuner.attached import Attached

if TYPE_CHECKING:
    from batchpilot.capacity.prometheus import PrometheusStepSource

# how long the server has to answer at all before the run is refused
REACH_TIMEOUT_S = 5.0


class AttachError(click.ClickException):
    """Bad --url input or nothing there: one line on stderr, exit 2."""

    exit_code = 2


def attach_to(
    url: str,
    runtime: Runtime,
    *,
    model: str | None,
    keep_winner: bool,
    control_url: str | None = None,
    access: HttpAccess = DIRECT,
) -> Attached:
    """The server to tune at `url`: its base URL (a full endpoint URL of the runtime's
    protocol is cut back to the base) once something answers HTTP there, and at
    `control_url` too when its control endpoint is given, https verified as `access`
    says. A runtime whose batching cannot be changed on a server elsewhere is refused
    first, before any request."""
    try:
        (base,) = normalise_urls(url)
    except ValueError as exc:
        raise AttachError(f"--url {url}: {exc}") from None
    if model is not None and not model.strip():
        raise AttachError("--model must name a model, got an empty string")
    unchangeable = runtime.unchangeable_from_elsewhere(model)
    if unchangeable is not None:
        raise AttachError(f"--url with --runtime {runtime.name}: {unchangeable}")
    base = base_of(base, runtime.protocol(model or runtime.default_model).path)
    tls = access.tls()
    try:
        asyncio.run(
            check_reachable([base], timeout_s=REACH_TIMEOUT_S, tls=tls, headers=access.headers)
        )
    except UnreachableError as exc:
        raise AttachError(
            f"--url {url}: nothing answers there ({exc}); give the base URL of a running "
            f"{runtime.title}"
        ) from None
    control = None if control_url is None else control_at(control_url, runtime, access=access)
    return Attached(
        url=base, model=model, keep_winner=keep_winner, control_url=control, access=access
    )


def control_at(url: str, runtime: Runtime, *, access: HttpAccess = DIRECT) -> str:
    """The runtime's control endpoint given by --control-url, once something answers
    HTTP there (reached as `access` says)."""
    what = runtime.control_endpoint.what
    try:
        (base,) = normalise_urls(url)
    except ValueError as exc:
        raise AttachError(f"--control-url {url}: {exc}; give the address of {what}") from None
    try:
        asyncio.run(
            check_reachable(
                [base], timeout_s=REACH_TIMEOUT_S, tls=access.tls(), headers=access.headers
            )
        )
    except UnreachableError as exc:
        raise AttachError(
            f"--control-url {url}: nothing answers there ({exc}); give the address of {what}"
        ) from None
    return base


def prometheus_source(
    url: str, runtime: Runtime, *, model: str | None, selector: str, step_s: float
) -> PrometheusStepSource:
    """Steps decided on `runtime`'s own metrics in the Prometheus at `url`, which must
    scrape the server often enough for steps of `step_s` seconds."""
    from batchpilot.capacity.prometheus import (
        NoLatencyHistogram,
        PrometheusQueryError,
        PrometheusStepSource,
    )
    from batchpilot.capacity.scrape import ScrapeWindowError

    try:
        (base,) = normalise_urls(url)
        asyncio.run(check_reachable([base], timeout_s=REACH_TIMEOUT_S))
        source = PrometheusStepSource.for_runtime(base, runtime, model=model, selector=selector)
        asyncio.run(source.check_step(step_s))
    except NoLatencyHistogram as exc:
        raise AttachError(f"--prometheus: {exc}") from None
    except UnreachableError as exc:
        raise AttachError(f"--prometheus {url}: nothing answers there ({exc})") from None
    except (ValueError, ScrapeWindowError, PrometheusQueryError) as exc:
        raise AttachError(f"--prometheus {url}: {exc}") from None
    return source
