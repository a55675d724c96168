"""The `--max-connections` option shared by the commands that send load: a cap the user
sets on the client's connections, so on its requests in flight (e.g. to spare a
production server); under it, a wait for a free connection is the client's limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from batchpilot.models import MAX_CONNECTIONS

MAX_CONNECTIONS_HELP = (
    "Most connections (requests in flight) the client holds{split}; a step that needs more "
    "waits for a free one and is client-bound, not a server failure [default: a pool "
    "sized for open loop]."
)

F = TypeVar("F", bound=Callable[..., Any])


def max_connections_option(split: str = "") -> Callable[[F], F]:
    """`--max-connections N` (1..100,000, default None); `split` says how the cap is
    shared where a command sends from several processes."""
    return click.option(
        "--max-connections",
        type=click.IntRange(1, MAX_CONNECTIONS),
        default=None,
        help=MAX_CONNECTIONS_HELP.format(split=split),
    )
