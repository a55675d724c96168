"""The capacity plot: p99 and achieved rate against offered rate, SLA and knee marked,
one colour per configuration (the tuner's report draws all its trials on one figure)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display

import matplotlib.pyplot as plt

from batchpilot.models import CapacityResult


def plot_capacity(results: Mapping[str, CapacityResult], path: str | Path) -> Path:
    """Write the figure for `results` (label → result) to `path` (format from its suffix)."""
    if not results:
        raise ValueError("nothing to plot: no capacity results given")
    out = Path(path)
    fig, (ax_p99, ax_rate) = plt.subplots(2, 1, sharex=True, figsize=(8, 7))
    try:
        sla_ms = None
        for index, (label, result) in enumerate(results.items()):
            colour = f"C{index % 10}"
            steps = sorted(result.steps, key=lambda s: s.offered_rps)
            offered = [s.offered_rps for s in steps]
            ax_p99.plot(offered, [s.p99_ms for s in steps], "-", color=colour, label=label)
            ax_rate.plot(offered, [s.achieved_rps for s in steps], "-", color=colour, label=label)
            for step in steps:
                marker = "o" if step.passed else "x"
                ax_p99.plot(step.offered_rps, step.p99_ms, marker, color=colour)
                ax_rate.plot(step.offered_rps, step.achieved_rps, marker, color=colour)
            if result.feasible:
                for ax in (ax_p99, ax_rate):
                    ax.axvline(result.effective_rps, color=colour, linestyle=":", linewidth=1)
                ax_rate.annotate(
                    f"knee {result.effective_rps:.0f} req/s",
                    (result.effective_rps, result.effective_rps),
                    textcoords="offset points",
                    xytext=(5, -12 - 10 * index),
                    color=colour,
                    fontsize=8,
                )
            sla_ms = result.sla.p99_ms
        if sla_ms is not None:
            ax_p99.axhline(sla_ms, color="red", linestyle="--", label=f"SLA p99 {sla_ms:g} ms")
        top = max((s.offered_rps for r in results.values() for s in r.steps), default=1.0)
        ax_rate.plot([0, top], [0, top], color="grey", linewidth=0.8, label="achieved = offered")
        ax_p99.set_yscale("log")
        ax_p99.set_ylabel("p99 latency (ms)")
        ax_rate.set_ylabel("achieved (req/s)")
        ax_rate.set_xlabel("offered (req/s)    o: step passed   x: step failed")
        ax_p99.legend(fontsize=8)
        ax_rate.legend(fontsize=8)
        ax_p99.set_title("Effective throughput: p99 and achieved rate against offered rate")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out
