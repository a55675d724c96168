"""Step decisions from the server's own metrics, through Prometheus (DESIGN.md §6): p99
from `histogram_quantile` over the step window, rates from counters."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from batchpilot.capacity.prometheus_http import PrometheusHTTP, PrometheusQueryError
from batchpilot.capacity.scrape import check_window, scrape_interval_from_config
from batchpilot.loadgen.result import LoadResult
from batchpilot.models import SLA, StepResult, step_passes

__all__ = ["PrometheusQueryError", "PrometheusStepSource"]


class PrometheusStepSource:
    """Decides a step from PromQL over the window the step ran in. `selector` narrows the
    series to the target's (e.g. `job="resnet",namespace="prod"`).

    `scrape_interval_s` is how often Prometheus scrapes the target; unset, it is read from
    Prometheus's configuration (`check_step`). A step shorter than four intervals is
    refused (`batchpilot.capacity.scrape`).

    https URLs are verified against the system's trust store, or only against
    `ca_pem` (PEM text) / `ca_file` (a PEM file) when given; a URL with a query or a
    fragment is refused (ValueError), as is a CA bundle that does not parse."""

    def __init__(
        self,
        url: str,
        *,
        latency_metric: str = "batchpilot_request_latency_seconds",
        requests_metric: str = "batchpilot_requests_total",
        ok_outcome: str = "ok",
        selector: str = "",
        settle_s: float = 2.5,
        query_timeout_s: float = 10.0,
        scrape_interval_s: float | None = None,
        ca_pem: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        if settle_s < 0 or query_timeout_s <= 0:
            raise ValueError("settle time must be ≥ 0 s and query timeout > 0 s")
        if scrape_interval_s is not None and not (
            math.isfinite(scrape_interval_s) and scrape_interval_s > 0
        ):
            raise ValueError(f"scrape interval must be > 0 s, got {scrape_interval_s:g}")
        self.scrape_interval_s = scrape_interval_s
        self._http = PrometheusHTTP(url, timeout_s=query_timeout_s, ca_pem=ca_pem, ca_file=ca_file)
        self.url = self._http.url
        self._latency = latency_metric
        self._requests = requests_metric
        self._ok = ok_outcome
        self._selector = selector.strip().strip("{}").strip()
        self._settle_s = settle_s
        self._timeout_s = query_timeout_s

    def queries(self, window_s: float) -> dict[str, str]:
        """The PromQL for a window, by what it measures."""
        window = f"{max(1, round(window_s * 1000))}ms"
        buckets = f"{self._latency}_bucket{self._matchers()}"
        ok = self._matchers(f'outcome="{self._ok}"')
        return {
            "p50": f"histogram_quantile(0.5, sum by (le) (rate({buckets}[{window}])))",
            "p99": f"histogram_quantile(0.99, sum by (le) (rate({buckets}[{window}])))",
            "ok_rps": f"sum(rate({self._requests}{ok}[{window}]))",
            "total_rps": f"sum(rate({self._requests}{self._matchers()}[{window}]))",
        }

    async def check_step(self, step_s: float) -> float:
        """Refuse (ScrapeWindowError) steps of `step_s` seconds if they are shorter than
        four scrape intervals, reading the interval from Prometheus unless configured.
        Returns the interval. Call it before the first step: steps only ever lengthen."""
        if self.scrape_interval_s is None:
            self.scrape_interval_s = scrape_interval_from_config(
                await self._config_yaml(), self._selector
            )
        check_window(step_s, self.scrape_interval_s)
        return self.scrape_interval_s

    async def _config_yaml(self) -> str:
        """Prometheus's loaded configuration (GET /api/v1/status/config)."""
        try:
            data: Any = await self._http.get("/api/v1/status/config")
            return str(data["yaml"])
        except PrometheusQueryError as exc:
            problem = str(exc).removeprefix(f"Prometheus at {self._http.shown}: ")
            body_excerpt = exc.body_excerpt
        except (KeyError, TypeError):
            problem, body_excerpt = "the answer holds no configuration", ""
        raise PrometheusQueryError(
            f"Prometheus at {self._http.shown}: cannot read its configuration for the scrape "
            f"interval ({problem}); give the interval explicitly",
            body_excerpt=body_excerpt,
        )

    async def step_result(
        self, *, load: LoadResult, start_unix: float, end_unix: float, sla: SLA
    ) -> StepResult:
        # Let Prometheus scrape past the end of the window before asking about it.
        await asyncio.sleep(self._settle_s)
        window_s = max(end_unix - start_unix, 2.0)
        if self.scrape_interval_s is not None:
            check_window(window_s, self.scrape_interval_s)
        values = {
            name: await self.query_scalar(query, at_unix=end_unix)
            for name, query in self.queries(window_s).items()
        }
        p99_ms = values["p99"] * 1000.0
        total = values["total_rps"]
        ok_rps = values["ok_rps"] if math.isfinite(values["ok_rps"]) else 0.0
        error_rate = 1.0 - ok_rps / total if math.isfinite(total) and total > 0 else 1.0
        if not math.isfinite(p99_ms) or not (math.isfinite(total) and total > 0):
            passed, reason = False, "Prometheus holds no requests for this window"
        else:
            passed, reason = step_passes(
                p99_ms=p99_ms,
                error_rate=error_rate,
                offered_rps=load.offered_rps,
                achieved_rps=ok_rps,
                sla=sla,
            )
        return StepResult(
            offered_rps=load.offered_rps,
            achieved_rps=ok_rps,
            p50_ms=_finite_or(values["p50"] * 1000.0, 0.0),
            p99_ms=_finite_or(p99_ms, math.inf),
            error_rate=error_rate,
            requests=round(total * window_s) if math.isfinite(total) else 0,
            passed=passed,
            reason=reason,
            duration_s=load.duration_s,
            source="prometheus",
        )

    async def query_scalar(self, query: str, *, at_unix: float) -> float:
        """The single value of an instant query at `at_unix`; NaN when there is none."""
        data: Any = await self._http.get(
            "/api/v1/query", {"query": query, "time": f"{at_unix:.3f}"}
        )
        try:
            result = data["result"]
            if data.get("resultType") == "scalar":
                return float(result[1])
            return float(result[0]["value"][1]) if result else math.nan
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise PrometheusQueryError(
                f"Prometheus at {self._http.shown}: the answer to the query is not a "
                "vector or scalar"
            ) from None

    async def check_reachable(self) -> None:
        """Raise PrometheusQueryError unless the API answers a trivial query: the URL,
        TLS and the path are checked before any load is sent."""
        await self.query_scalar("vector(1)", at_unix=time.time())

    def _matchers(self, *extra: str) -> str:
        parts = [p for p in (self._selector, *extra) if p]
        return "{" + ",".join(parts) + "}" if parts else ""


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default
