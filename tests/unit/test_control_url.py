"""`tune --url URL --control-url URL2`: each runtime's control goes to the endpoint it
names (Triton's metrics, Ray's dashboard, TorchServe's management API, MLServer's and
the reference server's control API), and bad input is refused in one line. The real
runtimes on non-default ports are in tests/runtimes/test_tune_url_control.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from rich.console import Console

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig
from batchpilot.runtimes.mlserver import MLServerRuntime
from batchpilot.runtimes.rayserve.adapter import RayServeRuntime
from batchpilot.runtimes.reference import ReferenceRuntime
from batchpilot.runtimes.registry import get_runtime, runtime_names
from batchpilot.runtimes.torchserve.adapter import TorchServeRuntime
from batchpilot.runtimes.triton.adapter import TritonRuntime, metrics_endpoint
from batchpilot.tuner.attached import check_attached
from batchpilot.tuner.cli import tune
from batchpilot.tuner.urlmode import AttachError, control_at


def test_triton_metrics_are_read_at_the_control_url() -> None:
    control = TritonRuntime().control("http://h:8000", control_url="http://m:9102")
    assert control.control.metrics_url == "http://m:9102/metrics"
    assert control.url == "http://h:8000"
    # a URL that names its path is taken as it is
    assert metrics_endpoint("http://m:9102/prom/metrics/") == "http://m:9102/prom/metrics"


def test_ray_changes_go_to_the_dashboard_at_the_control_url() -> None:
    control = RayServeRuntime().control("http://h:8000", control_url="http://h:18265")
    assert control.dashboard_url == "http://h:18265"
    assert control.url == "http://h:8000"


def test_torchserve_registers_through_the_management_api_at_the_control_url() -> None:
    control = TorchServeRuntime().control("http://h:8080", control_url="http://h:9181")
    assert control._management.url == "http://h:9181"
    default = TorchServeRuntime().control("http://h:8080")
    assert default._management.url == "http://h:8081"


def test_mlserver_reloads_through_the_control_url_and_verifies_through_inference() -> None:
    control = MLServerRuntime().control("http://h:8080/", control_url="http://admin:8080")
    assert control._client.url == "http://admin:8080"
    assert control.url == "http://h:8080"


def test_the_reference_server_is_set_through_the_control_url() -> None:
    control = ReferenceRuntime().control("http://h:8000", control_url="http://h:8001")
    assert control.url == "http://h:8001"


@pytest.mark.parametrize("name", runtime_names())
def test_every_runtime_says_what_its_control_endpoint_is(name: str) -> None:
    endpoint = get_runtime(name).control_endpoint
    assert endpoint.what
    assert endpoint.default


def test_a_control_url_that_is_not_a_url_is_refused_saying_what_it_should_be() -> None:
    with pytest.raises(AttachError) as caught:
        control_at("ftp://x", TritonRuntime())
    message = caught.value.message
    assert message.startswith("--control-url ftp://x: ")
    assert "give the address of Triton's metrics endpoint" in message


def test_a_control_url_where_nothing_answers_is_refused() -> None:
    # port 9 (discard) on loopback: nothing listens there in a test environment
    with pytest.raises(AttachError) as caught:
        control_at("http://127.0.0.1:9", RayServeRuntime())
    message = caught.value.message
    assert "--control-url http://127.0.0.1:9: nothing answers there" in message
    assert "Ray's dashboard" in message


def test_control_url_applies_to_url_runs_only() -> None:
    result = CliRunner().invoke(tune, ["--local", "--control-url", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "--control-url applies to --url runs" in result.output
    assert len(result.output.strip().splitlines()) == 1


class _Unreachable:
    url = "http://h:8080"

    async def current(self) -> BatchingConfig:
        raise TargetError("GET http://h:8081/models/m answered HTTP 404")

    async def apply(self, config: BatchingConfig) -> None:
        raise AssertionError("nothing is applied when nothing could be read")


async def test_a_failed_read_says_where_the_control_was_looked_for() -> None:
    console = Console(quiet=True)
    runtime = get_runtime("torchserve")
    with pytest.raises(TargetError) as default:
        await check_attached(_Unreachable(), runtime, "m", console)
    assert "port + 1" in str(default.value)
    assert "--control-url URL names another address" in str(default.value)
    with pytest.raises(TargetError) as given:
        await check_attached(_Unreachable(), runtime, "m", console, control_url="http://h:9")
    assert "was looked for at --control-url http://h:9" in str(given.value)
