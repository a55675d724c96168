"""scripts/test-report, the end of every `scripts/test` run: phase times, time per tier
and the slowest tests from pytest's JUnit XML, and one closing line counting every run's
tests together."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "scripts" / "test-report"

OTHER = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.unit.test_a" name="test_fast" time="0.5"/>
<testcase classname="tests.component.test_b" name="test_slow" time="120.25"/>
<testcase classname="tests.component.test_b" name="test_off" time="0.0">
<skipped message="no runtime"/></testcase>
</testsuite></testsuites>
"""
E2E = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="1">
<testcase classname="tests.e2e.test_c" name="test_broken" time="300.0">
<failure message="AssertionError: boom&#10;assert 1 == 2">trace</failure></testcase>
</testsuite></testsuites>
"""


def run(tmp_path: Path, *xml: str) -> subprocess.CompletedProcess[str]:
    phases = tmp_path / "phases.tsv"
    phases.write_text("venv\t12\npytest-other\t700\nbroken line\n")
    files = []
    for i, text in enumerate(xml):
        path = tmp_path / f"r{i}.xml"
        path.write_text(text)
        files.append(str(path))
    return subprocess.run(
        [sys.executable, str(REPORT), str(phases), *files],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_phases_tiers_slowest_first_and_one_count_of_both_runs(tmp_path: Path) -> None:
    done = run(tmp_path, OTHER, E2E)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "     12  venv" in lines
    assert "    700  pytest-other" in lines
    tiers = lines[lines.index(next(x for x in lines if x.startswith("== tiers"))) + 1 :][:3]
    assert [t.split()[1] for t in tiers] == ["e2e", "component", "unit"]
    slowest = [x for x in lines if "::" in x]
    assert slowest[0].strip() == "300.0  tests.e2e.test_c::test_broken"
    assert slowest[1].strip() == "120.2  tests.component.test_b::test_slow"
    assert lines[-1] == "suite: 2 passed, 1 failed, 1 skipped"
    failures = lines[lines.index("== failures (the head and the end of each message) ==") + 1 :]
    assert failures[:3] == [
        "--- tests.e2e.test_c::test_broken",
        "    AssertionError: boom",
        "    assert 1 == 2",
    ]


def test_a_long_failure_shows_its_head_and_its_end(tmp_path: Path) -> None:
    message = "&#10;".join(f"line {i}" for i in range(100))
    broken = E2E.replace('message="AssertionError: boom&#10;assert 1 == 2"', f'message="{message}"')
    done = run(tmp_path, broken)
    lines = done.stdout.splitlines()
    shown = lines[lines.index("--- tests.e2e.test_c::test_broken") + 1 : -1]
    assert [x.strip() for x in shown] == [
        *(f"line {i}" for i in range(6)),
        "[... 84 lines ...]",
        *(f"line {i}" for i in range(90, 100)),
    ]


def test_no_test_at_all_is_an_error(tmp_path: Path) -> None:
    empty = '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="0"/></testsuites>'
    done = run(tmp_path, empty)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == "suite: 0 passed, 0 failed, 0 skipped"
