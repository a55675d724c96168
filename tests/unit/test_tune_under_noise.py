"""The pure parts of benchmarks/tune_under_noise.py (the CPU stealer's schedule, the
false-gain rule, the JSON it prints) and the stealer's lifetime."""

from __future__ import annotations

import argparse
import itertools
import json
import os

import pytest

import tune_under_noise as tun
from batchpilot.models import SLA, BatchingConfig
from batchpilot.tuner.summary import ConfigFigures, LabelledTrial, TuneSummary, with_verdict
from batchpilot.tuner.verdict import decide

BASE = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
BIG = BatchingConfig(max_batch_size=48, max_queue_time_ms=1.0)
RULE = BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0)


# ---------------------------------------------------------------- the schedule


def test_the_same_seed_gives_the_same_pattern_and_another_seed_another() -> None:
    first = tun.burst_schedule(7, 600.0, 3)
    assert first == tun.burst_schedule(7, 600.0, 3)
    assert first != tun.burst_schedule(8, 600.0, 3)


def test_bursts_and_gaps_are_irregular_within_their_ranges_and_use_every_thread_count() -> None:
    schedule = tun.burst_schedule(0, 2_000.0, 4)
    low, high = tun.BUSY_S
    assert all(low <= b.duration_s <= high for b in schedule[:-1])
    gaps = [b.start_s - (a.start_s + a.duration_s) for a, b in itertools.pairwise(schedule)]
    assert all(tun.IDLE_S[0] <= g <= tun.IDLE_S[1] for g in gaps)
    assert tun.IDLE_S[0] <= schedule[0].start_s <= tun.IDLE_S[1]  # idle first
    assert {b.threads for b in schedule} == {1, 2, 3, 4}
    # irregular: not one duration repeated
    assert len({round(b.duration_s, 3) for b in schedule}) > len(schedule) // 2


