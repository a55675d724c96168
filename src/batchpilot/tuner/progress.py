"""What a person watching `tune --local` sees: one line per trial on stderr (stdout is
kept for --json), a spinner while a trial is measured, a table at the end."""

from __future__ import annotations

from rich.console import Console
from rich.status import Status
from rich.table import Table

from batchpilot.tuner.runner import TrialDone, TrialStart
from batchpilot.tuner.summary import ConfigFigures, TuneSummary

STATE_MARK = {
    "Complete": "[green]ok[/]",
    "Pruned": "[yellow]pruned[/]",
    "Infeasible": "[red]infeasible[/]",
    "Failed": "[red]failed[/]",
}


def _config_text(params: dict[str, float | int]) -> str:
    text = f"batch={params['max_batch_size']} wait={float(params['max_queue_time_ms']):g}ms"
    extras = [
        f"{k}={v:g}" for k, v in params.items() if k not in ("max_batch_size", "max_queue_time_ms")
    ]
    return " ".join([text, *extras])


def _rps(value: float | None) -> str:
    return f"{value:.0f} req/s" if value else "-"


def _ms(value: float | None) -> str:
    return f"{value:.1f} ms" if value is not None else "-"


class TrialProgress:
    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.total = total
        self._status: Status | None = None

    def start(self, event: TrialStart, label: str) -> None:
        how = "full ramp" if event.full else "may be pruned"
        text = f"trial {event.number} ({label}) {_config_text(event.params)}: measuring, {how}"
        if self.console.is_terminal:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self.console.print(f"[dim]{text}[/]", highlight=False)

    def done(self, event: TrialDone, label: str, measured: int) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        rec = event.record
        best = event.best
        best_text = (
            f"best {_rps(best.effective_rps)} (trial {best.number})"
            if best is not None
            else "no feasible trial yet"
        )
        detail = f"  [dim]{rec.reason}[/]" if rec.state == "Failed" else ""
        self.console.print(
            f"[bold]{measured:>2}/{self.total}[/] trial {rec.number:<3} {label:<13} "
            f"{_config_text(rec.params):<28} {_rps(rec.effective_rps):>11}  "
            f"p99 {_ms(rec.p99_ms):>9}  {STATE_MARK.get(rec.state, rec.state)}  | {best_text}"
            f"{detail}",
            highlight=False,
        )

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def _num(value: float | None, digits: int) -> str:
    return f"{value:.{digits}f}" if value is not None else "-"


def _gain(gain: float | None) -> str:
    return f"{gain:+.0%}" if gain is not None else "-"


def _row(
    name: str,
    fig: ConfigFigures | None,
    gain: float | None,
    again: ConfigFigures | None,
    again_gain: float | None,
) -> list[str]:
    if fig is None:
        return [name, "-", "-", "-", "-", "-", "-", "-", "-"]
    return [
        name,
        str(fig.trial),
        str(fig.max_batch_size),
        f"{fig.max_queue_time_ms:g}",
        _num(fig.effective_rps, 0),
        _num(fig.p99_ms, 1),
        _gain(gain),
        _num(again.effective_rps if again is not None else None, 0),
        _gain(again_gain),
    ]


def outdone_by(summary: TuneSummary) -> list[str]:
    """References that beat the recommendation when all were re-measured back to back."""
    best = summary.confirmed.get("best")
    if best is None:
        return []
    return [
        role.replace("_", " ")
        for role in ("baseline", "rule_of_thumb")
        if (ref := summary.confirmed.get(role)) is not None
        and (ref.effective_rps or 0.0) > (best.effective_rps or 0.0)
    ]


def render_summary(console: Console, summary: TuneSummary) -> None:
    table = Table(
        title=f"Effective throughput at p99 <= {summary.sla.p99_ms:g} ms "
        f"(errors <= {summary.sla.max_error_rate:g})",
        caption="req/s: effective throughput; best+: the recommendation's gain over the row; "
        "again: re-measured back to back after the study",
    )
    table.add_column("")
    for column in ("trial", "batch", "wait ms", "req/s", "p99 ms", "best+", "again", "best+"):
        table.add_column(column, justify="right")
    again = summary.confirmed
    table.add_row(*_row("best", summary.best, None, again.get("best"), None), style="bold green")
    table.add_row(
        *_row(
            "baseline",
            summary.baseline,
            summary.gain_over_baseline,
            again.get("baseline"),
            summary.confirmed_gain_over_baseline,
        )
    )
    table.add_row(
        *_row(
            "rule of thumb",
            summary.rule_of_thumb,
            summary.gain_over_rule_of_thumb,
            again.get("rule_of_thumb"),
            summary.confirmed_gain_over_rule_of_thumb,
        )
    )
    console.print(table)
    if summary.best is None:
        console.print(
            "[red]No configuration met the SLA: loosen the SLA or widen the search space.[/]"
        )
    else:
        b = summary.best
        console.print(
            f"Recommendation: max_batch_size={b.max_batch_size} "
            f"max_queue_time_ms={b.max_queue_time_ms:g}",
            highlight=False,
        )
    beaten = outdone_by(summary)
    if beaten:
        console.print(
            f"[yellow]Re-measured back to back, the {' and the '.join(beaten)} did better "
            "than the recommendation: the measurements are noisier than the differences "
            "between these configurations (a busy machine?). Run again, or with longer "
            "steps (measurement.step_duration_s).[/]"
        )
    if summary.interrupted:
        console.print("[yellow]Interrupted: this is the best so far.[/]")
