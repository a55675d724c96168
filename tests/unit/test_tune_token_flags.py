"""`tune`'s token-stream flags: the SLA they make (the token targets replace the default
end-to-end bound, not one the configuration file sets) and the combinations refused
before any server is touched, each naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from batchpilot.models import SLA
from batchpilot.tuner.cli import build_config, tune
from batchpilot.tuner.config import TuneConfig, parse_config


def sla_of(
    base: TuneConfig,
    *,
    p99: float | None = None,
    ttft_p99_ms: float | None = None,
    tpot_p99_ms: float | None = None,
) -> SLA:
    config = build_config(
        base, trials=None, seed=None, sampler=None, mix=None, quick=False, sla_p99_ms=p99,
        ttft_p99_ms=ttft_p99_ms, tpot_p99_ms=tpot_p99_ms,
    )  # fmt: skip
    return config.sla


def test_token_targets_replace_the_default_p99() -> None:
    assert sla_of(TuneConfig(), ttft_p99_ms=300.0) == SLA(ttft_p99_ms=300)
    assert sla_of(TuneConfig(), tpot_p99_ms=40.0, p99=9000.0) == SLA(p99_ms=9000, tpot_p99_ms=40)
    assert sla_of(TuneConfig(), p99=50.0) == SLA(p99_ms=50)
    assert sla_of(TuneConfig()) == SLA(p99_ms=100)


def test_token_targets_keep_the_files_p99_and_fill_its_targets() -> None:
    base = parse_config({"sla": {"p99_ms": 8000, "tpot_p99_ms": 30}})
    assert base.sla == SLA(p99_ms=8000, tpot_p99_ms=30)
    assert sla_of(base, ttft_p99_ms=300.0) == SLA(p99_ms=8000, ttft_p99_ms=300, tpot_p99_ms=30)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--local", "--ttft-p99-ms", "300"], "--ttft-p99-ms applies to --protocol"),
        (
            ["--local", "--protocol", "openai-stream", "--model", "m"],
            "--protocol openai-stream applies to --url runs",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--protocol", "openai-stream", "--tpot-p99-ms", "9"],
            "--protocol openai-stream needs --model",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--protocol", "openai-stream", "--model", "m",
             "--mix", "1:1"],
            "--mix applies to sized requests",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--protocol", "openai-chat-stream", "--model", "m",
             "--output-tokens", "uniform:9-3"],
            "--output-tokens 'uniform:9-3'",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--protocol", "openai-stream", "--model", "m",
             "--ttft-p99-ms", "-1"],
            "--ttft-p99-ms",
        ),
    ],
)  # fmt: skip
def test_bad_token_flags_are_refused_naming_the_flag(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(tune, args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output


def test_token_targets_in_the_file_need_token_streams(tmp_path: Path) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text("sla: {ttft_p99_ms: 300}\n")
    result = CliRunner().invoke(tune, ["--local", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "are judged on token streams" in result.output
    assert "--protocol openai-stream or openai-chat-stream" in result.output
