"""The TorchServe adapter's decisions: native units and rounding, the model archive and
config.properties it writes, what proves a change live, and `apply` against a fake
TorchServe management API (in-process, loopback) that keeps versions the way TorchServe
does, or refuses as scripted."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.registry import get_runtime, runtime_names
from batchpilot.runtimes.torchserve.adapter import TorchServeRuntime, management_url
from batchpilot.runtimes.torchserve.archive import (
    config_properties,
    handler_source,
    model_archive,
    models_entry,
)
from batchpilot.runtimes.torchserve.control import (
    MODEL,
    ModelStore,
    Observed,
    TorchServeControl,
    check_described,
    check_observed,
)
from batchpilot.runtimes.torchserve.process import launch_log


def test_knobs_are_batch_size_and_whole_milliseconds_of_delay() -> None:
    runtime = get_runtime("torchserve")
    assert isinstance(runtime, TorchServeRuntime)
    assert "torchserve" in runtime_names()
    config = BatchingConfig(max_batch_size=16, max_queue_time_ms=2.6)
    assert runtime.native(config) == {"batch_size": 16, "max_batch_delay": 3}
    # Python's rounding: a half goes to the even neighbour
    assert runtime.native(BatchingConfig(max_batch_size=1, max_queue_time_ms=2.5)) == {
        "batch_size": 1,
        "max_batch_delay": 2,
    }
    assert runtime.canonical({"batch_size": 16, "max_batch_delay": 3}) == BatchingConfig(
        max_batch_size=16, max_queue_time_ms=3.0
    )


def test_protocol_is_the_handlers_json() -> None:
    protocol = TorchServeRuntime().protocol("m")
    assert protocol.path == "/predictions/m"
    assert json.loads(protocol.body(5)) == {"size": 5}
    assert protocol.headers["Content-Type"] == "application/json"


def test_archive_holds_the_handler_and_a_versioned_manifest() -> None:
    data = model_archive("m", 7, b"print('handler')\n")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
        assert archive.read("handler.py") == b"print('handler')\n"
    assert manifest["model"] == {"modelName": "m", "handler": "handler.py", "modelVersion": "7"}
    assert model_archive("m", 7, b"x") == model_archive("m", 7, b"x")  # reproducible
    assert b"def handle(" in handler_source()


def test_config_properties_binds_every_listener_to_the_host() -> None:
    ports = dict(inference=1, management=2, metrics=3, grpc_inference=4, grpc_management=5)
    models = models_entry("m", "1", "m-v1.mar", {"batch_size": 8, "max_batch_delay": 5})
    text = config_properties(
        host="127.0.0.1", ports=ports, model_store="/s", load_models="m-v1.mar", models=models
    )
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["inference_address"] == "http://127.0.0.1:1"
    assert props["management_address"] == "http://127.0.0.1:2"
    assert props["metrics_address"] == "http://127.0.0.1:3"
    assert props["grpc_inference_address"] == props["grpc_management_address"] == "127.0.0.1"
    assert (props["grpc_inference_port"], props["grpc_management_port"]) == ("4", "5")
    assert props["disable_token_authorization"] == "true"
    assert props["load_models"] == "m-v1.mar"
    registered = json.loads(props["models"])["m"]["1"]
    assert registered["batchSize"] == 8
    assert registered["maxBatchDelay"] == 5
    assert registered["defaultVersion"] is True


def test_persistence_recommends_the_models_line_and_the_registration() -> None:
    persisted = TorchServeRuntime().persistence(
        BatchingConfig(max_batch_size=32, max_queue_time_ms=10.0), model="m"
    )
    assert persisted.kind == "recommend"
    first, second = persisted.snippet.splitlines()
    entry = json.loads(first.removeprefix("models="))["m"]["1.0"]
    assert (entry["batchSize"], entry["maxBatchDelay"], entry["marName"]) == (32, 10, "m.mar")
    assert "batch_size=32&max_batch_delay=10" in second
    assert persisted.where.startswith("register model m")


def test_management_address_of_a_remote_server_is_the_next_port() -> None:
    assert management_url("http://ts.example:8080/") == "http://ts.example:8081"
    with pytest.raises(ValueError, match="names no port"):
        management_url("http://ts.example")


def test_a_failed_start_says_what_the_worker_said_not_what_the_polling_did() -> None:
    # lines as TorchServe 0.12 wrote them when its worker could not import torch
    launcher = "\n".join(
        ["Torchserve version: 0.12.0"]
        + [
            f"2026-12-01T16:40:{s:02d},042 [INFO ] epollEventLoopGroup-3-1 ACCESS_LOG - "
            '/127.0.0.1:36898 "GET /models/batchpilot-mlp HTTP/1.1" 200 1'
            for s in range(60)
        ]
    )
    model_log = (
        "2026-12-01T16:40:43,990 [INFO ] W-9000-batchpilot-mlp_1-stdout MODEL_LOG - "
        "s_name_part0=/tmp/.ts.sock\n"
        "2026-12-01T16:40:44,007 [WARN ] W-9000-batchpilot-mlp_1-stderr MODEL_LOG -     "
        "import torch\n"
        "2026-12-01T16:40:44,007 [WARN ] W-9000-batchpilot-mlp_1-stderr MODEL_LOG - "
        "ImportError: libtorch_cpu.so: cannot open shared object file\n"
    )
    log = launch_log(launcher, model_log)
    assert "the model worker's stderr:\n    import torch\nImportError: libtorch_cpu.so" in log
    assert "s_name_part0" not in log  # the worker's stdout is not its error
    assert "ACCESS_LOG" not in log
    assert "the launcher's output:\nTorchserve version: 0.12.0" in log
    # a worker that wrote nothing leaves the launcher's output alone
    assert launch_log("", "") == "the launcher's output:\n(nothing)"


def test_launcher_refuses_a_workload() -> None:
    with pytest.raises(LaunchError, match="bundled model batchpilot-mlp, not 'encoder'"):
        TorchServeRuntime().launcher(
            BatchingConfig(max_batch_size=8, max_queue_time_ms=5), workload="encoder"
        )


def _answer(requests: int, *, version: str = "2", cap: int = 4) -> dict[str, Any]:
    return {"batch_requests": requests, "batch_size": cap, "model_version": version}


def test_batch_sizes_count_batches_from_the_answers() -> None:
    observed = Observed([_answer(4)] * 8 + [_answer(1)] * 2 + [_answer(3)] * 3)
    assert observed.batch_sizes() == {1: 2, 3: 1, 4: 2}


def test_a_change_is_proven_only_by_the_new_version_within_its_cap() -> None:
    native = {"batch_size": 4, "max_batch_delay": 20}
    assert check_observed(Observed([_answer(4)] * 8), native, "2") == []
    assert (
        "versions ['1', '2']"
        in check_observed(Observed([_answer(4), _answer(1, version="1")]), native, "2")[0]
    )
    assert "above the cap of 4" in check_observed(Observed([_answer(8)] * 8), native, "2")[-1]
    assert "runs batch_size [8]" in check_observed(Observed([_answer(2, cap=8)]), native, "2")[0]
    entry = {
        "modelVersion": "2",
        "batchSize": 4,
        "maxBatchDelay": 20,
        "workers": [{"status": "READY"}],
    }
    assert check_described(entry, native, "2") == []
    assert check_described({**entry, "maxBatchDelay": 100}, native, "2") == [
        "it runs batchSize 4, maxBatchDelay 100"
    ]
    assert check_described({**entry, "workers": []}, native, "2") == ["it has no ready worker"]
    # a worker still loading the new version: not verified until every one is READY
    starting = {**entry, "workers": [{"status": "READY"}, {"status": "STARTING"}]}
    assert check_described(starting, native, "2") == ["its workers are READY, STARTING"]


class FakeTorchServe:
    """Management and inference APIs over versions kept as TorchServe keeps them; the
    registration is refused when `refuse_register` is set."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.versions: dict[str, dict[str, Any]] = {"1": {"batchSize": 8, "maxBatchDelay": 5}}
        self.default = "1"
        self.calls: list[str] = []
        self.refuse_register = False

    def describe(self, version: str) -> dict[str, Any]:
        return {
            "modelName": MODEL,
            "modelVersion": version,
            **self.versions[version],
            "workers": [{"status": "READY"}],
        }

    def app(self) -> web.Application:
        async def register(request: web.Request) -> web.Response:
            q = request.query
            self.calls.append(f"register {q['url']}")
            if self.refuse_register:
                return web.json_response({"code": 400, "message": "no"}, status=400)
            with zipfile.ZipFile(self.store / q["url"]) as archive:
                manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
            version = manifest["model"]["modelVersion"]
            self.versions[version] = {
                "batchSize": int(q["batch_size"]),
                "maxBatchDelay": int(q["max_batch_delay"]),
            }
            return web.json_response({"status": "registered"})

        async def describe(request: web.Request) -> web.Response:
            return web.json_response([self.describe(self.default)])

        async def describe_all(request: web.Request) -> web.Response:
            return web.json_response([self.describe(v) for v in self.versions])

        async def describe_one(request: web.Request) -> web.Response:
            self.calls.append(f"describe {request.match_info['v']}")
            entry = self.describe(request.match_info["v"])
            return web.json_response([{**entry, "jobQueueStatus": {"pendingRequests": 0}}])

        async def set_default(request: web.Request) -> web.Response:
            self.calls.append(f"set-default {request.match_info['v']}")
            self.default = request.match_info["v"]
            return web.json_response({"status": "ok"})

        async def delete(request: web.Request) -> web.Response:
            self.calls.append(f"delete {request.match_info['v']}")
            del self.versions[request.match_info["v"]]
            return web.json_response({"status": "unregistered"})

        async def predict(request: web.Request) -> web.Response:
            self.calls.append("predict")
            served = self.versions[self.default]
            answer = _answer(1, version=self.default, cap=served["batchSize"])
            return web.json_response(answer)

        app = web.Application()
        app.router.add_post("/models", register)
        app.router.add_get(f"/models/{MODEL}", describe)
        app.router.add_get(f"/models/{MODEL}/all", describe_all)
        app.router.add_get(f"/models/{MODEL}/{{v}}", describe_one)
        app.router.add_put(f"/models/{MODEL}/{{v}}/set-default", set_default)
        app.router.add_delete(f"/models/{MODEL}/{{v}}", delete)
        app.router.add_post(f"/predictions/{MODEL}", predict)
        return app


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[FakeTorchServe, str]]:
    server = FakeTorchServe(tmp_path)
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield server, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_apply_registers_a_new_version_makes_it_default_and_deletes_the_old(
    fake: tuple[FakeTorchServe, str], tmp_path: Path
) -> None:
    server, url = fake
    store = ModelStore(tmp_path)
    store.add()  # version 1, as the launcher writes it
    control = TorchServeControl(url, management=url, store=store, timeout_s=5)
    assert await control.native() == {"batch_size": 8, "max_batch_delay": 5}
    config = BatchingConfig(max_batch_size=4, max_queue_time_ms=20.0)
    await control.apply(config)
    # the old version is drained (nothing queued) before it is deleted
    assert server.calls == [
        f"register {MODEL}-v2.mar",
        "set-default 2",
        "describe 1",
        "delete 1",
    ]
    assert await control.current() == config
    assert store.versions() == [2]
    verification = control.last_verification
    assert verification is not None
    assert verification.native == {"batch_size": 4, "max_batch_delay": 20}
    # verified by the management API alone: not one inference request (in the calls)
    assert verification.batch_sizes is None
    assert verification.verified_by == (
        "management describe (version 2: batchSize 4, maxBatchDelay 20 ms, 1 worker(s) READY)"
    )


async def test_a_refused_registration_leaves_the_old_version_serving(
    fake: tuple[FakeTorchServe, str], tmp_path: Path
) -> None:
    server, url = fake
    server.refuse_register = True
    store = ModelStore(tmp_path)
    store.add()
    control = TorchServeControl(url, management=url, store=store, timeout_s=5)
    with pytest.raises(TargetError, match="HTTP 400"):
        await control.apply(BatchingConfig(max_batch_size=4, max_queue_time_ms=20.0))
    assert store.versions() == [1]
    assert server.default == "1"
    assert list(server.versions) == ["1"]


async def test_without_the_model_store_the_control_only_recommends(
    fake: tuple[FakeTorchServe, str],
) -> None:
    _, url = fake
    control = TorchServeRuntime().control(url)
    with pytest.raises(TargetError, match="can only recommend"):
        await control.apply(BatchingConfig(max_batch_size=4, max_queue_time_ms=20.0))
