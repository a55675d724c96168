"""A tuning summary's configurations in a runtime's own terms (`TuneSummary.runtime`).

It reads both the summary and the runtime's adapter, so it sits in the tuner, above
the runtimes: the adapters know nothing of the tuner's summary."""

from __future__ import annotations

from batchpilot.models import BatchingConfig
from batchpilot.runtimes.base import Runtime, Verification
from batchpilot.tuner.summary import ConfigFigures, RuntimeFigures, TuneSummary


def runtime_figures(
    runtime: Runtime, summary: TuneSummary, verification: Verification | None = None
) -> RuntimeFigures:
    def native(config: BatchingConfig | ConfigFigures | None) -> dict[str, float] | None:
        if config is None:
            return None
        canonical = BatchingConfig(
            max_batch_size=config.max_batch_size, max_queue_time_ms=config.max_queue_time_ms
        )
        return {k: float(v) for k, v in runtime.native(canonical).items()}

    persisted = (
        runtime.persistence(summary.recommended, model=runtime.default_model)
        if summary.recommended is not None
        else None
    )
    return RuntimeFigures(
        name=runtime.name,
        knobs={k.canonical: f"{k.native} ({k.unit})" for k in runtime.knobs},
        how_applied=runtime.how_applied,
        baseline=native(summary.baseline),
        best=native(summary.best),
        recommended=native(summary.recommended),
        persist_kind=persisted.kind if persisted else None,
        persist_where=persisted.where if persisted else None,
        persist_snippet=persisted.snippet if persisted else None,
        verified_by=verification.verified_by if verification else None,
    )
