"""The one-line error rules every command shares."""

from __future__ import annotations

from typing import ClassVar

import click
import pytest
from click.testing import CliRunner

from batchpilot.clitools import OneLineErrors, SeeHelpErrors, fail


class _Named(OneLineErrors):
    error_prefix: ClassVar[str] = "tool: "
    fail_exit_code: ClassVar[int] = 3


def _command(cls: type[click.Command]) -> click.Command:
    @click.command(cls=cls)
    @click.option("--size", envvar="TOOL_SIZE", type=click.IntRange(1, 9), default=1)
    @click.option("--boom", is_flag=True)
    def tool(size: int, boom: bool) -> None:
        if boom:
            raise fail("it broke\nsecond line")
        click.echo(f"size {size}")

    return tool


@pytest.mark.parametrize(
    ("cls", "prefix", "hint"),
    [
        (OneLineErrors, "Error: ", ""),
        (SeeHelpErrors, "Error: ", " (see --help)"),
        (_Named, "tool: ", ""),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(
    cls: type[click.Command], prefix: str, hint: str
) -> None:
    result = CliRunner().invoke(_command(cls), ["--size", "0"])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(prefix)
    assert "'--size': 0 is not in the range 1<=x<=9" in line
    assert line.endswith("1<=x<=9." + hint) if hint else "see --help" not in line


def test_a_bad_environment_value_is_named() -> None:
    result = CliRunner().invoke(_command(OneLineErrors), [], env={"TOOL_SIZE": "x"})
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "environment variable TOOL_SIZE" in line


def test_a_flag_that_overrides_a_bad_environment_value_is_not_blamed_on_it() -> None:
    result = CliRunner().invoke(_command(OneLineErrors), ["--size", "0"], env={"TOOL_SIZE": "5"})
    assert result.exit_code == 2
    assert "environment variable" not in result.stderr


@pytest.mark.parametrize(
    ("cls", "prefix", "code"), [(OneLineErrors, "Error: ", 1), (_Named, "tool: ", 3)]
)
def test_fail_takes_the_commands_prefix_and_exit_status(
    cls: type[click.Command], prefix: str, code: int
) -> None:
    result = CliRunner().invoke(_command(cls), ["--boom"])
    assert result.exit_code == code
    assert result.stderr.strip().splitlines() == [f"{prefix}it broke"]


def test_fail_outside_a_command_is_a_plain_one_line_error() -> None:
    error = fail("")
    assert error.exit_code == 1
    assert error.format_message() == "failed"
