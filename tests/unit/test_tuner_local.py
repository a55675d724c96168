"""LocalTarget against a scripted admin endpoint (in-process, loopback), the ramp start
rule, and the tune CLI's configuration handling (no server is started)."""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner

from batchpilot.errors import TargetError
from batchpilot.loadgen.warmup import RejectedError
from batchpilot.models import SLA, BatchingConfig, RequestMix
from batchpilot.runtimes.reference import ReferenceControl as LocalTarget
from batchpilot.tuner.cli import build_config, resolve, tune
from batchpilot.tuner.config import (
    DEFAULT_MAX_ROUNDS,
    DEFAULT_SLA_P99_MS,
    QUICK_FINALISTS,
    QUICK_MAX_ROUNDS,
    QUICK_MEASUREMENT,
    QUICK_TRIALS,
    ConfigError,
    TuneConfig,
    load_config,
)
from batchpilot.tuner.local import LocalProbe, start_rate


class Admin:
    """A /admin/batching endpoint whose answers the test scripts."""

    def __init__(self) -> None:
        self.config = {"max_batch_size": 8, "max_queue_time_ms": 5.0}
        self.put_failures: list[int] = []  # statuses to answer the next PUTs with
        self.ignore_puts = False
        self.puts = 0

    async def get(self, request: web.Request) -> web.Response:
        return web.json_response(self.config)

    async def put(self, request: web.Request) -> web.Response:
        self.puts += 1
        if self.put_failures:
            status = self.put_failures.pop(0)
            return web.json_response({"error": f"scripted {status}"}, status=status)
        if not self.ignore_puts:
            self.config = await request.json()
        return web.json_response(self.config)


