"""`tune --url`: tuning a server BatchPilot did not start. Before any load, the running
configuration is applied once through the runtime's control, so a control that cannot
change this server (no access to its model repository, a management endpoint elsewhere,
a model it does not serve) fails at once in the runtime's own words. At the end the
configuration found running is put back, or the recommended one kept when asked."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rich.console import Console

from batchpilot.errors import RequestShapeError, TargetError
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import Runtime
from batchpilot.runtimes.http import DIRECT, HttpAccess
from batchpilot.tuner.interfaces import Target
from batchpilot.tuner.summary import TuneSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attached:
    """A server BatchPilot did not start: its base URL, the model to tune (None: the
    runtime's bundled one), whether the recommended configuration stays live at the
    end (else the configuration found running returns), and the runtime's control
    endpoint where it is not at its default (None: the default); how every call to it,
    load and control alike, is made (`access`: `tune --header`, `--ca-bundle`)."""

    url: str
    model: str | None = None
    keep_winner: bool = False
    control_url: str | None = None
    # the headers every call carries and the CA bundle https is verified against
    access: HttpAccess = DIRECT


def control_hint(runtime: Runtime, control_url: str | None) -> str:
    """Where the control endpoint was looked for, and how to point at another."""
    endpoint = runtime.control_endpoint
    if control_url is not None:
        return f"{endpoint.what} was looked for at --control-url {control_url}"
    return (
        f"{endpoint.what} was looked for at {endpoint.default}; --control-url URL "
        "names another address"
    )


async def check_attached(
    target: Target,
    runtime: Runtime,
    model: str | None,
    console: Console,
    *,
    control_url: str | None = None,
) -> BatchingConfig:
    """The configuration running now, once applied to itself. TargetError says what
    failed: reading it (the model is not served there, or not by this runtime) or
    changing it (the control cannot reach what it needs), and where the control
    endpoint was looked for."""
    url = getattr(target, "url", "")
    served = f"model {model!r}" if model is not None else "its model"
    hint = control_hint(runtime, control_url)
    try:
        baseline = await target.current()
    except TargetError as exc:
        raise TargetError(
            f"cannot read the batching configuration of {served} (is it served there, "
            f"and by {runtime.title}? {hint}): {exc}"
        ) from None
    console.print(
        f"Tuning the {runtime.title} running at {url} ({served}), found at "
        f"{baseline.label()}; checking that its configuration can be changed ...",
        highlight=False,
    )
    try:
        await target.apply(baseline)
    except RequestShapeError:
        raise  # the requests are wrong, not the control: its own message says what to set
    except TargetError as exc:
        raise TargetError(
            f"its configuration cannot be changed through the {runtime.name} control, so "
            f"it cannot be tuned from here ({hint}): {exc}"
        ) from None
    return baseline


def final_config(
    attach: Attached, baseline: BatchingConfig, summary: TuneSummary | None
) -> BatchingConfig:
    """What the server runs when BatchPilot leaves: the recommendation when the winner
    is to be kept and there is one, else the configuration found running."""
    if attach.keep_winner and summary is not None and summary.recommended is not None:
        return summary.recommended
    return baseline


async def leave_attached(
    target: Target,
    attach: Attached,
    baseline: BatchingConfig,
    summary: TuneSummary | None,
    console: Console,
) -> None:
    """Put the final configuration live. TargetError when that fails: the server then
    runs whatever the last trial left, and the user must know."""
    final = final_config(attach, baseline, summary)
    kept = final != baseline
    try:
        await target.apply(final)
    except TargetError as exc:
        raise TargetError(
            f"could not put {final.label()} back on the server at {attach.url}; it may still "
            f"run a trial's configuration, set {final.label()} yourself ({exc})"
        ) from None
    if kept:
        console.print(f"Kept the recommended {final.label()} live.", highlight=False)
    else:
        why = (
            " (nothing recommended over it)"
            if attach.keep_winner
            else "; --keep-winner leaves the recommended one live instead"
        )
        console.print(f"Put the starting {final.label()} back{why}.", highlight=False)
