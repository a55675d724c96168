"""Who this operator replica is, as the API server sees it: every request, from Kopf's
client and from the operator's own, carries the User-Agent
`batchpilot-operator/<version> (<identity>)`. All replicas share one ServiceAccount, so
the user name in the API server's audit log cannot tell them apart; the user agent can,
and under leader election `<identity>` is the Lease's holderIdentity."""

from __future__ import annotations

import re
import secrets
import socket
from importlib import metadata

PRODUCT = "batchpilot-operator"
# RFC 9110 comment text minus the parentheses and backslash that would end or escape
# the comment: what a host name may safely contribute to the header
_UNSAFE = re.compile(r"[^\x21-\x27\x2a-\x5b\x5d-\x7e]")
MAX_IDENTITY = 128


def replica_identity() -> str:
    """The host name tells a person which pod it is; the suffix tells restarts (and
    replicas on one host) apart."""
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


def package_version() -> str:
    try:
        return metadata.version("batchpilot")
    except metadata.PackageNotFoundError:
        return "unknown"


def user_agent(identity: str, version: str | None = None) -> str:
    """`batchpilot-operator/<version> (<identity>)`, the identity cut down to what a
    header comment may hold. An identity with nothing left is refused: a header
    that names no replica would defeat its purpose."""
    safe = _UNSAFE.sub("_", identity.strip())[:MAX_IDENTITY]
    if not safe.strip("_"):
        raise ValueError(
            f"replica identity {identity!r} has no printable ASCII characters to put in "
            "the User-Agent"
        )
    return f"{PRODUCT}/{version or package_version()} ({safe})"