@pytest.fixture
async def admin() -> AsyncIterator[tuple[Admin, str]]:
    state = Admin()
    app = web.Application()
    app.router.add_get("/admin/batching", state.get)
    app.router.add_put("/admin/batching", state.put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _target(url: str) -> LocalTarget:
    return LocalTarget(url, timeout_s=5.0, attempts=3, backoff_s=0.001, rng=random.Random(0))


CONFIG = BatchingConfig(max_batch_size=16, max_queue_time_ms=12.5)


async def test_apply_puts_and_verifies(admin: tuple[Admin, str]) -> None:
    state, url = admin
    target = _target(url)
    assert state.puts == 0
    assert await target.current() == BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
    await target.apply(CONFIG)
    assert await target.current() == CONFIG


async def test_server_errors_are_retried(admin: tuple[Admin, str]) -> None:
    state, url = admin
    state.put_failures = [503, 500]
    await _target(url).apply(CONFIG)
    assert state.puts == 3
    assert state.config["max_batch_size"] == 16


async def test_retries_are_bounded(admin: tuple[Admin, str]) -> None:
    state, url = admin
    state.put_failures = [503, 503, 503, 503]
    with pytest.raises(TargetError, match="failed 3 times: HTTP 503"):
        await _target(url).apply(CONFIG)
    assert state.puts == 3


async def test_a_refusal_is_final_and_carries_the_servers_message(
    admin: tuple[Admin, str],
) -> None:
    state, url = admin
    state.put_failures = [422]
    with pytest.raises(TargetError, match="HTTP 422: scripted 422"):
        await _target(url).apply(CONFIG)
    assert state.puts == 1


async def test_a_configuration_that_does_not_stick_is_an_error(admin: tuple[Admin, str]) -> None:
    state, url = admin
    state.ignore_puts = True
    with pytest.raises(TargetError, match="the server runs batch=8 wait=5ms"):
        await _target(url).apply(CONFIG)


async def test_an_unreachable_server_is_an_error_after_retries() -> None:
    from batchpilot.server.process import free_port

    target = _target(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TargetError, match="failed 3 times"):
        await target.current()


def test_ramp_start() -> None:
    assert start_rate(200.0) == 100.0  # half of what must be beaten
    assert start_rate(None) is None  # the capacity search's own start
    assert start_rate(0.0) is None


def test_defaults_and_quick() -> None:
    config = build_config(
        TuneConfig(), trials=None, sla_p99_ms=None, seed=None, sampler=None, mix=None, quick=False
    )
    assert config.sla.p99_ms == DEFAULT_SLA_P99_MS
    quick = build_config(
        config, trials=None, sla_p99_ms=None, seed=None, sampler=None, mix=None, quick=True
    )
    assert quick.tuning.trials == QUICK_TRIALS
    assert quick.measurement == QUICK_MEASUREMENT
    # the smoke run still proves its recommendation, against fewer finalists
    assert quick.tuning.confirm
    assert (quick.tuning.finalists, quick.tuning.rounds) == (QUICK_FINALISTS, 3)
    assert quick.tuning.max_rounds == QUICK_MAX_ROUNDS == 3  # no adaptive rounds
    assert quick.tuning.min_gain_percent == 5.0
    verdict_flags = build_config(
        config,
        trials=None,
        sla_p99_ms=None,
        seed=None,
        sampler=None,
        mix=None,
        quick=True,
        finalists=4,
        rounds=5,
        min_gain_percent=2.5,
    )
    assert (verdict_flags.tuning.finalists, verdict_flags.tuning.rounds) == (4, 5)
    assert verdict_flags.tuning.min_gain_percent == 2.5
    # adaptive confirmation: up to 6 rounds by default; --rounds above it lifts the cap
    assert (config.tuning.rounds, config.tuning.max_rounds) == (3, DEFAULT_MAX_ROUNDS)
    assert verdict_flags.tuning.max_rounds == 5  # --quick: a fixed count, lifted by --rounds

    def rounds_flags(rounds: int | None, max_rounds: int | None) -> TuneConfig:
        return build_config(
            config,
            trials=None,
            sla_p99_ms=None,
            seed=None,
            sampler=None,
            mix=None,
            quick=False,
            rounds=rounds,
            max_rounds=max_rounds,
        )

    assert rounds_flags(8, None).tuning.max_rounds == 8
    fixed = rounds_flags(None, 3)
    assert (fixed.tuning.rounds, fixed.tuning.max_rounds) == (3, 3)
    with pytest.raises(ValueError, match=r"max_rounds \(4\) must be >= rounds \(5\)"):
        rounds_flags(5, 4)
    # an explicit flag wins over --quick
    flagged = build_config(
        config, trials=3, sla_p99_ms=40, seed=9, sampler="Random", mix="1:1", quick=True
    )
    assert (flagged.tuning.trials, flagged.sla.p99_ms, flagged.tuning.seed) == (3, 40, 9)
    # one generator process unless asked: the server runs on the same machine
    assert config.measurement.workers == 1
    workers = build_config(
        config, trials=None, sla_p99_ms=None, seed=None, sampler=None, mix=None, quick=True,
        workers=3,
    )  # fmt: skip
    assert workers.measurement.workers == 3
    assert workers.measurement.step_duration_s == QUICK_MEASUREMENT.step_duration_s
    # no cap on the client's connections unless asked; --quick keeps one the file set
    assert config.measurement.max_connections is None
    capped = build_config(
        config.model_copy(
            update={"measurement": config.measurement.model_copy(update={"max_connections": 4})}
        ),
        trials=None, sla_p99_ms=None, seed=None, sampler=None, mix=None, quick=True,
    )  # fmt: skip
    assert capped.measurement.max_connections == 4
    flag = build_config(
        config, trials=None, sla_p99_ms=None, seed=None, sampler=None, mix=None, quick=False,
        max_connections=2,
    )  # fmt: skip
    assert flag.measurement.max_connections == 2
    space, mix = resolve(flagged)
    assert space.batch_bounds == (1, 64)
    assert mix.mean_size() == 1.0


def test_config_file(tmp_path: Path) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(
        "sla: {p99_ms: 80}\n"
        "parameters: {max_batch_size: {min: 2, max: 32}, max_queue_time_ms: {min: 0, max: 40}}\n"
        "tuning: {trials: 9, seed: 4}\n"
        "server: {max_batch_size: 4, max_queue_time_ms: 2}\n"
    )
    config = load_config(path)
    assert (config.sla.p99_ms, config.tuning.trials, config.server.max_batch_size) == (80, 9, 4)
    space, _ = resolve(config)
    assert (space.batch_bounds, space.queue_bounds) == ((2, 32), (0.0, 40.0))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sla: {p99_ms: 0}", "sla.p99_ms: Input should be greater than 0"),
        ("tuning: {trails: 3}", "tuning.trails: Extra inputs are not permitted"),
        ("tuning: {rounds: 2}", "tuning.rounds: Input should be greater than or equal to 3"),
        ("measurement: {workers: 0}", "measurement.workers: Input should be greater than"),
        ("tuning: {min_gain_percent: -1}", "tuning.min_gain_percent: Input should be greater"),
        ("tuning: {rounds: 5, max_rounds: 4}", r"max_rounds \(4\) must be >= rounds \(5\)"),
        ("parameters: {max_batch_size: {min: 8, max: 2}}", "min 8 must be <= max 2"),
        ("parameters: {max_batch_size: {min: 1.5, max: 2}}", "max_batch_size.min"),
        ("[1, 2]", "must be a mapping of sections"),
        ("sla: [", "not valid YAML/JSON"),
    ],
)
def test_bad_config_files_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(path)


