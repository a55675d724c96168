"""PromQL text for the step source: where a runtime's p99 (and a token-stream server's
TTFT and TPOT p99) and request rates come from
(`Metrics`, which each runtime adapter fills in), label matchers added to its counter
selectors, and the latency units runtimes export. Pure functions and one value type, no
Prometheus."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from batchpilot.models import Frozen

# A plain instant selector: `name`, `name{...}` or `{...}` (the form `Metrics` takes).
_SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)?\s*(\{(.*)\})?\s*$", re.DOTALL)
# how many milliseconds one of a histogram's unit is
MS_PER_UNIT: dict[str, float] = {"s": 1000.0, "ms": 1.0, "us": 1e-3}


class Metrics(Frozen):
    """Where p99 and the request rates come from in the runtime's Prometheus metrics.
    Each request expression is a PromQL counter (selector included) whose `rate()` over
    a window gives requests per second."""

    port_note: str  # where they are served, e.g. ":8002/metrics"
    latency_histogram: str | None  # the histogram's name without _bucket; None: none
    latency_unit: Literal["s", "ms", "us"] = "s"  # of every histogram here
    # label matchers that keep the histograms to inference requests, e.g. 'path="/infer"'
    latency_matchers: str = ""
    # a token-stream server's own time-to-first-token and time-per-output-token (one
    # value per request: (last - first) / (tokens - 1)) histograms, where it has them
    ttft_histogram: str | None = None
    tpot_histogram: str | None = None
    ok_requests: str
    total_requests: str
    batch_size: str | None = None  # PromQL for the mean batch size, where there is one
    # a summary (name, with a `quantile` label) the runtime keeps over its own sliding
    # window, where it has one: a cross-check only, the window is not the step's
    latency_summary: str | None = None
    # how late a request shows in the exported figures (Ray pushes its every ~10 s)
    export_delay_s: Annotated[float, Field(ge=0.0)] = 0.0


def join_matchers(*matchers: str) -> str:
    """Matcher lists ('a="1"', '', 'b=~"2.."') as one, braces and blanks dropped."""
    parts = [m.strip().strip("{}").strip() for m in matchers]
    return ",".join(p for p in parts if p)


def with_matchers(selector: str, *matchers: str) -> str:
    """`selector` narrowed by `matchers`, which come first inside its braces:
    with_matchers('x{a="1"}', 'job="j"') == 'x{job="j",a="1"}'. ValueError when
    `selector` is not a plain instant selector (a function or an operator: the step
    source takes rate() of it and needs the series themselves)."""
    match = _SELECTOR.match(selector)
    if match is None or not (match.group(1) or match.group(2)):
        raise ValueError(
            f'{selector!r} is not a plain PromQL selector such as name, name{{label="v"}} '
            'or {__name__=~"a|b"}'
        )
    name = match.group(1) or ""
    inner = join_matchers(*matchers, match.group(3) or "")
    return f"{name}{{{inner}}}" if inner else name
