"""A load generator's health as a step records it, for the tests of the rules that judge
whether the client or the server set a step's limit."""

from __future__ import annotations

from batchpilot.models import ClientHealth


def healthy_client(**update: object) -> ClientHealth:
    """A client well inside every limit (sub-millisecond lag and stalls, a third of a
    core, no wait for connections), with `update`'s fields changed."""
    base = ClientHealth(
        lag_p99_ms=0.5,
        lag_max_ms=1.0,
        conn_wait_p99_ms=0.0,
        conn_wait_max_ms=0.0,
        loop_delay_p99_ms=0.2,
        loop_delay_max_ms=0.5,
        cpu=0.3,
    )
    return base.model_copy(update=update)