def test_a_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(Path("no-such-file.yaml"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give one of --local"),
        (["--local", "--mix", "a:b"], "weight in mix item 'a:b' must be a number"),
        (["--local", "--config", "no-such.yaml"], "cannot read config file"),
        (["--local", "--sla-p99-ms", "0"], "--sla-p99-ms"),
        (["--local", "--sampler", "anneal"], "--sampler"),
        (["--local", "--storage", "foo://bar"], "--storage foo://bar: Can't load plugin"),
        (["--local", "--storage", "no-such-dir/j.journal"], "cannot open the journal file"),
        (["--local", "--rounds", "2"], "--rounds"),
        (["--local", "--finalists", "0"], "--finalists"),
        (["--local", "--min-gain-percent", "-1"], "--min-gain-percent"),
        (["--local", "--config", "no-such.yaml", "--rounds", "21"], "--rounds"),
        (["--local", "--runtime", "tritonn"], "'tritonn' is not one of"),
        (["--simulator", "c.json", "--runtime", "mlserver"], "--runtime applies to --local"),
    ],
)
def test_cli_rejects_bad_input_in_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(tune, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_runtime_with_its_own_model_refuses_server_model(tmp_path: Path) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text("server:\n  model: encoder\n")
    result = CliRunner().invoke(tune, ["--local", "--runtime", "mlserver", "--config", str(config)])
    assert result.exit_code == 2
    assert "the mlserver runtime serves its own bundled model" in result.output


@pytest.fixture
async def refusing() -> AsyncIterator[str]:
    """An endpoint that answers every request 500 with a two-line body."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(status=500, text="model exploded\nTraceback ...")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _probe(url: str) -> LocalProbe:
    return LocalProbe(
        url,
        sla=SLA(p99_ms=100),
        mix=RequestMix.uniform(1),
        precision=0.2,
        step_duration_s=0.2,
        warmup_s=0.2,
    )


async def test_a_target_refusing_the_first_measurement_stops_the_run(refusing: str) -> None:
    with pytest.raises(RejectedError, match=r"HTTP 500 to POST .*/v1/predict: model exploded$"):
        await _probe(refusing).measure(CONFIG, must_beat=None)


async def test_a_refusal_after_accepted_measurements_fails_only_that_trial(
    refusing: str,
) -> None:
    probe = _probe(refusing)
    probe.accepted = True  # as after an earlier measurement got past its warm-up
    expected = rf"^at {re.escape(CONFIG.label())} the target answered HTTP 500"
    with pytest.raises(TargetError, match=expected):
        await probe.measure(CONFIG, must_beat=None)


async def test_the_probe_hands_its_connection_cap_to_every_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import batchpilot.capacity.http as http

    seen: list[int | None] = []

    async def fake(*_: object, max_connections: int | None = None, **__: object) -> object:
        seen.append(max_connections)
        return object()

    monkeypatch.setattr(http, "measure_capacity", fake)
    probe = LocalProbe(
        "http://127.0.0.1:9", sla=SLA(p99_ms=100.0), mix=RequestMix.default(), precision=0.1,
        step_duration_s=1.0, warmup_s=0.0, max_connections=3,
    )  # fmt: skip
    await probe.measure(BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0), must_beat=None)
    assert seen == [3]
