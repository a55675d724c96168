"""Pure decisions of the node agent: what a pod's container may run, with which
environment and address, and the pod status that describes it. No I/O here."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

Pod = dict[str, Any]

# The command the project's container image runs when a pod gives none (its ENTRYPOINT).
IMAGE_ENTRYPOINT = ("batchpilot",)
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "[::]")
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
FIELD_REFS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.podIP",
    "status.hostIP",
)
HOST_IP = "127.0.0.1"


# `metadata.labels['key']` and `metadata.annotations['key']` (the Job controller gives
# an Indexed Job's pods JOB_COMPLETION_INDEX from a label)
_MAP_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: Pod, path: str, pod_ip: str) -> str:
    """The value of a downward-API fieldRef (one of FIELD_REFS, or a label or
    annotation)."""
    mapped = _MAP_REF.match(path)
    if mapped is not None:
        return str((pod["metadata"].get(mapped.group(1)) or {}).get(mapped.group(2), ""))
    if path == "status.podIP":
        return pod_ip
    if path == "status.hostIP":
        return HOST_IP
    section, _, key = path.partition(".")
    return str(pod[section].get(key, ""))


class Refused(ValueError):
    """The agent will not run this container; the message says why and what it runs."""


def _project_module(names: Sequence[str]) -> bool:
    return bool(names) and (names[0] == "batchpilot" or names[0].startswith("batchpilot."))


def project_argv(container: Mapping[str, Any], python: str) -> list[str]:
    """The argv to run for `container`: only the project's own CLI (`batchpilot ...` or
    `python -m batchpilot ...`) or one of its modules (`python -m batchpilot.runtimes.
    triton.serve ...`), run by the project's interpreter. Anything else is
    refused: the agent executes pod specs from the API server on the test machine."""
    command = list(container.get("command") or IMAGE_ENTRYPOINT)
    args = list(container.get("args") or [])
    argv = command + args
    head = PurePosixPath(argv[0]).name
    if head == "batchpilot":
        return [python, "-m", "batchpilot", *argv[1:]]
    if head.startswith("python") and argv[1:2] == ["-m"] and _project_module(argv[2:3]):
        return [python, *argv[1:]]
    raise Refused(
        f"container {container.get('name')!r} runs {argv[0]!r}: the e2e node agent runs only "
        "the project's CLI (`batchpilot ...` or `python -m batchpilot ...`)"
    )


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, `$$` escapes `$`,
    unknown references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(replace, value)


def bind_to_pod(argv: Sequence[str], pod_ip: str) -> list[str]:
    """Stand in for the pod's network namespace: a wildcard listen address would bind
    every loopback address of the test machine, so it becomes the pod's own address."""
    out: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if arg in WILDCARD_ADDRESSES:
            out.append(pod_ip)
        elif sep and key.startswith("-") and value in WILDCARD_ADDRESSES:
            out.append(f"{key}={pod_ip}")
        else:
            out.append(arg)
    return out


