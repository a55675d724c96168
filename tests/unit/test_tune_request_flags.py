"""`tune`'s request vocabulary, the one `loadtest` and `capacity` take: --protocol v2 with
--input-name/--features (one FP32 tensor described by hand), --protocol openai and
openai-chat with --max-tokens, the token streams; the requests each builds, and the
combinations refused before any server is touched, each naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchpilot.loadgen.protocols import OPENAI_COMPLETIONS_PATH, RequestProtocol
from batchpilot.tuner.cli import TuneFlags, check_flags, config_of, tune, tune_requests

URL = "http://127.0.0.1:9"


def requests_of(*args: str) -> RequestProtocol | None:
    """The requests `tune ARGS` would send (None: the runtime's own)."""
    context = tune.make_context("tune", list(args))
    flags = TuneFlags(**context.params)
    check_flags(flags)
    return tune_requests(flags, config_of(flags), streaming=False)


def test_a_tensor_by_hand_is_sent_to_the_model_tuned() -> None:
    requests = requests_of(
        *("--url", URL, "--runtime", "triton", "--model", "ident"),
        *("--input-name", "x", "--features", "4"),
    )
    assert requests is not None
    assert requests.path == "/v2/models/ident/infer"
    body = json.loads(requests.body(3))
    assert body["inputs"] == [
        {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": body["inputs"][0]["data"]}
    ]
    assert len(body["inputs"][0]["data"]) == 12
    only_name = requests_of("--url", URL, "--runtime", "mlserver", "--input-name", "x")
    assert only_name is not None
    assert json.loads(only_name.body(2))["inputs"][0]["shape"] == [2, 1]


def test_protocol_v2_alone_is_the_runtimes_requests_from_the_metadata() -> None:
    assert requests_of("--url", URL, "--runtime", "triton", "--protocol", "v2") is None
    assert requests_of("--url", URL, "--runtime", "triton") is None


def test_completions_go_to_the_openai_path_with_max_tokens() -> None:
    requests = requests_of(
        *("--url", URL, "--runtime", "ray", "--model", "llm/LLMServer"),
        *("--protocol", "openai", "--max-tokens", "8", "--mix", "1:4"),
    )
    assert requests is not None
    assert requests.path == OPENAI_COMPLETIONS_PATH
    body = json.loads(requests.body(4))
    assert body["max_tokens"] == 8
    assert body["model"] == "llm/LLMServer"
    assert len(body["prompt"].split()) == 4


def test_a_user_models_tensor_names_the_model_its_settings_give(tmp_path: Path) -> None:
    folder = tmp_path / "scaler"
    folder.mkdir()
    (folder / "model-settings.json").write_text(
        json.dumps({"name": "scaler", "implementation": "model.Scaler"}), encoding="utf-8"
    )
    (folder / "model.py").write_text("class Scaler: ...\n", encoding="utf-8")
    requests = requests_of(
        *("--local", "--runtime", "mlserver", "--model-dir", str(folder)),
        *("--input-name", "x", "--features", "2"),
    )
    assert requests is not None
    assert requests.path == "/v2/models/scaler/infer"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--url", URL, "--runtime", "ray", "--input-name", "x"],
            "--input-name and --features applies to the runtimes that serve KServe v2 "
            "inference (mlserver, triton); the ray runtime takes its own requests",
        ),
        (
            ["--url", URL, "--runtime", "torchserve", "--protocol", "v2"],
            "--protocol v2 applies to the runtimes that serve KServe v2",
        ),
        (
            ["--url", URL, "--runtime", "triton", "--max-tokens", "8"],
            "--max-tokens applies to --protocol openai or openai-chat, not to the triton "
            "runtime's own requests",
        ),
        (
            ["--url", URL, "--runtime", "triton", "--protocol", "openai", "--input-name", "x"],
            "--input-name applies to --protocol v2, not openai",
        ),
        (
            ["--url", URL, "--protocol", "openai-chat"],
            "--protocol openai-chat needs --model",
        ),
        (
            ["--local", "--runtime", "triton", "--input-name", "x"],
            "--input-name applies to --url runs and to --local with a model of your own",
        ),
        (
            ["--local", "--protocol", "openai"],
            "--protocol openai applies to --url runs and to --local --runtime vllm",
        ),
        (
            ["--local", "--runtime", "vllm", "--protocol", "openai"],
            "--protocol openai does not apply to --local --runtime vllm: its load is token "
            "streams",
        ),
        (
            ["--url", URL, "--runtime", "triton", "--features", "4", "--body-template", "{}"],
            "--body-template and --features exclude each other",
        ),
        (
            ["--simulator", "cost.json", "--input-name", "x"],
            "--input-name applies to --local and --url runs; a simulated run sends no load",
        ),
        (
            ["--url", URL, "--runtime", "triton", "--features", "0"],
            "--features",
        ),
    ],
)  # fmt: skip
def test_bad_request_flags_are_refused_naming_the_flag(args: list[str], message: str) -> None:
    result = CliRunner().invoke(tune, args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
