"""A Triton model of the user's own through the operator: a trial's requests are built
from the model's metadata as the pod serves it (its input's name, datatype and shape,
the batch dimension from its config's max_batch_size), not from the bundled model. KMock
for the API; an HTTP server written here stands in for the pod and answers as Triton
does, refusing with HTTP 400 any request that does not fit the model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from aiohttp import web
from test_operator_world import DEPLOYMENTS, NS, kube, ready_pod, target, world

from batchpilot.models import BatchingConfig
from batchpilot.operator.kube import Kube
from batchpilot.operator.spec import parse_spec
from batchpilot.operator.world import TargetProblem

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]
__all__ = ["kube"]  # the KMock-backed client fixture, used by name

CONFIG = BatchingConfig(max_batch_size=8, max_queue_time_ms=2.0)
MAX_BATCH = 16
WIDTH = 4


def metadata(datatype: str = "FP32") -> dict[str, Any]:
    return {
        "name": "ident",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "x", "datatype": datatype, "shape": [-1, WIDTH]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, WIDTH]}],
    }


def refusal(body: dict[str, Any]) -> str:
    """What Triton would refuse in an infer request to `ident`, "" when it fits."""
    inputs = body.get("inputs") or []
    if [i.get("name") for i in inputs] != ["x"]:
        names = [i.get("name") for i in inputs]
        return f"unexpected inference input {names!r} for model 'ident'"
    (tensor,) = inputs
    shape = tensor.get("shape")
    if tensor.get("datatype") != "FP32":
        return f"input 'x' datatype {tensor.get('datatype')!r}, expected FP32"
    if not (isinstance(shape, list) and len(shape) == 2 and shape[1] == WIDTH):
        return f"input 'x' shape {shape!r}, expected [-1,{WIDTH}]"
    if not 1 <= shape[0] <= MAX_BATCH:
        return f"batch size {shape[0]} exceeds max_batch_size {MAX_BATCH}"
    if len(tensor.get("data") or []) != shape[0] * WIDTH:
        return "input 'x' data does not match its shape"
    return ""


@pytest.fixture
async def triton_pod() -> AsyncIterator[tuple[int, dict[str, Any], list[dict[str, Any]]]]:
    """The pod's port, the metadata it answers (a test may change it) and every infer
    body it accepted."""
    answer: dict[str, Any] = {"metadata": metadata(), "status": 200}
    accepted: list[dict[str, Any]] = []

    async def model(_: web.Request) -> web.Response:
        return web.json_response(answer["metadata"], status=answer["status"])

    async def config(_: web.Request) -> web.Response:
        return web.json_response({"name": "ident", "max_batch_size": MAX_BATCH})

    async def infer(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        why = refusal(body)
        if why:
            return web.json_response({"error": why}, status=400)
        accepted.append(body)
        (tensor,) = body["inputs"]
        return web.json_response({"model_name": "ident", "outputs": [{**tensor, "name": "y"}]})

    app = web.Application()
    app.router.add_get("/v2/models/ident", model)
    app.router.add_get("/v2/models/ident/config", config)
    app.router.add_post("/v2/models/ident/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield int(runner.addresses[0][1]), answer, accepted
    finally:
        await runner.cleanup()


def triton_spec(port: int) -> Any:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "runtime": {"kind": "Triton", "model": "ident"},
            "sla": {"p99LatencyMs": 300, "maxErrorRate": 0.01},
            "load": {
                "endpoint": {"port": port},
                "requests": [{"weight": 1, "size": 1}, {"weight": 1, "size": 8}],
                "maxRps": 5,
                "maxOverloadSeconds": 1,
                "stepSeconds": 1,
                "warmupSeconds": 0,
                "minRequests": 0,
            },
            "tuning": {"strategy": "InPlace"},
        }
    )


async def refused_trial(kmock: kmock.KubernetesEmulator, kube: Kube, port: int) -> TargetProblem:
    """The problem a trial on the pod at `port` ends with (it must end with one)."""
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    with pytest.raises(TargetProblem) as caught:
        await world(kube, triton_spec(port)).trials.measure(
            CONFIG, must_beat=None, since=datetime.now(UTC)
        )
    return caught.value


async def test_the_requests_are_built_from_the_models_own_metadata(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    triton_pod: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    port, _, accepted = triton_pod
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    result = await world(kube, triton_spec(port)).trials.measure(
        CONFIG, must_beat=None, since=datetime.now(UTC)
    )
    assert result.steps
    assert all(step.requests > 0 and step.error_rate == 0.0 for step in result.steps), [
        (step.requests, step.error_rate, step.reason) for step in result.steps
    ]
    # each request one row of the model's width (its input has no variable dimension
    # for a size): batching them is the server's job, the knobs under test
    assert {tuple(b["inputs"][0]["shape"]) for b in accepted} == {(1, WIDTH)}


async def test_a_model_whose_input_needs_a_sample_stops_the_study_and_says_why(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    triton_pod: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    port, answer, accepted = triton_pod
    answer["metadata"] = metadata(datatype="BYTES")
    problem = await refused_trial(kmock, kube, port)
    assert problem.reason == "RequestShape"
    assert problem.stops_study
    assert "BYTES" in str(problem)
    assert not accepted


async def test_unreadable_metadata_fails_the_trial_with_the_servers_answer(
    kmock: kmock.KubernetesEmulator,
    kube: Kube,
    triton_pod: tuple[int, dict[str, Any], list[dict[str, Any]]],
) -> None:
    port, answer, accepted = triton_pod
    answer["metadata"], answer["status"] = {"error": "model 'ident' is not ready"}, 400
    problem = await refused_trial(kmock, kube, port)
    assert problem.reason == "ModelMetadataUnreadable"
    assert not problem.stops_study
    assert "is not ready" in str(problem)
    assert not accepted