def container_env(
    container: Mapping[str, Any],
    pod: Pod,
    pod_ip: str,
    secret_value: Callable[[str, str], str] | None = None,
) -> dict[str, str]:
    """The container's environment as the kubelet would build it from `env`;
    `secret_value(secret, key)` reads a secretKeyRef from the pod's namespace."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        secret_ref = (item["valueFrom"] or {}).get("secretKeyRef")
        if secret_ref is not None and secret_value is not None:
            env[name] = secret_value(str(secret_ref["name"]), str(secret_ref["key"]))
            continue
        field_ref = (item["valueFrom"] or {}).get("fieldRef")
        path = field_ref.get("fieldPath") if field_ref else None
        if path not in FIELD_REFS and not (path and _MAP_REF.match(path)):
            raise Refused(
                f"env {name}: the e2e node agent supports value and fieldRef "
                f"({', '.join(FIELD_REFS)}), not {item['valueFrom']!r}"
            )
        env[name] = field_value(pod, path, pod_ip)
    if container.get("envFrom"):
        raise Refused("envFrom is not supported by the e2e node agent")
    return env


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    """Named container ports (unnamed ones under their number)."""
    ports: dict[str, int] = {}
    for port in container.get("ports") or []:
        number = int(port["containerPort"])
        ports[str(port.get("name") or number)] = number
    return ports


@dataclass(frozen=True)
class HttpProbe:
    port: int
    path: str


def readiness_probe(container: Mapping[str, Any]) -> HttpProbe | None:
    """The container's HTTP readiness probe, named ports resolved; None when it has none
    (then the container is ready as soon as it runs)."""
    probe = container.get("readinessProbe")
    if not probe:
        return None
    http = probe.get("httpGet")
    if http is None:
        raise Refused("the e2e node agent supports only httpGet readiness probes")
    port = http["port"]
    if isinstance(port, str) and not port.isdigit():
        named = container_ports(container)
        if port not in named:
            raise Refused(f"readiness probe port {port!r} is not a named container port")
        port = named[port]
    return HttpProbe(port=int(port), path=str(http.get("path") or "/"))


def scrape_target(pod: Pod, pod_ip: str) -> tuple[str, str] | None:
    """(address, metrics path) Prometheus should scrape for `pod`, by the usual
    prometheus.io/* annotations, else the first container port and /metrics."""
    annotations = pod["metadata"].get("annotations") or {}
    if annotations.get("prometheus.io/scrape") == "false":
        return None
    port = annotations.get("prometheus.io/port")
    if port is None:
        containers = pod["spec"].get("containers") or []
        ports = container_ports(containers[0]) if containers else {}
        if not ports:
            return None
        port = str(next(iter(ports.values())))
    return f"{pod_ip}:{port}", annotations.get("prometheus.io/path", "/metrics")


@dataclass(frozen=True)
class ContainerState:
    """What the agent knows of the pod's (single served) container."""

    name: str
    image: str
    running_since: str | None  # RFC 3339; None while waiting to (re)start
    ready: bool
    restart_count: int
    last_exit_code: int | None = None
    last_finished_at: str | None = None
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""


def _condition(kind: str, status: bool, since: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if status else "False", "lastTransitionTime": since}


def pod_status(
    *,
    phase: str,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    container: ContainerState,
    ready_since: str,
) -> dict[str, Any]:
    """The status a kubelet would post for a one-container pod."""
    state: dict[str, Any]
    if container.running_since is not None:
        state = {"running": {"startedAt": container.running_since}}
    else:
        waiting: dict[str, str] = {"reason": container.waiting_reason}
        if container.waiting_message:
            waiting["message"] = container.waiting_message
        state = {"waiting": waiting}
    status: dict[str, Any] = {
        "name": container.name,
        "image": container.image,
        "imageID": "",
        "ready": container.ready,
        "started": container.running_since is not None,
        "restartCount": container.restart_count,
        "state": state,
    }
    if container.last_exit_code is not None:
        status["lastState"] = {
            "terminated": {
                "exitCode": container.last_exit_code,
                "reason": "Completed" if container.last_exit_code == 0 else "Error",
                "finishedAt": container.last_finished_at or start_time,
            }
        }
    return {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "conditions": [
            _condition("PodScheduled", True, start_time),
            _condition("Initialized", True, start_time),
            _condition("ContainersReady", container.ready, ready_since),
            _condition("Ready", container.ready, ready_since),
        ],
        "containerStatuses": [status],
    }


# The kubelet's crash-loop back-off: a first crash restarts at once, later ones wait
# 10 s, doubling, up to 300 s.
BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 300.0


def restart_delay(restarts_so_far: int) -> float:
    """Seconds before the kubelet restarts a container that has already been restarted
    `restarts_so_far` times and just exited again."""
    if restarts_so_far == 0:
        return 0.0
    return float(min(BACKOFF_BASE_S * 2 ** (restarts_so_far - 1), BACKOFF_CAP_S))


def restarts(policy: str, exit_code: int) -> bool:
    """Whether the kubelet restarts a container that exited with `exit_code`."""
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)
