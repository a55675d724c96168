"""apply.method Env: the unit each runtime's wait variable is written in (both ways), where
a pod's own knobs are read back after a rollout, and the comparison of what was rolled
out with what the pod reports."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from batchpilot.operator import decisions, envknobs, parents, runtimes
from batchpilot.operator.envknobs import WaitEncoding
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def spec(
    runtime: dict[str, Any] | None = None,
    *,
    wait_variable: str = "MAX_QUEUE_TIME_MS",
    live: bool = False,
    scheme: str = "http",
) -> InferenceServiceSpec:
    apply: dict[str, Any] = {
        "method": "Env",
        "env": {"maxBatchSize": "MAX_BATCH_SIZE", "maxQueueTimeMs": wait_variable},
    }
    if live:
        apply["live"] = {"port": 9000, "path": "/admin/batching"}
    endpoint: dict[str, Any] = {"port": 8000, "path": "/v1/predict", "scheme": scheme}
    if scheme == "https":
        endpoint["serverName"] = "model.ns.svc"
    raw: dict[str, Any] = {
        "target": {"name": "model", "container": "server"},
        "sla": {"p99LatencyMs": 200},
        "apply": apply,
        "load": {"endpoint": endpoint},
    }
    if runtime is not None:
        raw["runtime"] = runtime
    return parse_spec(raw)


MLSERVER = {"kind": "MLServer", "model": "m"}
TRITON = {"kind": "Triton", "model": "m"}
TORCHSERVE = {"kind": "TorchServe", "model": "m"}
RAY = {"kind": "RayServe", "model": "app"}


@pytest.mark.parametrize(
    ("runtime", "variable", "encoding"),
    [
        # the runtimes' own variables, named without a unit: the runtime's unit
        (MLSERVER, "MLSERVER_MODEL_MAX_BATCH_TIME", WaitEncoding("s")),
        (TRITON, "MAX_QUEUE_DELAY", WaitEncoding("us", integer=True)),
        (TORCHSERVE, "MAX_BATCH_DELAY", WaitEncoding("ms", integer=True)),
        (RAY, "BATCH_WAIT_TIMEOUT", WaitEncoding("s")),
        # a name that states its unit keeps it: a start script converting it itself
        (MLSERVER, "MAX_QUEUE_TIME_MS", WaitEncoding("ms")),
        (TRITON, "MAX_QUEUE_DELAY_MICROSECONDS", WaitEncoding("us", integer=True)),
        (TRITON, "MAX_QUEUE_TIME_MS", WaitEncoding("ms")),
        (TORCHSERVE, "BATCH_DELAY_S", WaitEncoding("s")),
        # no adapter (or the reference server): milliseconds unless the name says
        (None, "MAX_QUEUE_TIME_MS", WaitEncoding("ms")),
        ({"kind": "Generic"}, "BATCH_TIMEOUT", WaitEncoding("ms")),
        ({"kind": "Generic"}, "BATCH_TIMEOUT_US", WaitEncoding("us")),
        ({"kind": "VLLM", "model": "m"}, "BATCH_TIMEOUT_SECONDS", WaitEncoding("s")),
    ],
)
def test_the_wait_is_written_in_the_unit_its_reader_expects(
    runtime: dict[str, Any] | None, variable: str, encoding: WaitEncoding
) -> None:
    assert runtimes.env_wait(spec(runtime, wait_variable=variable)) == encoding


@pytest.mark.parametrize(
    ("encoding", "wait_ms", "text"),
    [
        (WaitEncoding("s"), 5.0, "0.005"),
        (WaitEncoding("s"), 12.5, "0.0125"),
        (WaitEncoding("s"), 1000.0, "1"),
        (WaitEncoding("us", integer=True), 2.5, "2500"),
        (WaitEncoding("us", integer=True), 0.1, "100"),
        (WaitEncoding("ms", integer=True), 7.0, "7"),
        (WaitEncoding("ms", integer=True), 7.6, "8"),
        (WaitEncoding("ms"), 12.5, "12.5"),
        (WaitEncoding("ms"), 20.0, "20"),
    ],
)
def test_params_to_env_and_back(encoding: WaitEncoding, wait_ms: float, text: str) -> None:
    names = {"max_batch_size": "B", "max_queue_time_ms": "W"}
    env = decisions.env_for_params(
        {"max_batch_size": 8, "max_queue_time_ms": wait_ms}, names, encoding
    )
    assert env == {"B": "8", "W": text}
    back = decisions.params_from_env(dict(env), names, encoding)
    assert back is not None
    assert back["max_batch_size"] == 8
    # exact where the unit takes the value whole; the runtime's rounding otherwise
    assert back["max_queue_time_ms"] == pytest.approx(round(wait_ms) if text == "8" else wait_ms)


def deployment(env: dict[str, str]) -> dict[str, Any]:
    variables = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "metadata": {"name": "model"},
        "spec": {"template": {"spec": {"containers": [{"name": "server", "env": variables}]}}},
    }


def test_the_original_is_read_in_the_runtimes_unit() -> None:
    s = spec(MLSERVER, wait_variable="MLSERVER_MODEL_MAX_BATCH_TIME")
    workload = deployment({"MAX_BATCH_SIZE": "16", "MLSERVER_MODEL_MAX_BATCH_TIME": "0.02"})
    original = decisions.original_config(workload, s, NOW, runtimes.env_wait(s))
    assert original.params == {"max_batch_size": 16, "max_queue_time_ms": 20.0}
    assert original.env == {"MAX_BATCH_SIZE": "16", "MLSERVER_MODEL_MAX_BATCH_TIME": "0.02"}
    # the trial of the original writes back exactly what was there
    wait = runtimes.env_wait(s)
    assert decisions.env_for_params(original.params, s.env_names(), wait) == original.env


def test_a_kserve_predictor_is_read_in_the_runtimes_unit() -> None:
    s = spec(TRITON, wait_variable="MAX_QUEUE_DELAY")
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "model"},
        "spec": {
            "predictor": {
                "containers": [
                    {
                        "name": "server",
                        "env": [
                            {"name": "MAX_BATCH_SIZE", "value": "4"},
                            {"name": "MAX_QUEUE_DELAY", "value": "1500"},
                        ],
                    }
                ]
            }
        },
    }
    original = parents.kserve_original(isvc, s, NOW)
    assert original.params == {"max_batch_size": 4, "max_queue_time_ms": 1.5}


@pytest.mark.parametrize(
    ("runtime", "live", "scheme", "readback"),
    [
        (TRITON, False, "http", "runtime"),
        (RAY, False, "http", "runtime"),
        (TORCHSERVE, False, "http", "runtime"),
        (TRITON, False, "https", None),  # the runtime's API is plain http
        (MLSERVER, False, "http", None),  # reports its values in nothing but its answers
        ({"kind": "Generic"}, False, "http", None),
        # no configuration to read: its engine's gauge under a burst beyond the cap
        ({"kind": "VLLM", "model": "m"}, False, "http", "engine"),
        ({"kind": "VLLM", "model": "m"}, False, "https", None),
        (None, True, "http", "apply.live"),
        (None, False, "http", None),  # a plain Deployment: nothing to ask
    ],
)
def test_where_an_env_rollout_is_read_back(
    runtime: dict[str, Any] | None, live: bool, scheme: str, readback: str | None
) -> None:
    assert runtimes.env_readback(spec(runtime, live=live, scheme=scheme)) == readback


def test_live_is_not_read_back_as_an_env_rollout() -> None:
    live = parse_spec(
        {
            "target": {"name": "model"},
            "sla": {"p99LatencyMs": 200},
            "runtime": TRITON,
            "apply": {"method": "Live"},
            "load": {"endpoint": {"port": 8000}},
        }
    )
    assert runtimes.env_readback(live) is None


NAMES = {"max_batch_size": "MAX_BATCH_SIZE", "max_queue_time_ms": "MAX_QUEUE_TIME_MS"}
WRITTEN: dict[str, str | None] = {"MAX_BATCH_SIZE": "32", "MAX_QUEUE_TIME_MS": "10"}
EXPECTED = {"max_batch_size": 32, "max_queue_time_ms": 10.0}


def test_a_pod_that_runs_what_was_rolled_out_passes() -> None:
    read = {"max_batch_size": 32, "max_queue_time_ms": 10.0 + 1e-7, "threads": 4}
    assert envknobs.env_ignored(expected=EXPECTED, read=read, names=NAMES, written=WRITTEN) is None


def test_a_pod_that_ignores_the_variables_is_named_with_both_sides() -> None:
    read = {"max_batch_size": 8, "max_queue_time_ms": 10.0}
    message = envknobs.env_ignored(expected=EXPECTED, read=read, names=NAMES, written=WRITTEN)
    assert message is not None
    assert message.startswith("runs max_batch_size=8 after MAX_BATCH_SIZE=32 was rolled out")
    assert "does not read the variable " in message
    assert "apply.method Live" in message
    read = {"max_batch_size": 8, "max_queue_time_ms": 2.5}
    message = envknobs.env_ignored(expected=EXPECTED, read=read, names=NAMES, written=WRITTEN)
    assert message is not None
    assert "max_queue_time_ms=2.5 after MAX_QUEUE_TIME_MS=10" in message
    assert "the variables " in message


def test_a_wait_in_the_wrong_unit_is_told_apart_from_rounding() -> None:
    # seconds written where the server reads ms: 1000 times off, not a rounding
    read = {"max_batch_size": 32, "max_queue_time_ms": 0.01}
    assert envknobs.env_ignored(expected=EXPECTED, read=read, names=NAMES, written=WRITTEN)
    # a runtime counting whole ms may truncate 10.6 to 10: within one unit
    expected = {"max_batch_size": 32, "max_queue_time_ms": 10.6}
    tolerance = envknobs.resolution_ms(runtimes.wait_knob(spec(TORCHSERVE)))
    assert tolerance == 1.0
    read = {"max_batch_size": 32, "max_queue_time_ms": 10.0}
    assert (
        envknobs.env_ignored(
            expected=expected, read=read, names=NAMES, written=WRITTEN, tolerance_ms=tolerance
        )
        is None
    )
    assert envknobs.resolution_ms(runtimes.wait_knob(spec(TRITON))) == pytest.approx(0.001)
    assert envknobs.resolution_ms(runtimes.wait_knob(spec(RAY))) == 0.0


def test_knobs_the_pod_does_not_report_are_not_judged() -> None:
    read = {"max_batch_size": 32}
    assert envknobs.env_ignored(expected=EXPECTED, read=read, names=NAMES, written=WRITTEN) is None
