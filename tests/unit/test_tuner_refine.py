"""The refinement phase (pure proposals and the stall rule) and the batch limit a trial
that killed the server sets, as the tuner records, rebuilds and enforces them."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState as OptunaState

# the made-up landscape and driver of the tuner's own tests
from test_tuner_study import landscape, make, measured, run

from batchpilot.models import BatchingConfig
from batchpilot.tuner.refine import (
    SERVER_DIED,
    batch_limit,
    next_refinement,
    proposals,
    server_died_reason,
    stalled,
)
from batchpilot.tuner.study import SearchSpace, TrialRecord, Tuner, crash_retried, replay_queue

SPACE = SearchSpace.from_bounds(max_batch_size=(1, 128), max_queue_time_ms=(0, 100))


def rec(number: int, batch: int, wait: float, rps: float | None, **kw: object) -> TrialRecord:
    fields: dict[str, object] = {
        "number": number,
        "params": {"max_batch_size": batch, "max_queue_time_ms": wait},
        "source": "sampler",
        "state": "Complete" if rps else "Failed",
        "effective_rps": rps,
    }
    fields.update(kw)
    return TrialRecord.model_validate(fields)


def batches(found: list[dict[str, float | int]]) -> list[tuple[int, float]]:
    return [(int(p["max_batch_size"]), float(p["max_queue_time_ms"])) for p in found]


def test_proposals_are_the_edges_around_the_best_batch_and_the_wait_halved_and_doubled() -> None:
    found = batches(proposals({"max_batch_size": 20, "max_queue_time_ms": 10.0}, SPACE))
    # neighbours, powers of two around 20, multiples of 8 and of 16 around it, then waits
    assert found == [
        (19, 10.0),
        (21, 10.0),
        (16, 10.0),
        (32, 10.0),
        (24, 10.0),
        (20, 5.0),
        (20, 20.0),
    ]


def test_proposals_on_an_edge_look_one_step_either_side() -> None:
    found = batches(proposals({"max_batch_size": 32, "max_queue_time_ms": 0.0}, SPACE))
    assert found[:2] == [(31, 0.0), (33, 0.0)]
    assert {(16, 0.0), (64, 0.0), (24, 0.0), (40, 0.0), (48, 0.0)} <= set(found)
    assert (32, 1.0) in found  # a zero wait "doubles" to 1 ms
    assert (32, 0.0) not in found


def test_proposals_are_clamped_to_the_space_and_below_the_batch_limit() -> None:
    space = SearchSpace.from_bounds(max_batch_size=(4, 40), max_queue_time_ms=(2, 30))
    found = batches(proposals({"max_batch_size": 40, "max_queue_time_ms": 20.0}, space, limit=36))
    assert all(4 <= b <= 35 and 2.0 <= w <= 30.0 for b, w in found)
    assert (35, 20.0) in found
    assert (35, 30.0) in found  # the best's batch itself is over the limit: clamped


def test_stall_counts_measured_trials_since_the_best() -> None:
    records = [rec(0, 8, 5.0, 100.0), rec(1, 16, 5.0, 150.0), rec(2, 2, 1.0, 90.0)]
    assert not stalled(records)
    records.append(rec(3, 4, 1.0, None, reason="interrupted"))
    assert not stalled(records)  # an interrupted trial is no measurement
    records.append(rec(4, 64, 1.0, 120.0))
    assert not stalled(records)
    records.append(rec(5, 64, 9.0, 80.0))
    assert stalled(records)


def test_next_refinement_waits_for_a_stall_then_skips_what_was_tried() -> None:
    records = [rec(0, 20, 10.0, 150.0), rec(1, 2, 1.0, 90.0), rec(2, 3, 1.0, 90.0)]
    assert next_refinement(records, SPACE) is None
    records.append(rec(3, 19, 10.0, 140.0))  # the first candidate, tried by the sampler
    assert next_refinement(records, SPACE) == {"max_batch_size": 21, "max_queue_time_ms": 10.0}


def test_a_stall_alternates_rounds_of_refinement_and_sampler_trials() -> None:
    records = [rec(0, 20, 10.0, 150.0)]
    turns = []
    for n in range(1, 16):
        turns.append(next_refinement(records, SPACE) is not None)
        records.append(rec(n, 1 + n, 0.0, 10.0))  # never the edges: the candidates stay
    # trials 1-3 sampler (the stall builds), 4-6 refine, 7-9 sampler, 10-12 refine, ...
    assert turns == [False] * 3 + [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3


def test_next_refinement_takes_the_last_trials_of_the_budget() -> None:
    records = [rec(0, 20, 10.0, 150.0)]
    assert next_refinement(records, SPACE, remaining=10) is None
    assert next_refinement(records, SPACE, remaining=4) is not None


def test_nothing_to_refine_without_a_feasible_trial() -> None:
    records = [rec(n, 8, 5.0, None, reason="rollout timed out") for n in range(5)]
    assert next_refinement(records, SPACE, remaining=1) is None


def test_batch_limit_is_the_smallest_batch_that_killed_the_server() -> None:
    records = [
        rec(0, 8, 5.0, 100.0),
        rec(1, 96, 5.0, None, reason=server_died_reason(96, "exit code -9")),
        rec(2, 64, 50.0, None, reason=server_died_reason(64, "OOMKilled")),
        rec(3, 32, 5.0, None, reason="rollout timed out"),
    ]
    assert records[1].reason.startswith(SERVER_DIED)
    # two deaths at 64 or above: what fits memory at one size fits at a smaller one
    assert batch_limit(records) == 64
    assert batch_limit(records[:1]) is None
    assert batch_limit(records[:2]) is None  # one death alone may be transient


def test_tuner_refines_after_a_stall_and_a_rebuild_replays_it() -> None:
    uninterrupted = make()
    expected = run(uninterrupted, 12)
    sources = [r.source for r in uninterrupted.records()]
    assert "refine" in sources
    first = sources.index("refine")
    rebuilt = make(uninterrupted.records()[: first + 1])
    assert run(rebuilt, 12 - first - 1) == expected[first + 1 :]
    assert [r.source for r in rebuilt.records()] == sources


def test_refinement_can_be_switched_off() -> None:
    tuner = make(refine=False)
    run(tuner, 12)
    assert "refine" not in {r.source for r in tuner.records()}


def test_the_budget_tail_is_refined() -> None:
    tuner = make(max_trials=8, warm_start=[])
    run(tuner, 8)
    assert [r.source for r in tuner.records()][-4:] == ["refine"] * 4


def died_at_64(tuner: Tuner) -> None:
    """Baseline, then a trial at batch 64 that kills the server, and its retry, which
    kills it again."""
    number, config, _ = tuner.ask()
    tuner.tell(number, landscape(config))
    number, config, _ = tuner.ask()
    assert config.max_batch_size == 64
    tuner.tell_server_died(number, "the server process exited with code -9")
    assert tuner.batch_limit() is None  # one death may be transient: asked again at once
    number, retry, _ = tuner.ask()
    assert retry == config
    tuner.tell_server_died(number, "the server process exited with code -9")


@pytest.mark.parametrize("sampler", ["TPE", "Random"])
def test_a_server_death_puts_its_batch_size_and_above_out_of_the_study(sampler: str) -> None:
    big = BatchingConfig(max_batch_size=64, max_queue_time_ms=10.0)
    bigger = BatchingConfig(max_batch_size=100, max_queue_time_ms=1.0)
    tuner = make(sampler=sampler, warm_start=[big, bigger])
    died_at_64(tuner)
    dead = tuner.records()[1]
    assert (dead.state, dead.reason.split(":")[0]) == ("Failed", "ServerDied at max_batch_size 64")
    assert tuner.batch_limit() == 64
    asked = run(tuner, 25)
    assert all(int(p["max_batch_size"]) < 64 for p in asked)  # the warm start at 100 too
    # rebuilt from its records alone: the same limit, the same suggestions
    history = [TrialRecord.model_validate_json(r.model_dump_json()) for r in tuner.records()]
    again = make(history[:3], sampler=sampler, warm_start=[big, bigger])
    assert again.batch_limit() == 64
    assert run(again, 25) == asked


def test_a_death_the_retry_survives_closes_nothing() -> None:
    tuner = make(warm_start=[BatchingConfig(max_batch_size=64, max_queue_time_ms=10.0)])
    number, config, _ = tuner.ask()
    tuner.tell(number, landscape(config))
    number, config, _ = tuner.ask()
    tuner.tell_server_died(number, "the model process was killed by SIGKILL")
    number, retry, _ = tuner.ask()
    assert retry == config
    tuner.tell(number, landscape(retry))
    assert tuner.batch_limit() is None
    asked = run(tuner, 25)
    assert any(int(p["max_batch_size"]) >= 64 for p in asked)


def test_a_crash_after_a_survived_one_is_retried_live_and_on_a_rebuild() -> None:
    # a death, its retry survives (that death no longer counts), then the same
    # configuration dies again: this death is the first that counts, so it is retried,
    # by the live tuner's rule and by the replay a rebuild makes alike
    died = server_died_reason(64, "OOMKilled")
    records = [
        rec(0, 8, 5.0, 100.0),
        rec(1, 64, 10.0, None, reason=died),
        rec(2, 64, 10.0, 300.0),
        rec(3, 64, 10.0, None, reason=died),
    ]
    assert crash_retried(records[:2])
    assert crash_retried(records)
    assert not crash_retried([*records[:2], records[1].model_copy(update={"number": 2})])
    queue = replay_queue([], records)
    assert list(queue) == [({"max_batch_size": 64, "max_queue_time_ms": 10.0}, "sampler")]


def test_a_death_is_told_to_the_sampler_as_a_constraint_violation() -> None:
    tuner = make(warm_start=[BatchingConfig(max_batch_size=64, max_queue_time_ms=10.0)])
    tuner.tell(tuner.ask()[0], measured(50.0))
    number, _, _ = tuner.ask()
    tuner.tell_server_died(number, "OOMKilled")
    frozen = tuner.study.trials[number]
    assert frozen.state == OptunaState.COMPLETE
    assert (frozen.value, frozen.constraints) == (0.0, {"sla": 1.0})
    # and so when rebuilt from the records
    history = [TrialRecord.model_validate_json(r.model_dump_json()) for r in tuner.records()]
    rebuilt = make(history, warm_start=[])
    assert rebuilt.study.trials[number].constraints == {"sla": 1.0}
    assert rebuilt.study.trials[number].value == 0.0


def test_tell_server_died_is_an_ordinary_failure_for_the_best() -> None:
    tuner = make()
    tuner.tell(tuner.ask()[0], measured(50.0))
    number, _, _ = tuner.ask()
    tuner.tell_server_died(number, "connection refused")
    best = tuner.best()
    assert best is not None
    assert best.number == 0
