"""The I/O around the platform team's limits (`operator.policy`): the policy built from
the operator's flags and environment, a spec checked against it (its Prometheus host
resolved, with a timeout), and the guard every Prometheus connection goes through."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from yarl import URL

from batchpilot.operator.policy import (
    DEFAULT_MAX_TRIAL_DEADLINE_S,
    RESOLVE_TIMEOUT_S,
    PlatformPolicy,
    parse_allow,
    prometheus_refusal,
    trial_deadline_refusal,
)

if TYPE_CHECKING:
    from batchpilot.capacity.prometheus_http import AddressGuard
    from batchpilot.operator.spec import InferenceServiceSpec

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


def policy_from_flags(
    allow: Iterable[str] = (),
    max_trial_deadline_s: int = DEFAULT_MAX_TRIAL_DEADLINE_S,
    environ: Mapping[str, str] | None = None,
) -> PlatformPolicy:
    """The policy of `--prometheus-allow` and `--max-trial-deadline-seconds`; the API
    server's address is the KUBERNETES_SERVICE_HOST of the operator's pod. ValueError
    for an allow-list entry that is neither a CIDR nor a host name."""
    env = os.environ if environ is None else environ
    networks, hosts = parse_allow(allow)
    api = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    return PlatformPolicy(
        allowed_networks=networks,
        allowed_hosts=hosts,
        api_server_addresses=frozenset({api} if api else ()),
        max_trial_deadline_s=max_trial_deadline_s,
    )


def address_guard(policy: PlatformPolicy) -> AddressGuard:
    """The check a Prometheus connection makes on the addresses its host resolved to."""

    def guard(host: str, addresses: Sequence[str]) -> str | None:
        return prometheus_refusal(host, addresses, policy)

    return guard


async def resolve(host: str, port: int, timeout_s: float = RESOLVE_TIMEOUT_S) -> list[str]:
    """Every address `host` resolves to; none when it does not resolve (yet) within
    `timeout_s`: the connection's guard checks again whatever it resolves to later."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


async def spec_refusal(
    spec: InferenceServiceSpec, policy: PlatformPolicy, *, resolver: Resolver = resolve
) -> tuple[str, str] | None:
    """(condition reason, message) when the platform's policy refuses `spec`, else None."""
    deadline = trial_deadline_refusal(spec.tuning.trial_deadline_seconds, policy)
    if deadline is not None:
        return "TrialDeadlineOverCap", deadline
    prometheus = spec.load.prometheus
    if prometheus is None:
        return None
    url = URL(prometheus.url)
    host = url.host
    if host is None:
        return None  # the spec's own validation refuses it
    addresses = await resolver(host, url.port or 80)
    refusal = prometheus_refusal(
        host, addresses, policy, url=str(url.with_user(None).with_query(None))
    )
    return None if refusal is None else ("PrometheusURLRefused", refusal)
