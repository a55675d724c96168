"""The node agent's pure decisions: what it runs, with which environment and address."""

from __future__ import annotations

from typing import Any

import pytest

from .podspec import (
    ContainerState,
    Refused,
    bind_to_pod,
    container_env,
    expand,
    pod_status,
    project_argv,
    readiness_probe,
    restart_delay,
    restarts,
    scrape_target,
)

POD: dict[str, Any] = {
    "metadata": {"name": "server-abc", "namespace": "ns", "uid": "u1"},
    "spec": {"nodeName": "e2e-node", "containers": [{"name": "server"}]},
}


def test_project_cli_runs_under_the_project_interpreter() -> None:
    argv = project_argv({"command": ["batchpilot", "serve"], "args": ["--port", "80"]}, "/py")
    assert argv == ["/py", "-m", "batchpilot", "serve", "--port", "80"]
    assert project_argv({"command": ["python3", "-m", "batchpilot", "serve"]}, "/py") == [
        "/py",
        "-m",
        "batchpilot",
        "serve",
    ]
    # A module of the project, such as a runtime's container command.
    module = ["python", "-m", "batchpilot.runtimes.triton.serve", "--host", "0.0.0.0"]
    assert project_argv({"command": module}, "/py") == ["/py", *module[1:]]
    # No command: the image's entrypoint, the project's CLI.
    assert project_argv({"args": ["serve"]}, "/py") == ["/py", "-m", "batchpilot", "serve"]


@pytest.mark.parametrize(
    "command",
    [
        ["sh", "-c", "batchpilot serve"],
        ["python", "-c", "print(1)"],
        ["/bin/batchpilotx"],
        ["python", "-m", "batchpilotx"],
        ["python", "-m", "http.server"],
    ],
)
def test_anything_else_is_refused(command: list[str]) -> None:
    with pytest.raises(Refused, match="runs only the project's CLI"):
        project_argv({"name": "c", "command": command}, "/py")


def test_env_values_field_refs_and_expansion() -> None:
    container = {
        "env": [
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "URL", "value": "http://$(IP):80/$$x/$(MISSING)"},
        ]
    }
    env = container_env(container, POD, "127.9.9.9")
    assert env == {
        "IP": "127.9.9.9",
        "POD": "server-abc",
        "URL": "http://127.9.9.9:80/$x/$(MISSING)",
    }
    assert expand("$(IP)-$(IP)", env) == "127.9.9.9-127.9.9.9"


def test_secret_refs_are_refused() -> None:
    container = {"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    with pytest.raises(Refused, match="supports value and fieldRef"):
        container_env(container, POD, "127.9.9.9")


def test_wildcard_listen_address_becomes_the_pod_address() -> None:
    argv = ["serve", "--host", "0.0.0.0", "--bind=0.0.0.0", "--name=0.0.0.0x", "::"]
    assert bind_to_pod(argv, "127.5.5.5") == [
        "serve",
        "--host",
        "127.5.5.5",
        "--bind=127.5.5.5",
        "--name=0.0.0.0x",
        "127.5.5.5",
    ]


def test_readiness_probe_resolves_named_ports() -> None:
    container = {
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}},
    }
    probe = readiness_probe(container)
    assert probe is not None
    assert (probe.port, probe.path) == (8080, "/readyz")
    assert readiness_probe({}) is None
    with pytest.raises(Refused):
        readiness_probe({"readinessProbe": {"exec": {"command": ["true"]}}})


def test_scrape_target_follows_annotations() -> None:
    pod: dict[str, Any] = {
        "metadata": {"annotations": {}},
        "spec": {"containers": [{"ports": [{"containerPort": 8080}]}]},
    }
    assert scrape_target(pod, "127.1.1.1") == ("127.1.1.1:8080", "/metrics")
    pod["metadata"]["annotations"] = {"prometheus.io/port": "9090", "prometheus.io/path": "/m"}
    assert scrape_target(pod, "127.1.1.1") == ("127.1.1.1:9090", "/m")
    pod["metadata"]["annotations"] = {"prometheus.io/scrape": "false"}
    assert scrape_target(pod, "127.1.1.1") is None


def test_crash_loop_back_off_like_the_kubelet() -> None:
    assert [restart_delay(n) for n in range(7)] == [0, 10, 20, 40, 80, 160, 300]


def test_restart_policy() -> None:
    assert restarts("Always", 0)
    assert restarts("OnFailure", 1)
    assert not restarts("OnFailure", 0)
    assert not restarts("Never", 137)


def test_status_of_a_crashed_container_waits_with_last_exit() -> None:
    container = ContainerState(
        name="server",
        image="img",
        running_since=None,
        ready=False,
        restart_count=2,
        last_exit_code=137,
        waiting_reason="CrashLoopBackOff",
    )
    status = pod_status(
        phase="Running",
        pod_ip="127.1.1.1",
        host_ip="127.0.0.1",
        start_time="t0",
        container=container,
        ready_since="t1",
    )
    [entry] = status["containerStatuses"]
    assert entry["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert entry["lastState"]["terminated"]["exitCode"] == 137
    assert entry["restartCount"] == 2
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready == {"type": "Ready", "status": "False", "lastTransitionTime": "t1"}
