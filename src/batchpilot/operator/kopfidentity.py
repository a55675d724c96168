"""Kopf's connection carrying the replica's User-Agent (identity.py says why). Apart
from identity.py so that the CLI can name a replica without importing Kopf."""

from __future__ import annotations

import dataclasses

import kopf


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentifiedConnectionInfo(kopf.ConnectionInfo):
    """Kopf's connection with the replica's User-Agent: Kopf puts `kopf/<version>`
    only on sessions whose headers carry none."""

    user_agent: str

    def as_http_headers(self) -> dict[str, str]:
        return {**super().as_http_headers(), "User-Agent": self.user_agent}


def identified(info: kopf.ConnectionInfo, agent: str) -> IdentifiedConnectionInfo:
    fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    fields["user_agent"] = agent
    return IdentifiedConnectionInfo(**fields)
