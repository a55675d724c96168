"""load.endpoint over https: the spec's rules (caBundle and serverName for https only, a
bundle that parses, Live admin kept off the TLS port), the URLs the operator builds for
pods, the request protocol that carries the bundle and the server name, and the server
name's trip to the load workers in the share."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from testca import TEST_CA_PEM

from batchpilot.loadgen.arrivals import as_arrival
from batchpilot.loadgen.protocols import REFERENCE_PATH
from batchpilot.loadgen.workers import ShareSpec, forwarded_protocol
from batchpilot.models import RequestMix
from batchpilot.operator import runtimes
from batchpilot.operator.spec import InferenceServiceSpec, parse_spec

SERVER_NAME = "model.serving.svc"


def spec(
    endpoint: dict[str, Any],
    *,
    runtime: dict[str, Any] | None = None,
    apply: dict[str, Any] | None = None,
) -> InferenceServiceSpec:
    raw: dict[str, Any] = {
        "target": {"name": "model"},
        "sla": {"p99LatencyMs": 200},
        "load": {"endpoint": {"port": 8443, **endpoint}},
    }
    if runtime is not None:
        raw["runtime"] = runtime
    if apply is not None:
        raw["apply"] = apply
    return parse_spec(raw)


HTTPS = {"path": "/v1/predict", "scheme": "https"}
TRITON = {"kind": "Triton", "model": "resnet"}


def test_http_is_the_default_and_keeps_the_reference_requests() -> None:
    s = spec({"path": "/v1/predict"})
    assert s.load.endpoint.scheme == "http"
    assert runtimes.pod_url(s, "10.1.2.3") == "http://10.1.2.3:8443"
    assert runtimes.load_protocol(s) is None


@pytest.mark.parametrize(
    ("endpoint", "runtime", "apply", "message"),
    [
        (
            {"path": "/p", "caBundle": TEST_CA_PEM},
            None,
            None,
            "load.endpoint.caBundle applies to scheme https only",
        ),
        (
            {"path": "/p", "serverName": SERVER_NAME},
            None,
            None,
            "load.endpoint.serverName applies to scheme https only",
        ),
        (
            {**HTTPS, "caBundle": "not a certificate"},
            None,
            None,
            "load.endpoint.caBundle: the load's CA bundle (text) is not usable: "
            "no PEM certificate block",
        ),
        ({**HTTPS, "serverName": "10.0.0.1:8443"}, None, None, "serverName"),
        ({**HTTPS, "scheme": "ftp"}, None, None, "scheme"),
        (
            {"scheme": "https"},
            TRITON,
            {"method": "Live"},
            "load.endpoint.scheme https takes apply.method Env, or Live with runtime.kind "
            "Reference",
        ),
        (
            HTTPS,
            None,
            {"method": "Live", "live": {"port": 8443, "path": "/admin/batching"}},
            "an apply.live port other than load.endpoint.port",
        ),
    ],
)
def test_bad_https_endpoints_are_refused_with_what_is_allowed(
    endpoint: dict[str, Any],
    runtime: dict[str, Any] | None,
    apply: dict[str, Any] | None,
    message: str,
) -> None:
    with pytest.raises(ValidationError) as refused:
        spec(endpoint, runtime=runtime, apply=apply)
    assert message in str(refused.value)


def test_https_with_live_admin_on_its_own_plain_port_is_accepted() -> None:
    s = spec(HTTPS, apply={"method": "Live", "live": {"port": 9000, "path": "/admin/batching"}})
    assert s.load.endpoint.scheme == "https"


def test_pod_urls_take_the_scheme_and_bracket_ipv6() -> None:
    s = spec(HTTPS)
    assert runtimes.pod_url(s, "10.1.2.3") == "https://10.1.2.3:8443"
    assert runtimes.pod_url(s, "fd00::1") == "https://[fd00::1]:8443"


def test_https_reference_requests_carry_the_bundle_and_the_server_name() -> None:
    s = spec({**HTTPS, "caBundle": TEST_CA_PEM, "serverName": SERVER_NAME})
    protocol = runtimes.load_protocol(s)
    assert protocol is not None
    assert protocol.path == REFERENCE_PATH
    assert protocol.ca_pem == TEST_CA_PEM
    assert protocol.server_name == SERVER_NAME
    context = protocol.tls()
    assert not isinstance(context, bool)
    assert context.check_hostname  # verification is never off
    assert len(context.get_ca_certs()) == 1


def test_https_without_a_bundle_verifies_with_the_system_trust_store() -> None:
    protocol = runtimes.load_protocol(spec(HTTPS))
    assert protocol is not None
    assert protocol.tls() is True
    assert protocol.server_name is None


def test_a_runtime_over_https_keeps_its_own_requests() -> None:
    s = spec({"scheme": "https", "serverName": SERVER_NAME}, runtime=TRITON, apply={})
    protocol = runtimes.load_protocol(s)
    assert protocol is not None
    assert protocol.path == "/v2/models/resnet/infer"
    assert protocol.server_name == SERVER_NAME


def test_the_server_name_travels_to_the_workers_in_the_share() -> None:
    protocol = runtimes.load_protocol(
        spec({**HTTPS, "caBundle": TEST_CA_PEM, "serverName": SERVER_NAME})
    )
    assert protocol is not None
    share = ShareSpec(
        urls=["https://10.1.2.3:8443"], rate=50.0, duration_s=1.0, mix=RequestMix.default(),
        arrival=as_arrival("constant"), timeout_s=1.0, seed=3,
    )  # fmt: skip
    carried = ShareSpec.model_validate_json(
        share.model_copy(update=forwarded_protocol(protocol, share)).model_dump_json()
    )
    assert carried.server_name == SERVER_NAME
    rebuilt = carried.protocol()
    assert rebuilt is not None
    assert rebuilt.server_name == SERVER_NAME
    assert rebuilt.ca_pem == TEST_CA_PEM
