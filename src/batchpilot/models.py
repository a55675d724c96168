"""Value types shared by every part: a batching configuration, an SLA, a request mix,
and the results of a measurement.

They are the contract between the load generator, the capacity search, the simulator,
the tuner and the operator, so they live here rather than in any one of them. Results
serialise to the JSON the CLI prints (`model_dump(mode="json")`).
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Any, NamedTuple, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

MAX_BATCH_SIZE_LIMIT = 4096
MAX_QUEUE_TIME_MS_LIMIT = 60_000.0


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BatchingConfig(Frozen):
    """The two knobs of dynamic batching."""

    max_batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE_LIMIT)]
    max_queue_time_ms: Annotated[float, Field(ge=0.0, le=MAX_QUEUE_TIME_MS_LIMIT)]

    def label(self) -> str:
        return f"batch={self.max_batch_size} wait={self.max_queue_time_ms:g}ms"


LatencyBound = Annotated[float, Field(gt=0.0, le=3_600_000.0)]


class SLA(Frozen):
    """What a sustained rate must keep to count as effective throughput: an end-to-end p99
    bound, token-stream targets (time to first token, time per output token, both p99),
    or several of them; and an error rate."""

    p99_ms: LatencyBound | None = None
    max_error_rate: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.001
    ttft_p99_ms: LatencyBound | None = None
    tpot_p99_ms: LatencyBound | None = None

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        if self.p99_ms is None and not self.token_targets:
            raise ValueError(
                "an SLA needs a p99 latency bound, a TTFT p99 target or a TPOT p99 target "
                "(one of them or several)"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_absent_targets(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An SLA without token targets serialises as it did before they existed."""
        data: dict[str, Any] = handler(self)
        for key in ("ttft_p99_ms", "tpot_p99_ms"):
            if data.get(key, 0) is None:
                del data[key]
        return data

    @property
    def token_targets(self) -> bool:
        """Whether a token-stream tail is judged (TTFT or TPOT p99)."""
        return self.ttft_p99_ms is not None or self.tpot_p99_ms is not None

    def scale_ms(self, output_tokens: float = 1.0) -> float:
        """The latency a window's own rules measure against (the trend of its latency,
        the client's allowance, the default request timeout): the end-to-end p99 bound,
        else the end-to-end time of an answer of `output_tokens` tokens within the token
        targets, TTFT + TPOT x (tokens - 1), counting each target that is set and at
        least one token's TPOT."""
        if self.p99_ms is not None:
            return self.p99_ms
        tpot = (self.tpot_p99_ms or 0.0) * max(output_tokens - 1.0, 1.0)
        return (self.ttft_p99_ms or 0.0) + tpot

    def describe(self, at_most: str = "≤") -> str:
        """The latency bounds in words, e.g. 'p99 ≤ 100 ms, TTFT p99 ≤ 500 ms'."""
        bounds = (
            ("p99", self.p99_ms),
            ("TTFT p99", self.ttft_p99_ms),
            ("TPOT p99", self.tpot_p99_ms),
        )
        return ", ".join(f"{name} {at_most} {ms:g} ms" for name, ms in bounds if ms is not None)


class RequestClass(Frozen):
    """One kind of request in a mix: its relative weight and its input size
    (feature rows for the MLP, tokens for the sequence model)."""

    weight: Annotated[float, Field(gt=0.0)]
    size: Annotated[int, Field(ge=1, le=65_536)]


class RequestMix(Frozen):
    """Weighted request sizes. Uniform sizes give a fake p99 (every batch costs the same),
    so the default mix is mostly short requests with a long tail."""

    classes: Annotated[tuple[RequestClass, ...], Field(min_length=1)]

    @classmethod
    def default(cls) -> RequestMix:
        """Mostly single-item requests, some of 4 and a few of 16: a long tail of sizes
        without which p99 would be flattering."""
        return cls(
            classes=(
                RequestClass(weight=80, size=1),
                RequestClass(weight=15, size=4),
                RequestClass(weight=5, size=16),
            )
        )

    @classmethod
    def uniform(cls, size: int) -> RequestMix:
        return cls(classes=(RequestClass(weight=1, size=size),))

    def mean_size(self) -> float:
        total = sum(c.weight for c in self.classes)
        return sum(c.weight * c.size for c in self.classes) / total

    def sampler(self, seed: int) -> SizeSampler:
        return SizeSampler(self, seed)


