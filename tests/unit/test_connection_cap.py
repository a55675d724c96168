"""A connection cap the user set (load.maxConnections): a request that waits for one of
its slots was held back by the client, so a step that fails by that wait is client-bound;
in the generator's own pool the same wait stays the server's backpressure."""

from __future__ import annotations

import pytest
from clienthealth import healthy_client
from pydantic import ValidationError

from batchpilot.capacity.steps import step_from_load
from batchpilot.loadgen.result import OK, TIMEOUT, LoadResult, merge_health, summarise
from batchpilot.loadgen.workers import share_connections
from batchpilot.models import SLA
from batchpilot.operator import decisions
from batchpilot.operator.spec import LoadSpec
from batchpilot.operator.status import TrialEntry

SLA_100 = SLA(p99_ms=100.0, max_error_rate=0.01)


def _queued_behind_slots(cap: int | None, *, server_ms: float = 40.0) -> LoadResult:
    """A window of 200 requests over 1 s, each answered by the server in `server_ms` once
    sent, whose sends waited longer and longer for a connection slot (0 to 300 ms): the
    latency from the schedule is that wait plus the server's time, and the completions
    run past the window by the last wait."""
    n = 200
    offsets = [i / n for i in range(n)]
    waits = [300.0 * i / (n - 1) for i in range(n)]
    return summarise(
        urls=["http://127.0.0.1:1"],
        arrival="constant",
        seed=0,
        target_rps=float(n),
        window_s=1.0,
        offsets=offsets,
        outcomes=[OK] * n,
        latencies_ms=[w + server_ms for w in waits],
        lags_ms=[0.0] * n,
        done_at=[o + (w + server_ms) / 1000.0 for o, w in zip(offsets, waits, strict=True)],
        elapsed_s=1.4,
        interrupted=False,
        conn_waits_ms=waits,
        loop_delays_ms=[0.2] * 100,
        cpu=0.2,
        connection_cap=cap,
    )


def test_a_capped_clients_slot_wait_is_a_client_limit() -> None:
    capped = healthy_client(conn_wait_p99_ms=160.0, conn_wait_max_ms=300.0, connection_cap=4)
    assert capped.limit_reason(SLA_100) == (
        "requests waited for one of the 4 connections the client is allowed: "
        "p99 wait 160.0 ms > 10% of SLA p99 (10 ms)"
    )
    # the same wait in the generator's own pool is the server holding its connections
    assert (
        healthy_client(conn_wait_p99_ms=160.0, conn_wait_max_ms=300.0).limit_reason(SLA_100) == ""
    )
    # a cap that never made a request wait past the bound is no limit
    assert healthy_client(conn_wait_p99_ms=10.0, connection_cap=4).limit_reason(SLA_100) == ""


def test_a_step_failed_by_waits_for_a_capped_slot_is_invalid_client_bound() -> None:
    step = step_from_load(_queued_behind_slots(2), SLA_100)
    assert not step.passed
    assert not step.valid
    assert step.reason.startswith(
        "invalid, client-bound: requests waited for one of the 2 connections"
    )
    assert step.client is not None
    assert step.client.connection_cap == 2


def test_the_same_wait_in_the_generators_own_pool_is_the_servers_failure() -> None:
    step = step_from_load(_queued_behind_slots(None), SLA_100)
    assert not step.passed
    assert step.valid
    assert step.reason.startswith("p99 ")


def test_a_slow_server_behind_a_cap_is_still_the_servers_failure() -> None:
    # once sent, each request took 150 ms: over the SLA whatever the slots did
    step = step_from_load(_queued_behind_slots(2, server_ms=150.0), SLA_100)
    assert not step.passed
    assert step.valid
    assert "(the client was over its limits too: requests waited for one of" in step.reason


@pytest.mark.parametrize(
    ("cap", "of", "shares"),
    [(None, 3, [None, None, None]), (10, 3, [4, 3, 3]), (8, 4, [2, 2, 2, 2]), (2, 3, [1, 1, 1])],
)
def test_a_cap_is_split_over_the_shares(cap: int | None, of: int, shares: list[int | None]) -> None:
    assert [share_connections(cap, i, of) for i in range(of)] == shares


def test_merged_caps_add_and_one_uncapped_part_leaves_the_client_uncapped() -> None:
    parts = [healthy_client(connection_cap=3), healthy_client(connection_cap=2)]
    assert merge_health(parts).connection_cap == 5
    assert merge_health([*parts, healthy_client()]).connection_cap is None


def _timeouts_held_in_slots(cap: int | None) -> LoadResult:
    """95 requests answered in 50 ms and 5 that timed out (1 s deadline) after waiting
    950 ms for a connection slot: the server had 50 ms for each before the deadline."""
    n = 100
    offsets = [i / n for i in range(n)]
    waits = [0.0] * 95 + [950.0] * 5
    return summarise(
        urls=["http://127.0.0.1:1"], arrival="constant", seed=0, target_rps=100.0,
        window_s=1.0, offsets=offsets, outcomes=[OK] * 95 + [TIMEOUT] * 5,
        latencies_ms=[50.0] * 95 + [1000.0] * 5, lags_ms=[0.0] * n,
        done_at=[o + 0.05 for o in offsets], elapsed_s=1.0, interrupted=False,
        conn_waits_ms=waits, loop_delays_ms=[0.2] * 100, cpu=0.2, timeout_s=1.0,
        connection_cap=cap, slot_waits_ms=waits,
    )  # fmt: skip


def test_timeouts_of_requests_a_cap_held_back_are_the_clients() -> None:
    capped = _timeouts_held_in_slots(1)
    assert capped.client.timeout_held_min_ms == 950.0
    step = step_from_load(capped, SLA_100)
    assert not step.passed
    assert not step.valid
    # without a cap the slot wait is not the client's: the timeouts are the server's
    uncapped = _timeouts_held_in_slots(None)
    assert uncapped.client.timeout_held_min_ms == 0.0
    assert step_from_load(uncapped, SLA_100).valid


def test_a_client_bound_trials_event_gives_its_score_as_a_lower_bound_and_why() -> None:
    reason = (
        "ClientBound: capacity ≥ 18.0 req/s, client-bound: invalid, client-bound: requests "
        "waited for one of the 2 connections the client is allowed: p99 wait 870.0 ms > 10% "
        "of SLA p99 (25 ms)"
    )
    trial = TrialEntry(
        number=0,
        params={"max_batch_size": 16, "max_queue_time_ms": 80.0},
        source="baseline",
        state="Complete",
        effective_rps=18.0,
        p99_ms=130.4,
        client_bound=True,
        reason=reason,
    )
    assert decisions.trial_message(trial, SLA(p99_ms=250)) == (
        f"Trial 0: batch=16 wait=80ms → ≥ 18 req/s, p99 130 ms ≤ 250 ms; {reason}"
    )


def test_the_crd_field_takes_one_connection_or_more() -> None:
    endpoint = {"endpoint": {"port": 8080, "path": "/v1/predict"}}
    assert LoadSpec.model_validate({**endpoint, "maxConnections": 2}).max_connections == 2
    assert LoadSpec.model_validate(endpoint).max_connections is None
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        LoadSpec.model_validate({**endpoint, "maxConnections": 0})
