"""`batchpilot operator`: run the Kopf operator with the InferenceService handlers."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import ClassVar

import click

from batchpilot.clitools import OneLineErrors, fail
from batchpilot.operator import leader
from batchpilot.operator.identity import replica_identity
from batchpilot.operator.policy import DEFAULT_MAX_TRIAL_DEADLINE_S

NAMESPACE_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
URL_PATTERN = re.compile(r"^https?://[^/\s]+(/\S*)?$")


def check_options(namespaces: tuple[str, ...], liveness: str) -> None:
    for namespace in namespaces:
        if not NAMESPACE_PATTERN.match(namespace) or len(namespace) > 63:
            raise fail(
                f"--namespace {namespace!r} is not a namespace name (lowercase letters, "
                "digits and '-', at most 63 characters)"
            )
    if liveness and not URL_PATTERN.match(liveness):
        raise fail(f"--liveness {liveness!r} is not a URL like http://0.0.0.0:8080/healthz")


# where a pod finds its own namespace without the downward API
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def election_settings(
    enabled: bool,
    standalone: bool,
    lease_name: str,
    lease_namespace: str,
    duration_s: int,
    renew_s: float,
    identity: str | None = None,
) -> leader.ElectionSettings | None:
    """The leader election the options ask for, or None without --leader-election."""
    if not enabled:
        return None
    if not standalone:
        raise fail("--leader-election and --peering are two ways to pick one replica: use one")
    problem = leader.check_timing(duration_s, renew_s)
    if problem is not None:
        raise fail(f"--lease-duration/--renew-period: {problem}")
    if not NAMESPACE_PATTERN.match(lease_name) or len(lease_name) > 253:
        raise fail(
            f"--lease-name {lease_name!r} is not an object name (lowercase letters, digits and '-')"
        )
    namespace = lease_namespace or os.environ.get("POD_NAMESPACE", "")
    if not namespace and SERVICE_ACCOUNT_NAMESPACE.is_file():
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    if not namespace:
        raise fail(
            "--leader-election needs the namespace of its Lease: pass --lease-namespace "
            "or set POD_NAMESPACE (in a pod, the service account's namespace is used)"
        )
    check_options((namespace,), "")
    return leader.ElectionSettings(
        namespace=namespace,
        identity=identity or replica_identity(),
        name=lease_name,
        duration_s=duration_s,
        renew_s=renew_s,
    )


class OperatorCommand(OneLineErrors):
    error_prefix: ClassVar[str] = "batchpilot operator: "
    fail_exit_code: ClassVar[int] = 2


@click.command(cls=OperatorCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch this namespace (repeatable). Without it, or with -A, the whole cluster.",
)
@click.option("-A", "--all-namespaces", is_flag=True, help="Watch every namespace.")
@click.option(
    "--liveness",
    default="http://0.0.0.0:8080/healthz",
    show_default=True,
    help="Liveness endpoint URL (Kopf's probe); empty to disable.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=9090,
    show_default=True,
    help="Port of the operator's /metrics; 0 disables it.",
)
@click.option(
    "--standalone/--peering",
    default=True,
    show_default=True,
    help="Standalone: no Kopf peering (run one replica). --peering needs Kopf's peering CRDs.",
)
@click.option(
    "--max-concurrent-trials",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Trials measured at once by this process; more than 1 lets load generators "
    "share CPU and skews their figures.",
)
@click.option(
    "--prometheus-allow",
    "prometheus_allow",
    multiple=True,
    metavar="CIDR|HOST",
    help="Allow a load.prometheus.url on this network or host name (repeatable). By "
    "default the operator refuses a Prometheus on loopback (127.0.0.0/8, ::1, "
    "localhost), link-local addresses (169.254.0.0/16, fe80::/10) and the Kubernetes "
    "API server, whatever the host name resolves to.",
)
@click.option(
    "--max-trial-deadline-seconds",
    type=click.IntRange(10, 86400),
    default=DEFAULT_MAX_TRIAL_DEADLINE_S,
    show_default=True,
    help="Refuse a spec whose tuning.trialDeadlineSeconds is longer: the platform "
    "team's cap on how long one tenant's trial may hold the measurement slot.",
)
@click.option(
    "--leader-election",
    is_flag=True,
    help="Run as one of several replicas: only the holder of a coordination.k8s.io "
    "Lease measures, patches workloads and writes status; the others stand by.",
)
@click.option(
    "--lease-name",
    default=leader.DEFAULT_LEASE_NAME,
    show_default=True,
    help="Name of the election's Lease.",
)
@click.option(
    "--lease-namespace",
    default="",
    help="Namespace of the Lease (default: $POD_NAMESPACE, else the pod's service "
    "account namespace).",
)
@click.option(
    "--lease-duration",
    type=int,
    default=leader.DEFAULT_DURATION_S,
    show_default=True,
    help="Seconds a Lease not renewed stays with its holder: how long a failover waits.",
)
@click.option(
    "--renew-period",
    type=float,
    default=leader.DEFAULT_RENEW_S,
    show_default=True,
    help="Seconds between renewals by the leader (at most a third of --lease-duration).",
)
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    liveness: str,
    metrics_port: int,
    standalone: bool,
    max_concurrent_trials: int,
    prometheus_allow: tuple[str, ...],
    max_trial_deadline_seconds: int,
    leader_election: bool,
    lease_name: str,
    lease_namespace: str,
    lease_duration: int,
    renew_period: float,
) -> None:
    """Run the BatchPilot operator: watch InferenceService resources and tune the
    dynamic batching of the workloads they point at."""
    check_options(namespaces, liveness)
    from batchpilot.operator.platform import policy_from_flags

    try:
        policy = policy_from_flags(prometheus_allow, max_trial_deadline_seconds)
    except ValueError as exc:
        raise fail(str(exc)) from None
    # the Lease's holder and the User-Agent of every request: one name per replica
    identity = replica_identity()
    election = election_settings(
        leader_election,
        standalone,
        lease_name,
        lease_namespace,
        lease_duration,
        renew_period,
        identity=identity,
    )
    import kopf  # imported here so `batchpilot --help` stays fast

    import batchpilot.operator.handlers  # noqa: F401  (registers the handlers)
    from batchpilot.operator import metrics

    if metrics_port:
        try:
            metrics.serve(metrics_port)
        except OSError as exc:
            raise fail(
                f"cannot serve metrics on port {metrics_port}: {exc.strerror or exc}"
            ) from None
    kopf.configure(verbose=False)
    # set when this replica loses the lead: Kopf stops, and the process exits (below);
    # an asyncio flag, as Kopf would wait for a threading one in a thread never joined
    deposed = asyncio.Event()
    kopf.run(
        stop_flag=deposed,
        standalone=standalone,
        clusterwide=all_namespaces or not namespaces,
        namespaces=() if all_namespaces else namespaces,
        liveness_endpoint=liveness or None,
        memo=kopf.Memo(
            max_concurrent_trials=max_concurrent_trials,
            policy=policy,
            election=election,
            identity=identity,
            liveness=liveness,
            deposed=deposed,
        ),
    )
    if deposed.is_set():
        # restarted (by the Deployment), the replica stands by until it leads again
        raise fail("this replica lost the leader election and stopped; restart it to stand by")
