"""What the operator reads from Prometheus about the target's pods: the step source of
a measurement, narrowed to the pods under load and its scrape interval checked against
the step before any load is sent, and the SLA verdict on production's traffic over a
window (the watch after a write-back, re-tune OnSLABreach)."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from batchpilot.operator import decisions, promscope
from batchpilot.operator.kubeworkload import Workload
from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.world import TargetProblem

if TYPE_CHECKING:
    from batchpilot.capacity.prometheus import PrometheusStepSource
    from batchpilot.capacity.prometheus_http import AddressGuard

log = logging.getLogger(__name__)


class PrometheusReads:
    def __init__(
        self,
        workload: Workload,
        *,
        spec: InferenceServiceSpec,
        guard: AddressGuard | None,
    ) -> None:
        self._workload = workload
        self._spec = spec
        # the platform's Prometheus URL policy, checked on every address a query uses
        self._guard = guard

    async def checked_source(self, pod_names: list[str]) -> PrometheusStepSource | None:
        """The Prometheus source narrowed to the pods under load, its scrape interval
        checked against the step length before any load is sent."""
        from batchpilot.capacity.prometheus import NoLatencyHistogram, PrometheusQueryError

        try:
            source = self.source(pod_names)
        except NoLatencyHistogram as exc:
            raise TargetProblem("NoLatencyHistogram", str(exc), stops_study=True) from None
        if source is None:
            return None
        from batchpilot.capacity.scrape import ScrapeWindowError

        try:
            await source.check_step(self._spec.load.step_seconds)
        except ScrapeWindowError as exc:
            raise TargetProblem("StepShorterThanScrapes", f"load.stepSeconds: {exc}") from None
        except PrometheusQueryError as exc:
            raise TargetProblem("PrometheusUnavailable", str(exc)) from None
        return source

    def source(self, pod_names: list[str]) -> PrometheusStepSource | None:
        """The source reading the series of `pod_names` only: a canary's pods, not
        production's; the pods under load, not every pod of the namespace."""
        prometheus = self._spec.load.prometheus
        if self._spec.load.source != "prometheus" or prometheus is None:
            return None
        from batchpilot.operator.promsource import prometheus_source

        try:
            selector = promscope.scoped_selector(
                prometheus.selector, pod_names, prometheus.pod_label
            )
        except ValueError as exc:
            raise TargetProblem("PrometheusScope", f"load.prometheus: {exc}") from None
        return prometheus_source(self._spec, selector=selector, address_guard=self._guard)

    async def production_verdict(self, window_s: float) -> decisions.ProductionVerdict | None:
        """Whether production kept the SLA over the window, with load.source prometheus;
        None when nothing could be judged: a query that fails or a window without
        traffic is no reason to undo a configuration that runs, nor proof that it
        keeps the SLA."""
        from batchpilot.capacity.prometheus import NoLatencyHistogram, PrometheusQueryError
        from batchpilot.capacity.promql import MS_PER_UNIT

        if self._spec.load.source != "prometheus":
            return None
        pods = await self._workload.pods(await self._workload.target())
        if not pods:
            return None  # nothing runs to judge; the watch above saw to the pods
        try:
            source = self.source([str(p["metadata"]["name"]) for p in pods])
        except NoLatencyHistogram:  # the study itself refused it: nothing to judge by
            return None
        if source is None:
            return None

        queries = source.queries(window_s)
        end = time.time()
        try:
            values = {
                name: await source.query_scalar(query, at_unix=end)
                for name, query in queries.items()
                if name in ("p99", "ok_rps", "total_rps", "ttft_p99", "tpot_p99")
            }
        except PrometheusQueryError as exc:
            log.warning("verify: no SLA verdict from Prometheus: %s", exc)
            return None
        total_rps = values["total_rps"]
        if not (math.isfinite(total_rps) and total_rps > 0):
            return None  # no traffic over the window: nothing to judge
        to_ms = MS_PER_UNIT[source.metrics.latency_unit]
        return decisions.ProductionVerdict(
            decisions.sla_breach(
                p99_ms=values["p99"] * to_ms,
                ok_rps=values["ok_rps"],
                total_rps=total_rps,
                sla=self._spec.sla.to_sla(),
                ttft_p99_ms=values.get("ttft_p99", math.nan) * to_ms,
                tpot_p99_ms=values.get("tpot_p99", math.nan) * to_ms,
            )
        )
