"""What the platform team allows a tenant's spec, decided without I/O.

Two rules, set by operator flags rather than by the tenant:

- `load.prometheus.url` must not point at the node's or the cloud's link-local services
  (169.254.0.0/16, fe80::/10: the metadata endpoint), at the operator's own loopback
  (127.0.0.0/8, ::1, localhost) or at the Kubernetes API server (kubernetes.default*,
  the KUBERNETES_SERVICE_HOST address): the operator would send its requests there
  with the tenant choosing the path. Every address the host resolves to is checked, so
  a name that resolves to 169.254.169.254 is refused like the address itself.
  `--prometheus-allow` (CIDRs or host names) lets such a Prometheus through.
- `tuning.trialDeadlineSeconds` must not pass `--max-trial-deadline-seconds`: a trial
  holds a measurement slot that every namespace shares.

The I/O (resolving the host, with a timeout) is the caller's: see `operator.promreads` and
the daemon in `operator.handlers`."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOW_FLAG = "--prometheus-allow"
DEADLINE_FLAG = "--max-trial-deadline-seconds"
DEFAULT_MAX_TRIAL_DEADLINE_S = 3600
# how long resolving a Prometheus host may take before the check gives up
RESOLVE_TIMEOUT_S = 5.0

_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_UNSPECIFIED = (ipaddress.ip_network("0.0.0.0/8"), ipaddress.ip_network("::/128"))
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
# the API server's in-cluster names: kubernetes, kubernetes.default,
# kubernetes.default.svc, kubernetes.default.svc.<cluster domain>
_API_SERVER_NAMES = ("kubernetes", "kubernetes.default")


@dataclass(frozen=True)
class PlatformPolicy:
    """The platform team's limits on tenants' specs (operator flags)."""

    # CIDRs and host names whose Prometheus is allowed though the rules would refuse it
    allowed_networks: tuple[IPNetwork, ...] = ()
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    # the API server's own addresses (KUBERNETES_SERVICE_HOST, as the operator sees it)
    api_server_addresses: frozenset[str] = field(default_factory=frozenset)
    max_trial_deadline_s: int = DEFAULT_MAX_TRIAL_DEADLINE_S


def parse_allow(entries: Iterable[str]) -> tuple[tuple[IPNetwork, ...], frozenset[str]]:
    """The CIDRs (a bare address is a /32 or /128) and host names of `--prometheus-allow`
    entries. ValueError, naming the entry, for one that is neither."""
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    for entry in entries:
        text = entry.strip()
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
            continue
        except ValueError:
            pass
        name = normal_host(text)
        labels = name.split(".")
        if not name or "/" in text or not all(_is_label(label) for label in labels):
            raise ValueError(
                f"{ALLOW_FLAG} {entry!r} is neither a CIDR (10.0.0.0/8, fd00::/8), an "
                "address nor a host name"
            )
        hosts.add(name)
    return tuple(networks), frozenset(hosts)


def _is_label(label: str) -> bool:
    return 0 < len(label) <= 63 and all(c.isalnum() or c == "-" for c in label)


def normal_host(host: str) -> str:
    """`host` lowercased, without a trailing dot or the brackets of an IPv6 literal."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def _address(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(normal_host(text).split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    return address


def _name_rule(host: str) -> str | None:
    """Why the host's name alone is refused, or None."""
    if host == "localhost" or host.endswith(".localhost"):
        return "is loopback (the operator's own pod)"
    if host in _API_SERVER_NAMES or host.startswith("kubernetes.default."):
        return "is the Kubernetes API server"
    return None


def _address_rule(address: IPAddress, policy: PlatformPolicy) -> str | None:
    """Why a connection to `address` is refused, or None."""
    if any(address in net for net in _LOOPBACK + _UNSPECIFIED if net.version == address.version):
        return "is loopback (the operator's own pod)"
    if any(address in net for net in _LINK_LOCAL if net.version == address.version):
        return "is link-local (169.254.0.0/16, fe80::/10: the node's and the cloud's metadata)"
    if any(_address(a) == address for a in policy.api_server_addresses):
        return "is the Kubernetes API server"
    return None


def _allowed_address(address: IPAddress, policy: PlatformPolicy) -> bool:
    return any(address.version == net.version and address in net for net in policy.allowed_networks)


def prometheus_refusal(
    host: str, addresses: Sequence[str], policy: PlatformPolicy, *, url: str = ""
) -> str | None:
    """Why the operator refuses to query a Prometheus at `host`, which resolves to
    `addresses` (for an address literal, itself); None when it is allowed. A host name
    in the allow-list allows the host whatever it resolves to; a CIDR allows the
    addresses it holds."""
    name = normal_host(host)
    if name in policy.allowed_hosts:
        return None
    where = f"load.prometheus.url {url!r}" if url else f"Prometheus host {name!r}"
    how = (
        f"the operator's {ALLOW_FLAG} flag (a CIDR or a host name, repeatable) allows it; "
        "ask your platform team"
    )
    literal = _address(name)
    if literal is None:
        reason = _name_rule(name)
        if reason is not None:
            return f"{where} refused: {name} {reason}; {how}"
    checked = [literal] if literal is not None else [_address(a) for a in addresses]
    for address in checked:
        if address is None or _allowed_address(address, policy):
            continue
        reason = _address_rule(address, policy)
        if reason is not None:
            resolved = "" if literal is not None else f" resolves to {address}, which"
            return f"{where} refused: {name}{resolved} {reason}; {how}"
    return None


def trial_deadline_refusal(seconds: int, policy: PlatformPolicy) -> str | None:
    """Why a spec's `tuning.trialDeadlineSeconds` is refused, or None."""
    if seconds <= policy.max_trial_deadline_s:
        return None
    return (
        f"tuning.trialDeadlineSeconds {seconds} refused: this operator's cap is "
        f"{policy.max_trial_deadline_s} s (a trial holds the measurement slot every "
        f"namespace shares); lower it, or ask your platform team to raise the operator's "
        f"{DEADLINE_FLAG} flag"
    )
