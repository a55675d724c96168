"""What every command shares: bad input as one line on stderr, and Ctrl-C handling.

A command states once, on its click command class, how its errors read (prefix, exit
status); `fail()` picks that up from the running command, so call sites stay one word."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import IO, Any, ClassVar

import click

USAGE_EXIT_CODE = 2


class OneLineError(click.ClickException):
    """One line on stderr (the first line of `message`), then exit `exit_code`."""

    def __init__(self, message: str, *, prefix: str = "Error: ", exit_code: int = 1) -> None:
        super().__init__(message.splitlines()[0] if message else "failed")
        self.prefix = prefix
        # click declares exit_code per class; one class here serves every status.
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{self.prefix}{self.format_message()}", file=file, err=file is None)


class OneLineErrors(click.Command):
    """Bad flags or environment values print one line (what was wrong, what is allowed)
    instead of click's usage block, exit status 2. Subclasses set how the line reads."""

    error_prefix: ClassVar[str] = "Error: "
    # Exit status of `fail()`; usage errors always exit USAGE_EXIT_CODE.
    fail_exit_code: ClassVar[int] = 1
    usage_hint: ClassVar[str] = ""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes `args` as it goes
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise OneLineError(
                usage_line(exc, given) + self.usage_hint,
                prefix=self.error_prefix,
                exit_code=USAGE_EXIT_CODE,
            ) from None


class SeeHelpErrors(OneLineErrors):
    """OneLineErrors whose usage errors end by pointing at --help."""

    usage_hint: ClassVar[str] = " (see --help)"


def usage_line(exc: click.UsageError, args: list[str]) -> str:
    """click's message, naming the environment variable when the bad value came from one
    (the user did not type it, so the flag alone would mislead)."""
    message = exc.format_message()
    param = exc.param if isinstance(exc, click.BadParameter) else None
    envvar = param.envvar if param is not None else None
    from_env = isinstance(envvar, str) and envvar in os.environ
    if from_env and param is not None and not any(o in args for o in param.opts):
        message += f" (it came from the environment variable {envvar})"
    return message


def fail(message: str) -> OneLineError:
    """An error the running command reports as one line, with its prefix and exit status
    (see OneLineErrors); `raise fail(...)`."""
    ctx = click.get_current_context(silent=True)
    command = ctx.command if ctx is not None else None
    if isinstance(command, OneLineErrors):
        return OneLineError(message, prefix=command.error_prefix, exit_code=command.fail_exit_code)
    return OneLineError(message)


def on_interrupt(callback: Callable[[], Any]) -> None:
    """Call `callback` on Ctrl-C (and SIGTERM) instead of raising KeyboardInterrupt, so a
    run can stop cleanly and still print what it measured."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, callback)
