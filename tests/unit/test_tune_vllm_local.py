"""`tune --local --runtime vllm` before any engine starts: the queue-time axis pinned at 0,
the token budget checked against the batches searched, TTFT/TPOT targets and stream
steps where nothing else is said (and what a flag or the file says kept), the flags
that do not apply refused naming themselves, `--url` refused with the reason; and the
adapter's and control's pure parts: vLLM's names, the persisted command line, the
configuration read back from /server_info, the running gauge of /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from batchpilot.errors import TargetError
from batchpilot.models import SLA, BatchingConfig
from batchpilot.runtimes.base import wait_pinned
from batchpilot.runtimes.registry import get_runtime
from batchpilot.runtimes.vllm.adapter import VllmRuntime
from batchpilot.runtimes.vllm.control import burst_streams, running, scheduler_knobs
from batchpilot.runtimes.vllm.knobs import VllmKnobs
from batchpilot.tuner.cli import TuneFlags, config_of, streaming_config, tune
from batchpilot.tuner.config import DEFAULT_STREAM_SLA, TuneConfig


def streaming(args: list[str]) -> TuneConfig:
    """The configuration `tune ARGS` runs a vLLM study with."""
    context = tune.make_context("tune", ["--local", "--runtime", "vllm", *args])
    flags = TuneFlags(**context.params)
    return streaming_config(config_of(flags), flags)


def test_defaults_pin_the_wait_and_judge_streams_on_token_targets() -> None:
    config = streaming(["--quick"])
    assert config.sla == DEFAULT_STREAM_SLA
    assert (config.parameters.max_queue_time_ms.min, config.parameters.max_queue_time_ms.max) == (
        0,
        0,
    )
    assert config.server.max_queue_time_ms == 0
    assert config.measurement.min_requests == 0
    assert (config.measurement.step_duration_s, config.measurement.warmup_s) == (2.0, 0.5)
    assert config.measurement.precision == 0.15
    assert config.tuning.screen is False
    full = streaming([]).measurement
    assert (full.step_duration_s, full.warmup_s, full.min_requests) == (4.0, 1.0, 0)
    assert full.precision == TuneConfig().measurement.precision


def test_what_the_flags_and_the_file_say_is_kept(tmp_path: Path) -> None:
    file = tmp_path / "tune.yaml"
    file.write_text("measurement: {step_duration_s: 9, min_requests: 50}\ntuning: {screen: true}\n")
    config = streaming(["--config", str(file), "--ttft-p99-ms", "400"])
    assert config.sla == SLA(ttft_p99_ms=400)
    assert config.measurement.step_duration_s == 9
    assert config.measurement.min_requests == 50
    # without --quick the full measurement's precision stays
    assert config.measurement.precision == TuneConfig().measurement.precision
    assert config.tuning.screen is True
    assert streaming(["--min-requests", "7"]).measurement.min_requests == 7
    file.write_text("sla: {p99_ms: 5000}\n")
    assert streaming(["--config", str(file)]).sla == SLA(p99_ms=5000)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--local", "--runtime", "vllm", "--wait-range-ms", "0..10"], "batches continuously"),
        (["--local", "--runtime", "vllm", "--token-budget", "32"],
         "--token-budget 32 is below the largest batch searched (64)"),
        (["--local", "--token-budget", "4096"], "--token-budget applies to --local --runtime vllm"),
        (["--local", "--runtime", "vllm", "--mix", "1:1"],
         "--mix does not apply to --runtime vllm"),
        (["--local", "--protocol", "openai-stream"],
         "--protocol openai-stream applies to --url runs"),
        (["--url", "http://127.0.0.1:9", "--runtime", "vllm"],
         "vLLM reads max_num_seqs and max_num_batched_tokens only when it starts"),
    ],
)  # fmt: skip
def test_what_vllm_cannot_take_is_refused_before_it_starts(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(tune, args)
    assert result.exit_code != 0, result.output
    assert fragment in result.output


def test_the_file_cannot_give_vllm_a_queue_wait(tmp_path: Path) -> None:
    file = tmp_path / "tune.yaml"
    file.write_text("server: {max_queue_time_ms: 5}\n")
    result = CliRunner().invoke(tune, ["--local", "--runtime", "vllm", "--config", str(file)])
    assert result.exit_code == 2, result.output
    assert "server.max_queue_time_ms" in result.output


def test_the_adapter_speaks_vllms_names_and_persists_its_command_line() -> None:
    runtime = get_runtime("vllm")
    assert isinstance(runtime, VllmRuntime)
    assert wait_pinned(runtime.knobs)
    assert not wait_pinned(get_runtime("reference").knobs)
    config = BatchingConfig(max_batch_size=16, max_queue_time_ms=0)
    assert runtime.native(config) == {"max_num_seqs": 16, "max_num_batched_tokens": 2048}
    assert runtime.with_token_budget(512).native(config)["max_num_batched_tokens"] == 512
    assert runtime.canonical({"max_num_seqs": 16}) == config
    persisted = runtime.persistence(config)
    assert persisted.kind == "args"
    assert persisted.snippet == "--max-num-seqs 16 --max-num-batched-tokens 2048"
    with pytest.raises(ValueError, match="outside what the runtime takes"):
        runtime.native(BatchingConfig(max_batch_size=16, max_queue_time_ms=5))
    with pytest.raises(ValueError, match="must be at least max_num_seqs"):
        runtime.with_token_budget(8).native(config)
    with pytest.raises(ValueError, match="token budget"):
        runtime.with_token_budget(0)
    with pytest.raises(ValueError, match="no token budget"):
        get_runtime("triton").with_token_budget(512)


def test_the_configuration_is_read_back_from_server_info() -> None:
    info = {
        "vllm_config": {
            "scheduler_config": {
                "max_num_seqs": 12,
                "max_num_batched_tokens": 1024,
                "enable_chunked_prefill": True,
            }
        }
    }
    assert scheduler_knobs(info) == VllmKnobs(
        max_num_seqs=12, max_num_batched_tokens=1024, enable_chunked_prefill=True
    )
    with pytest.raises(TargetError, match="VLLM_SERVER_DEV_MODE"):
        scheduler_knobs({"vllm_config": "text, not JSON"})


def test_the_running_gauge_is_the_busiest_engines() -> None:
    # each engine of a data-parallel server runs up to max_num_seqs of its own
    page = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="lora"} 2.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0\n'
    )
    assert running(page) == 4.0
    assert running('vllm:num_requests_running{model_name="m"} 6.0\n') == 6.0
    assert running("") == 0.0


def test_a_burst_always_outnumbers_the_cap() -> None:
    assert [burst_streams(cap) for cap in (1, 8, 64)] == [3, 10, 80]
