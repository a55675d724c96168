"""What a study through the operator costs: the time a user waits for a tuned service,
and what the operator takes from the cluster meanwhile.

Starts the e2e tier's local cluster (tests/e2e/harness.py: etcd, kube-apiserver,
kube-controller-manager, Prometheus and the node agent that runs pods as local
processes), the CRDs and the operator's ServiceAccount and RBAC from manifests/cluster-wide,
and `batchpilot operator` with a token of that ServiceAccount. Then, per repeat, in a
fresh namespace and with a fresh operator process, applies manifests/samples as they
are (the reference server as a Deployment with its Service, and the InferenceService
with its default tuning and load settings; only `tuning.maxTrials` is replaced when
--max-trials is given) and waits until the study ends.

    python benchmarks/operator_study.py [--json] [--max-trials N] [--repeats 1]
        [--timeout-s 3600]

Per study: wall_s_to_converged (the InferenceService applied until its phase is
Converged, the write-back's watch included), trials (finished trials, baseline
included), baseline_rps and best_rps (status.baseline / status.best effectiveRps),
gain_lcb_pct (status.best.gainLowPercent: the lower bound of the confirmed gain over
the incumbent, the rule a write-back follows), operator_rss_mb_max (VmRSS of the
operator's process group, the operator and any load workers it starts, sampled every
0.5 s) and api_requests: the operator's requests to the API server, counted from the
API server's audit log (one event per request, by auditID, for the operator's
ServiceAccount user; watches count once). The top level holds the medians over the
repeats. Figures move with whatever else runs on the machine."""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from rich.console import Console

import results

REPO = Path(__file__).resolve().parents[1]
# The e2e harness is a package of the test tree, not of the installed project.
sys.path.insert(0, str(REPO / "tests"))

from e2e.harness import (  # noqa: E402
    OPERATOR_ARGS,
    Cluster,
    OperatorIdentity,
    apply_crds,
    apply_operator_identity,
    create_namespace,
    local_cluster,
)
from e2e.operatorproc import OperatorProcess  # noqa: E402
from e2e.study import status as read_status  # noqa: E402
from e2e.workloads import dump  # noqa: E402

ENDED = ("Converged", "Failed", "RolledBack")
SAMPLE_INTERVAL_S = 0.5
# Metadata level: who asked for what, no bodies. Only ServiceAccounts are logged (the
# operator runs as one); the count keeps the operator's own user.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


class Study(BaseModel):
    phase: str
    wall_s_to_converged: float | None  # None: the study did not converge
    wall_s_to_end: float  # to whichever phase ended it, or to the timeout
    trials: int
    baseline_rps: float | None
    best_rps: float | None
    gain_lcb_pct: float | None
    best: dict[str, float | int] | None
    operator_rss_mb_max: float
    api_requests: int
    api_requests_by_verb: dict[str, int]
    message: str


class Report(BaseModel):
    wall_s_to_converged: float | None
    trials: float
    baseline_rps: float | None
    best_rps: float | None
    gain_lcb_pct: float | None
    operator_rss_mb_max: float
    api_requests: float
    max_trials: int | None  # None: the sample's own
    repeats: int
    sample_changes: list[str]
    api_requests_counted_by: str
    runs: list[Study]


def group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in group `pgid`, MB."""
    total_kb = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # the fields after the command name, which may hold spaces: state ppid pgrp
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the process ended between the listing and the read
    return total_kb / 1024


class RssSampler:
    """The largest resident memory of a process group, sampled on a thread of its own."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.max_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.max_mb = max(self.max_mb, group_rss_mb(self.pgid))
            self._stop.wait(SAMPLE_INTERVAL_S)


def _timestamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def count_requests(audit_log: Path, user: str, since: datetime) -> collections.Counter[str]:
    """The requests `user` made from `since` on, by verb: one per auditID (a watch logs
    ResponseStarted and ResponseComplete under one ID)."""
    verbs: dict[str, str] = {}
    with audit_log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("user", {}).get("username") != user:
                continue
            if _timestamp(event["requestReceivedTimestamp"]) < since:
                continue
            verbs[event["auditID"]] = event["verb"]
    return collections.Counter(verbs.values())


def sample_documents(
    cluster: Cluster, max_trials: int | None, p99_ms: float | None
) -> list[dict[str, Any]]:
    rendered = cluster.kubectl("kustomize", str(REPO / "manifests" / "samples"))
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    for doc in documents:
        if doc["kind"] != "InferenceService":
            continue
        if max_trials is not None:
            doc["spec"].setdefault("tuning", {})["maxTrials"] = max_trials
        if p99_ms is not None:
            doc["spec"]["sla"]["p99LatencyMs"] = p99_ms
    return documents


def sample_changes(max_trials: int | None, p99_ms: float | None) -> list[str]:
    """What the run changed in the sample InferenceService, for the report."""
    isvc = yaml.safe_load((REPO / "manifests" / "samples" / "inferenceservice.yaml").read_text())
    changes = []
    own_trials = int(isvc["spec"].get("tuning", {}).get("maxTrials", 20))
    if max_trials is not None and max_trials != own_trials:
        changes.append(f"tuning.maxTrials {own_trials} -> {max_trials}")
    own_p99 = isvc["spec"]["sla"]["p99LatencyMs"]
    if p99_ms is not None and p99_ms != own_p99:
        changes.append(f"sla.p99LatencyMs {own_p99:g} -> {p99_ms:g}")
    return changes


