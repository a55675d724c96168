"""`tune --url --runtime mlserver|torchserve|vllm`: none of them can take new batching
values over the network (MLServer reads them from model-settings.json at load, TorchServe
fixes them at the registration of an archive version, vLLM reads them from its command
line at start), so the run is refused before any request, saying why and how to set the values
by hand. Port 9 (discard) on loopback: nothing listens there, so an answer proves that no
request was needed. The real servers: tests/runtimes/test_tune_url_mlserver.py and
test_torchserve.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from batchpilot.runtimes.registry import get_runtime, runtime_names
from batchpilot.tuner.cli import tune

NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("name", "why", "by_hand"),
    [
        (
            "mlserver",
            "its repository API's load takes a model name and no settings",
            '"max_batch_size": <requests>, "max_batch_time": <seconds>',
        ),
        (
            "torchserve",
            "Model version ... is already registered",
            "batch_size=<requests>&max_batch_delay=<ms>",
        ),
        (
            "vllm",
            "are command-line options; no API changes them",
            "batchpilot capacity --protocol openai-stream",
        ),
    ],
)
def test_a_runtime_that_needs_its_model_files_is_refused_before_any_request(
    name: str, why: str, by_hand: str
) -> None:
    result = CliRunner().invoke(tune, ["--url", NOWHERE, "--runtime", name, "--model", "m"])
    assert result.exit_code == 2
    assert f"--url with --runtime {name}: " in result.output
    assert why in result.output
    assert "cannot be changed from here" in result.output
    assert f"--local --runtime {name}" in result.output
    assert by_hand in result.output
    # the snippet names the model asked for, and nothing was tried at the URL
    assert "nothing answers there" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_snippet_names_the_bundled_model_without_model() -> None:
    assert "model batchpilot-mlp" in str(get_runtime("mlserver").unchangeable_from_elsewhere())
    assert "model_name=batchpilot-mlp&" in str(
        get_runtime("torchserve").unchangeable_from_elsewhere()
    )


@pytest.mark.parametrize("name", sorted(set(runtime_names()) - {"mlserver", "torchserve", "vllm"}))
def test_runtimes_changed_over_the_network_are_not_refused(name: str) -> None:
    assert get_runtime(name).unchangeable_from_elsewhere("m") is None
    result = CliRunner().invoke(tune, ["--url", NOWHERE, "--runtime", name])
    assert result.exit_code == 2
    assert "nothing answers there" in result.output
