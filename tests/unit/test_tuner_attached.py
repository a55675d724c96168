"""`tune --url` one layer at a time: the checks before a server BatchPilot did not
start is tuned, what it is left running at the end, and the flags' errors. The target
is a recording fake; the end-to-end run is tests/component/test_tune_url.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from batchpilot.errors import RequestShapeError, TargetError
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.registry import get_runtime
from batchpilot.tuner.attached import Attached, check_attached, final_config, leave_attached
from batchpilot.tuner.cli import tune

FOUND = BatchingConfig(max_batch_size=4, max_queue_time_ms=2.0)
WINNER = BatchingConfig(max_batch_size=16, max_queue_time_ms=8.0)


class FakeTarget:
    def __init__(
        self, *, read_error: str = "", apply_error: str = "", refused: bool = False
    ) -> None:
        self.refused = refused
        self.url = "http://127.0.0.1:1"
        self.live = FOUND
        self.applied: list[BatchingConfig] = []
        self.read_error = read_error
        self.apply_error = apply_error

    async def current(self) -> BatchingConfig:
        if self.read_error:
            raise TargetError(self.read_error)
        return self.live

    async def apply(self, config: BatchingConfig) -> None:
        if self.refused:
            raise RequestShapeError("HTTP 400: unexpected inference input; set --body-template")
        if self.apply_error:
            raise TargetError(self.apply_error)
        self.applied.append(config)
        self.live = config


class _Summary:
    """The one field final_config reads."""

    def __init__(self, recommended: BatchingConfig | None) -> None:
        self.recommended = recommended


def _console() -> Console:
    return Console(quiet=True)


async def test_the_running_configuration_is_read_then_applied_to_itself() -> None:
    target = FakeTarget()
    baseline = await check_attached(target, get_runtime("mlserver"), "m", _console())
    assert baseline == FOUND
    assert target.applied == [FOUND]


async def test_a_model_not_served_is_named() -> None:
    target = FakeTarget(read_error="HTTP 404: Model nope not found")
    with pytest.raises(TargetError, match=r"configuration of model 'nope' \(is it served there"):
        await check_attached(target, get_runtime("mlserver"), "nope", _console())


async def test_a_control_that_cannot_change_the_server_stops_before_any_load() -> None:
    target = FakeTarget(apply_error="the model repository is not on this machine")
    with pytest.raises(TargetError, match="cannot be changed through the mlserver control"):
        await check_attached(target, get_runtime("mlserver"), None, _console())


async def test_requests_the_server_refuses_stop_in_their_own_words() -> None:
    target = FakeTarget(refused=True)
    with pytest.raises(RequestShapeError) as caught:
        await check_attached(target, get_runtime("triton"), "ident", _console())
    # not wrapped as a control that cannot change the server: the requests are wrong
    assert "cannot be changed" not in str(caught.value)
    assert "--body-template" in str(caught.value)


@pytest.mark.parametrize(
    ("keep", "recommended", "left"),
    [(False, WINNER, FOUND), (True, WINNER, WINNER), (True, None, FOUND)],
)
async def test_what_the_server_is_left_running(
    keep: bool, recommended: BatchingConfig | None, left: BatchingConfig
) -> None:
    attach = Attached(url="http://127.0.0.1:1", keep_winner=keep)
    summary = _Summary(recommended)
    assert final_config(attach, FOUND, summary) == left  # type: ignore[arg-type]
    target = FakeTarget()
    target.live = BatchingConfig(max_batch_size=64, max_queue_time_ms=50.0)  # a trial's
    await leave_attached(target, attach, FOUND, summary, _console())  # type: ignore[arg-type]
    assert target.live == left
    # stopped before any summary (an error, Ctrl-C early): the found one returns
    assert final_config(attach, FOUND, None) == FOUND


async def test_a_failed_restore_says_what_the_server_may_still_run() -> None:
    target = FakeTarget(apply_error="connection refused")
    attach = Attached(url="http://127.0.0.1:1")
    with pytest.raises(TargetError, match=r"could not put batch=4 wait=2ms back .* yourself"):
        await leave_attached(target, attach, FOUND, None, _console())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local", "--keep-winner"], "--keep-winner applies to --url runs"),
        (["--local", "--model", "m"], "--model applies to --url runs"),
        (["--local", "--prometheus", "http://127.0.0.1:9"], "--prometheus applies to --url"),
        (["--local", "--url", "http://127.0.0.1:9"], "--local and --url exclude each other"),
        (["--url", "ftp://x"], "--url ftp://x: target URL 'ftp://x' is not valid"),
        (["--url", "http://127.0.0.1:9", "--model", " "], "--model must name a model"),
        (["--local", "--header", "A: b"], "--header applies to --url runs"),
        (["--local", "--ca-bundle", "ca.pem"], "--ca-bundle applies to --url runs"),
        (
            ["--url", "http://127.0.0.1:9", "--header", "Bearer x"],
            "--header: header 'Bearer x' is not NAME:VALUE (e.g. 'Authorization: Bearer TOKEN')",
        ),
        (
            ["--url", "http://127.0.0.1:9", "--ca-bundle", "no-such-ca.pem"],
            "--ca-bundle: the CA bundle (file no-such-ca.pem) is not usable: No such file",
        ),
        (["--simulator", "c.json", "--body-template", "b.json"], "--body-template applies to"),
        (
            ["--local", "--runtime", "triton", "--body-template", "no-such-body.json"],
            "--body-template no-such-body.json: not JSON (which starts with '{' or '[') and "
            "not a file that can be read: No such file or directory",
        ),
    ],
)
def test_url_flags_reject_bad_input_in_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(tune, args)
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_server_model_in_the_file_is_refused_with_url(tmp_path: Path) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text("server:\n  model: encoder\n")
    result = CliRunner().invoke(tune, ["--url", "http://127.0.0.1:9", "--config", str(config)])
    assert result.exit_code == 2
    assert "name the one to tune with --model" in result.output


def test_a_body_template_goes_to_the_models_inference_path(tmp_path: Path) -> None:
    from batchpilot.tuner.cli import _body_template

    sample = tmp_path / "body.json"
    sample.write_text(
        '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}]}'
    )
    requests = _body_template(str(sample), get_runtime("triton"), "ident")
    assert requests.path == "/v2/models/ident/infer"
    assert requests.body(1) == requests.body(16) == sample.read_bytes()
    # the same JSON given on the command line, as loadtest and capacity take it
    inline = _body_template(sample.read_text(), get_runtime("triton"), "ident")
    assert inline.body(1) == sample.read_bytes()
