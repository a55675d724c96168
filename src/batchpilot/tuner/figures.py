"""A tuning summary's configurations in a runtime's own terms (`TuneSummary.runtime`).

It reads both the summary and the runtime's adapter, so it sits in the tuner, above
the runtimes: the adapters know nothing of the tuner's summary."""

from __future__ import annotations

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import Persistence, Runtime, Verification
from batchpilot.tuner.summary import ConfigFigures, RuntimeFigures, TuneSummary


def runtime_figures(
    runtime: Runtime,
    summary: TuneSummary,
    verification: Verification | None = None,
    *,
    persisted: Persistence | None = None,
) -> RuntimeFigures:
    """`persisted`: the recommendation's persistence as the control that measured it
    knows it (default: the runtime's, for its bundled model)."""

    def native(config: BatchingConfig | ConfigFigures | None) -> dict[str, float] | None:
        if config is None:
            return None
        canonical = BatchingConfig(
            max_batch_size=config.max_batch_size, max_queue_time_ms=config.max_queue_time_ms
        )
        return {k: float(v) for k, v in runtime.native(canonical).items()}

    if persisted is None and summary.recommended is not None:
        persisted = runtime.persistence(summary.recommended, model=runtime.default_model)
    return RuntimeFigures(
        name=runtime.name,
        # a knob the runtime does not have (vLLM's queue wait) is pinned at 0, no unit
        knobs={
            k.canonical: f"{k.native} ({k.unit})" if k.maximum > 0 else f"{k.native}: pinned at 0"
            for k in runtime.knobs
        },
        how_applied=runtime.how_applied,
        baseline=native(summary.baseline),
        best=native(summary.best),
        recommended=native(summary.recommended),
        persist_kind=persisted.kind if persisted else None,
        persist_where=persisted.where if persisted else None,
        persist_snippet=persisted.snippet if persisted else None,
        verified_by=verification.verified_by if verification else None,
    )
