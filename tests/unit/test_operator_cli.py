"""`batchpilot operator` rejects bad options with one line and a non-zero exit."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchpilot.cli import main
from batchpilot.operator.cli import election_settings
from batchpilot.operator.policy import PlatformPolicy


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-n", "Bad_Namespace"], "--namespace 'Bad_Namespace' is not a namespace name"),
        (["--liveness", "healthz"], "--liveness 'healthz' is not a URL"),
        (
            ["--leader-election", "--lease-namespace", "ops", "--lease-duration", "6"],
            "must be at most a third of the lease duration (6 s)",
        ),
        (
            ["--leader-election", "--lease-namespace", "ops", "--renew-period", "0.05"],
            "the renew period must be at least 0.2 s",
        ),
        (
            ["--leader-election", "--lease-namespace", "ops", "--lease-duration", "0"],
            "the lease duration must be 1 to 300 s",
        ),
        (["--leader-election", "--lease-namespace", "Ops"], "'Ops' is not a namespace name"),
        (["--leader-election", "--lease-namespace", "o", "--lease-name", "A"], "'A' is not"),
        (["--leader-election", "--lease-namespace", "ops", "--peering"], "use one"),
        (["--prometheus-allow", "http://prom:9090"], "--prometheus-allow 'http://prom:9090' is"),
        (["--prometheus-allow", "10.0.0.0/33"], "neither a CIDR"),
    ],
)
def test_bad_options_are_one_line_on_stderr(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, ["operator", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert expected in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--metrics-port", "70000"],
        ["--max-concurrent-trials", "0"],
        ["--max-trial-deadline-seconds", "5"],
        ["--bogus"],
    ],
)
def test_click_errors_are_one_line_too(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["operator", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert args[0] in lines[0]


def test_operator_is_registered() -> None:
    result = CliRunner().invoke(main, ["operator", "--help"])
    assert result.exit_code == 0
    for option in (
        "--namespace",
        "--all-namespaces",
        "--liveness",
        "--metrics-port",
        "--standalone",
    ):
        assert option in result.output


def test_leader_election_needs_a_namespace_for_its_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(
        "batchpilot.operator.cli.SERVICE_ACCOUNT_NAMESPACE", Path("/nonexistent/namespace")
    )
    result = CliRunner().invoke(main, ["operator", "--leader-election"])
    assert result.exit_code == 2
    assert "needs the namespace of its Lease" in result.stderr


def test_election_settings_take_the_pod_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "batchpilot-system")
    settings = election_settings(True, True, "bp", "", 10, 2.0)
    assert settings is not None
    assert (settings.namespace, settings.name, settings.duration_s, settings.renew_s) == (
        "batchpilot-system",
        "bp",
        10,
        2.0,
    )
    other = election_settings(True, True, "bp", "", 10, 2.0)
    assert other is not None
    assert other.identity != settings.identity
    assert election_settings(False, True, "bp", "", 10, 2.0) is None


def test_the_platform_flags_reach_the_handlers_as_the_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kopf

    ran: list[kopf.Memo] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: ran.append(kwargs["memo"]))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    result = CliRunner().invoke(
        main,
        [
            "operator",
            "--metrics-port=0",
            "--prometheus-allow=127.0.0.0/8",
            "--prometheus-allow=Prom.Local",
            "--max-trial-deadline-seconds=600",
        ],
    )
    assert result.exit_code == 0, result.output
    policy = ran[0]["policy"]
    assert policy == PlatformPolicy(
        allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),),
        allowed_hosts=frozenset({"prom.local"}),
        api_server_addresses=frozenset({"10.96.0.1"}),
        max_trial_deadline_s=600,
    )


def test_without_the_flags_the_policy_is_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    ran: list[kopf.Memo] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: ran.append(kwargs["memo"]))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(main, ["operator", "--metrics-port=0"])
    assert result.exit_code == 0, result.output
    assert ran[0]["policy"] == PlatformPolicy(max_trial_deadline_s=3600)
