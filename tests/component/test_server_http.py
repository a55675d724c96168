"""The HTTP API of the reference server, served in-process on 127.0.0.1 with the real
MLP model: predict, admin, readiness, metrics, and every kind of bad input."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import pytest
import torch
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from batchpilot.models import BatchingConfig
from batchpilot.server.app import ServerOptions, ServerState, build_app
from batchpilot.server.engine import InferenceEngine, ModelError
from batchpilot.server.inputs import MLP_FEATURES, MLP_MAX_ROWS, ModelInput
from batchpilot.server.workloads import MLPWorkload

pytestmark = pytest.mark.component

MAX_BODY = 256 * 1024
Client = TestClient[web.Request, web.Application]


@pytest.fixture(scope="module")
def engine() -> Iterator[InferenceEngine]:
    engine = InferenceEngine("mlp", "cpu", threads=1)
    yield engine
    engine.close()


@contextlib.asynccontextmanager
async def serving(
    engine: InferenceEngine, batching: BatchingConfig, queue_limit: int = 64
) -> AsyncIterator[tuple[Client, ServerState]]:
    state = ServerState(
        engine, ServerOptions(batching=batching, queue_limit=queue_limit, max_body_bytes=MAX_BODY)
    )
    state.batcher.start()
    await state.warm_up()
    server = TestServer(build_app(state), host="127.0.0.1", handler_cancellation=True)
    async with TestClient(server) as client:
        yield client, state
    await state.batcher.close()


@pytest.fixture
async def served(engine: InferenceEngine) -> AsyncIterator[tuple[Client, ServerState]]:
    async with serving(engine, BatchingConfig(max_batch_size=4, max_queue_time_ms=1.0)) as pair:
        yield pair


@pytest.fixture
def client(served: tuple[Client, ServerState]) -> Client:
    return served[0]


async def error_of(client: Client, method: str, path: str, status: int, **kwargs: object) -> str:
    response = await client.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert response.status == status, await response.text()
    body = await response.json()
    assert set(body) == {"error"}
    message: str = body["error"]
    return message


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll `condition` (bounded): the server's state changes on its own schedule."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the exposition")


async def test_predict_synthetic(client: Client) -> None:
    response = await client.post("/v1/predict", json={"synthetic": {"size": 3}})
    assert response.status == 200
    body = await response.json()
    assert body["model"] == "mlp"
    assert body["size"] == 3
    assert len(body["classes"]) == 3
    assert all(0 <= c < 16 for c in body["classes"])
    assert 1 <= body["batch_size"] <= 4
    assert body["queue_ms"] >= 0
    assert body["compute_ms"] > 0


async def test_predict_real_inputs_match_synthetic_rows(client: Client) -> None:
    # The synthetic table is seeded: the same in this process as in the model process.
    rows = MLPWorkload(torch.device("cpu")).synthetic(2).tolist()
    real = await (await client.post("/v1/predict", json={"inputs": rows})).json()
    synthetic = await (await client.post("/v1/predict", json={"synthetic": {"size": 2}})).json()
    assert real["classes"] == synthetic["classes"]


async def test_concurrent_requests_share_batches(client: Client) -> None:
    responses = await asyncio.gather(
        *(client.post("/v1/predict", json={"synthetic": {"size": 1}}) for _ in range(8))
    )
    bodies = [await r.json() for r in responses]
    assert all(r.status == 200 for r in responses)
    assert max(b["batch_size"] for b in bodies) > 1
    assert all(b["batch_size"] <= 4 for b in bodies)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", "body is empty"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "JSON list: send a JSON object"),
        (b'{"synthetic": {"size": 1}, "extra": 1}', "extra: unknown field"),
        (b"{}", 'exactly one of "inputs"'),
        (b'{"inputs": [[1.0]], "synthetic": {"size": 1}}', 'exactly one of "inputs"'),
        (b'{"synthetic": {"size": 0}}', "synthetic.size"),
        (b'{"synthetic": {"size": "3"}}', "synthetic.size"),
        (b'{"synthetic": {"size": 1, "seed": 2}}', "synthetic.seed: unknown field"),
        (b'{"synthetic": {"size": 5000}}', f"takes 1 to {MLP_MAX_ROWS} rows"),
        (b'{"inputs": []}', f"each a list of {MLP_FEATURES} numbers"),
        (b'{"inputs": [1, 2, 3]}', "inputs[0]` has int"),
        (b'{"inputs": [[1, 2]]}', f"has 2 values: each row must be a list of {MLP_FEATURES}"),
        (b'{"inputs": "abc"}', "`inputs` must be a list"),
        (b'{"inputs": [[NaN' + b", 0" * (MLP_FEATURES - 1) + b"]]}", "must be finite"),
    ],
)
async def test_bad_predict_bodies_are_400(client: Client, body: bytes, expected: str) -> None:
    message = await error_of(client, "POST", "/v1/predict", 400, data=body)
    assert expected in message
    if "allowed" in message:
        assert "synthetic" in message  # says what is allowed


async def test_non_numbers_in_rows_are_400(client: Client) -> None:
    for bad in (True, "1", None, [1]):
        row: list[object] = [0.0] * MLP_FEATURES
        row[5] = bad
        message = await error_of(client, "POST", "/v1/predict", 400, json={"inputs": [row]})
        assert "inputs[0]` holds" in message
        assert "only numbers" in message


async def test_oversized_body_is_413(client: Client) -> None:
    message = await error_of(client, "POST", "/v1/predict", 413, data=b" " * (MAX_BODY + 10))
    assert f"at most {MAX_BODY} bytes" in message


async def test_oversized_chunked_body_is_413(client: Client) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024

    message = await error_of(client, "POST", "/v1/predict", 413, data=chunks())
    assert f"limit of {MAX_BODY} bytes" in message


async def test_bad_requests_are_counted(client: Client) -> None:
    await client.post("/v1/predict", data=b"nope")
    await client.post("/v1/predict", json={"synthetic": {"size": 1}})
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, 'batchpilot_requests_total{outcome="bad_request"}') == 1
    assert metric_value(text, 'batchpilot_requests_total{outcome="ok"}') == 1


async def test_unknown_path_and_method_are_json(client: Client) -> None:
    assert "no such endpoint /v2/predict" in await error_of(client, "GET", "/v2/predict", 404)
    message = await error_of(client, "GET", "/v1/predict", 405)
    assert "use POST" in message


async def test_admin_batching_get_and_partial_put(served: tuple[Client, ServerState]) -> None:
    client, state = served
    assert await (await client.get("/admin/batching")).json() == {
        "max_batch_size": 4,
        "max_queue_time_ms": 1.0,
    }
    response = await client.put("/admin/batching", json={"max_batch_size": 16})
    assert response.status == 200
    assert await response.json() == {"max_batch_size": 16, "max_queue_time_ms": 1.0}
    response = await client.put("/admin/batching", json={"max_queue_time_ms": 20})
    assert await response.json() == {"max_batch_size": 16, "max_queue_time_ms": 20.0}
    assert state.batcher.config == BatchingConfig(max_batch_size=16, max_queue_time_ms=20.0)
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "batchpilot_max_batch_size") == 16
    assert metric_value(text, "batchpilot_max_queue_time_seconds") == pytest.approx(0.02)
    assert metric_value(text, "batchpilot_config_changes_total") == 2
    # The same values again change nothing.
    await client.put("/admin/batching", json={"max_batch_size": 16})
    text = await (await client.get("/metrics")).text()
    assert metric_value(text, "batchpilot_config_changes_total") == 2


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ({"max_batch_size": 0}, 422, "integer 1 to 4096"),
        ({"max_batch_size": 5000}, 422, "integer 1 to 4096"),
        ({"max_queue_time_ms": -1}, 422, "number 0 to 60000"),
        ({"max_queue_time_ms": 1e9}, 422, "number 0 to 60000"),
        ({"max_batch_size": 2.5}, 400, "max_batch_size"),
        ({"max_batch_size": "8"}, 400, "max_batch_size"),
        ({"max_batch_size": True}, 400, "max_batch_size"),
        ({"max_queue_time_ms": "fast"}, 400, "max_queue_time_ms"),
        ({"max_queue_time_ms": "5"}, 400, "max_queue_time_ms"),
        ({"max_queue_time_ms": False}, 400, "max_queue_time_ms"),
        ({"batch": 8}, 400, "batch: unknown field"),
    ],
)
async def test_admin_rejects_bad_values(
    served: tuple[Client, ServerState], body: object, status: int, expected: str
) -> None:
    client, state = served
    message = await error_of(client, "PUT", "/admin/batching", status, json=body)
    assert expected in message
    assert state.batcher.config == BatchingConfig(max_batch_size=4, max_queue_time_ms=1.0)


async def test_admin_rejects_malformed_json(client: Client) -> None:
    message = await error_of(client, "PUT", "/admin/batching", 400, data=b"{")
    assert "not valid JSON" in message
    assert "max_batch_size" in message


async def test_health_and_readiness(served: tuple[Client, ServerState]) -> None:
    client, state = served
    assert (await client.get("/healthz")).status == 200
    response = await client.get("/readyz")
    assert response.status == 200
    assert (await response.json())["status"] == "ready"
    state.draining = True
    response = await client.get("/readyz")
    assert response.status == 503
    assert (await response.json())["status"] == "draining"
    assert (await client.get("/healthz")).status == 200


async def test_not_ready_before_warm_up(engine: InferenceEngine) -> None:
    state = ServerState(
        engine, ServerOptions(batching=BatchingConfig(max_batch_size=2, max_queue_time_ms=0))
    )
    async with TestClient(TestServer(build_app(state), host="127.0.0.1")) as client:
        response = await client.get("/readyz")
        assert response.status == 503
        assert (await response.json())["status"] == "warming up"
        await state.warm_up()
        assert (await client.get("/readyz")).status == 200


async def test_metrics_exposition(client: Client) -> None:
    for size in (1, 2):
        await client.post("/v1/predict", json={"synthetic": {"size": size}})
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.content_type == "text/plain"
    text = await response.text()
    for name in (
        "batchpilot_request_latency_seconds_bucket",
        "batchpilot_queue_wait_seconds_bucket",
        "batchpilot_batch_size_bucket",
        "batchpilot_batch_compute_seconds_bucket",
        "batchpilot_queue_depth",
    ):
        assert name in text
    assert metric_value(text, "batchpilot_request_latency_seconds_count") == 2
    assert metric_value(text, "batchpilot_queue_wait_seconds_count") == 2
    assert metric_value(text, 'batchpilot_requests_total{outcome="ok"}') == 2
    for outcome in ("rejected", "error", "cancelled"):
        assert metric_value(text, f'batchpilot_requests_total{{outcome="{outcome}"}}') == 0
    assert metric_value(text, "batchpilot_max_batch_size") == 4
    assert metric_value(text, "batchpilot_queue_depth") == 0


async def test_profile_reports_and_resets(client: Client) -> None:
    await client.post("/v1/predict", json={"synthetic": {"size": 3}})
    profile = await (await client.get("/admin/profile")).json()
    assert profile["model"] == "mlp"
    assert profile["device"] == "cpu"
    (one,) = [b for b in profile["batches"] if b["batch_size"] == 1]
    assert one["count"] == 1
    assert one["mean_rows"] == 3
    assert one["mean_compute_ms"] > 0
    response = await client.delete("/admin/profile")
    assert (await response.json())["batches"] == []
    assert (await (await client.get("/admin/profile")).json())["batches"] == []


async def test_failing_batch_is_500_for_its_requests_only(
    engine: InferenceEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run_batch = engine.run_batch
    calls = 0

    async def fail_once(inputs: Sequence[ModelInput]) -> list[list[int]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ModelError("RuntimeError: out of memory (simulated)")
        return await real_run_batch(inputs)

    # The batcher takes `engine.run_batch` when the state is built: patch it before.
    monkeypatch.setattr(engine, "run_batch", fail_once)
    batching = BatchingConfig(max_batch_size=4, max_queue_time_ms=1.0)
    async with serving(engine, batching) as (client, _):
        message = await error_of(
            client, "POST", "/v1/predict", 500, json={"synthetic": {"size": 1}}
        )
        assert message == "the batch failed: ModelError: RuntimeError: out of memory (simulated)"
        response = await client.post("/v1/predict", json={"synthetic": {"size": 1}})
        assert response.status == 200
        assert len((await response.json())["classes"]) == 1
        text = await (await client.get("/metrics")).text()
        assert metric_value(text, 'batchpilot_requests_total{outcome="error"}') == 1
        assert metric_value(text, 'batchpilot_requests_total{outcome="ok"}') == 1
        assert metric_value(text, "batchpilot_batch_size_count") == 2
    assert calls == 2


async def test_full_queue_is_503_with_retry_after(engine: InferenceEngine) -> None:
    batching = BatchingConfig(max_batch_size=8, max_queue_time_ms=60_000)
    async with serving(engine, batching, queue_limit=2) as (client, state):
        waiting = [
            asyncio.create_task(client.post("/v1/predict", json={"synthetic": {"size": 1}}))
            for _ in range(2)
        ]
        await until(lambda: state.batcher.depth == 2)
        response = await client.post("/v1/predict", json={"synthetic": {"size": 1}})
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        assert "queue is full" in (await response.json())["error"]
        # Lowering the wait releases the batch being collected.
        await client.put("/admin/batching", json={"max_queue_time_ms": 0})
        assert [r.status for r in await asyncio.gather(*waiting)] == [200, 200]
        text = await (await client.get("/metrics")).text()
        assert metric_value(text, 'batchpilot_requests_total{outcome="rejected"}') == 1


async def test_client_gone_is_cancelled_and_never_computed(engine: InferenceEngine) -> None:
    batching = BatchingConfig(max_batch_size=8, max_queue_time_ms=60_000)
    async with serving(engine, batching) as (client, state):
        batches_before = state.batcher.stats.batches
        request = asyncio.create_task(client.post("/v1/predict", json={"synthetic": {"size": 1}}))
        await until(lambda: state.batcher.depth == 1)
        request.cancel()  # the client hangs up
        with pytest.raises(asyncio.CancelledError):
            await request
        await until(lambda: state.batcher.depth == 0)
        await client.put("/admin/batching", json={"max_queue_time_ms": 0})
        ok = await client.post("/v1/predict", json={"synthetic": {"size": 1}})
        assert (await ok.json())["batch_size"] == 1
        assert state.batcher.stats.batches == batches_before + 1
        assert state.batcher.stats.dropped_cancelled == 1
        text = await (await client.get("/metrics")).text()
        assert metric_value(text, 'batchpilot_requests_total{outcome="cancelled"}') == 1
