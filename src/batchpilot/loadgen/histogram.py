"""Latency histograms that merge exactly (HDR), so percentiles of several generators,
pods or windows combine without the error of averaging percentiles."""

from __future__ import annotations

from collections.abc import Iterable

from hdrh.histogram import HdrHistogram

from batchpilot.models import LatencySummary

# Microsecond resolution from 1 µs to one hour at three significant digits: ≤ 0.1% error.
_LOWEST_US = 1
_HIGHEST_US = 3_600_000_000
_SIGNIFICANT_DIGITS = 3
# The largest latency a histogram holds: where a request that never succeeded is recorded.
TOP_MS = _HIGHEST_US / 1000.0


class LatencyHistogram:
    """Latencies in milliseconds, stored as microseconds in an HdrHistogram."""

    def __init__(self, hdr: HdrHistogram | None = None) -> None:
        self._hdr = hdr or HdrHistogram(_LOWEST_US, _HIGHEST_US, _SIGNIFICANT_DIGITS)

    def record_ms(self, latency_ms: float, count: int = 1) -> None:
        value = min(max(round(latency_ms * 1000.0), _LOWEST_US), _HIGHEST_US)
        self._hdr.record_value(value, count)

    def merge(self, other: LatencyHistogram) -> None:
        self._hdr.add(other._hdr)

    @property
    def count(self) -> int:
        return int(self._hdr.get_total_count())

    def percentile_ms(self, percentile: float) -> float:
        if self.count == 0:
            return 0.0
        return float(self._hdr.get_value_at_percentile(percentile)) / 1000.0

    def encode(self) -> str:
        """The compressed, base64 HDR encoding (the format other HDR tools read)."""
        return bytes(self._hdr.encode()).decode("ascii")

    @classmethod
    def decode(cls, encoded: str) -> LatencyHistogram:
        hdr = HdrHistogram.decode(encoded.encode("ascii"))
        return cls(hdr)

    def summary(self) -> LatencySummary:
        if self.count == 0:
            return LatencySummary(
                count=0,
                mean_ms=0.0,
                p50_ms=0.0,
                p90_ms=0.0,
                p95_ms=0.0,
                p99_ms=0.0,
                p999_ms=0.0,
                max_ms=0.0,
            )
        return LatencySummary(
            count=self.count,
            mean_ms=float(self._hdr.get_mean_value()) / 1000.0,
            p50_ms=self.percentile_ms(50),
            p90_ms=self.percentile_ms(90),
            p95_ms=self.percentile_ms(95),
            p99_ms=self.percentile_ms(99),
            p999_ms=self.percentile_ms(99.9),
            max_ms=float(self._hdr.get_max_value()) / 1000.0,
        )


def merge_encoded(encoded: Iterable[str]) -> LatencyHistogram:
    """One histogram holding every sample of the encoded histograms."""
    merged = LatencyHistogram()
    for item in encoded:
        merged.merge(LatencyHistogram.decode(item))
    return merged
