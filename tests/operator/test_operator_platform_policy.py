"""The platform team's limits, set by operator flags and not by the tenant, against KMock:
a load.prometheus.url on link-local, loopback or the API server, and a trial deadline
over `--max-trial-deadline-seconds`, are refused with SpecValid=False and Stalled=True
whose message says what was refused, why and which flag allows it; nothing is applied.
`--prometheus-allow` lets such a Prometheus through."""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from opsupport import (
    ISVC,
    NAMESPACE,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    events_of,
    eventually,
    isvc,
    phase_is,
    status_of,
)

from batchpilot.operator.platform import policy_from_flags

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(60),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]

LOAD = {"endpoint": {"port": 8080, "path": "/v1/predict"}, "maxRps": 1000}


def condition(status: dict[str, Any], type: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type)


def prometheus_load(url: str) -> dict[str, Any]:
    return {**LOAD, "source": "prometheus", "prometheus": {"url": url}}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data", "is link-local"),
        ("http://[fe80::1]:9090", "is link-local"),
        ("http://127.0.0.1:9090", "is loopback"),
        ("http://localhost:9090", "is loopback"),
        ("https://kubernetes.default.svc", "is the Kubernetes API server"),
    ],
)
async def test_a_denied_prometheus_url_is_refused_by_default(
    kmock: kmock.KubernetesEmulator,
    operator: Operator,
    cluster: FakeCluster,
    url: str,
    why: str,
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(load=prometheus_load(url))
    async with operator(policy=policy_from_flags([], environ={})):
        await eventually(lambda: phase_is(kmock, "Failed"), what="refusal reported")
        status = status_of(kmock)
        valid = condition(status, "SpecValid")
        assert valid["status"] == "False"
        assert valid["reason"] == "PrometheusURLRefused"
        assert "load.prometheus.url" in valid["message"]
        assert why in valid["message"]
        assert "--prometheus-allow" in valid["message"]
        stalled = condition(status, "Stalled")
        assert stalled["status"] == "True"
        assert stalled["reason"] == "PrometheusURLRefused"
        await eventually(
            lambda: any(e["reason"] == "PrometheusURLRefused" for e in events_of(kmock)),
            what="event posted",
        )
    assert cluster.applied == []
    assert cluster.lookups == 0  # refused before the study touches the target


async def test_the_api_server_address_is_refused_too(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(load=prometheus_load("https://10.96.0.1"))
    policy = policy_from_flags([], environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    async with operator(policy=policy):
        await eventually(lambda: phase_is(kmock, "Failed"), what="refusal reported")
        message = condition(status_of(kmock), "SpecValid")["message"]
        assert "10.96.0.1 is the Kubernetes API server" in message
    assert cluster.applied == []


async def test_the_allow_list_lets_a_loopback_prometheus_through(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        load=prometheus_load("http://127.0.0.1:9090"), tuning={"strategy": "Canary", "maxTrials": 2}
    )
    async with operator(policy=policy_from_flags(["127.0.0.0/8"], environ={})):
        await eventually(lambda: len(cluster.applied) >= 1, what="a trial applied")
        valid = condition(status_of(kmock), "SpecValid")
        assert valid["status"] == "True"


async def test_a_trial_deadline_over_the_cap_is_refused_naming_the_cap_and_the_flag(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "Canary", "maxTrials": 4, "trialDeadlineSeconds": 86400}
    )
    async with operator(policy=policy_from_flags([], 3600, environ={})):
        await eventually(lambda: phase_is(kmock, "Failed"), what="refusal reported")
        status = status_of(kmock)
        valid = condition(status, "SpecValid")
        assert valid["status"] == "False"
        assert valid["reason"] == "TrialDeadlineOverCap"
        assert "tuning.trialDeadlineSeconds 86400 refused" in valid["message"]
        assert "cap is 3600 s" in valid["message"]
        assert "--max-trial-deadline-seconds" in valid["message"]
        assert condition(status, "Stalled")["status"] == "True"
    assert cluster.applied == []


async def test_a_trial_deadline_within_the_cap_runs(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    kmock.objects[ISVC, NAMESPACE, "resnet"] = isvc(
        tuning={"strategy": "Canary", "maxTrials": 2, "trialDeadlineSeconds": 7200}
    )
    async with operator(policy=policy_from_flags([], 7200, environ={})):
        await eventually(lambda: len(cluster.applied) >= 1, what="a trial applied")
