"""`batchpilot tune --url --runtime triton --model ident` on a model written here, not
shipped in `src/`: a python-backend model whose input is `x` (FP32, dims [4]), with
`max_batch_size: 16` and `preferred_batch_size: [8]` pinned, that records nothing about
its batches. Its requests come from its own metadata, every change is verified by
Triton's configuration read back, and the preferred batch sizes follow one policy from
the model's original configuration."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.triton.adapter import TritonRuntime
from batchpilot.runtimes.triton.control import TritonControl, batching_of, preferred_of
from batchpilot.runtimes.triton.install import VENV_NAME
from batchpilot.runtimes.triton.process import TritonProcess
from batchpilot.runtimes.triton.repository import TritonBatching
from support.gateway import Gateway

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(480), pytest.mark.asyncio]

MODEL = "ident"
USER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (x * 2.0).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
"""
USER_CONFIG = """
name: "ident"
backend: "python"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 2000 preferred_batch_size: [ 8 ] }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
START = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.0)


def expected_preferred(cap: int) -> list[int]:
    """The policy for this model: its pinned [8] while the cap allows it, else the cap
    (Triton's fill-in for a cleared list)."""
    return [8] if cap >= 8 else [cap]


@pytest_asyncio.fixture
async def triton(tmp_path: Path) -> AsyncIterator[TritonProcess]:
    require_runtime(VENV_NAME, "python")
    folder = tmp_path / "models" / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(USER_CONFIG, encoding="utf-8")
    (folder / "1" / "model.py").write_text(USER_MODEL, encoding="utf-8")
    async with TritonProcess(models=tmp_path / "models", model=MODEL) as server:
        yield server


async def read_back(triton: TritonProcess) -> tuple[TritonBatching, list[int]]:
    config = await TritonControl(triton.url, triton.metrics_url, MODEL).config()
    return batching_of(config), preferred_of(config)


async def tune_url(url: str, triton: TritonProcess, tmp_path: Path, *extra: str) -> Any:
    """The JSON of `tune --url URL --runtime triton --model ident --quick` with `extra`,
    Triton's metrics read directly, without the confirmation rounds."""
    code, out, err = await run_tune(url, triton, tmp_path, *extra)
    assert code == 0, err[-2000:]
    return json.loads(out)


async def run_tune(
    url: str, triton: TritonProcess, tmp_path: Path, *extra: str
) -> tuple[int | None, str, str]:
    """`tune_url`'s command: its exit code, stdout and stderr."""
    config = tmp_path / "tune.yaml"
    config.write_text("tuning:\n  confirm: false\n", encoding="utf-8")
    tune = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "batchpilot", "tune", "--url", url, "--runtime", "triton"),
        *("--model", MODEL, "--control-url", triton.metrics_url, *extra),
        # the flow is under test, not the model's speed on a shared machine
        *("--quick", "--p99-ms", "500", "--config", str(config), "--json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(tune.communicate(), timeout=420)
    return tune.returncode, out.decode(), err.decode()


async def test_preferred_sizes_follow_the_cap_from_the_original_every_change(
    triton: TritonProcess,
) -> None:
    control = TritonRuntime().control(triton.url, model=MODEL, metrics_url=triton.metrics_url)
    assert await control.current() == START
    seen = []
    for cap in (8, 32, 4, 64):
        await control.apply(BatchingConfig(max_batch_size=cap, max_queue_time_ms=10.0))
        live, preferred = await read_back(triton)
        assert live == TritonBatching(cap, 10_000)
        seen.append(preferred)
    # a cap of 4 clears the pinned [8]; the next cap of 64 starts from the original again
    assert seen == [[8], [8], [4], [8]]
    assert control.last_verification is not None
    assert "model READY" in control.last_verification.verified_by
    await control.apply(START)
    assert await read_back(triton) == (TritonBatching(16, 2000), [8])


async def test_a_users_model_tunes_on_requests_built_from_its_metadata(
    triton: TritonProcess, tmp_path: Path
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            triton.url + f"/v2/models/{MODEL}/infer",
            json={
                "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]
            },
        ) as response,
    ):
        assert response.status == 400, "the bundled model's request is not this model's"
    result = await tune_url(triton.url, triton, tmp_path, "--keep-winner", "--trials", "3")
    assert all(t["state"] == "Complete" for t in result["trials"]), result["trials"]
    # the batches Triton itself counted while each trial's change was verified, never
    # above that trial's cap
    executed = {t["number"]: t["executed_batches"] for t in result["trials"]}
    assert all(executed.values()), executed
    for trial in result["trials"]:
        cap = trial["params"]["max_batch_size"]
        assert all(1 <= int(size) <= cap for size in trial["executed_batches"]), trial
    recommended = result["recommended"]
    assert recommended is not None
    cap = int(recommended["max_batch_size"])
    runtime = result["runtime"]
    assert runtime["verified_by"].startswith("config read-back (preferred_batch_size")
    assert "model READY" in runtime["verified_by"]
    # --keep-winner: the server runs what tune reports, with the policy's preferred sizes
    live, preferred = await read_back(triton)
    assert live.max_batch_size == cap
    assert live.max_queue_delay_microseconds == round(recommended["max_queue_time_ms"] * 1000)
    assert runtime["recommended"] == {
        "max_batch_size": float(live.max_batch_size),
        "max_queue_delay_microseconds": float(live.max_queue_delay_microseconds),
    }
    assert preferred == expected_preferred(cap)
    # the lines to persist are exactly what ran
    sizes = ", ".join(str(size) for size in preferred)
    assert runtime["persist_snippet"] == (
        f"max_batch_size: {live.max_batch_size}\n"
        "dynamic_batching {\n"
        f"  preferred_batch_size: [ {sizes} ]\n"
        f"  max_queue_delay_microseconds: {live.max_queue_delay_microseconds}\n"
        "}\n"
    )
    assert f"model '{MODEL}'" in runtime["persist_where"]


