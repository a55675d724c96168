"""Several generator processes share ONE seeded schedule: split by index i % N, every
request keeps its due time and size, and the merged result is the one-process result."""

from __future__ import annotations

import random

import pytest
from hdrh.histogram import HdrHistogram

from batchpilot.loadgen.arrivals import MMPP, as_arrival, schedule
from batchpilot.loadgen.generator import share_of_schedule
from batchpilot.loadgen.lengths import TokenLengths
from batchpilot.loadgen.protocols import openai_stream, template_protocol
from batchpilot.loadgen.result import OK, TIMEOUT, TREND_BINS, LoadResult, merge_results, summarise
from batchpilot.loadgen.tokens import StreamMeasure, TokenSla, summarise_stream
from batchpilot.loadgen.workers import (
    MAX_WORKERS,
    ShareSpec,
    check_workers,
    forwarded_protocol,
)
from batchpilot.models import RequestMix

MIX = RequestMix.default()
RATE = 400.0
DURATION_S = 3.0
WARMUP_S = 0.3


def _summarise(target_rps: float, offsets: list[float], sizes: list[int], ks: range) -> LoadResult:
    """Per-request outcomes that depend only on the request (its position and size), as
    a server would give them whichever process sent it, reduced to a result."""
    outcomes: list[str | None] = []
    latencies: list[float] = []
    for k, size in zip(ks, sizes, strict=True):
        outcomes.append("503" if k % 97 == 0 else TIMEOUT if k % 89 == 0 else OK)
        latencies.append(1.0 + (k * 7919 % 1000) / 10.0 + size)
    return summarise(
        urls=["http://127.0.0.1:1"],
        arrival="poisson",
        seed=0,
        target_rps=target_rps,
        window_s=DURATION_S,
        offsets=offsets,
        outcomes=outcomes,
        latencies_ms=latencies,
        lags_ms=[0.1] * len(offsets),
        done_at=[o + lat / 1000.0 for o, lat in zip(offsets, latencies, strict=True)],
        elapsed_s=DURATION_S,
        interrupted=False,
        warmup_s=WARMUP_S,
    )


def _contents(encoded: str) -> list[tuple[int, int]]:
    """A histogram compared in full: every recorded value (µs bucket) with its count."""
    hdr = HdrHistogram.decode(encoded.encode("ascii"))
    return [
        (v.value_iterated_to, v.count_at_value_iterated_to) for v in hdr.get_recorded_iterator()
    ]


# Two schedules per worker count, each from its own seed, rate and arrival process
# (Poisson, bursty MMPP and constant in turn): request counts that N divides and ones
# it does not.
CASES = [
    (workers, random.Random(workers * 1000 + draw).randrange(1_000_000), (workers + draw) % 3)
    for workers in range(1, 17)
    for draw in range(2)
]


@pytest.mark.parametrize(("workers", "seed", "kind"), CASES)
def test_split_then_merge_equals_the_one_worker_schedule(
    workers: int, seed: int, kind: int
) -> None:
    rate = RATE * random.Random(seed).uniform(0.5, 1.5)
    arrival = (as_arrival("poisson"), MMPP(), as_arrival("constant"))[kind]
    offsets = schedule(rate, DURATION_S, arrival, seed)
    sizes = MIX.sampler(seed).draw(len(offsets))

    shares = [share_of_schedule(offsets, MIX.sampler(seed), i, workers) for i in range(workers)]
    # every request exactly once, with the time and size it has in the single schedule
    sent = sorted((k, o, s) for o_, s_, ks in shares for k, o, s in zip(ks, o_, s_, strict=True))
    assert sent == [(k, offsets[k], sizes[k]) for k in range(len(offsets))]
    # and each share is its slice of the schedule: requests i, i + N, ...
    for i, (_, _, positions) in enumerate(shares):
        assert list(positions) == list(range(i, len(offsets), workers))

    whole = _summarise(rate, offsets, sizes, range(len(offsets)))
    merged = merge_results([_summarise(rate / workers, o, s, ks) for o, s, ks in shares])
    assert _contents(merged.histogram) == _contents(whole.histogram)
    assert _contents(merged.sla_histogram) == _contents(whole.sla_histogram)
    assert merged.latency == whole.latency
    assert (merged.requests, merged.ok, merged.errors) == (whole.requests, whole.ok, whole.errors)
    assert merged.sla_p99_ms == whole.sla_p99_ms
    assert merged.target_rps == pytest.approx(whole.target_rps)
    assert merged.offered_rps == pytest.approx(whole.offered_rps)
    # each part's queue growth from its own slice medians: close to the whole's
    assert merged.achieved_rps == pytest.approx(whole.achieved_rps, rel=0.01)
    assert (merged.ok_first_done_s, merged.ok_last_done_s) == (
        whole.ok_first_done_s,
        whole.ok_last_done_s,
    )
    assert merged.warmup_s == whole.warmup_s
    assert [(t.t_s, t.scheduled, t.ok, t.errors) for t in merged.timeline] == [
        (t.t_s, t.scheduled, t.ok, t.errors) for t in whole.timeline
    ]
    assert [(b.t_s, b.answered) for b in merged.trend] == [(b.t_s, b.answered) for b in whole.trend]
    assert len(merged.trend) == TREND_BINS
    # each slice's median is the worst part's: never below the whole schedule's
    assert all(
        m.p50_ms >= w.p50_ms or not w.answered
        for m, w in zip(merged.trend, whole.trend, strict=True)
    )
    assert merged.client.workers == workers
    assert len(merged.worker_clients) == workers


