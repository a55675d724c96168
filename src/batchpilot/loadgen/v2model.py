"""KServe v2 requests shaped by the served model's own metadata.

A v2 server says what a model takes: `GET /v2/models/M` lists its inputs (name,
datatype, shape with -1 for a variable dimension) and, on Triton, `GET
/v2/models/M/config` gives `max_batch_size` (0: the model does not batch, so no
dimension is the batch's). From these the request for each size class is built: the
batch dimension (the first, where the model batches) 1, so a server's batch cap counts
requests; the first other variable dimension the request's size, any further one 1;
seeded random values of the input's datatype. BYTES inputs have no meaningful random
value: they need a sample body from the user.

The building is pure (`parse_inputs`, `request_body`, `v2_model_protocol`); the fetch
(`fetch_v2_model`) is a thin edge with a timeout that raises `MetadataError`. Nothing here
is Triton's alone but `max_batch_size` from its config endpoint, which a server of
another kind (MLServer) simply does not ask for."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from batchpilot.httpbody import MAX_CONTROL_BODY_BYTES, BodyTooLarge, text_capped
from batchpilot.loadgen.protocols import RequestProtocol, v2_path, with_json

# What a request of each datatype carries. Small non-negative integers stay valid for
# models that index with them (embeddings, class ids) and within every integer type.
FLOAT_TYPES = ("FP16", "FP32", "FP64", "BF16")
INT_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
_INT_HIGH = 8
# The flag that replaces the built body with the user's own, named in every error that
# a built body cannot get past.
BODY_FLAG = "--body-template"
# The flags that describe one FP32 tensor by hand instead.
TENSOR_FLAGS = "--input-name and --features"
# What to give when a server refuses the requests: either way of setting them.
REQUEST_FLAGS = f"one FP32 tensor with {TENSOR_FLAGS}, or a request body with {BODY_FLAG}"


def given_by(protocol: RequestProtocol) -> str:
    """The flags that gave requests of the user's own, for messages about them."""
    if protocol.name == "v2":
        return TENSOR_FLAGS
    if protocol.name == "template":
        return BODY_FLAG
    return f"--protocol {protocol.name}"


METADATA_TIMEOUT_S = 10.0


class MetadataError(ValueError):
    """The model's metadata could not be read, or it does not say enough to build a
    request; the message says which model, what was wrong and what to do."""


@dataclass(frozen=True)
class V2Input:
    """One input tensor as the metadata declares it (-1: a variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class V2Model:
    """What a request to `name` needs: its inputs and whether the first dimension of
    each is the batch's (`batched`: Triton's max_batch_size > 0)."""

    name: str
    inputs: tuple[V2Input, ...]
    batched: bool


def parse_inputs(metadata: object, model: str) -> tuple[V2Input, ...]:
    """The inputs of a `GET /v2/models/M` answer. MetadataError when there are none or
    one is malformed."""
    raw = metadata.get("inputs") if isinstance(metadata, dict) else None
    if not isinstance(raw, list) or not raw:
        raise MetadataError(
            f"the metadata of model {model!r} lists no inputs: {json.dumps(metadata)[:200]}"
        )
    inputs = []
    for item in raw:
        name = item.get("name") if isinstance(item, dict) else None
        datatype = item.get("datatype") if isinstance(item, dict) else None
        shape = item.get("shape") if isinstance(item, dict) else None
        if (
            not isinstance(name, str)
            or not isinstance(datatype, str)
            or not isinstance(shape, list)
            or not all(isinstance(d, int) and d >= -1 for d in shape)
        ):
            raise MetadataError(
                f"model {model!r} declares an input BatchPilot cannot read "
                f"(name, datatype and a shape of integers >= -1 are needed): {item!r}"
            )
        inputs.append(V2Input(name=name, datatype=datatype.upper(), shape=tuple(shape)))
    return tuple(inputs)


def max_batch_size_of(config: object, model: str) -> int:
    """`max_batch_size` of a Triton `GET /v2/models/M/config` answer (0: no batching)."""
    size = config.get("max_batch_size", 0) if isinstance(config, dict) else None
    if not isinstance(size, int) or size < 0:
        raise MetadataError(f"model {model!r} reports max_batch_size {size!r}, not an integer >= 0")
    return size


def request_shape(tensor: V2Input, size: int, *, batched: bool) -> list[int]:
    """The shape a request of `size` gives `tensor`: the batch dimension 1, the first
    other variable dimension `size`, any further variable one 1."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    dims = list(tensor.shape)
    shape: list[int] = []
    sized = False
    for index, dim in enumerate(dims):
        if batched and index == 0:
            shape.append(1)
        elif dim == -1 and not sized:
            shape.append(size)
            sized = True
        else:
            shape.append(1 if dim == -1 else dim)
    return shape


