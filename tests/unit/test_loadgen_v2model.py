"""KServe v2 requests built from a model's metadata: every datatype, the batch
dimension, variable dimensions, BYTES refused with the flag to use, and the fetch edge
against a small local v2 server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from batchpilot.loadgen.v2model import (
    FLOAT_TYPES,
    INT_TYPES,
    MetadataError,
    V2Input,
    V2Model,
    fetch_v2_model,
    parse_inputs,
    request_body,
    request_shape,
    v2_model_protocol,
)

# What Triton 2.51 answers for a python-backend model with input x, FP32, dims [4],
# max_batch_size 16: the batch dimension is the leading -1.
IDENT_METADATA = {
    "name": "ident",
    "versions": ["1"],
    "platform": "python",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
}


def model(*inputs: tuple[str, str, list[int]], batched: bool = True) -> V2Model:
    return V2Model(
        name="m",
        inputs=tuple(V2Input(name=n, datatype=t, shape=tuple(s)) for n, t, s in inputs),
        batched=batched,
    )


def decoded(body: bytes) -> list[dict[str, Any]]:
    tensors: list[dict[str, Any]] = json.loads(body)["inputs"]
    return tensors


def test_the_users_model_gets_its_own_input_one_row_per_request() -> None:
    ident = V2Model("ident", parse_inputs(IDENT_METADATA, "ident"), batched=True)
    (tensor,) = decoded(request_body(ident, 16))
    assert tensor["name"] == "x"
    assert tensor["datatype"] == "FP32"
    assert tensor["shape"] == [1, 4], "batch dimension 1, the fixed dims as declared"
    assert len(tensor["data"]) == 4
    assert all(isinstance(v, float) and 0.0 <= v < 1.0 for v in tensor["data"])


@pytest.mark.parametrize("datatype", FLOAT_TYPES)
def test_float_inputs_get_floats(datatype: str) -> None:
    (tensor,) = decoded(request_body(model(("a", datatype, [-1, 3])), 1))
    assert tensor["datatype"] == datatype
    assert all(isinstance(v, float) for v in tensor["data"])
    assert len(tensor["data"]) == 3


@pytest.mark.parametrize("datatype", INT_TYPES)
def test_integer_inputs_get_small_non_negative_integers(datatype: str) -> None:
    (tensor,) = decoded(request_body(model(("a", datatype, [-1, 5])), 1))
    assert tensor["datatype"] == datatype
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in tensor["data"])
    assert all(0 <= v < 8 for v in tensor["data"])


def test_bool_inputs_get_booleans() -> None:
    (tensor,) = decoded(request_body(model(("a", "BOOL", [-1, 6])), 1))
    assert tensor["datatype"] == "BOOL"
    assert all(isinstance(v, bool) for v in tensor["data"])


def test_a_bytes_input_asks_for_a_sample_body_and_names_the_flag() -> None:
    bytes_model = model(("ids", "FP32", [-1, 2]), ("text", "BYTES", [-1, 1]))
    with pytest.raises(MetadataError, match=r"'text'.*BYTES.*--body-template"):
        request_body(bytes_model, 1)
    with pytest.raises(MetadataError, match="--body-template"):
        v2_model_protocol(bytes_model)


def test_an_unknown_datatype_names_the_input_and_the_flag() -> None:
    with pytest.raises(MetadataError, match=r"'a'.*COMPLEX.*--body-template"):
        request_body(model(("a", "COMPLEX", [-1, 2])), 1)


def test_variable_dims_take_the_size_then_one() -> None:
    tensor = V2Input("a", "FP32", (-1, -1, 3, -1))
    assert request_shape(tensor, 7, batched=True) == [1, 7, 3, 1]
    assert request_shape(tensor, 7, batched=False) == [7, 1, 3, 1]
    assert request_shape(V2Input("a", "FP32", (2, 3)), 9, batched=False) == [2, 3]


def test_a_model_that_does_not_batch_keeps_its_first_dimension() -> None:
    (tensor,) = decoded(request_body(model(("a", "INT64", [3, -1]), batched=False), 4))
    assert tensor["shape"] == [3, 4]
    assert len(tensor["data"]) == 12


def test_every_input_is_sent() -> None:
    two = model(("a", "FP32", [-1, 2]), ("b", "INT32", [-1, 1]))
    assert [t["name"] for t in decoded(request_body(two, 1))] == ["a", "b"]


def test_bodies_are_seeded_and_built_once_per_size() -> None:
    ident = model(("x", "FP32", [-1, 4]))
    assert request_body(ident, 2, seed=1) == request_body(ident, 2, seed=1)
    assert request_body(ident, 2, seed=1) != request_body(ident, 2, seed=2)
    protocol = v2_model_protocol(ident, seed=3)
    assert protocol.path == "/v2/models/m/infer"
    assert protocol.headers["Content-Type"] == "application/json"
    assert protocol.body(5) is protocol.body(5)


@pytest.mark.parametrize(
    "metadata",
    [
        {"inputs": []},
        {"name": "m"},
        {"inputs": [{"name": "x", "datatype": "FP32"}]},
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-2]}]},
        ["not", "an", "object"],
    ],
)
def test_metadata_that_says_too_little_is_refused(metadata: object) -> None:
    with pytest.raises(MetadataError, match="'m'"):
        parse_inputs(metadata, "m")


SENT: list[dict[str, Any]] = []


@pytest_asyncio.fixture
async def v2_server() -> AsyncIterator[str]:
    async def infer(request: web.Request) -> web.Response:
        body = await request.json()
        SENT.append(body)
        if [t["name"] for t in body["inputs"]] != ["x"]:
            return web.json_response({"error": "unexpected inference input"}, status=400)
        return web.json_response({"outputs": []})

    async def metadata(request: web.Request) -> web.Response:
        if request.match_info["model"] != "ident":
            return web.json_response({"error": "unknown model"}, status=404)
        return web.json_response(IDENT_METADATA)

    async def config(request: web.Request) -> web.Response:
        return web.json_response({"name": "ident", "max_batch_size": 16})

    app = web.Application()
    app.router.add_get("/v2/models/{model}", metadata)
    app.router.add_get("/v2/models/{model}/config", config)
    app.router.add_post("/v2/models/{model}/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_fetch_reads_inputs_and_the_batch_dimension(v2_server: str) -> None:
    triton = await fetch_v2_model(v2_server, "ident", triton_config=True)
    assert triton == V2Model("ident", (V2Input("x", "FP32", (-1, 4)),), batched=True)
    plain = await fetch_v2_model(v2_server, "ident", triton_config=False)
    assert not plain.batched


@pytest.mark.asyncio
async def test_the_fetch_names_a_model_the_server_does_not_have(v2_server: str) -> None:
    with pytest.raises(MetadataError, match=r"HTTP 404.*'nope'"):
        await fetch_v2_model(v2_server, "nope", triton_config=True)


@pytest.mark.asyncio
async def test_the_fetch_names_a_server_that_is_not_there() -> None:
    with pytest.raises(MetadataError, match="cannot read the metadata of model 'm'"):
        await fetch_v2_model("http://127.0.0.1:9", "m", triton_config=False, timeout_s=2.0)


async def test_loadtest_v2_sends_the_inputs_the_metadata_declares(v2_server: str) -> None:
    from batchpilot.loadgen.arrivals import Poisson
    from batchpilot.loadgen.cli import _run
    from batchpilot.loadgen.protocol_option import build_protocol, reads_metadata
    from batchpilot.models import RequestMix

    assert reads_metadata(protocol="v2", input_name=None, features=None)
    assert not reads_metadata(protocol="v2", input_name=None, features=4)
    assert not reads_metadata(protocol="v2", input_name="x", features=None)
    request = build_protocol(
        protocol="v2",
        model="ident",
        max_tokens=None,
        input_name=None,
        features=None,
        body_template=None,
        headers=(),
        path=None,
    )
    SENT.clear()
    result = await _run(
        [v2_server],
        20.0,
        0.5,
        RequestMix.default(),
        Poisson(),
        5.0,
        0,
        request,
        (0, 1),
        None,
        None,
        "ident",
    )
    assert SENT, "requests were sent"
    assert result.error_rate == 0.0, result.errors
    assert {t["inputs"][0]["name"] for t in SENT} == {"x"}
    assert all(t["inputs"][0]["shape"] == [1, 4] for t in SENT)
