"""What the load-generation commands share: one-line errors and Ctrl-C handling."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import click


class OneLineErrors(click.Command):
    """Usage errors as a single line on stderr (no usage block), exit status 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise _UsageLine(f"{e.format_message()} (see --help)") from None


class _UsageLine(click.ClickException):
    exit_code = 2


def fail(message: str) -> click.ClickException:
    """An error the CLI reports as one line and exit status 1."""
    return click.ClickException(message.splitlines()[0] if message else "failed")


def on_interrupt(callback: Callable[[], Any]) -> None:
    """Call `callback` on Ctrl-C (and SIGTERM) instead of raising KeyboardInterrupt, so a
    run can stop cleanly and still print what it measured."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, callback)
