"""How long the harness lets kubectl run: never less than kubectl's own `--timeout`."""

from __future__ import annotations

import pytest

from .kubectl import subprocess_timeout_s


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("get", "pods"), 60.0),
        (("rollout", "status", "deployment/llm", "--timeout=400s"), 430.0),
        (("delete", "crd", "x", "--timeout=5m"), 330.0),
        (("wait", "--for=condition=Ready", "--timeout=1h2m3s"), 3753.0),
        # a short wait of kubectl's own still gets the default
        (("delete", "pod", "p", "--timeout=10s"), 60.0),
        # not a duration kubectl's flag would take: the default
        (("get", "pods", "--timeout=soon"), 60.0),
    ],
)
def test_kubectl_runs_past_its_own_timeout(args: tuple[str, ...], expected: float) -> None:
    assert subprocess_timeout_s(args) == expected
