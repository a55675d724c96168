"""Step decisions from the server's own metrics, through Prometheus: p99 from
`histogram_quantile` over the step window, rates from counters. The metric names are a
runtime adapter's `Metrics` (`PrometheusStepSource.for_runtime`); by default the
reference server's."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

from batchpilot.capacity.prometheus_http import AddressGuard, PrometheusHTTP, PrometheusQueryError
from batchpilot.capacity.promql import MS_PER_UNIT, Metrics, with_matchers
from batchpilot.capacity.scrape import (
    MIN_SCRAPES_PER_WINDOW,
    check_window,
    scrape_interval_from_config,
)
from batchpilot.capacity.steps import (
    P99_UCB_LEVEL,
    judge_client,
    quantile_upper_rank,
    stream_figures,
    token_tails,
)
from batchpilot.loadgen.result import LoadResult
from batchpilot.models import SLA, StepResult, TokenTails, step_passes

__all__ = ["PrometheusQueryError", "PrometheusStepSource"]


class HasMetrics(Protocol):
    """What `PrometheusStepSource.for_runtime` reads of a runtime adapter
    (`runtimes.base.Runtime`): its name for people and its metrics for a model. The
    capacity search sits below the runtimes, so it names only what it uses."""

    @property
    def title(self) -> str: ...

    def metrics_for(self, model: str | None = None) -> Metrics: ...


class NoLatencyHistogram(ValueError):
    """The runtime exports no latency histogram, so no p99 can come from Prometheus."""


DEFAULT_LATENCY_METRIC = "batchpilot_request_latency_seconds"
DEFAULT_REQUESTS_METRIC = "batchpilot_requests_total"


def reference_metrics(
    latency_metric: str = DEFAULT_LATENCY_METRIC,
    requests_metric: str = DEFAULT_REQUESTS_METRIC,
    ok_outcome: str = "ok",
) -> Metrics:
    """The reference server's metrics (or ones named like them: a histogram in seconds,
    a request counter with an `outcome` label)."""
    return Metrics(
        port_note="the serving port, /metrics",
        latency_histogram=latency_metric,
        latency_unit="s",
        ok_requests=f'{requests_metric}{{outcome="{ok_outcome}"}}',
        total_requests=requests_metric,
    )


class PrometheusStepSource:
    """Decides a step from PromQL over the window the step ran in. `selector` narrows the
    series to the target's (e.g. `job="resnet",namespace="prod"`); `metrics` names them
    (default: the reference server's, or `latency_metric`/`requests_metric`/`ok_outcome`
    named like them). Where the runtime exports its metrics `export_delay_s` late, the
    window is read that much later.

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
        latency_metric: str = DEFAULT_LATENCY_METRIC,
        requests_metric: str = DEFAULT_REQUESTS_METRIC,
        ok_outcome: str = "ok",
        selector: str = "",
        metrics: Metrics | None = None,
        settle_s: float = 2.5,
        query_timeout_s: float = 10.0,
        scrape_interval_s: float | None = None,
        ca_pem: str | None = None,
        ca_file: str | None = None,
        address_guard: AddressGuard | None = None,
    ) -> None:
        if settle_s < 0 or query_timeout_s <= 0:
            raise ValueError("settle time must be ≥ 0 s and query timeout > 0 s")
        if scrape_interval_s is not None and not (
            math.isfinite(scrape_interval_s) and scrape_interval_s > 0
        ):
            raise ValueError(f"scrape interval must be > 0 s, got {scrape_interval_s:g}")
        self.scrape_interval_s = scrape_interval_s
        if metrics is None:
            metrics = reference_metrics(latency_metric, requests_metric, ok_outcome)
        if metrics.latency_histogram is None:
            raise NoLatencyHistogram(
                "these metrics hold no latency histogram, so Prometheus cannot give a p99; "
                "decide steps on the client's p99 instead"
            )
        self._http = PrometheusHTTP(
            url,
            timeout_s=query_timeout_s,
            ca_pem=ca_pem,
            ca_file=ca_file,
            address_guard=address_guard,
        )
        self.url = self._http.url
        self.metrics = metrics
        self._latency = metrics.latency_histogram
        self._selector = selector.strip().strip("{}").strip()
        # checked here, so a malformed expression fails before any load is sent
        with_matchers(metrics.ok_requests, self._selector)
        with_matchers(metrics.total_requests, self._selector)
        self._settle_s = settle_s
        self._timeout_s = query_timeout_s
        # live traffic the series carry besides the load (a production target): set by
        # `set_background`, taken off the goodput before it is held against the offer
        self.background_ok_rps = 0.0

    @classmethod
    def for_runtime(
        cls,
        url: str,
        runtime: HasMetrics,
        *,
        model: str | None = None,
        selector: str = "",
        settle_s: float = 2.5,
        query_timeout_s: float = 10.0,
        scrape_interval_s: float | None = None,
        ca_pem: str | None = None,
        ca_file: str | None = None,
        address_guard: AddressGuard | None = None,
        tokens: Mapping[str, str] | None = None,
    ) -> PrometheusStepSource:
        """A source reading `runtime`'s own metrics (`runtime.metrics`) for `model`
        (default: its bundled one), with `tokens` replacing its `ttft_histogram` or
        `tpot_histogram`. NoLatencyHistogram when the runtime exports no latency
        histogram."""
        metrics = runtime.metrics_for(model).model_copy(update=dict(tokens or {}))
        if metrics.latency_histogram is None:
            summary = (
                f"; its summary {metrics.latency_summary} holds quantiles over its own "
                "sliding window, mixing earlier steps into each"
                if metrics.latency_summary
                else ""
            )
            raise NoLatencyHistogram(
                f"{runtime.title} exports no latency histogram ({metrics.port_note}){summary}"
                ", so a step's p99 cannot come from Prometheus; leave the Prometheus source "
                "out and steps are decided on the client's p99"
            )
        return cls(
            url,
            metrics=metrics,
            selector=selector,
            settle_s=settle_s,
            query_timeout_s=query_timeout_s,
            scrape_interval_s=scrape_interval_s,
            ca_pem=ca_pem,
            ca_file=ca_file,
            address_guard=address_guard,
        )

    def queries(self, window_s: float, sla_quantile: float | None = None) -> dict[str, str]:
        """The PromQL for a window, by what it measures (p50/p99 in the histogram's
        unit, rates in requests per second; "ttft_p99" and "tpot_p99" where the server
        has those histograms); with `sla_quantile`, also the answered requests'
        latency at that quantile ("sla": see sla_quantile, and "ttft_sla", "tpot_sla")."""
        window = f"{max(1, round(window_s * 1000))}ms"

        def quantile(q: float, histogram: str) -> str:
            buckets = with_matchers(
                f"{histogram}_bucket", self._selector, self.metrics.latency_matchers
            )
            return f"histogram_quantile({q:.6g}, sum by (le) (rate({buckets}[{window}])))"

        ok = with_matchers(self.metrics.ok_requests, self._selector)
        total = with_matchers(self.metrics.total_requests, self._selector)
        queries = {
            "p50": quantile(0.5, self._latency),
            "p99": quantile(0.99, self._latency),
            "ok_rps": f"sum(rate({ok}[{window}]))",
            "total_rps": f"sum(rate({total}[{window}]))",
        }
        tokens = (("ttft", self.metrics.ttft_histogram), ("tpot", self.metrics.tpot_histogram))
        for name, histogram in tokens:
            if histogram is not None:
                queries[f"{name}_p99"] = quantile(0.99, histogram)
        if sla_quantile is not None:
            queries["sla"] = quantile(sla_quantile, self._latency)
            for name, histogram in tokens:
                if histogram is not None:
                    queries[f"{name}_sla"] = quantile(sla_quantile, histogram)
        return queries

    @property
    def reads_token_tails(self) -> bool:
        """Whether the server's own TTFT or TPOT histogram is read (else the client's
        tails decide a token-stream step)."""
        return self.metrics.ttft_histogram is not None or self.metrics.tpot_histogram is not None

    async def live_ok_rps(self, window_s: float) -> float:
        """The successful requests per second the series served over the `window_s`
        seconds up to now: before any load is sent, what live traffic alone brings.
        0.0 when Prometheus holds none."""
        queries = self.queries(window_s)
        value = await self.query_scalar(queries["ok_rps"], at_unix=time.time())
        return value if math.isfinite(value) and value > 0 else 0.0

    def set_background(self, ok_rps: float) -> None:
        """Live traffic of `ok_rps` flows through the series beside the offered load: a
        step's goodput is judged against its offer without it (the load must still be
        served in full), while the step reports everything served, live traffic
        included, as the pods' throughput."""
        if not (math.isfinite(ok_rps) and ok_rps >= 0):
            raise ValueError(f"background rate must be ≥ 0 req/s, got {ok_rps:g}")
        self.background_ok_rps = ok_rps

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

    def measured_window(self, load: LoadResult, start_unix: float) -> tuple[float, float]:
        """(end, length) of the window a step is read over: the schedule less its warm-up,
        as the client's figures are, without the drain after it. Where that is shorter
        than MIN_SCRAPES_PER_WINDOW scrape intervals (or 2 s), it reaches back into the
        warm-up as far as it must to be read from enough scrapes."""
        end = start_unix + load.duration_s
        length = load.duration_s - load.warmup_s
        floor = 2.0
        if self.scrape_interval_s is not None:
            floor = max(floor, MIN_SCRAPES_PER_WINDOW * self.scrape_interval_s)
        return end, max(length, floor)

    async def step_result(
        self,
        *,
        load: LoadResult,
        start_unix: float,
        end_unix: float,
        sla: SLA,
        min_requests: int = 0,
    ) -> StepResult:
        """The step decided on the server's own figures by the client's rules: the SLA p99
        counts every non-OK attempt (the server's, or the client's timeouts and
        connection errors) as infinitely slow, a window with fewer than `min_requests`
        requests is judged on its p99's upper confidence bound, the warm-up and the
        drain are left out, and the client's health decides whether it could tell."""
        # The runtime's figures for the window reach Prometheus export_delay_s late:
        # read the window that much later, and only once Prometheus has scraped past it
        # and the drain has ended.
        window_end, window_s = self.measured_window(load, start_unix)
        at_unix = window_end + self.metrics.export_delay_s
        ready_unix = max(at_unix, end_unix + self.metrics.export_delay_s)
        await asyncio.sleep(max(0.0, ready_unix - time.time()) + self._settle_s)
        queries = self.queries(window_s)
        values = {name: await self.query_scalar(q, at_unix=at_unix) for name, q in queries.items()}
        to_ms = MS_PER_UNIT[self.metrics.latency_unit]
        ok_p99_ms = values["p99"] * to_ms
        total = values["total_rps"]
        ok_rps = values["ok_rps"] if math.isfinite(values["ok_rps"]) else 0.0
        server_errors = 1.0 - ok_rps / total if math.isfinite(total) and total > 0 else 1.0
        error_rate = max(server_errors, load.error_rate)
        requests = round(total * window_s) if math.isfinite(total) else 0
        p99_ms = math.inf
        bound_note = ""
        # the client's TTFT and TPOT tails, unless the server's own histograms are read
        tails = token_tails(load, bound=0 < load.requests < min_requests)
        if not math.isfinite(ok_p99_ms) or requests <= 0:
            passed, reason = False, "Prometheus holds no requests for this window"
        else:
            quantile = sla_quantile(requests, error_rate, min_requests)
            at_sla = values
            if quantile is not None:
                p99_ms = ok_p99_ms
                if not math.isclose(quantile, 0.99):
                    extra = self.queries(window_s, quantile)
                    at_sla = {
                        name.replace("_sla", "_p99"): await self.query_scalar(q, at_unix=at_unix)
                        for name, q in extra.items()
                        if name.endswith("sla")
                    }
                    p99_ms = at_sla.pop("sla") * to_ms
            if tails is not None and self.reads_token_tails:
                tails = server_token_tails(
                    at_sla if quantile is not None else {}, tails, self.metrics
                )
            if 0 < requests < min_requests:
                bound_note = (
                    f" (upper {P99_UCB_LEVEL:.0%} bound of p99 from {requests} requests, "
                    f"fewer than {min_requests})"
                )
            passed, reason = step_passes(
                p99_ms=p99_ms,
                error_rate=error_rate,
                offered_rps=load.offered_rps,
                achieved_rps=max(0.0, ok_rps - self.background_ok_rps),
                sla=sla,
                tokens=tails,
            )
            if not passed and bound_note:
                reason += bound_note
        passed, reason, valid = judge_client(load, sla, p99_ms, passed, reason, tails)
        return StepResult(
            offered_rps=load.offered_rps,
            achieved_rps=ok_rps,
            p50_ms=_finite_or(values["p50"] * to_ms, 0.0),
            p99_ms=p99_ms if math.isfinite(p99_ms) else math.inf,
            ok_p99_ms=_finite_or(ok_p99_ms, math.inf),
            error_rate=error_rate,
            requests=requests,
            passed=passed,
            reason=reason,
            duration_s=load.duration_s,
            source="prometheus",
            valid=valid,
            client=load.client,
            worker_clients=load.worker_clients,
            warmup_s=load.warmup_s,
            **stream_figures(load, tails),
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


def server_token_tails(
    values: dict[str, float], client: TokenTails, metrics: Metrics
) -> TokenTails:
    """A window's TTFT and TPOT tails from the server's histograms (`values`: "ttft_p99"
    and "tpot_p99" in the histograms' unit), the client's where the server has no such
    histogram. A histogram the server has but that holds nothing in the window gives
    an infinite TTFT (no stream answered, or too few to judge) and no TPOT (no answer
    of two tokens or more, which meets any target)."""
    to_ms = MS_PER_UNIT[metrics.latency_unit]

    def tail(
        name: str, histogram: str | None, mine: float | None, empty: float | None
    ) -> float | None:
        if histogram is None:
            return mine
        value = values.get(f"{name}_p99", math.nan)
        return value * to_ms if math.isfinite(value) else empty

    return TokenTails(
        tail("ttft", metrics.ttft_histogram, client.ttft_p99_ms, math.inf),
        tail("tpot", metrics.tpot_histogram, client.tpot_p99_ms, None),
    )


def sla_quantile(requests: int, non_ok_share: float, min_requests: int = 0) -> float | None:
    """The quantile of the answered requests' latencies that is the SLA p99 of every
    attempt, each non-OK one counted infinitely slow; with fewer than `min_requests`
    requests, the quantile of that p99's upper confidence bound (steps.quantile_upper_rank).
    None when it is infinite: more non-OK attempts than the quantile leaves, or too few
    requests to bound it."""
    quantile = 0.99
    if 0 < requests < min_requests:
        rank = quantile_upper_rank(requests)
        if rank > requests:
            return None
        quantile = rank / requests
    ok_share = 1.0 - non_ok_share
    if ok_share <= 0 or quantile > ok_share:
        return None
    return min(quantile / ok_share, 1.0)


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default
