"""`tune --report DIR`: the summary as JSON and three PNG views of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchpilot.tuner.summary import TuneSummary

STATE_STYLE: dict[str, dict[str, Any]] = {
    "Complete": {"marker": "o", "color": "tab:blue"},
    "Pruned": {"marker": "v", "color": "tab:gray"},
    "Infeasible": {"marker": "x", "color": "tab:red"},
    "Failed": {"marker": "s", "color": "black"},
}
SERIES = (("best", "tab:green"), ("baseline", "tab:orange"), ("rule_of_thumb", "tab:purple"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def plot_trials(summary: TuneSummary, path: Path) -> None:
    """Effective throughput per trial, the best so far, and the two references."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    best_so_far: list[float] = []
    running = 0.0
    for trial in summary.trials:
        if trial.state == "Complete" and trial.effective_rps:
            running = max(running, trial.effective_rps)
        best_so_far.append(running)
    for state, style in STATE_STYLE.items():
        xs = [t.number for t in summary.trials if t.state == state]
        ys = [t.effective_rps or 0.0 for t in summary.trials if t.state == state]
        if xs:
            ax.scatter(xs, ys, label=state.lower(), zorder=3, **style)
    ax.step(
        [t.number for t in summary.trials],
        best_so_far,
        where="post",
        color="tab:green",
        label="best so far",
    )
    for name, color in SERIES[1:]:
        ref = getattr(summary, name)
        if ref is not None and ref.effective_rps:
            ax.axhline(
                ref.effective_rps,
                color=color,
                linestyle="--",
                label=f"{name.replace('_', ' ')} ({ref.effective_rps:.0f} req/s)",
            )
    ax.set_xlabel("trial")
    ax.set_ylabel("effective throughput (req/s)")
    ax.set_title(f"Effective throughput per trial ({summary.sla.describe('<=')})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(summary: TuneSummary, path: Path) -> None:
    """p99 against offered rate for the best, the baseline and the rule of thumb: every
    step of their capacity searches, passed (filled) and failed (hollow)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, color in SERIES:
        result = summary.measurements.get(name)
        figures = getattr(summary, name)
        if result is None or figures is None:
            continue
        steps = sorted(result.steps, key=lambda s: s.offered_rps)
        label = (
            f"{name.replace('_', ' ')}: batch={figures.max_batch_size} "
            f"wait={figures.max_queue_time_ms:g}ms"
        )
        ax.plot(
            [s.offered_rps for s in steps],
            [s.p99_ms for s in steps],
            color=color,
            alpha=0.6,
            label=label,
        )
        for passed, face in ((True, color), (False, "none")):
            chosen = [s for s in steps if s.passed == passed]
            ax.scatter(
                [s.offered_rps for s in chosen],
                [s.p99_ms for s in chosen],
                edgecolors=color,
                facecolors=face,
                zorder=3,
            )
    if summary.sla.p99_ms is not None:
        ax.axhline(summary.sla.p99_ms, color="tab:red", linestyle=":", label="SLA p99")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title("p99 against offered rate (hollow: step failed)")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_space(summary: TuneSummary, path: Path) -> None:
    """The explored parameter space: where each trial sat and how it scored."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    done = [t for t in summary.trials if t.state == "Complete"]
    if done:
        points = ax.scatter(
            [t.params["max_batch_size"] for t in done],
            [t.params["max_queue_time_ms"] for t in done],
            c=[t.effective_rps or 0.0 for t in done],
            cmap="viridis",
            s=60,
            zorder=3,
        )
        fig.colorbar(points, ax=ax, label="effective req/s")
    for state in ("Pruned", "Infeasible", "Failed"):
        chosen = [t for t in summary.trials if t.state == state]
        if chosen:
            ax.scatter(
                [t.params["max_batch_size"] for t in chosen],
                [t.params["max_queue_time_ms"] for t in chosen],
                label=state.lower(),
                zorder=2,
                **STATE_STYLE[state],
            )
    for t in summary.trials:
        ax.annotate(
            str(t.number),
            (t.params["max_batch_size"], t.params["max_queue_time_ms"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=7,
        )
    if summary.best is not None:
        ax.scatter(
            [summary.best.max_batch_size],
            [summary.best.max_queue_time_ms],
            marker="*",
            s=300,
            facecolors="none",
            edgecolors="tab:green",
            label="best",
            zorder=4,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1.0)  # 0 ms is a real setting
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("max_batch_size")
    ax.set_ylabel("max_queue_time_ms")
    ax.set_title("Explored configurations")
    ax.legend(fontsize="small", loc="best")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(summary: TuneSummary, directory: Path) -> list[Path]:
    """report.json, trials.png, latency.png, space.png in `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "report.json"
    json_path.write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
    paths = [json_path]
    for name, plot in (("trials", plot_trials), ("latency", plot_latency), ("space", plot_space)):
        path = directory / f"{name}.png"
        plot(summary, path)
        paths.append(path)
    return paths
