"""Steps the scenarios share: deploy the reference server, start a study, read it."""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from pathlib import Path
from typing import Any, Self

from .conftest import Cluster
from .operatorproc import OperatorProcess
from .study import wait_for
from .workloads import SERVER_PORT, dump, server_deployment

FINISHED = ("Complete", "Pruned", "Infeasible")
STUDY_TIMEOUT_S = 240.0
DESCRIBE_DIR_ENV = "BATCHPILOT_DESCRIBE_DIR"


class Poller:
    """Calls `poll` every `interval_s` on a thread of its own while its `with` block runs
    (a study, say): the scenarios' spies and stand-in controllers."""

    interval_s = 0.25
    join_s = 10.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.join_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def poll(self) -> None:
        raise NotImplementedError


def deploy_server(cluster: Cluster, namespace: str, name: str = "server", **kwargs: Any) -> None:
    cluster.kubectl.apply(dump(server_deployment(name, **kwargs)), "-n", namespace)
    cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=120s")


def describe(cluster: Cluster, namespace: str, name: str, label: str) -> str:
    """`kubectl describe inferenceservice`, also saved as `<label>.txt` under
    $BATCHPILOT_DESCRIBE_DIR (else the session's work directory): the examples of a
    failed, a rolled-back and a converged study in docs/operator/kubectl.md are these
    files."""
    text = cluster.kubectl("describe", "inferenceservice", name, "-n", namespace)
    chosen = os.environ.get(DESCRIBE_DIR_ENV)
    directory = Path(chosen) if chosen else cluster.workdir / "describe"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{label}.txt").write_text(text)
    return text


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl.json(
        "get", "pods", "-n", namespace, "-l", selector
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def live_config(pod: dict[str, Any]) -> dict[str, Any]:
    url = f"http://{pod['status']['podIP']}:{SERVER_PORT}/admin/batching"
    with urllib.request.urlopen(url, timeout=5) as response:
        config: dict[str, Any] = json.load(response)
    return config


def study_lines(isvc: dict[str, Any]) -> list[str]:
    """One InferenceService in a few lines: its phase and message, then each trial's
    configuration, state, score and reason."""
    meta, status = isvc["metadata"], isvc.get("status") or {}
    lines = [
        f"{meta.get('namespace', '')}/{meta['name']}: phase={status.get('phase')} "
        f"message={status.get('message', '')!r}"
    ]
    for trial in status.get("trials") or []:
        lines.append(
            f"  trial {trial.get('number')} {trial.get('state')} {trial.get('params')} "
            f"rps={trial.get('effectiveRps')} p99={trial.get('p99Ms')} "
            f"errors={trial.get('errorRate')} reason={trial.get('reason', '')!r}"
        )
    return lines


def diagnostics(cluster: Cluster, operator: OperatorProcess | None = None) -> str:
    """What a failing scenario prints: first each study in a few lines (a log that keeps
    only the head of a failure still says what the trials did), then every
    InferenceService whole, the cluster's events, the control plane's and the operator's
    logs."""
    kubectl = cluster.kubectl
    listed = kubectl.run("get", "inferenceservices", "-A", "-o", "json", check=False)
    try:
        studies = [line for i in json.loads(listed.stdout)["items"] for line in study_lines(i)]
    except (ValueError, KeyError):
        studies = [f"(not readable: {listed.stderr.strip()[:300]})"]
    parts = [
        "--- studies ---",
        *studies,
        "--- inferenceservices ---",
        kubectl.run("get", "inferenceservices", "-A", "-o", "yaml", check=False).stdout[-6000:],
        "--- events ---",
        kubectl.run("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout[-4000:],
        cluster.diagnostics(),
    ]
    if operator is not None:
        parts.append(f"--- operator ---\n{operator.output()}")
    return "\n".join(parts)


def wait_converged(
    cluster: Cluster, namespace: str, name: str, operator: OperatorProcess
) -> dict[str, Any]:
    return wait_for(
        cluster.kubectl,
        namespace,
        name,
        lambda s: s.get("phase") in ("Converged", "Failed"),
        what="finished",
        timeout_s=STUDY_TIMEOUT_S,
        diagnostics=lambda: diagnostics(cluster, operator),
    )


def wait_running_trial(
    cluster: Cluster, namespace: str, name: str, operator: OperatorProcess, at_least: int = 1
) -> int:
    """Wait until trial number >= `at_least` is running; its number."""
    status = wait_for(
        cluster.kubectl,
        namespace,
        name,
        lambda s: any(
            t["state"] == "Running" and t["number"] >= at_least for t in s.get("trials") or []
        ),
        what=f"running trial {at_least}",
        timeout_s=STUDY_TIMEOUT_S,
        diagnostics=lambda: diagnostics(cluster, operator),
    )
    return max(int(t["number"]) for t in status["trials"] if t["state"] == "Running")


def finished_trials(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in status.get("trials") or [] if t["state"] in FINISHED]


def gap_free(status: dict[str, Any]) -> bool:
    numbers = [int(t["number"]) for t in status.get("trials") or []]
    return sorted(numbers) == list(range(len(numbers)))


def table_cells(header: str, row: str) -> dict[str, str]:
    """kubectl's aligned table row by column name: a blank cell stays a blank string,
    where splitting on spaces would drop it and shift the cells after it."""
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    bounds = [*starts[1:], len(row) + 1]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, bounds, strict=True)}
