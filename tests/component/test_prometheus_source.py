"""The Prometheus step source against a real Prometheus scraping the reference server:
the same step decision from PromQL as from the client, and how the server-side p99
compares with the client's on the same steps; the operator's queries narrowed to a pod
by the label a scrape setup relabelled its name into."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

from batchpilot.capacity.http import measure_step
from batchpilot.capacity.prometheus import PrometheusQueryError, PrometheusStepSource
from batchpilot.capacity.scrape import ScrapeWindowError
from batchpilot.capacity.steps import step_from_load
from batchpilot.models import SLA, RequestMix
from batchpilot.operator import promscope
from batchpilot.operator.promsource import prometheus_source
from batchpilot.operator.spec import parse_spec
from batchpilot.server.process import ServerProcess, free_port
from support.prometheus_process import PrometheusProcess

pytestmark = [pytest.mark.component, pytest.mark.timeout(240)]


# a scrape setup that puts the pod's name in kubernetes_pod_name, not in pod
POD = "resnet-7d9f-x2x4q"
POD_RELABEL = {"target_label": "kubernetes_pod_name", "replacement": POD}


def operator_source(url: str, job: str) -> tuple[PrometheusStepSource, str]:
    """The source the operator builds for load.prometheus.podLabel kubernetes_pod_name,
    narrowed to the measured pod, and the selector it reads with."""
    prometheus = {"url": url, "selector": f'job="{job}"', "podLabel": "kubernetes_pod_name"}
    spec = parse_spec(
        {
            "target": {"name": "resnet"},
            "sla": {"p99LatencyMs": 500},
            "load": {
                "endpoint": {"port": 8080, "path": "/v1/predict"},
                "source": "prometheus",
                "prometheus": prometheus,
            },
        }
    )
    assert spec.load.prometheus is not None
    scoped = promscope.scoped_selector(
        spec.load.prometheus.selector, [POD], spec.load.prometheus.pod_label
    )
    source = prometheus_source(spec, selector=scoped)
    assert source is not None
    return source, scoped


async def test_server_side_and_client_side_steps_agree(
    record_property: Callable[[str, object], None],
) -> None:
    sla = SLA(p99_ms=500, max_error_rate=0.01)
    server = ServerProcess(
        max_batch_size=8, max_queue_time_ms=5.0, threads=1, extra_args=["--queue-limit", "64"]
    )
    async with (
        server,
        PrometheusProcess([server.url], scrape_interval_s=0.5) as prometheus,
    ):
        await prometheus.wait_for_scrape()
        source = PrometheusStepSource(prometheus.url, selector=f'job="{prometheus.job}"')
        comparison = []
        # A light step both views pass, and a flood far past any CPU server's capacity
        # (its bounded queue rejects with 503) that both fail.
        for rate, expect_pass in ((20.0, True), (3000.0, False)):
            step, load = await measure_step(
                [server.url], rate=rate, sla=sla, mix=RequestMix.default(), duration_s=3.0,
                timeout_s=2.0, seed=1, arrival="constant", source=source,
            )  # fmt: skip
            client = step_from_load(load, sla)
            comparison.append((rate, step.p99_ms, client.p99_ms, step.passed, client.passed))
            assert step.source == "prometheus"
            assert step.passed is expect_pass, step.reason
            assert client.passed is expect_pass, client.reason
            assert step.offered_rps == load.offered_rps
            if expect_pass:
                assert math.isfinite(step.p99_ms)
                assert step.p99_ms > 0
                assert step.error_rate == 0.0
                assert step.achieved_rps == pytest.approx(load.achieved_rps, rel=0.25)
            else:
                assert step.error_rate > sla.max_error_rate
    for rate, server_p99, client_p99, _, _ in comparison:
        record_property(
            f"p99_ms_at_{rate:g}_rps", f"server {server_p99:.1f}, client {client_p99:.1f}"
        )
        print(
            f"{rate:g} req/s: server-side p99 {server_p99:.1f} ms, client-side {client_p99:.1f} ms"
        )


async def test_an_unreachable_prometheus_is_a_clear_error() -> None:
    source = PrometheusStepSource(f"http://127.0.0.1:{free_port()}", query_timeout_s=2.0)
    with pytest.raises(PrometheusQueryError, match=r"Prometheus at http://127\.0\.0\.1"):
        await source.query_scalar("up", at_unix=0.0)


async def test_scrape_interval_is_read_from_prometheus_and_short_steps_refused() -> None:
    server = ServerProcess(max_batch_size=8, max_queue_time_ms=5.0, threads=1)
    scrape = PrometheusProcess([server.url], scrape_interval_s=0.5, relabel_configs=[POD_RELABEL])
    async with server, scrape as prometheus:
        source = PrometheusStepSource(prometheus.url, selector=f'job="{prometheus.job}"')
        assert await source.check_step(2.0) == pytest.approx(0.5)
        # the operator's scoped query finds the pod's series by the relabelled label; the
        # `pod` label it would have used before podLabel matches nothing here
        await prometheus.wait_for_scrape()
        scoped_source, scoped = operator_source(prometheus.url, prometheus.job)
        now = time.time()
        assert await scoped_source.query_scalar(f"count(up{{{scoped}}})", at_unix=now) == 1.0
        in_pod = f'job="{prometheus.job}",{promscope.pods_matcher([POD])}'
        assert math.isnan(await scoped_source.query_scalar(f"count(up{{{in_pod}}})", at_unix=now))
        with pytest.raises(ScrapeWindowError, match="shorter than 4 scrape intervals"):
            await source.check_step(1.5)
    with pytest.raises(PrometheusQueryError, match="give the interval explicitly"):
        await PrometheusStepSource(f"http://127.0.0.1:{free_port()}").check_step(5.0)
