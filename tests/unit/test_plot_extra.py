"""Matplotlib is the `plot` extra: without it, the two commands that draw (`capacity
--plot`, `tune --report`) stop before any load with one line naming the extra, and the
others never look for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from batchpilot import extras
from batchpilot.cli import main
from batchpilot.simulator.cost import LinearCost

NAMES_THE_EXTRA = (
    "needs matplotlib, which is not installed here; it comes with the `plot` extra: "
    "pip install 'batchpilot[plot]'"
)
# nothing listens on the discard port: a command that sent a request would say so
NOWHERE = "http://127.0.0.1:9"


@pytest.fixture
def without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = extras._installed
    monkeypatch.setattr(extras, "_installed", lambda name: name != "matplotlib" and installed(name))


@pytest.fixture
def cost_file(tmp_path: Path) -> Path:
    path = tmp_path / "cost.json"
    path.write_text(LinearCost(fixed_ms=2.0, per_row_ms=0.1).model_dump_json())
    return path


def test_matplotlib_missing_says_nothing_where_it_is_installed() -> None:
    assert extras.matplotlib_missing("capacity --plot") is None


@pytest.mark.usefixtures("without_matplotlib")
def test_matplotlib_missing_names_the_extra() -> None:
    assert extras.matplotlib_missing("x") == f"x {NAMES_THE_EXTRA}"


@pytest.mark.usefixtures("without_matplotlib")
def test_capacity_plot_stops_before_any_load(tmp_path: Path) -> None:
    plot = tmp_path / "capacity.png"
    result = CliRunner().invoke(main, ["capacity", NOWHERE, "--p99-ms", "100", "--plot", str(plot)])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f"Error: capacity --plot {NAMES_THE_EXTRA}"]
    assert not plot.exists()


@pytest.mark.usefixtures("without_matplotlib")
def test_tune_report_stops_before_any_trial(tmp_path: Path, cost_file: Path) -> None:
    report = tmp_path / "report"
    result = CliRunner().invoke(
        main,
        [
            "tune", "--simulator", str(cost_file), "--p99-ms", "100", "--max-trials", "2",
            "--report", str(report), "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: tune --report (its plots) {NAMES_THE_EXTRA}"
    ]
    assert result.stdout == ""
    assert not report.exists()


@pytest.mark.usefixtures("without_matplotlib")
def test_tune_without_report_runs_without_matplotlib(cost_file: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["tune", "--simulator", str(cost_file), "--p99-ms", "100", "--max-trials", "2", "--json"],
    )
    assert result.exit_code == 0, result.stderr
