"""load.protocol and load.request: the requests a study sends, in the command line's
vocabulary. Each field is refused outside the protocols its flag belongs to, with a
message naming it; each protocol builds the requests `loadtest --protocol` would."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.loadgen.protocols import APPLIES_TO, OPENAI_CHAT_PATH, REFERENCE_PATH
from batchpilot.operator import runtimes
from batchpilot.operator.spec import (
    LOAD_PROTOCOLS,
    InferenceServiceSpec,
    explain_validation_error,
    parse_spec,
)


def raw_spec(
    load: dict[str, Any] | None = None, runtime: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "target": {"name": "server"},
        "runtime": runtime or {"kind": "Generic"},
        "apply": {"method": "Env"},
        "sla": {"p99LatencyMs": 300},
        "load": {"endpoint": {"port": 8080, "path": "/predict"}, **(load or {})},
    }


def spec_of(load: dict[str, Any], runtime: dict[str, Any] | None = None) -> InferenceServiceSpec:
    return parse_spec(raw_spec(load, runtime))


def refusal(load: dict[str, Any], runtime: dict[str, Any] | None = None) -> str:
    with pytest.raises(ValidationError) as caught:
        spec_of(load, runtime)
    return explain_validation_error(caught.value)


def test_every_protocol_of_the_command_line_has_a_name_in_the_spec() -> None:
    from batchpilot.loadgen.protocol_option import PROTOCOLS

    named = {cli for cli in LOAD_PROTOCOLS.values() if cli is not None}
    # the reference server's body is load.protocol Runtime of kinds Reference and Generic
    assert named == set(PROTOCOLS) - {"reference"}


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("model", "m", "--model"),
        ("inputName", "x", "--input-name"),
        ("features", 4, "--features"),
        ("maxTokens", 8, "--max-tokens"),
        ("bodyTemplate", "{}", "--body-template"),
    ],
)
def test_each_request_field_applies_where_its_flag_does(field: str, value: Any, flag: str) -> None:
    allowed = {name for name, cli in LOAD_PROTOCOLS.items() if cli in APPLIES_TO[flag]}
    runtime = {"kind": "VLLM", "model": "m"}
    for protocol in LOAD_PROTOCOLS:
        load: dict[str, Any] = {"protocol": protocol, "request": {field: value}}
        if protocol == "Template" and field != "bodyTemplate":
            load["request"]["bodyTemplate"] = "{}"
        if protocol in allowed:
            request = spec_of(load, runtime).load.request
            assert request is not None
            assert field in request.given()
        else:
            message = refusal(load, runtime)
            assert f"load.request.{field} applies to load.protocol" in message, (protocol, message)


def test_a_template_needs_its_body_and_the_body_must_be_json() -> None:
    assert "load.protocol Template needs load.request.bodyTemplate" in refusal(
        {"protocol": "Template"}
    )
    message = refusal({"protocol": "Template", "request": {"bodyTemplate": '{"x": [{size}'}})
    assert "load.request.bodyTemplate: the body template is not valid JSON" in message


@pytest.mark.parametrize("protocol", ["V2", "OpenAI", "OpenAIChat", "OpenAIStream"])
def test_protocols_that_name_a_model_need_one_from_the_request_or_the_runtime(
    protocol: str,
) -> None:
    message = refusal({"protocol": protocol})
    assert "send a model name" in message
    assert "set load.request.model" in message
    spec = spec_of({"protocol": protocol, "request": {"model": "m"}})
    assert spec.request_model() == "m"


def test_a_header_name_that_http_does_not_allow_is_refused() -> None:
    message = refusal({"request": {"headers": {"X Bad": "1"}}})
    assert "load.request.headers: 'X Bad' is not an HTTP header name" in message


def test_a_template_is_sent_to_the_endpoint_path_with_and_without_a_size() -> None:
    sized = runtimes.load_protocol(
        spec_of({"protocol": "Template", "request": {"bodyTemplate": '{"rows": {size}}'}})
    )
    assert sized is not None
    assert (sized.path, json.loads(sized.body(7))) == ("/predict", {"rows": 7})
    one = runtimes.load_protocol(
        spec_of({"protocol": "Template", "request": {"bodyTemplate": '{"instances": ["hi"]}'}})
    )
    assert one is not None
    assert one.body(1) == one.body(64) == b'{"instances": ["hi"]}'


def test_a_template_without_a_path_goes_to_the_runtimes_inference_path() -> None:
    raw = raw_spec(
        {"protocol": "Template", "request": {"bodyTemplate": '{"data": [1]}'}},
        {"kind": "TorchServe", "model": "mine"},
    )
    del raw["load"]["endpoint"]["path"]
    protocol = runtimes.load_protocol(parse_spec(raw))
    assert protocol is not None
    assert protocol.path == "/predictions/mine"


def test_v2_with_a_tensor_by_hand_uses_its_name_and_width() -> None:
    spec = spec_of(
        {"protocol": "V2", "request": {"model": "ident", "inputName": "x", "features": 4}}
    )
    assert not runtimes.shaped_by_metadata(spec)
    protocol = runtimes.load_protocol(spec)
    assert protocol is not None
    (tensor,) = json.loads(protocol.body(3))["inputs"]
    assert (tensor["name"], tensor["shape"]) == ("x", [3, 4])


@pytest.mark.parametrize(
    ("runtime", "load", "shaped"),
    [
        ({"kind": "MLServer", "model": "mine"}, {"protocol": "V2"}, True),
        ({"kind": "Generic"}, {"protocol": "V2", "request": {"model": "m"}}, True),
        ({"kind": "Triton", "model": "mine"}, {}, True),
        ({"kind": "MLServer", "model": "mine"}, {}, True),
        ({"kind": "TorchServe", "model": "mine"}, {}, False),
    ],
)
def test_v2_requests_come_from_the_metadata_unless_a_tensor_is_given(
    runtime: dict[str, Any], load: dict[str, Any], shaped: bool
) -> None:
    raw = raw_spec(load, runtime)
    if runtime["kind"] == "Triton":
        raw["apply"] = {"method": "Live"}
    spec = parse_spec(raw)
    assert runtimes.shaped_by_metadata(spec) is shaped
    if shaped:
        assert runtimes.metadata_model(spec) == (runtime.get("model") or "m")


def test_openai_requests_take_the_request_model_and_max_tokens_and_headers() -> None:
    spec = spec_of(
        {
            "protocol": "OpenAIChat",
            "request": {"model": "served", "maxTokens": 5, "headers": {"content-type": "x/y"}},
        }
    )
    protocol = runtimes.load_protocol(spec)
    assert protocol is not None
    body = json.loads(protocol.body(2))
    assert (body["model"], body["max_tokens"]) == ("served", 5)
    # load.endpoint.path replaces the chat path; the user's content type replaces JSON's
    assert protocol.path == "/predict" != OPENAI_CHAT_PATH
    assert dict(protocol.headers) == {"content-type": "x/y"}


def test_headers_alone_keep_the_reference_body_with_them() -> None:
    assert runtimes.load_protocol(spec_of({})) is None
    protocol = runtimes.load_protocol(spec_of({"request": {"headers": {"X-Tenant": "a"}}}))
    assert protocol is not None
    assert protocol.name == "reference"
    assert protocol.path == "/predict" != REFERENCE_PATH
    assert protocol.headers["X-Tenant"] == "a"
    assert protocol.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("runtime", "load", "fields"),
    [
        ({"kind": "Generic"}, {}, "load.protocol V2 (requests from the model's metadata)"),
        ({"kind": "Triton", "model": "m"}, {}, "load.request.inputName and features"),
        (
            {"kind": "Generic"},
            {"protocol": "Template", "request": {"bodyTemplate": "{}"}},
            "set load.request.bodyTemplate,",
        ),
        (
            {"kind": "VLLM", "model": "m"},
            {"protocol": "OpenAIChatStream"},
            "load.promptTokens and load.outputTokens",
        ),
    ],
)
def test_a_refusal_names_the_servers_words_and_the_fields_to_set(
    runtime: dict[str, Any], load: dict[str, Any], fields: str
) -> None:
    raw = raw_spec(load, runtime)
    if runtime["kind"] == "Triton":
        raw["apply"] = {"method": "Live"}
    message = runtimes.refusal_message(parse_spec(raw), "POST u answered HTTP 400: no input 'x'")
    assert "HTTP 400: no input 'x'" in message
    assert fields in message
    assert "load.endpoint.path" in message
