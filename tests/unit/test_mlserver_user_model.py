"""A user's own MLServer model folder (`tune --local --runtime mlserver --model-dir`):
its model-settings.json read and validated, each trial's copy written in MLServer's
units (seconds), the user's folder never changed, and what MLServer's repository index,
counters and refusals say, read without a server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner

from batchpilot.errors import RequestShapeError, TargetError
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import LaunchError
from batchpilot.runtimes.mlserver import (
    MLServerRuntime,
    ModelRepository,
    UserModelControl,
    UserModelError,
    load_user_model,
)
from batchpilot.runtimes.mlserver.control import (
    answered,
    index_problem,
    no_inputs_message,
    refused_message,
    served_versions,
)
from batchpilot.runtimes.mlserver.user import (
    parse_settings,
    persisted_settings,
    settings_native,
    trial_settings,
)
from batchpilot.runtimes.registry import get_runtime
from batchpilot.tuner.cli import tune

CODE = "class Scaler:\n    pass\n"
SETTINGS: dict[str, Any] = {
    "name": "scaler",
    "implementation": "scaler_model.Scaler",
    "max_batch_size": 4,
    "max_batch_time": 0.002,
    "parameters": {"content_type": "np", "version": "mine"},
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
}


def write_model(folder: Path, settings: dict[str, Any] | str = SETTINGS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = settings if isinstance(settings, str) else json.dumps(settings)
    (folder / "model-settings.json").write_text(text, encoding="utf-8")
    (folder / "scaler_model.py").write_text(CODE, encoding="utf-8")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_users_values_are_the_baseline_in_mlserver_units(tmp_path: Path) -> None:
    model = load_user_model(write_model(tmp_path / "scaler"))
    assert model.name == "scaler"
    assert model.baseline == {"max_batch_size": 4, "max_batch_time": 0.002}
    # 0.002 s is 2 ms in BatchPilot's canonical terms
    config = MLServerRuntime().canonical(model.baseline)
    assert (config.max_batch_size, config.max_queue_time_ms) == (4, 2.0)


def test_absent_values_are_mlservers_defaults_and_name_the_folders(tmp_path: Path) -> None:
    settings = {"implementation": "scaler_model.Scaler"}
    model = load_user_model(write_model(tmp_path / "folder-name", settings))
    assert model.name == "folder-name"
    # MLServer's 0 / 0.0: no adaptive batching, which runs as a cap of 1
    assert model.baseline == {"max_batch_size": 1, "max_batch_time": 0.0}


def test_a_trials_settings_carry_its_values_in_seconds_and_a_new_version() -> None:
    model = parse_settings(
        json.dumps(SETTINGS), path=Path("d/model-settings.json"), folder_name="d"
    )
    native = MLServerRuntime().native(
        MLServerRuntime().canonical({"max_batch_size": 16, "max_batch_time": 0.0125})
    )
    written = trial_settings(model, native, version=7)
    assert written["max_batch_size"] == 16
    assert written["max_batch_time"] == pytest.approx(0.0125)
    assert written["parameters"] == {"content_type": "np", "version": "7"}
    assert written["inputs"] == SETTINGS["inputs"]
    assert settings_native(written) == {"max_batch_size": 16, "max_batch_time": 0.0125}
    assert model.settings == SETTINGS, "the parsed settings are never changed"
    kept = persisted_settings(model, {"max_batch_size": 8, "max_batch_time": 0.01})
    assert kept == {**SETTINGS, "max_batch_size": 8, "max_batch_time": 0.01}


def test_each_version_is_a_copy_and_the_users_folder_is_untouched(tmp_path: Path) -> None:
    source = write_model(tmp_path / "scaler")
    (source / "weights").mkdir()
    (source / "weights" / "w.bin").write_bytes(b"\x00\x01")
    before = snapshot(source)
    repository = ModelRepository(tmp_path / "models", user=load_user_model(source))
    assert repository.model == "scaler"
    assert repository.write({"max_batch_size": 8, "max_batch_time": 0.01}) == 1
    assert repository.write({"max_batch_size": 2, "max_batch_time": 0.0}) == 2
    assert repository.versions() == [2]
    copy = tmp_path / "models" / "scaler" / "v2"
    assert (copy / "scaler_model.py").read_text() == CODE
    assert (copy / "weights" / "w.bin").read_bytes() == b"\x00\x01"
    assert repository.written(2) == {"max_batch_size": 2, "max_batch_time": 0.0}
    settings = json.loads((copy / "model-settings.json").read_text())
    assert settings["parameters"]["version"] == "2"
    assert snapshot(source) == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "has no model-settings.json; expected a folder holding model-settings.json"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "holds list, not a JSON object"),
        ({"name": "m"}, "has no implementation: MLServer needs the model's class as \"impl"),
        ({"implementation": "nodot"}, "has implementation 'nodot'"),
        ({"implementation": "m.M", "name": ""}, "name is ''; give the model's name"),
        ({"implementation": "m.M", "max_batch_size": 2.5}, "max_batch_size is 2.5; MLServer"),
        ({"implementation": "m.M", "max_batch_time": -1}, "max_batch_time is -1; MLServer"),
        ({"implementation": "m.M", "max_batch_time": "5ms"}, "a number of seconds >= 0"),
    ],
)
def test_a_folder_mlserver_cannot_serve_says_what_is_wrong(
    tmp_path: Path, content: dict[str, Any] | str | None, message: str
) -> None:
    folder = tmp_path / "m"
    if content is None:
        folder.mkdir()
    else:
        write_model(folder, content)
    with pytest.raises(UserModelError) as caught:
        load_user_model(folder)
    assert message in str(caught.value)
    assert str(folder) in str(caught.value)


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserModelError, match="does not exist; expected a folder holding"):
        load_user_model(tmp_path / "nowhere")


def test_the_launcher_checks_the_folder_and_other_runtimes_refuse_one(tmp_path: Path) -> None:
    start = MLServerRuntime().canonical({"max_batch_size": 4, "max_batch_time": 0.002})
    with pytest.raises(LaunchError, match=r"has no model-settings\.json"):
        MLServerRuntime().launcher(start, model_dir=tmp_path)
    folder = write_model(tmp_path / "scaler")
    server = MLServerRuntime().launcher(start, model_dir=folder)
    assert server.native_start == {"max_batch_size": 4, "max_batch_time": 0.002}
    assert server.model == "scaler"
    with pytest.raises(LaunchError, match="serves one bundled model"):
        get_runtime("triton").launcher(start, model_dir=folder)


def test_mlservers_index_and_counters_are_read_for_the_version() -> None:
    index = [
        {"name": "other", "version": "1", "state": "READY"},
        {"name": "scaler", "version": "3", "state": "READY", "reason": ""},
    ]
    versions = served_versions(index, "scaler")
    assert versions == {"3": "READY"}
    assert index_problem(versions, "scaler", "3") is None
    problem = index_problem({"2": "READY", "3": "UNAVAILABLE"}, "scaler", "3")
    assert problem == (
        "MLServer's repository index shows model scaler at versions "
        "[2 READY, 3 UNAVAILABLE], expected 3 READY"
    )
    metrics = "\n".join(
        [
            "# TYPE model_infer_request_success_total counter",
            'model_infer_request_success_total{model="scaler",version="None"} 40.0',
            'model_infer_request_success_total{model="scaler",version="3"} 16.0',
            'model_infer_request_success_total{model="other",version="3"} 5.0',
            'model_infer_request_success_created{model="scaler",version="3"} 1.7e+09',
        ]
    )
    assert answered(metrics, "scaler", "3") == 16.0
    assert answered(metrics, "scaler", "4") == 0.0


def test_refusals_and_missing_inputs_say_what_to_set() -> None:
    refused = refused_message(400, '{"error": "bad input"}', "scaler")
    assert "HTTP 400: bad input" in refused
    assert "declare the model's inputs (name, datatype, shape) in its model-settings.json" in (
        refused
    )
    assert "--body-template" in refused
    template = refused_message(422, '{"detail": "no shape"}', "scaler", given="--body-template")
    assert template == (
        "MLServer refused the --body-template requests for model 'scaler' (HTTP 422: "
        '{"detail": "no shape"}); give requests it accepts: one FP32 tensor with '
        "--input-name and --features, or a request body with --body-template"
    )
    tensor = refused_message(400, '{"error": "x?"}', "scaler", given="--input-name and --features")
    assert tensor.startswith("MLServer refused the --input-name and --features requests")
    missing = no_inputs_message("scaler", "the metadata of model 'scaler' lists no inputs")
    assert '"inputs": [{"name": "<input>"' in missing
    assert "--body-template" in missing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:9", "--model-dir", "d"], "--model-dir applies to --local"),
        (
            ["--local", "--runtime", "triton", "--model-dir", "d"],
            "--model-dir: the triton runtime serves its bundled model only; --runtime mlserver",
        ),
        (
            ["--local", "--runtime", "mlserver", "--model-dir", "no-such-dir"],
            "--model-dir no-such-dir: no-such-dir does not exist; expected a folder holding",
        ),
    ],
)
def test_model_dir_flags_are_checked_in_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(tune, args)
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_start_from_the_config_file_is_refused_with_a_model_dir(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "scaler")
    config = tmp_path / "tune.yaml"
    config.write_text("server:\n  max_batch_size: 8\n", encoding="utf-8")
    args = ["--local", "--runtime", "mlserver", "--model-dir", str(folder)]
    result = CliRunner().invoke(tune, [*args, "--config", str(config)])
    assert result.exit_code == 2
    assert "server.max_batch_size sets the start of a bundled model" in result.output


class FakeMLServer:
    """Loads the newest version of the repository as MLServer does and answers its
    repository index, versioned inference and request counter; misbehaves as scripted."""

    def __init__(self, repo: ModelRepository) -> None:
        self.repo = repo
        self.version = ""
        self.counted: dict[str, int] = {}
        self.stale_index = False  # the index keeps showing the version before
        self.uncounted = False  # answers, but counts nothing
        self.refuse = 0  # a 4xx status for every inference

    def load_newest(self) -> None:
        self.version = str(self.repo.versions()[-1])

    async def load(self, request: web.Request) -> web.Response:
        if not self.stale_index:
            self.load_newest()
        return web.Response(status=200)

    async def index(self, request: web.Request) -> web.Response:
        return web.json_response(
            [{"name": "scaler", "version": self.version, "state": "READY", "reason": ""}]
        )

    async def metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "scaler", "inputs": SETTINGS["inputs"]})

    async def infer(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse:
            return web.json_response({"error": "scripted refusal"}, status=self.refuse)
        assert body["inputs"][0]["name"] == "x"
        assert body["inputs"][0]["shape"] == [1, 4]
        version = request.match_info["version"]
        if not self.uncounted:
            self.counted[version] = self.counted.get(version, 0) + 1
        return web.json_response({"model_name": "scaler", "outputs": []})

    async def metrics(self, request: web.Request) -> web.Response:
        lines = [
            f'model_infer_request_success_total{{model="scaler",version="{v}"}} {n}.0'
            for v, n in self.counted.items()
        ]
        return web.Response(text="\n".join(lines) + "\n")


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[FakeMLServer, UserModelControl]]:
    repo = ModelRepository(tmp_path / "models", user=load_user_model(write_model(tmp_path / "m")))
    repo.write({"max_batch_size": 4, "max_batch_time": 0.002})
    server = FakeMLServer(repo)
    server.load_newest()
    app = web.Application()
    app.router.add_post("/v2/repository/models/scaler/load", server.load)
    app.router.add_post("/v2/repository/index", server.index)
    app.router.add_get("/v2/models/scaler", server.metadata)
    app.router.add_post("/v2/models/scaler/versions/{version}/infer", server.infer)
    app.router.add_get("/metrics", server.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    control = UserModelControl(url, repository=repo, metrics_url=url + "/metrics", timeout_s=5)
    try:
        yield server, control
    finally:
        await runner.cleanup()


async def test_current_is_the_settings_of_the_version_mlserver_serves(
    fake: tuple[FakeMLServer, UserModelControl],
) -> None:
    _, control = fake
    assert await control.current() == BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)


async def test_a_change_is_verified_by_the_index_the_settings_and_the_counter(
    fake: tuple[FakeMLServer, UserModelControl],
) -> None:
    server, control = fake
    await control.apply(BatchingConfig(max_batch_size=16, max_queue_time_ms=5.0))
    assert server.counted == {"2": 32}  # 2 x the cap, sent to version 2 by name
    verification = control.last_verification
    assert verification is not None
    assert verification.native == {"max_batch_size": 16, "max_batch_time": 0.005}
    assert verification.verified_by == (
        "repository index: version 2 alone and READY, its model-settings.json read back "
        "(max_batch_size 16, max_batch_time 0.005 s: adaptive batching on); 32 requests to "
        "that version answered (model_infer_request_success_total)"
    )
    persisted = await control.persistence(BatchingConfig(max_batch_size=8, max_queue_time_ms=10))
    assert json.loads(persisted.snippet) == {
        **SETTINGS,
        "max_batch_size": 8,
        "max_batch_time": 0.01,
    }
    assert persisted.where.startswith(str(control.repo.dir.parent.parent / "m" / "model-settings"))


@pytest.mark.parametrize(
    ("script", "problem"),
    [
        ("stale_index", "index shows model scaler at versions [1 READY], expected 2 READY"),
        ("uncounted", "MLServer counts 0 of 8 requests answered by version 2"),
    ],
)
async def test_a_change_mlserver_does_not_show_fails(
    fake: tuple[FakeMLServer, UserModelControl], script: str, problem: str
) -> None:
    server, control = fake
    setattr(server, script, True)
    with pytest.raises(TargetError, match=r"did not take batch=2 wait=1ms: ") as caught:
        await control.apply(BatchingConfig(max_batch_size=2, max_queue_time_ms=1.0))
    assert problem in str(caught.value)


async def test_refused_requests_stop_with_the_servers_words(
    fake: tuple[FakeMLServer, UserModelControl],
) -> None:
    server, control = fake
    server.refuse = 400
    with pytest.raises(RequestShapeError, match=r"HTTP 400: scripted refusal\); declare"):
        await control.apply(BatchingConfig(max_batch_size=2, max_queue_time_ms=1.0))
