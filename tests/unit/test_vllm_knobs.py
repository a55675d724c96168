"""vLLM's batching knobs on its command line: the cap and the token budget always, chunked
prefill only when chosen, a budget smaller than the cap refused as vLLM would."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.vllm.knobs import VllmKnobs, knobs_for, vllm_args
from batchpilot.runtimes.vllm.process import VllmProcess


def test_cap_and_budget_become_their_options() -> None:
    knobs = VllmKnobs(max_num_seqs=8, max_num_batched_tokens=512)
    assert vllm_args(knobs) == ["--max-num-seqs", "8", "--max-num-batched-tokens", "512"]
    assert knobs.label() == "seqs=8 tokens=512"


@pytest.mark.parametrize(
    ("chunked", "flag"),
    [(True, "--enable-chunked-prefill"), (False, "--no-enable-chunked-prefill")],
)
def test_chunked_prefill_only_when_chosen(chunked: bool, flag: str) -> None:
    knobs = VllmKnobs(max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=chunked)
    assert vllm_args(knobs)[-1] == flag


def test_a_budget_below_the_cap_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least max_num_seqs"):
        VllmKnobs(max_num_seqs=16, max_num_batched_tokens=8)


def test_batch_size_maps_to_max_num_seqs_and_the_queue_time_is_dropped() -> None:
    config = BatchingConfig(max_batch_size=12, max_queue_time_ms=7.0)
    assert knobs_for(config, 1024) == VllmKnobs(max_num_seqs=12, max_num_batched_tokens=1024)


def test_server_command_line_carries_the_knobs_and_the_loopback_port() -> None:
    server = VllmProcess(Path("/models/tiny"), VllmKnobs(max_num_seqs=3, max_num_batched_tokens=96))
    server.ports = {"http": 18000}
    args = server.args()
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == "18000"
    assert args[args.index("--max-num-seqs") + 1] == "3"
    assert args[args.index("--max-num-batched-tokens") + 1] == "96"
    assert server.metrics_url == "http://127.0.0.1:18000/metrics"