def run_study(
    cluster: Cluster,
    identity: OperatorIdentity,
    audit_log: Path,
    max_trials: int | None,
    p99_ms: float | None,
    timeout_s: float,
    console: Console,
) -> Study:
    namespace = f"study-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, namespace)
    operator = OperatorProcess(
        identity.kubeconfig, cluster.workdir / f"operator-{namespace}.log", OPERATOR_ARGS
    )
    documents = sample_documents(cluster, max_trials, p99_ms)
    [isvc] = [d for d in documents if d["kind"] == "InferenceService"]
    name = isvc["metadata"]["name"]
    started_at = datetime.now().astimezone()
    operator.start()
    assert operator.proc is not None
    try:
        with RssSampler(operator.proc.pid) as rss:
            start = time.monotonic()
            cluster.kubectl.apply(dump(*documents), "-n", namespace)
            deadline = start + timeout_s
            status: dict[str, Any] = {}
            last_note = ""
            while time.monotonic() < deadline:
                status = read_status(cluster.kubectl, namespace, name)
                note = f"{status.get('phase')} {status.get('trialsProgress') or ''}"
                if note != last_note:
                    console.print(f"[dim]{time.monotonic() - start:7.1f} s  {note}[/]")
                    last_note = note
                if status.get("phase") in ENDED:
                    break
                time.sleep(1.0)
            wall_s = time.monotonic() - start
        verbs = count_requests(audit_log, identity.user, started_at)
    finally:
        cluster.kubectl.run(
            "delete", "inferenceservices", "--all", "-n", namespace, "--timeout=120s", check=False
        )
        operator.stop()
        cluster.kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)
    phase = str(status.get("phase"))
    if phase not in ENDED:
        console.print(f"[yellow]not ended within {timeout_s:g} s; operator log tail:[/]")
        console.print(operator.output(2000), markup=False)
    baseline = status.get("baseline") or {}
    best = status.get("best") or {}
    finished = [t for t in status.get("trials") or [] if t.get("state") != "Running"]
    summary = status.get("trialsSummary") or {}
    return Study(
        phase=phase,
        wall_s_to_converged=round(wall_s, 1) if phase == "Converged" else None,
        wall_s_to_end=round(wall_s, 1),
        trials=len(finished) + int(summary.get("count") or 0),
        baseline_rps=baseline.get("effectiveRps"),
        best_rps=best.get("effectiveRps"),
        gain_lcb_pct=best.get("gainLowPercent"),
        best={k: best[k] for k in ("maxBatchSize", "maxQueueTimeMs") if k in best} or None,
        operator_rss_mb_max=round(rss.max_mb, 1),
        api_requests=sum(verbs.values()),
        api_requests_by_verb=dict(sorted(verbs.items())),
        message=str(status.get("message", "")),
    )


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def run(
    max_trials: int | None,
    p99_ms: float | None,
    repeats: int,
    timeout_s: float,
    console: Console,
) -> Report:
    workdir = Path(tempfile.mkdtemp(prefix="batchpilot-operator-study-"))
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    audit_log = workdir / "audit.log"
    audit_args = [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
    ]
    runs: list[Study] = []
    with local_cluster(workdir / "cluster", apiserver_args=audit_args) as cluster:
        apply_crds(cluster)
        identity = apply_operator_identity(cluster)
        for repeat in range(repeats):
            console.print(f"study {repeat + 1}/{repeats} (work directory {workdir})")
            runs.append(
                run_study(cluster, identity, audit_log, max_trials, p99_ms, timeout_s, console)
            )
    return Report(
        wall_s_to_converged=_median([r.wall_s_to_converged for r in runs]),
        trials=statistics.median(r.trials for r in runs),
        baseline_rps=_median([r.baseline_rps for r in runs]),
        best_rps=_median([r.best_rps for r in runs]),
        gain_lcb_pct=_median([r.gain_lcb_pct for r in runs]),
        operator_rss_mb_max=max(r.operator_rss_mb_max for r in runs),
        api_requests=statistics.median(r.api_requests for r in runs),
        max_trials=max_trials,
        repeats=repeats,
        sample_changes=sample_changes(max_trials, p99_ms),
        api_requests_counted_by="kube-apiserver audit log (Metadata level): requests by "
        "the operator's ServiceAccount user, one per auditID",
        runs=runs,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--max-trials", type=int, default=None, help="tuning.maxTrials (default: the sample's)"
    )
    parser.add_argument(
        "--p99-ms",
        type=float,
        default=None,
        help="sla.p99LatencyMs (default: the sample's, set for a GPU; a CPU-only machine "
        "may need more)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="studies, one after another")
    parser.add_argument(
        "--timeout-s", type=float, default=3600.0, help="longest a study may take, s"
    )
    results.add_options(parser)
    args = parser.parse_args()
    if args.max_trials is not None and not 1 <= args.max_trials <= 200:
        parser.error("--max-trials takes 1 to 200")
    if args.p99_ms is not None and not 1 <= args.p99_ms <= 600_000:
        parser.error("--p99-ms takes 1 to 600000")
    if not 1 <= args.repeats <= 20:
        parser.error("--repeats takes 1 to 20")
    if not 60 <= args.timeout_s <= 86400:
        parser.error("--timeout-s takes 60 to 86400")
    # The operator and the pods it measures run this checkout's code, as in the e2e tier.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p
    )
    console = Console(stderr=True)
    recorder = results.start("operator_study", args)
    report = run(args.max_trials, args.p99_ms, args.repeats, args.timeout_s, console)
    recorder.save(report.model_dump(mode="json"))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        Console().print_json(json.dumps(report.model_dump(mode="json")))
    if any(r.phase != "Converged" for r in report.runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
