"""A study's requests as load.protocol and load.request describe them, on servers written
here that take only their own requests: a Generic server with a JSON body of its own
(a body template), an MLServer-like v2 server whose input is `x` (built from its
metadata), and the first requests refused with a 4xx stopping the study with the
server's words. KMock for the API; the servers stand in for the pods."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from aiohttp import web
from test_operator_world import DEPLOYMENTS, NS, kube, ready_pod, target, world

from batchpilot.models import BatchingConfig, CapacityResult
from batchpilot.operator.kube import Kube
from batchpilot.operator.spec import parse_spec
from batchpilot.operator.world import TargetProblem

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]
__all__ = ["kube"]  # the KMock-backed client fixture, used by name

CONFIG = BatchingConfig(max_batch_size=8, max_queue_time_ms=2.0)
WIDTH = 3
GENERIC_BODY = {"features": [[0.5, 0.25]]}


def v2_refusal(body: dict[str, Any]) -> str:
    """What an MLServer-like server would refuse in an infer request to `mine`, "" when
    it fits: one FP32 input `x` of shape [n, WIDTH]."""
    inputs = body.get("inputs") or []
    if [i.get("name") for i in inputs] != ["x"]:
        return f"Model mine: unexpected inputs {[i.get('name') for i in inputs]!r}"
    (tensor,) = inputs
    shape = tensor.get("shape")
    if tensor.get("datatype") != "FP32" or not (
        isinstance(shape, list) and len(shape) == 2 and shape[1] == WIDTH
    ):
        return f"Model mine: input 'x' must be FP32 [-1, {WIDTH}], got {shape!r}"
    return ""


Servers = tuple[int, dict[str, list[Any]]]


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    """One port serving both pods' ways: POST /predict takes only GENERIC_BODY, the v2
    model `mine` only its input `x`; what each accepted, by path."""
    accepted: dict[str, list[Any]] = {"/predict": [], "/v2/models/mine/infer": []}

    async def predict(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if body != GENERIC_BODY:
            return web.json_response({"detail": "expected {'features': [[a, b]]}"}, status=422)
        accepted["/predict"].append(body)
        return web.json_response({"scores": [0.1]})

    async def metadata(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": "mine",
                "platform": "sklearn",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, WIDTH]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
            }
        )

    async def infer(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        why = v2_refusal(body)
        if why:
            return web.json_response({"error": why}, status=400)
        accepted["/v2/models/mine/infer"].append(body)
        return web.json_response({"model_name": "mine", "outputs": []})

    app = web.Application()
    app.router.add_post("/predict", predict)
    app.router.add_get("/v2/models/mine", metadata)
    app.router.add_post("/v2/models/mine/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield int(runner.addresses[0][1]), accepted
    finally:
        await runner.cleanup()


def spec(port: int, runtime: dict[str, Any], **load: Any) -> Any:
    return parse_spec(
        {
            "target": {"name": "resnet", "container": "server"},
            "runtime": runtime,
            "apply": {"method": "Env"},
            "sla": {"p99LatencyMs": 300, "maxErrorRate": 0.01},
            "load": {
                "endpoint": {"port": port, **({"path": "/predict"} if "path" not in load else {})},
                "requests": [{"weight": 1, "size": 1}, {"weight": 1, "size": 8}],
                "maxRps": 5,
                "maxOverloadSeconds": 1,
                "stepSeconds": 1,
                "warmupSeconds": 0,
                "minRequests": 0,
                **{k: v for k, v in load.items() if k != "path"},
            },
            "tuning": {"strategy": "InPlace"},
        }
    )


async def measure(kmock: kmock.KubernetesEmulator, kube: Kube, spec: Any) -> CapacityResult:
    kmock.objects[DEPLOYMENTS, NS, "resnet"] = target()
    kmock.objects["v1/pods", NS, "resnet-1"] = ready_pod()
    return await world(kube, spec).trials.measure(CONFIG, must_beat=None, since=datetime.now(UTC))


def clean(result: CapacityResult) -> None:
    assert result.steps
    assert all(step.requests > 0 and step.error_rate == 0.0 for step in result.steps), [
        (step.requests, step.error_rate, step.reason) for step in result.steps
    ]


async def test_a_body_template_is_what_a_generic_server_receives(
    kmock: kmock.KubernetesEmulator, kube: Kube, servers: Servers
) -> None:
    port, accepted = servers
    template = {"protocol": "Template", "request": {"bodyTemplate": json.dumps(GENERIC_BODY)}}
    clean(await measure(kmock, kube, spec(port, {"kind": "Generic"}, **template)))
    assert accepted["/predict"]
    assert all(body == GENERIC_BODY for body in accepted["/predict"])


@pytest.mark.parametrize("protocol", ["V2", "Runtime"])
async def test_v2_requests_are_built_from_a_v2_servers_metadata(
    kmock: kmock.KubernetesEmulator, kube: Kube, servers: Servers, protocol: str
) -> None:
    # MLServer's own requests (Runtime) are the model's, as V2 asks for any v2 server
    port, accepted = servers
    runtime = {"kind": "MLServer", "model": "mine"}
    clean(await measure(kmock, kube, spec(port, runtime, protocol=protocol, path=None)))
    shapes = {tuple(b["inputs"][0]["shape"]) for b in accepted["/v2/models/mine/infer"]}
    # no config says the model batches: the variable dimension is each request's size
    assert shapes == {(1, WIDTH), (8, WIDTH)}


async def test_requests_the_server_refuses_stop_the_study_with_its_words(
    kmock: kmock.KubernetesEmulator, kube: Kube, servers: Servers
) -> None:
    port, accepted = servers
    with pytest.raises(TargetProblem) as caught:
        await measure(kmock, kube, spec(port, {"kind": "Generic"}))
    problem = caught.value
    assert problem.reason == "RequestShape"
    assert problem.stops_study
    message = str(problem)
    assert "HTTP 422: expected {'features': [[a, b]]}" in message
    assert "Template with load.request.bodyTemplate" in message
    assert not accepted["/predict"]


async def test_a_v2_tensor_given_by_hand_that_the_model_refuses_stops_the_study(
    kmock: kmock.KubernetesEmulator, kube: Kube, servers: Servers
) -> None:
    port, accepted = servers
    by_hand = {"protocol": "V2", "request": {"model": "mine", "inputName": "INPUT"}}
    with pytest.raises(TargetProblem) as caught:
        await measure(kmock, kube, spec(port, {"kind": "Generic"}, path=None, **by_hand))
    assert caught.value.reason == "RequestShape"
    assert "unexpected inputs ['INPUT']" in str(caught.value)
    assert "load.request.inputName and features" in str(caught.value)
    assert not accepted["/v2/models/mine/infer"]
