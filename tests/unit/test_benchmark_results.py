"""benchmarks/results.py: a benchmark's run is recorded with its command, the load
average and the versions; its tables render; the index shows the latest run and the
history in time order; `--no-save` writes nothing; every benchmark records."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import results
import simulator_speed

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"

RESULT: dict[str, Any] = {
    "requests": 1000,
    "min_requests_per_cpu_s": 2_345_078,
    "meets_target": True,
    "target_requests_per_cpu_s": 1e6,
    "repeats": 1,
    "rows": [
        {
            "case": "light",
            "policy": "sequential",
            "engine_requests_per_cpu_s": 2_345_078,
            "reference_requests_per_cpu_s": 340_244,
            "speedup": 6.9,
        },
        {
            "case": "busy",
            "policy": "pipelined",
            "engine_requests_per_cpu_s": 10_888_976,
            "reference_requests_per_cpu_s": 957_616,
            "speedup": 11.4,
        },
    ],
}


def options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    results.add_options(parser)
    return parser.parse_args(list(argv))


def recorder_at(tmp_path: Path, when: dt.datetime, load: float = 0.5) -> results.Recorder:
    return results.Recorder(
        benchmark="simulator_speed",
        argv=["benchmarks/simulator_speed.py", "--json"],
        started=when,
        load_average_start=[load, load, load],
        results_dir=tmp_path,
    )


def test_the_record_holds_the_result_command_load_and_versions(tmp_path: Path) -> None:
    args = options("--results-dir", str(tmp_path))
    argv = ["benchmarks/simulator_speed.py", "--json", "--requests", "1000"]
    recorder = results.start("simulator_speed", args, argv=argv, runtimes={"triton": "2.51"})
    path = recorder.save(RESULT)

    assert path is not None
    assert path.parent == tmp_path / "simulator_speed"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d{6}Z\.json", path.name)
    record = json.loads(path.read_text())
    assert record["result"] == RESULT
    run = record["run"]
    assert run["benchmark"] == "simulator_speed"
    assert run["argv"] == argv
    for key in ("load_average_start", "load_average_end"):
        assert len(run[key]) == 3
        assert all(isinstance(x, float) and x >= 0 for x in run[key])
    assert run["utc"].endswith("Z")
    assert run["cpu_count"] >= 1
    assert run["memory_bytes"] > 0
    assert run["python"] == ".".join(map(str, sys.version_info[:3]))
    assert run["versions"]["batchpilot"] == importlib.metadata.version("batchpilot")
    assert run["versions"]["numpy"] == importlib.metadata.version("numpy")
    assert run["versions"]["optuna"] == importlib.metadata.version("optuna")
    assert "torch" in run["versions"]
    assert run["runtimes"] == {"triton": "2.51"}
    # the table beside it
    assert path.with_suffix(".md").read_text() == results.render_record(record, path.name)


def test_two_runs_in_one_second_keep_both(tmp_path: Path) -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    first = recorder_at(tmp_path, when).save(RESULT)
    second = recorder_at(tmp_path, when).save({**RESULT, "requests": 2000})
    assert first is not None
    assert second is not None
    assert first != second
    assert json.loads(first.read_text())["result"]["requests"] == 1000
    assert json.loads(second.read_text())["result"]["requests"] == 2000


def test_versions_do_not_import_torch() -> None:
    code = (
        "import sys, results; v = results.versions(); "
        "assert 'torch' in v; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, check=True, timeout=60, capture_output=True
    )


def test_the_markdown_shows_the_run_and_the_main_figures(tmp_path: Path) -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    path = recorder_at(tmp_path, when, load=1.25).save(RESULT)
    assert path is not None
    text = path.with_suffix(".md").read_text()
    assert text.startswith("# simulator_speed, 2026-01-02T03:04:05Z\n")
    assert f"[{path.name}]({path.name})" in text
    assert "| command | `benchmarks/simulator_speed.py --json` |" in text
    assert "| load average (1, 5, 15 min) | start 1.25 / 1.25 / 1.25; end " in text
    assert "| slowest case, requests per CPU-s | 2,345,078 |" in text
    assert "| meets target | yes |" in text
    header = (
        "| case | policy | engine_requests_per_cpu_s | reference_requests_per_cpu_s | speedup |"
    )
    assert header in text
    assert "| busy | pipelined | 10,888,976 | 957,616 | 11.4 |" in text


def test_cells_and_paths() -> None:
    assert results.cell(None) == "-"
    assert results.cell(False) == "no"
    assert results.cell(0.123456) == "0.1235"
    assert results.cell(12345.6) == "12,346"
    assert results.cell("a|b") == "a\\|b"
    assert results.lookup(RESULT, "rows.-1.speedup") == 11.4
    assert results.lookup(RESULT, "rows.*.case") == ["light", "busy"]
    assert results.lookup(RESULT, "rows.5.case") is None
    assert results.lookup(RESULT, "nothing.here") is None


def test_a_benchmark_without_a_layout_renders_flat() -> None:
    text = results.render_tables("new_one", {"a": 1, "b": {"c": 0.5, "d": [1, 2]}})
    assert "| a | 1 |" in text
    assert "| b.c | 0.5 |" in text
    assert "| b.d | 1, 2 |" in text


def test_the_index_shows_the_latest_run_and_the_history_newest_first(tmp_path: Path) -> None:
    # written out of time order: the index orders by the run's time
    for day, rps in ((3, 3_000_000), (1, 1_000_000), (2, 2_000_000)):
        when = dt.datetime(2026, 1, day, 12, 0, 0, tzinfo=dt.UTC)
        recorder_at(tmp_path, when, load=float(day)).save({**RESULT, "min_requests_per_cpu_s": rps})
    index = results.write_index(tmp_path)
    text = index.read_text()

    section = text.split("## simulator_speed\n", 1)[1].split("\n## ", 1)[0]
    assert "### Latest: 2026-01-03T12:00:00Z" in section
    latest = section.split("### History", 1)[0]
    assert "| slowest case, requests per CPU-s | 3,000,000 |" in latest
    assert "| slowest case, requests per CPU-s | 1,000,000 |" not in latest
    history = section.split("### History", 1)[1]
    rows = [line for line in history.splitlines() if line.startswith("| 2026-")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| 2026-01-03T12:00:00Z",
        "| 2026-01-02T12:00:00Z",
        "| 2026-01-01T12:00:00Z",
    ]
    # the load at the start (set here) and at the end (the machine's)
    assert re.fullmatch(
        r"\| 2026-01-03T12:00:00Z \| 3 → [\d.]+ \| 3,000,000 \| "
        r"\[2026-01-03T120000Z\.json\]\(simulator_speed/2026-01-03T120000Z\.json\) \|",
        rows[0],
    )
    # every link of the index reaches a file
    for target in re.findall(r"\]\((simulator_speed/[^)]+)\)", text):
        assert (tmp_path / target).is_file(), target
    # a benchmark without a run is still listed
    assert "## operator_study\n" in text
    assert "No run recorded yet." in text.split("## operator_study\n", 1)[1]


def test_no_save_writes_nothing(tmp_path: Path) -> None:
    args = options("--results-dir", str(tmp_path), "--no-save")
    assert results.start("simulator_speed", args).save(RESULT) is None
    assert list(tmp_path.iterdir()) == []


def test_a_benchmark_records_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = ["--json", "--requests", "1000", "--reference-requests", "100", "--repeats", "1"]
    where = ["--results-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["simulator_speed.py", *tiny, *where, "--no-save"])
    simulator_speed.main()
    printed = json.loads(capsys.readouterr().out)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(sys, "argv", ["simulator_speed.py", *tiny, *where])
    simulator_speed.main()
    printed = json.loads(capsys.readouterr().out)
    (path,) = (tmp_path / "simulator_speed").glob("*.json")
    record = json.loads(path.read_text())
    assert record["result"] == printed
    assert record["run"]["argv"] == ["simulator_speed.py", *tiny, *where]


def test_wrap_records_a_commands_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = [sys.executable, "-c", "print('{\"gain_over_baseline\": 0.25}')"]
    code = results.main(["wrap", "tune_local", "--results-dir", str(tmp_path), "--", *command])
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"gain_over_baseline": 0.25}
    (path,) = (tmp_path / "tune_local").glob("*.json")
    record = json.loads(path.read_text())
    assert record["result"] == {"gain_over_baseline": 0.25}
    assert record["run"]["argv"] == command
    assert record["run"]["exit_code"] == 0


def test_every_benchmark_that_prints_json_records_its_run() -> None:
    printing = [
        path
        for path in sorted(BENCHMARKS.glob("*.py"))
        if '"--json"' in path.read_text() and path.name != "results.py"
    ]
    assert len(printing) >= 11
    for path in printing:
        text = path.read_text()
        assert "results.add_options(parser)" in text, path.name
        assert "results.start(" in text, path.name
        assert ".save(" in text, path.name
    recorded = set(
        re.findall(r'results\.start\(\s*"(\w+)"', "".join(p.read_text() for p in printing))
    )
    # every benchmark recorded has a layout, a docs page and a place in the index
    assert recorded <= set(results.LAYOUTS)
    for layout in results.LAYOUTS.values():
        assert (ROOT / "docs" / "benchmarks" / layout.page).is_file(), layout.page


def test_the_committed_index_is_the_generated_one() -> None:
    committed = (results.RESULTS_DIR / "index.md").read_text()
    assert committed == results.render_index(results.RESULTS_DIR), (
        "docs/benchmarks/results/index.md is stale: python benchmarks/results.py index"
    )
