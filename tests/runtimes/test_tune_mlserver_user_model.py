"""`batchpilot tune --local --runtime mlserver --model-dir DIR` on a model written here,
not shipped in `src/`: an MLModel whose input is `x` (FP32, shape [-1, 4]), with
`max_batch_size: 4` and `max_batch_time: 0.002` (seconds) in its own model-settings.json,
whose answers say nothing about its batching. Its requests come from its metadata, every
change is a copy of the folder with the trial's values verified by MLServer itself (its
repository index, the settings it loaded, its request counter per version), and the
user's folder is never changed."""

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
from batchpilot.runtimes.mlserver import VENV, MLServerProcess, MLServerRuntime, UserModelControl

from .support import require_runtime

pytestmark = [pytest.mark.runtimes, pytest.mark.timeout(240), pytest.mark.asyncio]

MODEL = "scaler"
USER_MODEL = """
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Scaler(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        y = (x * 2.0).astype(np.float32)
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("y", y)]
        )
"""
SETTINGS: dict[str, Any] = {
    "name": MODEL,
    "implementation": "scaler_model.Scaler",
    "max_batch_size": 4,
    "max_batch_time": 0.002,
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
}
START = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)


def write_model(folder: Path, settings: dict[str, Any]) -> Path:
    folder.mkdir(parents=True)
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    (folder / "scaler_model.py").write_text(USER_MODEL, encoding="utf-8")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    require_runtime(VENV, "mlserver")
    return write_model(tmp_path / MODEL, SETTINGS)


@pytest_asyncio.fixture
async def mlserver(model_dir: Path) -> AsyncIterator[MLServerProcess]:
    async with MLServerRuntime().launcher(START, model_dir=model_dir) as server:
        yield server


async def index(server: MLServerProcess) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + "/v2/repository/index", json={}) as response,
    ):
        found: list[dict[str, Any]] = await response.json()
        return found


async def test_changes_are_verified_by_mlserver_not_by_the_model(
    mlserver: MLServerProcess, model_dir: Path
) -> None:
    before = snapshot(model_dir)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{mlserver.url}/v2/models/{MODEL}/infer", json=body) as response,
    ):
        answer = await response.json()
    assert answer["parameters"] == {}, "the model reports nothing about its batching"
    assert answer["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
    control = MLServerRuntime().control(mlserver.url, model=MODEL, server=mlserver)
    assert isinstance(control, UserModelControl)
    assert await control.current() == START
    for config, on in (
        (BatchingConfig(max_batch_size=8, max_queue_time_ms=10.0), "on"),
        (BatchingConfig(max_batch_size=1, max_queue_time_ms=0.0), "off"),
    ):
        await control.apply(config)
        verification = control.last_verification
        assert verification is not None
        native = MLServerRuntime().native(config)
        assert verification.native == native
        version = (await index(mlserver))[0]["version"]
        assert await index(mlserver) == [
            {"name": MODEL, "version": version, "state": "READY", "reason": ""}
        ]
        assert verification.verified_by == (
            f"repository index: version {version} alone and READY, its model-settings.json "
            f"read back (max_batch_size {native['max_batch_size']}, max_batch_time "
            f"{native['max_batch_time']:g} s: adaptive batching {on}); "
            f"{verification_burst(config)} requests to that version answered "
            "(model_infer_request_success_total)"
        )
        assert await control.current() == config
    assert snapshot(model_dir) == before


def verification_burst(config: BatchingConfig) -> int:
    return min(max(2 * config.max_batch_size, 8), 64)


async def tune(*args: str, timeout_s: float) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "batchpilot", "tune", "--local", "--runtime", "mlserver", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_users_model_folder_tunes_from_its_own_settings(
    model_dir: Path, tmp_path: Path
) -> None:
    before = snapshot(model_dir)
    config = tmp_path / "tune.yaml"
    config.write_text("tuning:\n  confirm: false\n", encoding="utf-8")
    code, out, err = await tune(
        *("--model-dir", str(model_dir)),
        # the flow is under test, not the model's speed on a shared machine
        *("--quick", "--trials", "2", "--p99-ms", "500", "--config", str(config), "--json"),
        timeout_s=200,
    )
    assert code == 0, err[-2000:]
    result = json.loads(out)
    trials = result["trials"]
    assert [t["label"] for t in trials] == ["baseline", "rule of thumb"]
    assert all(t["state"] == "Complete" for t in trials), trials
    # the baseline is the user's own settings: 4 requests, 0.002 s = 2 ms
    assert (result["baseline"]["max_batch_size"], result["baseline"]["max_queue_time_ms"]) == (
        4,
        2.0,
    )
    runtime = result["runtime"]
    assert runtime["baseline"] == {"max_batch_size": 4.0, "max_batch_time": 0.002}
    # the last trial's values, seen by MLServer in the version it serves
    last = trials[-1]["params"]
    verified = runtime["verified_by"]
    assert verified.startswith("repository index: version ")
    assert (
        f"(max_batch_size {last['max_batch_size']}, max_batch_time "
        f"{last['max_queue_time_ms'] / 1000:g} s: adaptive batching on)"
    ) in verified
    assert "requests to that version answered (model_infer_request_success_total)" in verified
    # to keep the winner: the user's own file with the values changed, nothing else
    recommended = result["recommended"]
    assert runtime["persist_where"].startswith(str(model_dir / "model-settings.json"))
    assert json.loads(runtime["persist_snippet"]) == {
        **SETTINGS,
        "max_batch_size": recommended["max_batch_size"],
        "max_batch_time": pytest.approx(recommended["max_queue_time_ms"] / 1000),
    }
    assert f"Starting the MLServer 1.7.1 (model {MODEL} from {model_dir}" in err
    assert snapshot(model_dir) == before


async def test_a_model_without_declared_inputs_is_told_what_to_declare(tmp_path: Path) -> None:
    require_runtime(VENV, "mlserver")
    settings = {k: v for k, v in SETTINGS.items() if k != "inputs"}
    folder = write_model(tmp_path / MODEL, settings)
    code, _, err = await tune("--model-dir", str(folder), "--quick", timeout_s=120)
    assert code != 0
    assert "lists no inputs" in err
    assert '"inputs": [{"name": "<input>", "datatype": "FP32"' in err
    assert "--body-template" in err


async def test_requests_mlserver_refuses_stop_the_run_with_its_words(
    model_dir: Path, tmp_path: Path
) -> None:
    body = tmp_path / "body.json"
    body.write_text('{"inputs": [{"name": "x"}]}', encoding="utf-8")
    args = ("--model-dir", str(model_dir), "--body-template", str(body), "--quick")
    code, _, err = await tune(*args, timeout_s=120)
    assert code != 0
    assert "MLServer refused the --body-template requests for model 'scaler' (HTTP 422" in err
    assert "Field required" in err
    assert "trial 0" not in err, "no trial starts"
