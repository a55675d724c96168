"""What a Prometheus URL and CA bundle may be, in the CLI's and the operator's checks
(the API server's CEL twins are in tests/e2e/test_validation.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.capacity.prometheus import PrometheusStepSource
from batchpilot.capacity.prometheus_http import (
    PrometheusQueryError,
    check_prometheus_url,
    display_url,
    tls_context,
)
from batchpilot.operator.spec import PrometheusSpec


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://prometheus:9090/#/graph", "has a fragment ('#')"),
        ("http://prometheus:9090/prom#", "has a fragment ('#')"),
        ("https://prometheus/api?x=1", "has a query ('?')"),
        ("ftp://prometheus:9090", "expected http(s)://HOST[:PORT][/PATH]"),
        ("http://", "expected http(s)://HOST[:PORT][/PATH]"),
        ("prometheus:9090", "expected http(s)://HOST[:PORT][/PATH]"),
    ],
)
def test_bad_urls_are_refused_saying_why(url: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="Prometheus URL") as caught:
        check_prometheus_url(url)
    assert fragment in str(caught.value)


def test_good_urls_lose_the_trailing_slash_only() -> None:
    assert check_prometheus_url(" https://prom.example:9090/prometheus/ ") == (
        "https://prom.example:9090/prometheus"
    )
    assert check_prometheus_url("http://10.0.0.1:9090") == "http://10.0.0.1:9090"


def test_messages_never_show_a_password() -> None:
    assert display_url("https://user:s3cret@prom:9090/x") == "https://prom:9090/x"
    with pytest.raises(ValueError, match="fragment") as caught:
        check_prometheus_url("https://user:s3cret@prom:9090/#x")
    assert "s3cret" not in str(caught.value)


def test_the_source_refuses_a_fragment_before_any_query() -> None:
    with pytest.raises(ValueError, match="fragment"):
        PrometheusStepSource("http://127.0.0.1:9/#/api")


@pytest.mark.parametrize(
    ("pem", "fragment"),
    [
        ("not a certificate", "no PEM certificate block"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not usable"),
    ],
)
def test_a_ca_bundle_that_does_not_parse_is_refused(pem: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="CA bundle") as caught:
        tls_context(ca_pem=pem)
    assert fragment in str(caught.value)


def test_a_missing_ca_file_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\(file /nonexistent/ca.pem\) is not usable"):
        tls_context(ca_file="/nonexistent/ca.pem")


def test_verification_is_on_by_default() -> None:
    import ssl

    context = tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_query_errors_keep_the_body_out_of_the_message() -> None:
    error = PrometheusQueryError("Prometheus at x answered query with HTTP 400", body_excerpt="b")
    assert str(error) == "Prometheus at x answered query with HTTP 400"
    assert error.body_excerpt == "b"


def _spec(**prometheus: Any) -> PrometheusSpec:
    return PrometheusSpec.model_validate(prometheus)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"url": "http://prometheus:9090/#/"}, "load.prometheus.url: Prometheus URL"),
        ({"url": "http://prometheus:9090/?a=b"}, "has a query"),
        (
            {"url": "http://prometheus:9090", "caBundle": "-----BEGIN CERTIFICATE-----"},
            "caBundle applies to https:// URLs only",
        ),
        ({"url": "https://prometheus:9090", "caBundle": "junk"}, "load.prometheus.caBundle"),
    ],
)
def test_the_spec_refuses_what_the_crd_refuses(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _spec(**fields)
    assert fragment in str(caught.value)


def test_the_crd_carries_the_url_rules() -> None:
    schema = PrometheusSpec.model_json_schema()
    rules = {rule["rule"] for rule in schema["x-kubernetes-validations"]}
    assert "!self.url.contains('#') && !self.url.contains('?')" in rules
    assert "!has(self.caBundle) || self.url.startsWith('https://')" in rules
