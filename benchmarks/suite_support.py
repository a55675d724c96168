"""The test suite's helpers (tests/support) for the benchmarks.

A benchmark runs as a script (`python benchmarks/NAME.py`), which puts only benchmarks/
on sys.path; this module adds tests/ after it, so that the suite's `support` package
imports, and hands on what the benchmarks use of it."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

from support.stub_server import StubServerProcess  # noqa: E402

__all__ = ["StubServerProcess"]