async def test_a_tensor_described_by_hand_is_what_the_load_sends(
    triton: TritonProcess, tmp_path: Path
) -> None:
    """--input-name and --features replace the requests built from the metadata: a wrong
    name is refused by Triton at the first change, with its words and the flags to set;
    the model's own name tunes."""
    code, _, err = await run_tune(
        triton.url, triton, tmp_path, "--input-name", "INPUT0", "--features", "4"
    )
    message = " ".join(err.split())
    assert code == 1, message[-2000:]
    assert (
        f"Triton refused the requests --input-name and --features gave for model '{MODEL}' "
        "(HTTP 400: unexpected inference input 'INPUT0' for model 'ident'); give requests "
        "it accepts"
    ) in message, message[-800:]
    assert await read_back(triton) == (TritonBatching(16, 2000), [8]), "put back on failure"
    result = await tune_url(
        triton.url, triton, tmp_path, "--input-name", "x", "--features", "4", "--trials", "1"
    )
    (trial,) = result["trials"]
    assert trial["state"] == "Complete", trial
    assert trial["executed_batches"], trial
    assert await read_back(triton) == (TritonBatching(16, 2000), [8])


async def test_behind_a_gateway_every_call_to_triton_carries_the_header(
    triton: TritonProcess, tmp_path: Path
) -> None:
    """Triton's HTTP port behind a gateway that wants credentials: the metadata read,
    the repository loads that change the model, the read-backs, the statistics and the
    load all carry --header; its metrics port is reached directly (--control-url)."""
    secret = "Bearer tr-51e0"
    async with Gateway(triton.url, header=("Authorization", secret)) as gateway:
        result = await tune_url(
            gateway.url, triton, tmp_path, "--header", f"Authorization: {secret}", "--trials", "2"
        )
    assert len(result["trials"]) == 2
    assert not gateway.refused, dict(gateway.refused)
    model = f"/v2/models/{MODEL}"
    assert gateway.forwarded[model] >= 1  # the metadata the requests are built from
    assert gateway.forwarded[f"{model}/config"] >= 2  # read-backs
    # each trial's change, and the restore at the end
    assert gateway.forwarded[f"/v2/repository/models/{MODEL}/load"] >= 3
    assert gateway.forwarded[f"{model}/infer"] >= 100
    # put back as found, through the gateway
    assert await read_back(triton) == (TritonBatching(16, 2000), [8])
