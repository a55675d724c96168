"""spec.runtime: the rules that keep it consistent with apply and load, and the pure
decisions the operator takes from it (adapter, ports, request protocol, persistence)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.loadgen.protocols import OPENAI_COMPLETIONS_PATH
from batchpilot.operator import runtimes
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec
from batchpilot.runtimes.rayserve.control import RayServeControl
from batchpilot.runtimes.triton.adapter import TritonRuntime, TritonRuntimeControl


def spec(
    runtime: dict[str, Any] | None = None,
    *,
    method: str = "Live",
    path: str | None = None,
    **extra: Any,
) -> InferenceServiceSpec:
    endpoint: dict[str, Any] = {"port": 8000}
    if path is not None:
        endpoint["path"] = path
    raw: dict[str, Any] = {
        "target": {"name": "model"},
        "sla": {"p99LatencyMs": 200},
        "apply": {"method": method},
        "load": {"endpoint": endpoint},
        **extra,
    }
    if runtime is not None:
        raw["runtime"] = runtime
    return parse_spec(raw)


TRITON = {"kind": "Triton", "model": "resnet"}


@pytest.mark.parametrize(
    ("runtime", "method", "path", "extra", "message"),
    [
        (None, "Live", "/v1/predict", {}, "apply.live (port and path of the admin endpoint)"),
        (None, "Env", None, {}, "load.endpoint.path is required for runtime.kind Reference"),
        ({"kind": "Generic"}, "Env", None, {}, "load.endpoint.path is required"),
        ({"kind": "Triton"}, "Live", None, {}, "runtime.model is required"),
        ({"kind": "Reference", "model": "x"}, "Env", "/p", {}, "runtime.model is required"),
        ({"kind": "Generic", "model": "x"}, "Env", "/p", {}, "not used by Reference and Generic"),
        (
            {**TRITON, "managementPort": 8265},
            "Live",
            None,
            {},
            "managementPort (the Ray dashboard's port",
        ),
        ({"kind": "RayServe", "model": "app", "metricsPort": 9}, "Live", None, {}, "metricsPort"),
        (
            TRITON,
            "Live",
            None,
            {"apply": {"method": "Live", "live": {"port": 8000, "path": "/admin"}}},
            "apply.live is for runtime.kind Reference only",
        ),
        ({"kind": "MLServer", "model": "m"}, "Live", None, {}, "are tuned by rollout"),
        ({"kind": "TorchServe", "model": "m"}, "Live", None, {}, "are tuned by rollout"),
        ({"kind": "VLLM", "model": "m"}, "Live", None, {}, "set apply.method Env"),
        (
            TRITON,
            "Live",
            None,
            {"parameters": {"extra": [{"name": "instances", "min": 1, "max": 2}]}},
            "a runtime's live control sets maxBatchSize and maxQueueTimeMs only",
        ),
    ],
)
def test_inconsistent_runtime_specs_are_refused_with_the_rule(
    runtime: dict[str, Any] | None,
    method: str,
    path: str | None,
    extra: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(runtime, method=method, path=path, **extra)
    assert message in str(caught.value)


def test_reference_is_the_default_and_unchanged() -> None:
    s = spec(
        method="Live",
        path="/v1/predict",
        apply={"method": "Live", "live": {"port": 8080, "path": "/admin/batching"}},
    )
    assert s.runtime.kind == "Reference"
    assert runtimes.live_adapter(s) is None  # apply.live, as before
    assert runtimes.load_protocol(s) is None  # the reference requests on the given path
    assert runtimes.persist_advice(s, {"max_batch_size": 8, "max_queue_time_ms": 2.0}) is None


def test_triton_live_speaks_v2_to_its_model_and_verifies_on_the_metrics_port() -> None:
    s = spec(TRITON)
    runtime = runtimes.live_adapter(s)
    assert isinstance(runtime, TritonRuntime)
    protocol = runtimes.load_protocol(s)
    assert protocol is not None
    assert protocol.path == "/v2/models/resnet/infer"
    body = json.loads(protocol.body(3))
    assert body["inputs"][0]["shape"] == [1, 3]
    control = runtimes.control_for(runtime, s, "10.0.0.7")
    assert isinstance(control, TritonRuntimeControl)
    assert control.url == "http://10.0.0.7:8000"
    assert control.control.metrics_url == "http://10.0.0.7:8002/metrics"
    assert control.control.model == "resnet"
    custom = spec({**TRITON, "metricsPort": 9102})
    control = runtimes.control_for(runtime, custom, "10.0.0.7")
    assert isinstance(control, TritonRuntimeControl)
    assert control.control.metrics_url == "http://10.0.0.7:9102/metrics"


def test_a_given_path_replaces_the_runtime_path_but_not_its_body() -> None:
    protocol = runtimes.load_protocol(spec(TRITON, path="/proxy/infer"))
    assert protocol is not None
    assert protocol.path == "/proxy/infer"
    assert json.loads(protocol.body(2))["inputs"][0]["datatype"] == "FP32"


def test_ray_serve_control_goes_to_the_dashboard_port() -> None:
    s = spec({"kind": "RayServe", "model": "app/Model", "managementPort": 18265})
    runtime = runtimes.live_adapter(s)
    assert runtime is not None
    control = runtimes.control_for(runtime, s, "10.0.0.8")
    assert isinstance(control, RayServeControl)
    assert control.dashboard_url == "http://10.0.0.8:18265"
    assert control.model == "app/Model"


def test_vllm_is_tuned_by_rollout_and_loaded_with_completions() -> None:
    s = spec({"kind": "VLLM", "model": "facebook/opt-125m"}, method="Env")
    assert runtimes.live_adapter(s) is None
    assert runtimes.adapter(s) is None
    protocol = runtimes.load_protocol(s)
    assert protocol is not None
    assert protocol.path == OPENAI_COMPLETIONS_PATH
    assert json.loads(protocol.body(4))["model"] == "facebook/opt-125m"
    assert runtimes.persist_advice(s, {"max_batch_size": 8, "max_queue_time_ms": 2.0}) is None


def test_generic_sends_the_reference_requests_to_the_users_path() -> None:
    s = spec({"kind": "Generic"}, method="Env", path="/predict")
    assert runtimes.load_protocol(s) is None
    assert runtimes.adapter(s) is None


def test_an_env_rollout_of_a_runtime_is_persisted_by_the_template_itself() -> None:
    s = spec({"kind": "MLServer", "model": "m"}, method="Env")
    assert runtimes.live_adapter(s) is None
    assert runtimes.persist_advice(s, {"max_batch_size": 8, "max_queue_time_ms": 2.0}) is None
    protocol = runtimes.load_protocol(s)
    assert protocol is not None
    assert protocol.path == "/v2/models/m/infer"


def test_a_live_triton_write_back_comes_with_its_config_pbtxt() -> None:
    advice = runtimes.persist_advice(spec(TRITON), {"max_batch_size": 12, "max_queue_time_ms": 2.5})
    assert advice is not None
    assert (advice.runtime, advice.kind) == ("Triton", "recommend")
    assert "max_batch_size: 12" in advice.snippet
    assert "max_queue_delay_microseconds: 2500" in advice.snippet
    assert "'resnet'" in advice.where


def test_triton_and_mlserver_models_are_loaded_with_requests_built_from_their_metadata() -> None:
    assert runtimes.shaped_by_metadata(spec(TRITON))
    assert runtimes.served_model(spec(TRITON)) == "resnet"
    streamed = spec(TRITON, load={"endpoint": {"port": 8000}, "protocol": "OpenAIStream"})
    assert not runtimes.shaped_by_metadata(streamed)
    mlserver = spec({"kind": "MLServer", "model": "m"}, method="Env")
    assert runtimes.shaped_by_metadata(mlserver)
    assert runtimes.metadata_model(mlserver) == "m"
    assert not runtimes.shaped_by_metadata(spec({"kind": "TorchServe", "model": "m"}, method="Env"))
    assert not runtimes.shaped_by_metadata(spec(path="/v1/predict", method="Env"))
