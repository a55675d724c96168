"""A tenant's `load.prometheus.url` pointing at a server that streams without end: the
operator refuses each answer at its cap, says so in the resource's status, and neither
dies nor grows (the operator as a process with the manifests' ServiceAccount, the
hostile server a real HTTP server on loopback, which the e2e operators allow)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.hostile_server import ENDLESS_BYTES, Hostile, hostile_server

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .scenario import deploy_server, diagnostics
from .study import wait_for
from .workloads import dump, inference_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# every path the operator asks a Prometheus for, each answered without end
PROMETHEUS_PATHS = {"/api/v1/query": "endless", "/api/v1/status/config": "endless"}
# the operator's resident memory, measured at 149 MB at its peak over a whole study:
# an answer of 1 GiB read whole would pass this many times over
MAX_RSS_BYTES = 400 * 1024 * 1024


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    """The hostile server on its own event loop in a thread, for the test's duration."""
    ready = threading.Event()
    stop: list[asyncio.Future[None]] = []
    found: list[Hostile] = []

    async def serve() -> None:
        async with hostile_server(PROMETHEUS_PATHS) as server:
            found.append(server)
            stop.append(asyncio.get_running_loop().create_future())
            ready.set()
            await stop[0]

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the hostile server did not start"
    yield found[0]
    loop.call_soon_threadsafe(stop[0].set_result, None)
    thread.join(10)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


# Without scrapeIntervalSeconds the operator first reads the scrape interval from
# Prometheus's configuration; with it, the first read is a query.
@pytest.mark.parametrize(
    ("prometheus", "path"),
    [({}, "/api/v1/status/config"), ({"scrapeIntervalSeconds": 0.25}, "/api/v1/query")],
    ids=["configuration", "query"],
)
def test_a_prometheus_that_streams_without_end_does_not_take_the_operator_down(
    cluster: Cluster,
    operator: OperatorProcess,
    namespace: str,
    hostile: Hostile,
    prometheus: dict[str, object],
    path: str,
) -> None:
    kubectl = cluster.kubectl
    deploy_server(cluster, namespace)
    isvc = inference_service("hostile", "server", strategy="Canary", max_failures=1)
    isvc["spec"]["load"]["source"] = "prometheus"
    isvc["spec"]["load"]["prometheus"] = {"url": hostile.base, **prometheus}
    kubectl.apply(dump(isvc), "-n", namespace)

    assert operator.proc is not None
    pid = operator.proc.pid
    peak = [0]

    def ended(status: dict[str, object]) -> bool:
        peak[0] = max(peak[0], _rss_bytes(pid))
        return status.get("phase") == "Failed"

    status = wait_for(
        kubectl,
        namespace,
        "hostile",
        ended,
        what="the study to fail on the refused answers",
        timeout_s=200,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    said = str(status.get("message", "")) + " ".join(
        str(t.get("reason", "")) for t in status.get("trials") or []
    )
    assert "PrometheusUnavailable" in said, status
    assert "more than 16 MiB" in said, status
    # the same process all along: it never died
    assert operator.running(), operator.output()
    assert operator.proc.pid == pid
    assert peak[0] < MAX_RSS_BYTES, f"the operator's memory reached {peak[0] / 2**20:.0f} MiB"
    # the operator hung up at the cap: the server never sent its gigabyte
    assert path in hostile.sent, hostile.sent
    assert max(hostile.sent.values()) < ENDLESS_BYTES / 4, hostile.sent
