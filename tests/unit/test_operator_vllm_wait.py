"""runtime.kind VLLM has no queue wait: the operator searches the batch cap alone (the
wait axis pinned at 0 whatever parameters.maxQueueTimeMs says, as the API server fills
in its 0..100 default), reads the baseline from the batch variable alone, and never
writes a queue-wait variable into the Deployment. Other kinds keep their range."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from batchpilot.operator import decisions
from batchpilot.operator.spec import MAX_BATCH_SIZE, MAX_QUEUE_TIME_MS, parse_spec
from batchpilot.operator.trials import search_space


def spec_of(kind: str) -> Any:
    return parse_spec(
        {
            "target": {"name": "llm"},
            "runtime": {"kind": kind, **({"model": "tiny-llama"} if kind == "VLLM" else {})},
            "apply": {"method": "Env"},
            "sla": {"p99LatencyMs": 5000},
            "parameters": {"maxBatchSize": {"min": 1, "max": 32}},
            "load": {"endpoint": {"port": 8000, "path": "/v1/predict"}},
        }
    )


def deployment(env: dict[str, str]) -> dict[str, Any]:
    container = {"name": "server", "env": [{"name": k, "value": v} for k, v in env.items()]}
    return {"spec": {"template": {"spec": {"containers": [container]}}}}


def test_the_wait_axis_is_pinned_for_vllm_only() -> None:
    vllm, generic = spec_of("VLLM"), spec_of("Generic")
    assert vllm.wait_pinned
    assert not generic.wait_pinned
    assert search_space(vllm).queue_bounds == (0.0, 0.0)
    assert search_space(generic).queue_bounds == (0.0, 100.0)
    assert decisions.rule_of_thumb(vllm) == {MAX_BATCH_SIZE: 21, MAX_QUEUE_TIME_MS: 0.0}
    assert decisions.rule_of_thumb(generic)[MAX_QUEUE_TIME_MS] == 20.0
    assert decisions.clamp_params({MAX_BATCH_SIZE: 64, MAX_QUEUE_TIME_MS: 7.0}, vllm) == {
        MAX_BATCH_SIZE: 32,
        MAX_QUEUE_TIME_MS: 0.0,
    }


def test_only_the_batch_variable_is_read_and_written_for_vllm() -> None:
    vllm = spec_of("VLLM")
    assert vllm.env_names() == {MAX_BATCH_SIZE: "MAX_BATCH_SIZE"}
    original = decisions.original_config(
        deployment({"MAX_BATCH_SIZE": "8"}), vllm, datetime.now(UTC)
    )
    assert original.params == {MAX_BATCH_SIZE: 8, MAX_QUEUE_TIME_MS: 0.0}
    written = decisions.env_for_params(
        {MAX_BATCH_SIZE: 16, MAX_QUEUE_TIME_MS: 0.0}, vllm.env_names()
    )
    assert written == {"MAX_BATCH_SIZE": "16"}
    # without the batch variable the baseline is unknown, as for any runtime
    unset = decisions.original_config(deployment({}), vllm, datetime.now(UTC))
    assert unset.params == {}


def test_other_kinds_still_need_and_write_both_variables() -> None:
    generic = spec_of("Generic")
    original = decisions.original_config(
        deployment({"MAX_BATCH_SIZE": "8"}), generic, datetime.now(UTC)
    )
    assert original.params == {}
    assert decisions.env_for_params(
        {MAX_BATCH_SIZE: 16, MAX_QUEUE_TIME_MS: 5.0}, generic.env_names()
    ) == {"MAX_BATCH_SIZE": "16", "MAX_QUEUE_TIME_MS": "5"}


def test_a_token_trials_tails_reach_the_status_and_its_best() -> None:
    from batchpilot.operator.trials import to_entry
    from batchpilot.tuner.study import TrialRecord

    record = TrialRecord(
        number=1,
        params={MAX_BATCH_SIZE: 16, MAX_QUEUE_TIME_MS: 0.0},
        source="sampler",
        state="Complete",
        effective_rps=25.1,
        ttft_p99_ms=35.5,
        tpot_p99_ms=6.6,
        output_tokens_per_s=3218.0,
    )
    entry = to_entry(record)
    shown = entry.model_dump(by_alias=True, exclude_none=True)
    assert (shown["ttftP99Ms"], shown["tpotP99Ms"], shown["outputTokensPerS"]) == (
        35.5,
        6.6,
        3218.0,
    )
    best = decisions.result_of(entry, generation=1)
    assert (best.ttft_p99_ms, best.tpot_p99_ms) == (35.5, 6.6)