def tensor_data(datatype: str, count: int, rng: random.Random) -> list[Any]:
    """`count` values of `datatype` from `rng`. MetadataError for BYTES (and any type
    the v2 protocol does not know): no value can be made up for those."""
    if datatype in FLOAT_TYPES:
        return [round(rng.random(), 4) for _ in range(count)]
    if datatype in INT_TYPES:
        return [rng.randrange(_INT_HIGH) for _ in range(count)]
    if datatype == "BOOL":
        return [rng.random() < 0.5 for _ in range(count)]
    raise MetadataError(f"no values can be made up for datatype {datatype}")


def request_body(model: V2Model, size: int, *, seed: int = 0) -> bytes:
    """The v2 inference request of a request of `size` to `model`: every input, shaped
    by `request_shape`, with values drawn from `seed` (the same body for the same size
    and seed). MetadataError names an input no request can be built for and the flag
    that gives one."""
    rng = random.Random(f"{seed}:{size}")
    tensors = []
    for tensor in model.inputs:
        if tensor.datatype == "BYTES":
            raise MetadataError(
                f"input {tensor.name!r} of model {model.name!r} is BYTES: BatchPilot cannot "
                f"make up its contents; give a sample request body with {BODY_FLAG}"
            )
        shape = request_shape(tensor, size, batched=model.batched)
        count = 1
        for dim in shape:
            count *= dim
        try:
            data = tensor_data(tensor.datatype, count, rng)
        except MetadataError as exc:
            raise MetadataError(
                f"input {tensor.name!r} of model {model.name!r}: {exc}; give a sample request "
                f"body with {BODY_FLAG}"
            ) from None
        tensors.append(
            {"name": tensor.name, "shape": shape, "datatype": tensor.datatype, "data": data}
        )
    return json.dumps({"inputs": tensors}).encode()


def v2_model_protocol(
    model: V2Model,
    *,
    seed: int = 0,
    version: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> RequestProtocol:
    """The v2 protocol for `model`, each size's body built once. MetadataError (before
    any request) when no body can be built."""
    request_body(model, 1, seed=seed)

    @functools.lru_cache(maxsize=256)
    def body(size: int) -> bytes:
        return request_body(model, size, seed=seed)

    return RequestProtocol("v2", v2_path(model.name, version), body, with_json(headers or {}))


async def fetch_v2_model(
    url: str,
    model: str,
    *,
    triton_config: bool | None,
    timeout_s: float = METADATA_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | bool = True,
    server_name: str | None = None,
) -> V2Model:
    """Read `model`'s metadata from the v2 server at base URL `url` and, with
    `triton_config`, Triton's `max_batch_size` from its config endpoint (None: where the
    server has that endpoint, as a server of any v2 kind may be asked); without it the
    inputs are taken as declared, no dimension the batch's. `tls` verifies https, the
    certificate against `server_name` when given (a pod addressed by its IP)."""
    base = url.rstrip("/")
    get = functools.partial(
        _get_json,
        model=model,
        timeout_s=timeout_s,
        headers=headers,
        tls=tls,
        server_name=server_name,
    )
    inputs = parse_inputs(await get(f"{base}/v2/models/{model}"), model)
    batched = False
    if triton_config is not False:
        try:
            config = await get(f"{base}/v2/models/{model}/config")
        except MetadataError:
            if triton_config:
                raise
        else:
            batched = max_batch_size_of(config, model) > 0
    return V2Model(name=model, inputs=inputs, batched=batched)


async def _get_json(
    url: str,
    *,
    model: str,
    timeout_s: float,
    headers: Mapping[str, str] | None,
    tls: ssl.SSLContext | bool,
    server_name: str | None = None,
) -> object:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(
                url, headers=dict(headers or {}), ssl=tls, server_hostname=server_name
            ) as response,
        ):
            text = await text_capped(response, cap=MAX_CONTROL_BODY_BYTES, url=url)
    except BodyTooLarge as exc:
        raise MetadataError(f"cannot read the metadata of model {model!r}: {exc}") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise MetadataError(
            f"cannot read the metadata of model {model!r} at {url}: {type(exc).__name__}: {exc}"
        ) from None
    if response.status != 200:
        raise MetadataError(
            f"GET {url} answered HTTP {response.status} ({text[:200].strip()}): is model "
            f"{model!r} served and ready there?"
        )
    try:
        return json.loads(text)
    except ValueError:
        raise MetadataError(f"GET {url} did not answer JSON: {text[:200]!r}") from None


async def metadata_request(
    like: RequestProtocol, url: str, model: str, *, seed: int = 0
) -> RequestProtocol:
    """v2 requests built from `model`'s metadata as the server at base URL `url` declares
    it (whether the model batches from Triton's config where the server has one), sent
    with `like`'s headers and TLS settings. MetadataError (a ValueError) before any load
    when the metadata cannot be read or says too little."""
    found = await fetch_v2_model(
        url,
        model,
        triton_config=None,
        headers=like.headers,
        tls=like.tls(),
        server_name=like.server_name,
    )
    built = v2_model_protocol(found, seed=seed, headers=like.headers)
    return dataclasses.replace(
        built, ca_file=like.ca_file, ca_pem=like.ca_pem, server_name=like.server_name
    )
