"""The platform team's limits on tenants' specs, decided without I/O: which Prometheus
hosts the operator refuses to query (loopback, link-local, the API server; by name and by
every address the name resolves to, IPv6 and IPv4-mapped included) and what
`--prometheus-allow` lets through; the cap on trial deadlines."""

from __future__ import annotations

import ipaddress

import pytest

from batchpilot.operator.policy import (
    PlatformPolicy,
    parse_allow,
    prometheus_refusal,
    trial_deadline_refusal,
)

DEFAULT = PlatformPolicy(api_server_addresses=frozenset({"10.96.0.1"}))


def allowing(*entries: str) -> PlatformPolicy:
    networks, hosts = parse_allow(entries)
    return PlatformPolicy(
        allowed_networks=networks,
        allowed_hosts=hosts,
        api_server_addresses=DEFAULT.api_server_addresses,
    )


@pytest.mark.parametrize(
    ("host", "addresses", "why"),
    [
        ("127.0.0.1", [], "is loopback"),
        ("127.1.2.3", [], "is loopback"),
        ("::1", [], "is loopback"),
        ("[::1]", [], "is loopback"),
        ("0.0.0.0", [], "is loopback"),
        ("localhost", ["127.0.0.1"], "is loopback"),
        ("LOCALHOST.", [], "is loopback"),
        ("prom.localhost", [], "is loopback"),
        ("169.254.169.254", [], "is link-local"),
        ("fe80::1", [], "is link-local"),
        ("fe80::1%eth0", [], "is link-local"),
        ("::ffff:169.254.169.254", [], "is link-local"),
        ("kubernetes", [], "is the Kubernetes API server"),
        ("kubernetes.default", [], "is the Kubernetes API server"),
        ("kubernetes.default.svc.cluster.local", [], "is the Kubernetes API server"),
        ("10.96.0.1", [], "is the Kubernetes API server"),
    ],
)
def test_denied_hosts_are_refused_by_default(host: str, addresses: list[str], why: str) -> None:
    refusal = prometheus_refusal(host, addresses, DEFAULT)
    assert refusal is not None
    assert why in refusal
    assert "refused" in refusal
    assert "--prometheus-allow" in refusal


@pytest.mark.parametrize(
    ("addresses", "shown"),
    [
        (["169.254.169.254"], "169.254.169.254"),
        (["10.0.0.7", "169.254.169.254"], "169.254.169.254"),  # every address is checked
        (["fe80::a9fe:a9fe"], "fe80::a9fe:a9fe"),
        (["::ffff:a9fe:a9fe"], "169.254.169.254"),
        (["127.0.0.53"], "127.0.0.53"),
        (["10.96.0.1"], "10.96.0.1"),
    ],
)
def test_a_name_that_resolves_to_a_denied_address_is_refused(
    addresses: list[str], shown: str
) -> None:
    refusal = prometheus_refusal("metrics.evil.example", addresses, DEFAULT, url="http://x")
    assert refusal is not None
    assert f"metrics.evil.example resolves to {shown}, which is" in refusal
    assert "load.prometheus.url 'http://x' refused" in refusal


@pytest.mark.parametrize(
    ("host", "addresses"),
    [
        ("prometheus.monitoring.svc", ["10.0.12.4"]),
        ("10.0.12.4", []),
        ("fd00::12", []),
        ("2001:db8::1", []),
        ("prometheus.example.com", ["203.0.113.9", "2001:db8::9"]),
        ("not-resolved.example", []),  # nothing to check yet: the connection checks again
    ],
)
def test_ordinary_hosts_are_allowed(host: str, addresses: list[str]) -> None:
    assert prometheus_refusal(host, addresses, DEFAULT) is None


def test_the_allow_list_takes_cidrs_addresses_and_host_names() -> None:
    loopback = allowing("127.0.0.0/8")
    assert prometheus_refusal("127.0.0.1", [], loopback) is None
    assert prometheus_refusal("localhost", ["127.0.0.1"], loopback) is not None  # the name
    assert prometheus_refusal("local.test", ["127.0.0.1"], loopback) is None
    assert prometheus_refusal("::1", [], loopback) is not None  # an IPv4 CIDR only
    assert prometheus_refusal("::1", [], allowing("::1")) is None
    assert prometheus_refusal("fe80::5", [], allowing("fe80::/64")) is None
    assert prometheus_refusal("169.254.169.254", [], allowing("169.254.1.0/24")) is not None
    by_name = allowing("localhost", "Kubernetes.Default.")
    assert prometheus_refusal("localhost", ["127.0.0.1", "::1"], by_name) is None
    assert prometheus_refusal("kubernetes.default", [], by_name) is None
    assert prometheus_refusal("kubernetes", [], by_name) is not None
    # a CIDR covers one address of a name, not another
    partly = allowing("127.0.0.0/8")
    refusal = prometheus_refusal("two.test", ["127.0.0.1", "169.254.169.254"], partly)
    assert refusal is not None
    assert "169.254.169.254" in refusal


def test_the_allow_list_parses_and_refuses_what_it_cannot_read() -> None:
    networks, hosts = parse_allow(["10.0.0.0/8", "fd00::/8", "127.0.0.1", " Prom.Example. "])
    assert networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
        ipaddress.ip_network("127.0.0.1/32"),
    )
    assert hosts == frozenset({"prom.example"})
    for bad in ["10.0.0.0/33", "not a host", "http://prom:9090", "", "a..b"]:
        with pytest.raises(ValueError, match="--prometheus-allow"):
            parse_allow([bad])


def test_trial_deadlines_past_the_cap_are_refused_naming_the_cap_and_the_flag() -> None:
    policy = PlatformPolicy(max_trial_deadline_s=3600)
    assert trial_deadline_refusal(3600, policy) is None
    assert trial_deadline_refusal(900, policy) is None
    refusal = trial_deadline_refusal(86400, policy)
    assert refusal is not None
    assert "tuning.trialDeadlineSeconds 86400 refused" in refusal
    assert "cap is 3600 s" in refusal
    assert "--max-trial-deadline-seconds" in refusal