def test_a_share_spec_travels_as_json_with_its_arrival_process() -> None:
    spec = ShareSpec(
        urls=["http://127.0.0.1:8080"], rate=100.0, duration_s=5.0, mix=MIX,
        arrival=MMPP(burst_factor=3.0), timeout_s=1.0, seed=7, warmup_s=0.5, index=1, of=3,
    )  # fmt: skip
    assert ShareSpec.model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize("bad", [0, -1, MAX_WORKERS + 1])
def test_a_worker_count_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=f"workers must be 1 to {MAX_WORKERS}, got {bad}"):
        check_workers(bad)


def test_a_share_outside_the_count_is_refused() -> None:
    import asyncio

    from batchpilot.loadgen.generator import run_load

    with pytest.raises(ValueError, match="share must be i of n with 0 ≤ i < n, got 2 of 2"):
        asyncio.run(run_load("http://127.0.0.1:1", rate=10, duration_s=1, mix=MIX, share=(2, 2)))


def test_the_protocol_in_force_reaches_the_workers_as_the_bodies_it_sends() -> None:
    protocol = template_protocol(
        '{"rows": {size}}', path="/score", headers={"Authorization": "Bearer t"}
    )
    spec = ShareSpec(
        urls=["http://127.0.0.1:9"], rate=300.0, duration_s=2.0, mix=RequestMix.default(),
        arrival=as_arrival("poisson"), timeout_s=1.0, seed=7, of=3,
    )  # fmt: skip
    assert spec.protocol() is None  # nothing in force: the worker sends the reference body
    carried = spec.model_copy(update=forwarded_protocol(protocol, spec))
    rebuilt = ShareSpec.model_validate_json(carried.model_dump_json()).protocol()
    assert rebuilt is not None
    assert rebuilt.path == "/score"
    assert dict(rebuilt.headers) == dict(protocol.headers)
    sizes = spec.mix.sampler(spec.seed).draw(len(schedule(300.0, 2.0, "poisson", 7)))
    assert rebuilt.body(max(sizes)) == protocol.body(max(sizes))
    for size in set(sizes):
        assert rebuilt.body(size) == protocol.body(size)


def test_a_token_stream_protocol_reaches_the_workers_as_its_spec() -> None:
    lengths = TokenLengths(pairs=((12, 3), (40, 9)), source="pairs.jsonl")
    protocol = openai_stream(
        "m", lengths=lengths, chat=True, sla=TokenSla(ttft_ms=200.0), headers={"X-A": "1"}
    )
    spec = ShareSpec(
        urls=["http://127.0.0.1:9"], rate=300.0, duration_s=2.0, mix=RequestMix.default(),
        arrival=as_arrival("poisson"), timeout_s=1.0, seed=7, of=3,
    )  # fmt: skip
    carried = spec.model_copy(update=forwarded_protocol(protocol, spec))
    assert carried.bodies is None  # each worker builds its requests from the spec
    rebuilt = ShareSpec.model_validate_json(carried.model_dump_json()).protocol()
    assert rebuilt is not None
    assert rebuilt.stream == protocol.stream
    assert (rebuilt.path, dict(rebuilt.headers)) == (protocol.path, dict(protocol.headers))


def test_results_merge_their_token_figures_only_when_every_part_streamed() -> None:
    offsets = schedule(RATE, DURATION_S, as_arrival("constant"), 0)
    plain = _summarise(RATE, offsets, [1] * len(offsets), range(len(offsets)))
    tokens = summarise_stream([StreamMeasure(50.0, [10.0], 10.0, 2)], sla=TokenSla(), measured_s=1)
    streamed = plain.model_copy(update={"stream": tokens})
    assert merge_results([plain, plain]).stream is None
    merged = merge_results([streamed, streamed]).stream
    assert merged is not None
    assert (merged.streams, merged.output_tokens, merged.ttft.count) == (2, 4, 2)
    with pytest.raises(ValueError, match="token-stream and other runs"):
        merge_results([streamed, plain])
