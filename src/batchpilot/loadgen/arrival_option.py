"""The `--arrival` option shared by every command that offers or simulates traffic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from batchpilot.loadgen.arrivals import ARRIVAL_SYNTAX, ArrivalKind, parse_arrival

ARRIVAL_HELP = (
    "Arrival process: poisson, constant, mmpp bursts (mmpp:FACTOR,FRACTION,BURST_S or "
    "mmpp:factor=4,fraction=0.2,burst_s=0.5: bursts at FACTOR x the quiet rate, FRACTION "
    "of the time, BURST_S s long on average) or trace:FILE (timestamps replayed, scaled "
    "to each rate)."
)


class ArrivalType(click.ParamType[ArrivalKind, Any]):
    """Parses `parse_arrival`'s syntax; a bad value is a usage error naming what is allowed."""

    name = "arrival"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> ArrivalKind:
        if not isinstance(value, str):
            return value  # type: ignore[no-any-return]  # already a process
        try:
            return parse_arrival(value)
        except ValueError as exc:
            message = str(exc)
            if ARRIVAL_SYNTAX not in message:
                message = f"{message}; allowed: {ARRIVAL_SYNTAX}"
            self.fail(message, param, ctx)


ARRIVAL = ArrivalType()


F = TypeVar("F", bound=Callable[..., Any])


def arrival_option(default: str = "poisson") -> Callable[[F], F]:
    """The `--arrival` click option; the command receives an `ArrivalKind`."""
    return click.option(
        "--arrival",
        type=ARRIVAL,
        default=default,
        show_default=True,
        help=ARRIVAL_HELP,
    )


__all__ = ["ARRIVAL", "ARRIVAL_HELP", "ArrivalKind", "ArrivalType", "arrival_option"]