class SizeSampler:
    """Seeded draws of request sizes from a mix."""

    def __init__(self, mix: RequestMix, seed: int) -> None:
        self._rng = random.Random(seed)
        self._sizes = [c.size for c in mix.classes]
        self._weights = [c.weight for c in mix.classes]

    def draw(self, n: int) -> list[int]:
        return self._rng.choices(self._sizes, weights=self._weights, k=n)


class LatencySummary(Frozen):
    """End-to-end latency percentiles in milliseconds."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float


# Most generator processes one machine may split a step's schedule over (--workers).
MAX_LOAD_WORKERS = 64
# the most connections a user may cap the load generator's client at (--max-connections,
# load.maxConnections)
MAX_CONNECTIONS = 100_000

# Measured requests a step holds at least, so its p99 is an estimate rather than its
# largest value (a step is stretched for them up to a cap; see capacity.http).
DEFAULT_MIN_REQUESTS = 2000

# A step is invalid (the client, not the server, set its figures) only for what is the
# client's own doing. Send lag and connection-slot wait are reported but never blamed on
# the client: both grow when the *server* is slow (a slow server holds its connections,
# so new requests wait for a slot and their sends queue behind them), and latency runs
# from each request's scheduled time, so that wait is charged to the server. Blaming the
# client for it turned every overloaded step into an invalid one and stopped every search
# at its first overload instead of bisecting. What the client alone causes:
# a stall of its event loop (a sampler task's oversleep) above this share of the SLA
# p99 -- a stall delays sends and the reading of responses alike, so below the bound
# it can only make a server within 10 % of its SLA fail, never pass ...
CLIENT_MAX_LOOP_DELAY_SHARE = 0.10
# ... or one generator process using this share of a core or more over the window (a
# saturated client falls behind whatever its loop's stalls say).
CLIENT_MAX_CPU = 0.90
# ... or sends that fell behind their schedule for good: the requests of the measured
# window left over a span this much longer than they were scheduled over, so the server
# was offered less than the rate a pass would be credited with.
CLIENT_MIN_SEND_RATE_SHARE = 0.97


class ClientHealth(Frozen):
    """How well the load generator kept its own schedule during one window: without it a
    slow client reads as a slow server."""

    lag_p99_ms: float  # p99 of how late each send left against its scheduled time
    lag_max_ms: float
    conn_wait_p99_ms: float  # p99 of the time a request waited for a free connection
    conn_wait_max_ms: float
    loop_delay_max_ms: float  # worst oversleep of a sampler task: the event loop's stalls
    loop_delay_p99_ms: float
    cpu: float  # client CPU seconds per wall second (1.0 = one core busy), all workers
    workers: int = 1
    # the busiest generator process's CPU share (None: one process, i.e. `cpu`)
    cpu_max_worker: float | None = None
    # the connections the user allowed the client (None: the generator's own pool, sized
    # for open loop); with a cap, a wait for a slot is the client's limit, not the server's
    connection_cap: int | None = None
    # the scheduled span of the measured requests over the span their sends actually
    # took (1.0: on schedule; below: the client fell behind and offered less)
    send_rate_share: float = 1.0
    # the least time the client itself held a request that then timed out: its send lag,
    # plus its wait for a slot under connection_cap (None: no timeout in the window)
    timeout_held_min_ms: float | None = None

    def busiest_cpu(self) -> float:
        return self.cpu if self.cpu_max_worker is None else self.cpu_max_worker

    def server_held_sends(self) -> bool:
        """Whether sends waited for connections in the generator's own pool, sized for
        open loop: only the server, holding every connection, makes them wait there."""
        return self.connection_cap is None and self.conn_wait_p99_ms > 0

    def limit_reason(self, sla: SLA, scale_ms: float | None = None) -> str:
        """Why the client could not keep its schedule at this SLA (empty when it could):
        the validity rule, with the bounds named in the message. Its delays are weighed
        against `scale_ms` [the SLA's own scale, `SLA.scale_ms`]."""
        reasons: list[str] = []
        scale = sla.scale_ms() if scale_ms is None else scale_ms
        bound = CLIENT_MAX_LOOP_DELAY_SHARE * scale
        what = "SLA p99" if sla.p99_ms is not None else f"the token targets' {scale:g} ms"
        # The worst stall, not a percentile of the loop's samples: a few 300 ms stalls
        # among thousands of 10 ms samples leave the p99 low, yet delay every request in
        # flight through them. Whether they explain a failure is client_could_explain's.
        if self.loop_delay_max_ms > bound:
            reasons.append(
                f"client event-loop stall up to {self.loop_delay_max_ms:.1f} ms > "
                f"{CLIENT_MAX_LOOP_DELAY_SHARE:.0%} of {what} ({bound:g} ms)"
            )

        if self.send_rate_share < CLIENT_MIN_SEND_RATE_SHARE and not self.server_held_sends():
            reasons.append(
                f"client sent at {self.send_rate_share:.0%} of the scheduled rate (its sends "
                f"fell behind the schedule), < {CLIENT_MIN_SEND_RATE_SHARE:.0%}"
            )
        if self.busiest_cpu() >= CLIENT_MAX_CPU:
            reasons.append(
                f"client CPU {self.busiest_cpu():.0%} of a core ≥ {CLIENT_MAX_CPU:.0%}"
                + (" (busiest worker)" if self.cpu_max_worker is not None else "")
            )
        if self.connection_cap is not None and self.conn_wait_p99_ms > bound:
            reasons.append(
                f"requests waited for one of the {self.connection_cap} connections the client "
                f"is allowed: p99 wait {self.conn_wait_p99_ms:.1f} ms > "
                f"{CLIENT_MAX_LOOP_DELAY_SHARE:.0%} of {what} ({bound:g} ms)"
            )
        return "; ".join(reasons)


class StepResult(Frozen):
    """One fixed window of the capacity search at one offered rate."""

    offered_rps: float
    achieved_rps: float  # goodput: successful responses per second
    p50_ms: float
    # The SLA percentile: every non-OK request (error, timeout, give-up, not sent) counts
    # as infinitely slow, so shedding load cannot buy a better p99.
    p99_ms: float
    error_rate: float
    requests: int
    passed: bool
    reason: str = ""  # why the step failed, empty when it passed
    duration_s: float
    source: str = "client"  # client | prometheus | simulator
    # False when the client could not keep its schedule: the step says nothing about the
    # server, so it is neither a pass nor a failure.
    valid: bool = True
    # An invalid step that says nothing of the client either (a load worker died while
    # it held a share): the search measures the same rate once more.
    repeat: bool = False
    ok_p99_ms: float | None = None  # p99 of successful requests only
    client: ClientHealth | None = None  # all generator processes together
    worker_clients: list[ClientHealth] = []  # each process's own, when several sent
    warmup_s: float = 0.0  # the start of the window left out of the figures
    # Failed only on the upper confidence bound of a short window's p99: the measured
    # p99, error rate and goodput hold the SLA, there were too few requests to prove it.
    failed_on_bound_only: bool = False
    # A token-stream window (None otherwise): the tails it was judged on (the upper
    # confidence bounds in a short window), its goodput (requests per second that met
    # every TTFT and TPOT target; the effective rate of a passing step) and its output
    # tokens per second.
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    goodput_rps: float | None = None
    output_tokens_per_s: float | None = None


class CapacityResult(Frozen):
    """The effective throughput of one configuration and every step that found it."""

    effective_rps: float  # 0.0 when no step passed
    p99_ms: float | None  # p99 at effective_rps
    # a token-stream search's figures at effective_rps (None otherwise)
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tokens_per_s: float | None = None
    sla: SLA
    feasible: bool  # at least one step passed
    pruned: bool = False  # the search stopped early because it could not win
    precision: float
    steps: list[StepResult]
    # The client could not drive a higher rate: the capacity is at least effective_rps.
    client_bound: bool = False
    client_ceiling_rps: float | None = None  # highest offered rate the client kept up with
    # Why a rate below the capacity the search found broke the SLA and capped
    # effective_rps (capacity.lightload); empty when none did or none was measured.
    light_load: str = ""
    # Why the search ended before its bracket reached `precision` (the step limit, the
    # load budget, the rate cap): the answer is a lower bound of that coarseness. Empty
    # when the bracket closed, or the configuration was pruned or client-bound.
    short_of_precision: str = ""
    # Why the search stopped ramping down before any step passed: below its lowest step
    # no window could hold enough requests to bound a p99, so none could pass. Empty
    # when it did not stop for that.
    unjudged: str = ""

    def capacity_label(self) -> str:
        if self.client_bound:
            return f"≥ {self.effective_rps:.1f} req/s, client-bound"
        return f"{self.effective_rps:.1f} req/s"

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.feasible != (self.effective_rps > 0.0):
            raise ValueError("feasible must be true exactly when effective_rps > 0")
        return self


class TokenTails(NamedTuple):
    """A token-stream window's tails, ms: TTFT p99 (None: no whole stream) and TPOT p99
    (None: no answer of two tokens or more, which meets any TPOT target)."""

    ttft_p99_ms: float | None
    tpot_p99_ms: float | None


def step_passes(
    *,
    p99_ms: float,
    error_rate: float,
    offered_rps: float,
    achieved_rps: float,
    sla: SLA,
    min_achieved_ratio: float = 0.97,
    tokens: TokenTails | None = None,
) -> tuple[bool, str]:
    """The step rule (docs/architecture.md, "How a measurement flows"): p99 within the SLA's
    bound when it has one, the TTFT and TPOT tails of a token-stream window (`tokens`)
    within the SLA's targets when it has them, errors within the bound, and the server
    keeping up with the offered rate. Returns (passed, reason for failing)."""
    reasons: list[str] = []
    if sla.p99_ms is not None and (not math.isfinite(p99_ms) or p99_ms > sla.p99_ms):
        reasons.append(f"p99 {p99_ms:.1f} ms > SLA {sla.p99_ms:g} ms")
    if sla.token_targets and tokens is None:
        reasons.append("TTFT and TPOT targets are judged on token streams; none was measured")
    elif tokens is not None:
        ttft, tpot = tokens
        if sla.ttft_p99_ms is not None and ttft is None:
            reasons.append("no whole stream, so no TTFT to judge")
        elif sla.ttft_p99_ms is not None and ttft is not None and not ttft <= sla.ttft_p99_ms:
            reasons.append(f"TTFT p99 {ttft:.1f} ms > SLA {sla.ttft_p99_ms:g} ms")
        if sla.tpot_p99_ms is not None and tpot is not None and not tpot <= sla.tpot_p99_ms:
            reasons.append(f"TPOT p99 {tpot:.1f} ms > SLA {sla.tpot_p99_ms:g} ms")
    if error_rate > sla.max_error_rate:
        reasons.append(f"error rate {error_rate:.4f} > {sla.max_error_rate:g}")
    if offered_rps > 0 and achieved_rps < min_achieved_ratio * offered_rps:
        reasons.append(
            f"achieved {achieved_rps:.1f} req/s < {min_achieved_ratio:.0%} of offered "
            f"{offered_rps:.1f} req/s"
        )
    return (not reasons, "; ".join(reasons))


def accelerator_hours_per_million(
    effective_rps: float, replicas: int = 1, accelerators_per_replica: int = 1
) -> float:
    """Accelerator-hours per million effective requests: what a capacity result costs."""
    if effective_rps <= 0:
        return math.inf
    return replicas * accelerators_per_replica / (effective_rps * 3600.0) * 1e6
