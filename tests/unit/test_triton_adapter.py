"""The Triton adapter's decisions: knobs in Triton's units, the request it sends, what
the batches executed after a change prove, how a winner is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchpilot.errors import RequestShapeError, TargetError
from batchpilot.loadgen.protocols import RequestProtocol, template_protocol
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import LaunchError, representable
from batchpilot.runtimes.registry import get_runtime, runtime_names
from batchpilot.runtimes.triton.adapter import (
    TritonRuntime,
    check_batches,
    refused_requests,
    row_body,
    to_batching,
    triton_protocol,
)
from batchpilot.runtimes.triton.control import (
    TritonCounters,
    batches_since,
    parse_batch_stats,
)
from batchpilot.runtimes.triton.process import TritonProcess
from batchpilot.runtimes.triton.repository import TritonBatching


def test_triton_is_registered() -> None:
    assert "triton" in runtime_names()
    runtime = get_runtime("Triton")
    assert isinstance(runtime, TritonRuntime)
    assert runtime.default_model == "batchpilot"


def test_the_wait_goes_to_whole_microseconds_and_back() -> None:
    runtime = TritonRuntime()
    config = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.5004)
    assert runtime.native(config) == {
        "max_batch_size": 16,
        "max_queue_delay_microseconds": 2500,
    }
    assert representable(runtime.knobs, config) == BatchingConfig(
        max_batch_size=16, max_queue_time_ms=2.5
    )
    assert runtime.canonical({"max_batch_size": 4, "max_queue_delay_microseconds": 150}) == (
        BatchingConfig(max_batch_size=4, max_queue_time_ms=0.15)
    )
    assert to_batching(runtime.native(config)) == TritonBatching(16, 2500)


def test_each_request_is_one_row_of_its_size() -> None:
    protocol = triton_protocol("m")
    assert protocol.path == "/v2/models/m/infer"
    assert protocol.headers["Content-Type"] == "application/json"
    body = json.loads(protocol.body(3))
    assert body == {
        "inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1.0] * 3}]
    }
    with pytest.raises(ValueError, match="size must be >= 1"):
        row_body(0)
    with pytest.raises(ValueError, match="model name"):
        triton_protocol("a/b")


def test_batches_within_the_cap_verify_the_change() -> None:
    how, problem = check_batches(4, {2: 1, 4: 3}, TritonCounters())
    assert problem is None
    assert how == "executed batch sizes {2: 1, 4: 3} (Triton's statistics)"


def test_a_batch_above_the_new_cap_means_the_old_configuration_serves() -> None:
    _, problem = check_batches(2, {1: 1, 4: 2}, TritonCounters())
    assert problem == "Triton executed batches of 4 requests above the new cap 2"


def test_without_the_models_record_the_mean_batch_decides() -> None:
    ok = TritonCounters(inferences=8, executions=4)
    how, problem = check_batches(2, {}, ok)
    assert problem is None
    assert how == "mean executed batch 2.00 (nv_inference_count/exec_count)"
    _, problem = check_batches(2, {}, TritonCounters(inferences=12, executions=4))
    assert problem == "Triton's mean executed batch 3.00 is above the new cap 2"
    # answered requests that the metrics do not show: not this server's metrics
    how, problem = check_batches(2, {}, TritonCounters())
    assert problem is None
    assert "not seen" in how


def stats(model: str, sizes: dict[int, int], version: str = "1") -> dict[str, Any]:
    """One model's entry of Triton's statistics answer, with its batches by size."""
    batch_stats = [
        {"batch_size": size, "compute_infer": {"count": n, "ns": 1000 * n}}
        for size, n in sizes.items()
    ]
    return {"name": model, "version": version, "batch_stats": batch_stats}


def test_triton_statistics_give_any_models_batches_by_size_and_as_a_delta() -> None:
    answer = {
        "model_stats": [
            stats("m", {4: 25, 8: 3}),
            stats("m", {8: 2}, version="2"),
            stats("other", {8: 100}),
        ]
    }
    now = parse_batch_stats(answer, "m")
    assert now == {4: 25.0, 8: 5.0}
    assert batches_since(now, {4: 20.0}) == {4: 5, 8: 5}
    assert batches_since(now, now) == {}
    assert parse_batch_stats(answer, "absent") == {}
    assert parse_batch_stats({"error": "unknown model"}, "m") == {}


def test_persistence_is_the_exact_config_pbtxt_lines() -> None:
    kept = TritonRuntime().persistence(
        BatchingConfig(max_batch_size=32, max_queue_time_ms=1.5), model="resnet"
    )
    assert kept.kind == "recommend"
    assert kept.where.startswith("replace these lines in config.pbtxt of model 'resnet'")
    assert kept.snippet == (
        "max_batch_size: 32\n"
        "dynamic_batching {\n"
        "  preferred_batch_size: [ 32 ]\n"
        "  max_queue_delay_microseconds: 1500\n"
        "}\n"
    )


def test_metrics_name_triton_counters() -> None:
    metrics = TritonRuntime.metrics
    assert metrics.latency_histogram is None
    assert metrics.ok_requests == "nv_inference_request_success"
    assert "nv_inference_request_failure" in metrics.total_requests
    assert metrics.batch_size is not None
    assert "nv_inference_exec_count" in metrics.batch_size


def test_control_reads_metrics_from_port_8002_of_a_server_it_did_not_start() -> None:
    control = TritonRuntime().control("http://10.0.0.5:8000", model="resnet")
    assert control.control.metrics_url == "http://10.0.0.5:8002/metrics"
    assert control.protocol is None, "requests are built from the model's metadata"
    explicit = TritonRuntime().control("http://h:8000", metrics_url="http://h:9000/metrics")
    assert explicit.control.metrics_url == "http://h:9000/metrics"
    assert explicit.control.model == "batchpilot"


def test_the_launcher_starts_at_the_configuration_in_triton_units() -> None:
    server = TritonRuntime().launcher(BatchingConfig(max_batch_size=8, max_queue_time_ms=5))
    assert isinstance(server, TritonProcess)
    assert server.batching == TritonBatching(8, 5000)
    with pytest.raises(LaunchError, match="one bundled model"):
        TritonRuntime().launcher(
            BatchingConfig(max_batch_size=8, max_queue_time_ms=5), workload="encoder"
        )


def test_a_wait_beyond_the_limit_is_refused_in_native_terms() -> None:
    runtime = TritonRuntime()
    with pytest.raises(ValueError, match="max_queue_delay_microseconds"):
        runtime.knobs[1].to_native(60_000.5)


class FakeStats:
    """Triton's statistics as a sequence of readings of the model's batches by size; its
    metrics text says nothing of the model."""

    def __init__(self, readings: list[dict[int, int]]) -> None:
        self.model = "batchpilot"
        self.readings = readings

    async def batch_stats(self) -> dict[int, float]:
        answer = {"model_stats": [stats(self.model, self.readings.pop(0))]}
        return parse_batch_stats(answer, self.model)

    async def metrics_text(self) -> str:
        return ""


REQUESTS = TritonRuntime().protocol("batchpilot")


def control_with(
    readings: list[dict[int, int]], failed: list[tuple[int | None, str]] | None = None
) -> Any:
    control = TritonRuntime().control("http://127.0.0.1:1")
    control.control = FakeStats(readings)  # type: ignore[assignment]

    async def burst(n: int, protocol: RequestProtocol) -> list[tuple[int | None, str]]:
        return failed or []

    control._burst = burst  # type: ignore[method-assign]
    return control


async def test_a_batch_the_old_instance_finished_is_looked_at_again() -> None:
    # first burst: the old instance's batch of 16 is still seen; second: only the new cap
    control = control_with([{16: 1}, {16: 2, 4: 1}, {16: 2, 4: 1}, {16: 2, 4: 3}])
    batches, how = await control._executed(4, REQUESTS)
    assert batches == {4: 2}
    assert how == "executed batch sizes {4: 2} (Triton's statistics)"


async def test_batches_above_the_cap_twice_fail_the_change() -> None:
    control = control_with([{}, {16: 1}, {16: 1}, {16: 2}])
    with pytest.raises(TargetError, match="batches of 16 requests above the new cap 4"):
        await control._executed(4, REQUESTS)


async def test_requests_failing_after_a_change_fail_it() -> None:
    control = control_with([{}], failed=[(503, "busy"), (None, "TimeoutError: ")])
    failed = r"2 requests failed right after the change: HTTP 503: busy$"
    with pytest.raises(TargetError, match=failed):
        await control._executed(4, REQUESTS)


async def test_requests_refused_with_a_4xx_stop_with_the_servers_words_and_the_flag() -> None:
    # (status, body) as the burst gives them
    refusal = (400, "{\"error\":\"unexpected inference input 'INPUT0' for model 'ident'\"}")
    control = control_with([{}], failed=[refusal, refusal])
    with pytest.raises(RequestShapeError) as caught:
        await control._executed(16, REQUESTS)
    message = str(caught.value)
    assert "(HTTP 400: unexpected inference input 'INPUT0' for model 'ident');" in message
    assert "--body-template" in message


def test_only_a_4xx_is_a_refusal_of_the_requests() -> None:
    assert refused_requests([(503, "busy"), (None, "timeout")], "m") is None
    refused = refused_requests([(None, "timeout"), (422, '{"error": "bad shape"}')], "m")
    assert refused is not None
    assert "HTTP 422: bad shape" in refused
    assert refused.startswith("Triton refused the requests built for model 'm'")
    assert refused.endswith(
        "give requests it accepts: one FP32 tensor with --input-name and --features, or a "
        "request body with --body-template"
    )
    mine = refused_requests([(400, "{}")], "m", "--input-name and --features")
    assert mine is not None
    assert mine.startswith("Triton refused the requests --input-name and --features gave")


async def test_metrics_that_cannot_be_read_leave_the_batches_unchecked() -> None:
    control = TritonRuntime().control(
        "http://127.0.0.1:1", metrics_url="http://127.0.0.1:9/metrics"
    )

    async def burst(n: int, protocol: RequestProtocol) -> list[tuple[int | None, str]]:
        return []

    control._burst = burst  # type: ignore[method-assign]
    batches, how = await control._executed(4, REQUESTS)
    assert batches == {}
    assert "not checked" in how


async def test_the_users_body_replaces_the_metadata() -> None:
    control = TritonRuntime().control("http://127.0.0.1:1", model="ident")
    own = template_protocol('{"inputs": [], "id": "{size}"}', path="/v2/models/ident/infer")
    assert await control.request_protocol(own) is own
    assert await control.request_protocol() is own
