"""Every test under tests/unit carries the `unit` marker, so the tier runs on its own
with `-m unit` like the others (`component`, `operator`, `e2e`, `runtimes`)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a conftest's hook sees every collected item, not only this directory's
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.unit)
