"""A tenant's `load.prometheus.url` pointing at a server that streams without end: the
operator refuses each answer at its cap, says so in the resource's status, and neither
dies nor grows (the operator as a process with the manifests' ServiceAccount, the
hostile server a real HTTP server on loopback, which the e2e operators allow)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from operator_study import RssSampler
from support.hostile_server import ENDLESS_BYTES, Hostile, hostile_app
from support.tokenserver import serving_in_thread

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
MAX_RSS_MB = 400.0


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    """The hostile server on its own event loop in a thread, for the test's duration."""
    hostile = Hostile()
    with serving_in_thread(hostile_app(hostile, PROMETHEUS_PATHS)) as url:
        hostile.port = int(url.rsplit(":", 1)[1])
        yield hostile


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
    # the operator runs in a process group of its own (procs.spawn)
    with RssSampler(pid) as rss:
        status = wait_for(
            kubectl,
            namespace,
            "hostile",
            lambda s: s.get("phase") == "Failed",
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
    assert rss.max_mb < MAX_RSS_MB, f"the operator's memory reached {rss.max_mb:.0f} MB"
    # the operator hung up at the cap: the server never sent its gigabyte
    assert path in hostile.sent, hostile.sent
    assert max(hostile.sent.values()) < ENDLESS_BYTES / 4, hostile.sent
