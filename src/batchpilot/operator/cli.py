"""`batchpilot operator`: run the Kopf operator with the InferenceService handlers."""

from __future__ import annotations

import re
from typing import ClassVar

import click

from batchpilot.clitools import OneLineErrors, fail

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
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    liveness: str,
    metrics_port: int,
    standalone: bool,
    max_concurrent_trials: int,
) -> None:
    """Run the BatchPilot operator: watch InferenceService resources and tune the
    dynamic batching of the workloads they point at."""
    check_options(namespaces, liveness)
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
    kopf.run(
        standalone=standalone,
        clusterwide=all_namespaces or not namespaces,
        namespaces=() if all_namespaces else namespaces,
        liveness_endpoint=liveness or None,
        memo=kopf.Memo(max_concurrent_trials=max_concurrent_trials),
    )