def test_the_schedule_covers_the_span_and_never_runs_past_it() -> None:
    schedule = tun.burst_schedule(3, 100.0, 2)
    assert all(b.start_s < 100.0 for b in schedule)
    assert all(b.start_s + b.duration_s <= 100.0 + 1e-9 for b in schedule)
    # the last burst starts within one busy and one idle period of the end
    assert schedule[-1].start_s > 100.0 - tun.BUSY_S[1] - tun.IDLE_S[1]
    assert tun.burst_schedule(3, 0.0, 2) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_threads": 0}, "max_threads must be >= 1"),
        ({"total_s": -1.0}, "total_s must be >= 0"),
        ({"busy_s": (0.0, 1.0)}, "busy_s must be 0 < low <= high"),
        ({"idle_s": (2.0, 1.0)}, "idle_s must be 0 < low <= high"),
    ],
)
def test_a_schedule_it_cannot_make_is_refused_with_the_reason(
    kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"seed": 0, "total_s": 10.0, "max_threads": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        tun.burst_schedule(**args)  # type: ignore[arg-type]


def test_threads_at_follows_the_bursts() -> None:
    schedule = [
        tun.Burst(start_s=1.0, duration_s=2.0, threads=2),
        tun.Burst(start_s=4.0, duration_s=0.5, threads=1),
    ]
    assert [tun.threads_at(schedule, t) for t in (0.0, 1.0, 2.9, 3.0, 3.5, 4.2, 4.5, 9.0)] == [
        0,
        2,
        2,
        0,
        0,
        1,
        0,
        0,
    ]
    assert tun.threads_at([], 1.0) == 0


def test_the_noise_summary_counts_what_ran_within_the_elapsed_time() -> None:
    schedule = [
        tun.Burst(start_s=1.0, duration_s=2.0, threads=2),
        tun.Burst(start_s=4.0, duration_s=4.0, threads=1),
        tun.Burst(start_s=20.0, duration_s=1.0, threads=3),
    ]
    noise = tun.noise_summary(schedule, 10.0, seed=5, max_threads=3)
    assert noise.bursts == 2
    assert noise.busy_share == pytest.approx(0.6)  # 2 + 4 of 10 s
    assert noise.mean_threads_busy == pytest.approx((2 * 2 + 4 * 1) / 6, abs=0.01)
    cut = tun.noise_summary(schedule, 5.0, seed=5, max_threads=3)
    assert cut.busy_share == pytest.approx(0.6)  # 2 + 1 of 5 s
    assert tun.noise_summary([], 0.0, seed=0, max_threads=1).busy_share == 0.0


# ---------------------------------------------------------------- the false-gain rule


@pytest.mark.parametrize(
    ("written", "gain", "false"),
    [
        (True, -3.0, True),
        (True, 0.0, True),  # no better is a false gain
        (True, 0.1, False),
        (True, None, False),  # not re-measured: unchecked, not judged
        (False, -40.0, False),  # kept the baseline: nothing written
        (False, None, False),
    ],
)
def test_a_false_gain_is_written_and_re_measured_no_better(
    written: bool, gain: float | None, false: bool
) -> None:
    assert tun.is_false_gain(written, gain) is false


def summary(rounds: dict[BatchingConfig, list[float]], *, min_gain: float = 5.0) -> TuneSummary:
    """A tune run's summary whose verdict judged `rounds` (the baseline is BASE)."""
    trials = [
        LabelledTrial(
            number=i,
            params={"max_batch_size": c.max_batch_size, "max_queue_time_ms": c.max_queue_time_ms},
            source="baseline" if c == BASE else "sampler",
            state="Complete",
            effective_rps=1000.0 + i,
            label="baseline" if c == BASE else "sampler",
        )
        for i, c in enumerate(rounds)
    ]
    study = TuneSummary(
        sla=SLA(p99_ms=100.0),
        sampler="TPE",
        seed=0,
        space="",
        best=None,
        baseline=None,
        rule_of_thumb=None,
        gain_over_baseline=None,
        gain_over_rule_of_thumb=None,
        interrupted=False,
        duration_s=1.0,
        trials=trials,
        measurements={},
    )
    return with_verdict(study, decide(rounds, BASE, min_gain_percent=min_gain))


def test_a_proven_gain_is_written_and_re_measured() -> None:
    run = summary({BIG: [2000.0, 1800.0, 1500.0], RULE: [1500, 1400, 1100], BASE: [1000, 900, 700]})
    assert tun.written(run)
    assert tun.baseline_of(run) == BASE
    assert tun.candidate_of(run) == BIG
    assert tun.figure_of(run, BIG) == pytest.approx(run.verdict.ranking[0].estimate)  # type: ignore[union-attr]


def test_a_kept_baseline_is_not_written_and_its_best_finalist_is_re_measured() -> None:
    run = summary({BIG: [1050.0, 900.0, 800.0], BASE: [1000.0, 950.0, 760.0]})
    assert run.recommended == BASE
    assert not tun.written(run)
    assert tun.candidate_of(run) == BIG


def test_without_a_verdict_the_study_best_is_what_was_written() -> None:
    run = summary({BIG: [2000.0, 1800.0, 1500.0], BASE: [1000, 900, 700]}).model_copy(
        update={
            "verdict": None,
            "recommended": RULE,
            "baseline": ConfigFigures(
                trial=0,
                max_batch_size=8,
                max_queue_time_ms=5.0,
                effective_rps=900.0,
                p99_ms=50.0,
                state="Complete",
            ),
        }
    )
    assert tun.written(run)
    assert tun.candidate_of(run) == RULE
    assert tun.figure_of(run, BIG) == 1000.0  # the trial's figure when no verdict has one
    assert tun.figure_of(run, RULE) is None


# ---------------------------------------------------------------- the JSON it prints


def report(runs: list[tun.RunResult]) -> tun.Report:
    args = tun.parse_args([])
    noise = tun.noise_summary(tun.burst_schedule(0, 50.0, 2), 50.0, seed=0, max_threads=2)
    return tun.report_of(runs, args, noise, 600.0, (1.0, 2.0))


def test_the_report_has_the_issue_s_keys_and_counts_false_gains() -> None:
    written_run = summary({BIG: [2000.0, 1800.0, 1500.0], BASE: [1000, 900, 700]})
    good = tun.run_result(
        0,
        0,
        written_run,
        remeasured=BIG,
        rounds={BIG: [1800.0, 1700.0, 1600.0], BASE: [1000.0, 990.0, 900.0]},
        gain=(80.0, 60.0, 100.0),
        tune_s=200.0,
        remeasure_s=60.0,
    )
    false = tun.run_result(
        1,
        1,
        written_run,
        remeasured=BIG,
        rounds={BIG: [900.0, 950.0, 800.0], BASE: [1000.0, 990.0, 900.0]},
        gain=(-7.5, -20.0, 6.0),
        tune_s=200.0,
        remeasure_s=60.0,
    )
    out = report([good, false])
    data = json.loads(out.model_dump_json())
    assert {"runs", "false_gain_runs", "false_gain_rule", "settings", "noise"} <= set(data)
    for row in data["runs"]:
        assert {"recommended", "baseline", "gain_lcb_pct", "written"} <= set(row)
    assert data["runs"][0]["recommended"] == {"max_batch_size": 48, "max_queue_time_ms": 1.0}
    assert data["runs"][0]["baseline"] == {"max_batch_size": 8, "max_queue_time_ms": 5.0}
    assert data["runs"][0]["gain_lcb_pct"] == 60.0
    assert data["runs"][1]["false_gain"] is True
    assert data["runs"][0]["remeasured_rounds_rps"] == [1800.0, 1700.0, 1600.0]
    assert data["false_gain_runs"] == 1
    assert data["settings"]["runs"] == 3  # the issue's default
    assert "<= 0 %" in data["false_gain_rule"]
    assert tun.exit_code(out) == 1
    assert tun.exit_code(report([good])) == 0


def test_a_run_that_could_not_be_checked_fails_the_check_without_a_false_gain() -> None:
    written_run = summary({BIG: [2000.0, 1800.0, 1500.0], BASE: [1000, 900, 700]})
    lost = tun.run_result(
        0,
        0,
        written_run,
        remeasured=BIG,
        rounds={},
        gain=None,
        tune_s=200.0,
        remeasure_s=600.0,
        error="the re-measurement did not finish within 600 s",
    )
    crashed = tun.failed_run(1, 1, "tune --seed 1 exited with 1", 30.0)
    out = report([lost, crashed])
    assert [r.checked for r in out.runs] == [False, False]
    assert out.runs[0].error == "the re-measurement did not finish within 600 s"
    assert out.false_gain_runs == 0
    assert out.unchecked_runs == 2
    assert tun.exit_code(out) == 2


def test_a_kept_run_is_checked_without_a_re_measured_gain() -> None:
    kept = summary({BIG: [1050.0, 900.0, 800.0], BASE: [1000.0, 950.0, 760.0]})
    row = tun.run_result(
        0, 0, kept, remeasured=None, rounds={}, gain=None, tune_s=1.0, remeasure_s=0.0
    )
    assert row.checked
    assert not row.written
    assert row.gain_lcb_pct is None
    assert row.error is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "0"], "--runs must be >= 1"),
        (["--burst-threads", "0"], "--burst-threads must be >= 1"),
        (["--rounds", "2"], "--rounds must be 3-20"),
        (["--tune-max-rounds", "21"], "--tune-max-rounds must be 3-20"),
        (["--precision", "1.5"], "--precision must be between 0 and 1"),
        (["--tune-timeout-s", "0"], "--tune-timeout-s must be > 0"),
    ],
)
def test_bad_options_are_refused_with_what_is_allowed(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        tun.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_defaults_are_the_issue_s() -> None:
    args: argparse.Namespace = tun.parse_args([])
    assert (args.runs, args.seed, args.burst_threads) == (3, 0, os.cpu_count() or 1)
    assert "--max-rounds" not in tun.tune_command(0, args.tune_max_rounds)


def test_tune_max_rounds_reaches_the_tune_run_before_its_seed() -> None:
    command = tun.tune_command(4, 6)
    assert command[-4:] == ["--max-rounds", "6", "--seed", "4"]
    assert command[3:7] == ["tune", "--local", "--quick", "--json"]


# ---------------------------------------------------------------- the stealer's lifetime


def test_the_stealer_stops_on_stop_and_on_its_own_at_the_end_of_its_lifetime() -> None:
    busy = [tun.Burst(start_s=0.0, duration_s=60.0, threads=2)]
    stealer = tun.Stealer(busy, threads=2, lifetime_s=60.0)
    stealer.start()
    workers = list(stealer._workers)
    assert all(w.is_alive() for w in workers)
    stealer.stop()
    assert not any(w.is_alive() for w in workers)

    short = tun.Stealer(busy, threads=1, lifetime_s=0.2)
    short.start()
    worker = short._workers[0]
    worker.join(30.0)  # ends by itself, without stop()
    assert worker.exitcode == 0
    short.stop()
    assert short._workers == []
