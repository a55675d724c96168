"""A user's own TorchServe archive (`tune --local --runtime torchserve --model-archive`):
the .mar read and checked with errors that name the flag and what is allowed, each
trial's version written as a folder of the archive's files with its own manifest (the
user's file never changed), the handler's exception found in TorchServe's log, and the
tune flags refused in one line where they cannot apply. Read without a server."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from batchpilot.runtimes.registry import get_runtime
from batchpilot.runtimes.torchserve.adapter import TorchServeRuntime
from batchpilot.runtimes.torchserve.control import (
    ArchiveStore,
    needs_template_message,
    refused_message,
)
from batchpilot.runtimes.torchserve.process import handler_exception
from batchpilot.runtimes.torchserve.user import (
    MANIFEST,
    UserArchiveError,
    extract_archive,
    load_user_archive,
)
from batchpilot.tuner.cli import tune

HANDLER = "def handle(data, context):\n    return data\n"
MODEL: dict[str, Any] = {
    "modelName": "summer",
    "handler": "summer_handler.py",
    "modelVersion": "2.0",
    "configFile": "model-config.yaml",
}


def manifest(**model: Any) -> dict[str, Any]:
    return {"runtime": "python", "model": {**MODEL, **model}, "archiverVersion": "0.12.0"}


def write_mar(
    path: Path,
    entries: dict[str, str | dict[str, Any]] | None = None,
    *,
    config: str = "batchSize: 4\nmaxBatchDelay: 5\n",
) -> Path:
    """A .mar as torch-model-archiver writes it (a handler, a config file), with
    `entries` replacing or adding files (a dict is written as JSON)."""
    files: dict[str, str | dict[str, Any]] = {
        MANIFEST: manifest(),
        "summer_handler.py": HANDLER,
        "model-config.yaml": config,
        **(entries or {}),
    }
    with zipfile.ZipFile(path, "w") as mar:
        for name, content in files.items():
            mar.writestr(name, content if isinstance(content, str) else json.dumps(content))
    return path


def test_an_archive_gives_its_name_and_the_baseline_of_its_config_file(tmp_path: Path) -> None:
    archive = load_user_archive(write_mar(tmp_path / "summer.mar"))
    assert (archive.name, archive.version, archive.handler) == ("summer", "2.0", MODEL["handler"])
    assert archive.baseline == {"batch_size": 4, "max_batch_delay": 5}
    runtime = TorchServeRuntime()
    assert runtime.user_model(tmp_path / "summer.mar") == "summer"
    server = runtime.launcher(runtime.canonical(archive.baseline), model_dir=archive.path)
    assert server.model == "summer"
    assert server.native_start == {"batch_size": 4, "max_batch_delay": 5}


@pytest.mark.parametrize(
    ("config", "baseline"),
    [
        ("", {"batch_size": 1, "max_batch_delay": 100}),
        ("minWorkers: 1\n", {"batch_size": 1, "max_batch_delay": 100}),
        # TorchServe takes a config value only above 0, its default otherwise
        ("batchSize: 8\nmaxBatchDelay: 0\n", {"batch_size": 8, "max_batch_delay": 100}),
    ],
)
def test_what_the_config_file_leaves_out_is_torchserves_default(
    tmp_path: Path, config: str, baseline: dict[str, int]
) -> None:
    archive = load_user_archive(write_mar(tmp_path / "m.mar", config=config))
    assert archive.baseline == baseline


def test_an_archive_without_config_file_or_with_a_builtin_handler_is_served(
    tmp_path: Path,
) -> None:
    bare = manifest(configFile=None)
    del bare["model"]["configFile"]
    archive = load_user_archive(write_mar(tmp_path / "a.mar", {MANIFEST: bare}))
    assert archive.baseline == {"batch_size": 1, "max_batch_delay": 100}
    builtin = manifest(handler="image_classifier")
    assert load_user_archive(write_mar(tmp_path / "b.mar", {MANIFEST: builtin})).name == "summer"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({MANIFEST: "{not json"}, "MAR-INF/MANIFEST.json is not valid JSON"),
        ({MANIFEST: {"runtime": "python"}}, 'has no "model" object; expected a model archive'),
        ({MANIFEST: manifest(modelName="")}, "names modelName ''; torch-model-archiver"),
        ({MANIFEST: manifest(handler=None)}, "names no handler; torch-model-archiver --handler"),
        (
            {MANIFEST: manifest(handler="other.py:handle")},
            "the handler 'other.py:handle' its manifest names is neither in the archive "
            "(other.py) nor one of TorchServe's own (base_handler,",
        ),
        ({MANIFEST: {**manifest(), "runtime": "LSP"}}, "says runtime 'LSP'; BatchPilot starts"),
        (
            {MANIFEST: manifest(configFile="missing.yaml")},
            "missing.yaml, the configFile its manifest names, is not in the archive",
        ),
        ({"model-config.yaml": "batchSize: [1]\n"}, "batchSize is [1]; TorchServe takes a whole"),
        ({"model-config.yaml": "- 1\n"}, "holds list, not a YAML mapping"),
    ],
)
def test_an_archive_torchserve_cannot_serve_says_what_is_wrong(
    tmp_path: Path, entries: dict[str, str | dict[str, Any]], message: str
) -> None:
    path = write_mar(tmp_path / "m.mar", entries)
    with pytest.raises(UserArchiveError) as caught:
        load_user_archive(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_file_that_is_no_archive_says_what_is_expected(tmp_path: Path) -> None:
    expected = "expected a model archive (.mar) as torch-model-archiver writes it"
    for path, what in (
        (tmp_path / "nowhere.mar", "does not exist"),
        (tmp_path, "is not a file"),
        (tmp_path / "handler.py", "is not a .mar file"),
        (tmp_path / "text.mar", "is not a zip archive"),
        (tmp_path / "empty.mar", "has no MAR-INF/MANIFEST.json"),
    ):
        if path.suffix and path.name != "nowhere.mar":
            path.write_text("print()")
        if path.name == "empty.mar":
            with zipfile.ZipFile(path, "w") as mar:
                mar.writestr("handler.py", HANDLER)
        with pytest.raises(UserArchiveError) as caught:
            load_user_archive(path)
        assert f"{path} {what}; {expected}" in str(caught.value)


def test_each_version_is_a_folder_of_the_archives_files_with_its_own_manifest(
    tmp_path: Path,
) -> None:
    mar = write_mar(tmp_path / "summer.mar", {"weights/w.bin": "0123"})
    before = mar.read_bytes()
    archive = load_user_archive(mar)
    extract_archive(archive, tmp_path / "source")
    (tmp_path / "store").mkdir()
    store = ArchiveStore(tmp_path / "store", archive, tmp_path / "source")
    assert store.add() == (1, "summer-v1")
    assert store.add() == (2, "summer-v2")
    assert store.versions() == [1, 2]
    version = tmp_path / "store" / "summer-v2"
    written = json.loads((version / MANIFEST).read_text())
    assert written == {**manifest(), "model": {**MODEL, "modelVersion": "2"}}
    assert (version / "weights" / "w.bin").read_text() == "0123"
    assert (version / "summer_handler.py").read_text() == HANDLER
    # the source keeps the user's manifest: the version's is a file of its own
    assert json.loads((tmp_path / "source" / MANIFEST).read_text()) == manifest()
    store.remove(1)
    assert store.versions() == [2]
    assert mar.read_bytes() == before


def test_the_handlers_exception_is_read_from_torchserves_log() -> None:
    prefix = "2026-12-05T11:19:50,820 [INFO ] W-9000-summer_1-stdout MODEL_LOG - "
    log = "\n".join(
        prefix + line
        for line in (
            "Backend received inference at: 1796469590",
            "Invoking custom service failed.",
            "Traceback (most recent call last):",
            '  File "/tmp/store/summer-v1/summer_handler.py", line 12, in handle',
            '    answers.append(json.dumps({"sum": sum(body["values"])}))',
            "KeyError: 'values'",
            "Backend received inference at: 1796469591",
        )
    )
    assert handler_exception(log) == "KeyError: 'values'"
    assert handler_exception(prefix + "Torch worker started.") == ""


def test_refusals_say_what_torchserve_and_the_handler_said_and_what_to_set() -> None:
    answer = json.dumps({"code": 503, "type": "InternalServerException", "message": "x"})
    assert refused_message(503, answer, "summer", handler_said="KeyError: 'values'") == (
        "TorchServe answered HTTP 503 to the --body-template requests for model 'summer' "
        "(x); the handler raised KeyError: 'values'; give a request body your handler "
        "accepts with --body-template"
    )
    assert "(HTTP 404 page)" not in refused_message(404, "page", "summer")
    assert "for model 'summer' (page); give" in refused_message(404, "page", "summer")
    assert "pass --body-template FILE" in needs_template_message("summer")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--url", "http://127.0.0.1:9", "--runtime", "torchserve", "--model-archive", "a"],
            "--model-archive applies to --local runs",
        ),
        (
            ["--local", "--runtime", "triton", "--model-archive", "a.mar"],
            "--model-archive: the triton runtime serves its bundled model only; "
            "--runtime torchserve serves a model archive of your own",
        ),
        (
            ["--local", "--runtime", "mlserver", "--model-archive", "a.mar"],
            "--model-archive: the mlserver runtime takes your own model as --model-dir: ",
        ),
        (
            ["--local", "--runtime", "torchserve", "--model-dir", "d"],
            "--model-dir: the torchserve runtime takes your own model as --model-archive: "
            "a TorchServe model archive (.mar",
        ),
        (
            ["--local", "--runtime", "torchserve", "--model-archive", "no.mar"],
            "--model-archive no.mar: no.mar does not exist; expected a model archive (.mar)",
        ),
        (
            ["--local", "--model-dir", "d", "--model-archive", "a.mar"],
            "--model-dir and --model-archive exclude each other",
        ),
    ],
)
def test_model_archive_flags_are_checked_in_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(tune, args)
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_an_archive_without_a_body_template_is_refused_before_the_server_starts(
    tmp_path: Path,
) -> None:
    mar = write_mar(tmp_path / "summer.mar")
    result = CliRunner().invoke(
        tune, ["--local", "--runtime", "torchserve", "--model-archive", str(mar)]
    )
    assert result.exit_code == 2
    assert (
        f"--model-archive {mar}: TorchServe hands each request's body to the handler as it "
        "is, so BatchPilot cannot build its requests: pass --body-template FILE"
    ) in result.output
    assert "Starting" not in result.output


def test_a_start_from_the_config_file_is_refused_with_an_archive(tmp_path: Path) -> None:
    mar = write_mar(tmp_path / "summer.mar")
    config = tmp_path / "tune.yaml"
    config.write_text("server:\n  max_batch_size: 8\n", encoding="utf-8")
    args = ["--local", "--runtime", "torchserve", "--model-archive", str(mar)]
    result = CliRunner().invoke(tune, [*args, "--config", str(config)])
    assert result.exit_code == 2
    assert "with --model-archive the baseline is what your model's own settings say" in (
        result.output
    )


def test_tune_url_says_what_a_change_on_a_running_torchserve_needs() -> None:
    why = get_runtime("torchserve").unchangeable_from_elsewhere("summer")
    assert why is not None
    for part in (
        "takes the version from the archive's MAR-INF/MANIFEST.json",
        "PUT /models/summer?batch_size=... only scales its workers",
        "unless started with --enable-model-api",
        "--local --runtime torchserve --model-archive FILE.mar --body-template BODY.json",
    ):
        assert part in why
