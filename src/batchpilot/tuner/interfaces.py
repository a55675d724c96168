"""What the tuner needs from the world, and nothing more (docs/architecture.md, "The
parts").

Local mode implements these against a runtime's server; the operator implements them
against Kubernetes workloads. The tuner's study never imports either: only the modes
that wire it to a world do (the `tuner-core` contract in pyproject.toml).
"""

from __future__ import annotations

from typing import Protocol

from batchpilot.errors import TargetError
from batchpilot.models import BatchingConfig, CapacityResult


class Target(Protocol):
    """Where a configuration is applied."""

    async def current(self) -> BatchingConfig:
        """The configuration that is live now (the baseline before tuning)."""
        ...

    async def apply(self, config: BatchingConfig) -> None:
        """Apply `config` and return only once it is live: every serving replica runs it,
        is ready and warmed up. Raises TargetError when that cannot be reached."""
        ...


class Probe(Protocol):
    """How the live configuration is scored."""

    async def measure(self, config: BatchingConfig, *, must_beat: float | None) -> CapacityResult:
        """Effective throughput of what is live now (`config` is for labelling).

        `must_beat` is the best effective req/s so far: the probe may stop its ramp
        early (returning a result with `pruned=True`) once this configuration
        provably cannot exceed it."""
        ...


class ServerDied(TargetError):
    """The server died during the trial: its process exited, or it stopped answering at
    all (on an accelerator typically out of memory at a large batch). The tuner puts the
    trial's batch size and every larger one out of the study (see `refine`)."""
