"""`batchpilot operator` rejects bad options with one line and a non-zero exit."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from batchpilot.cli import main


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-n", "Bad_Namespace"], "--namespace 'Bad_Namespace' is not a namespace name"),
        (["--liveness", "healthz"], "--liveness 'healthz' is not a URL"),
    ],
)
def test_bad_options_are_one_line_on_stderr(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, ["operator", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert expected in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args", [["--metrics-port", "70000"], ["--max-concurrent-trials", "0"], ["--bogus"]]
)
def test_click_errors_are_one_line_too(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["operator", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert args[0] in lines[0]


def test_operator_is_registered() -> None:
    result = CliRunner().invoke(main, ["operator", "--help"])
    assert result.exit_code == 0
    for option in (
        "--namespace",
        "--all-namespaces",
        "--liveness",
        "--metrics-port",
        "--standalone",
    ):
        assert option in result.output
