"""Running per-batch-size compute statistics: what the tuner fits its batch-cost model
t(b) to (GET /admin/profile)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel


class BatchSizeStats(BaseModel):
    batch_size: int
    count: int
    mean_compute_ms: float
    mean_rows: float


class ProfileReport(BaseModel):
    model: str
    device: str
    batches: list[BatchSizeStats]


@dataclass
class _Sums:
    count: int = 0
    compute_s: float = 0.0
    rows: int = 0


class BatchProfile:
    """Counts and sums per batch size (requests in the batch); means on demand."""

    def __init__(self) -> None:
        self._sums: dict[int, _Sums] = {}

    def record(self, batch_size: int, compute_s: float, rows: int) -> None:
        sums = self._sums.setdefault(batch_size, _Sums())
        sums.count += 1
        sums.compute_s += compute_s
        sums.rows += rows

    def reset(self) -> None:
        self._sums.clear()

    def report(self, model: str, device: str) -> ProfileReport:
        return ProfileReport(
            model=model,
            device=device,
            batches=[
                BatchSizeStats(
                    batch_size=size,
                    count=s.count,
                    mean_compute_ms=s.compute_s * 1000.0 / s.count,
                    mean_rows=s.rows / s.count,
                )
                for size, s in sorted(self._sums.items())
            ],
        )
