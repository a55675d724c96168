"""What a person watching `tune --local` sees: one line per trial on stderr (stdout is
kept for --json), a spinner while a trial is measured, a table at the end."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.status import Status
from rich.table import Table

from batchpilot.tuner.runner import TrialDone, TrialStart
from batchpilot.tuner.summary import ConfigFigures, TuneSummary
from batchpilot.tuner.verdict import Verdict, gain_over_incumbent

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
        # a token-stream trial is judged on its TTFT and TPOT tails, scored by goodput
        tails = (
            f"TTFT p99 {_ms(rec.ttft_p99_ms):>9}  TPOT p99 {_ms(rec.tpot_p99_ms):>8}  "
            f"{_num(rec.output_tokens_per_s, 0)} tok/s"
            if rec.ttft_p99_ms is not None or rec.tpot_p99_ms is not None
            else f"p99 {_ms(rec.p99_ms):>9}"
        )
        self.console.print(
            f"[bold]{measured:>2}/{self.total}[/] trial {rec.number:<3} {label:<13} "
            f"{_config_text(rec.params):<28} {_rps(rec.effective_rps):>11}  "
            f"{tails}  {STATE_MARK.get(rec.state, rec.state)}  | {best_text}"
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
    name: str, fig: ConfigFigures | None, gain: float | None, *, tokens: bool = False
) -> list[str]:
    """A summary row; `tokens`: the TTFT and TPOT tails and output tokens/s in place of
    the end-to-end p99 (a token-stream study is judged on them)."""
    latency = 3 if tokens else 1
    if fig is None:
        return [name, "-", "-", "-", "-", *["-"] * latency, "-"]
    figures = (
        [_num(fig.ttft_p99_ms, 1), _num(fig.tpot_p99_ms, 2), _num(fig.output_tokens_per_s, 0)]
        if tokens
        else [_num(fig.p99_ms, 1)]
    )
    return [
        name,
        str(fig.trial),
        str(fig.max_batch_size),
        f"{fig.max_queue_time_ms:g}",
        _num(fig.effective_rps, 0),
        *figures,
        _gain(gain),
    ]


def verdict_table(verdict: Verdict) -> Table:
    """Each re-measured configuration: its rounds, its estimate and interval, its gain
    over the incumbent and that gain's interval, and whether it is the one to run. Kept
    narrow: stderr is often not a terminal, and rich then lays tables out in 80 columns."""
    level = f"{verdict.level:.0%}"
    table = Table(
        title=f"Re-measured interleaved, {len(verdict.incumbent.rounds)} rounds",
        caption=f"method: {verdict.method}",
        box=box.SIMPLE_HEAD,
    )
    for column in ("config", "rounds req/s", f"req/s [{level}]", f"gain [{level}]", ""):
        table.add_column(
            column, justify="left" if column in ("config", "") else "right", no_wrap=True
        )
    for estimate in verdict.ranking:
        config = estimate.config
        is_incumbent = config == verdict.incumbent.config
        gain, low, high = gain_over_incumbent(verdict, estimate)
        if config == verdict.chosen:
            note = "chosen" if verdict.significant else "kept"
        elif config == verdict.winner.config:
            note = f"low < {verdict.min_gain_percent:g}%"
        elif min(estimate.rounds) <= 0.0:
            note = "missed SLA"
        else:
            note = ""
        table.add_row(
            f"{config.max_batch_size}/{config.max_queue_time_ms:g}ms"
            + (" now" if is_incumbent else ""),
            " ".join(f"{v:.0f}" for v in estimate.rounds),
            f"{estimate.estimate:.0f} [{estimate.low:.0f}, {estimate.high:.0f}]",
            "-" if is_incumbent else f"{gain:+.0f}% [{low:+.0f}, {high:+.0f}]",
            note,
            style="bold green" if config == verdict.chosen else None,
        )
    return table


def render_summary(console: Console, summary: TuneSummary) -> None:
    table = Table(
        title=f"Study: effective throughput at {summary.sla.describe('<=')} "
        f"(errors <= {summary.sla.max_error_rate:g})",
        caption="req/s: effective throughput in the study; best+: the study's best over the row",
    )
    tokens = any(
        fig is not None and fig.ttft_p99_ms is not None
        for fig in (summary.best, summary.baseline, summary.rule_of_thumb)
    )
    latency = ("TTFT p99 ms", "TPOT p99 ms", "tok/s") if tokens else ("p99 ms",)
    table.add_column("")
    for column in ("trial", "batch", "wait ms", "req/s", *latency, "best+"):
        table.add_column(column, justify="right")
    table.add_row(*_row("best", summary.best, None, tokens=tokens), style="bold")
    table.add_row(*_row("baseline", summary.baseline, summary.gain_over_baseline, tokens=tokens))
    table.add_row(
        *_row(
            "rule of thumb", summary.rule_of_thumb, summary.gain_over_rule_of_thumb, tokens=tokens
        )
    )
    console.print(table)
    if summary.verdict is not None:
        console.print(verdict_table(summary.verdict))
    if summary.recommended is None:
        console.print(
            "[red]No configuration met the SLA: loosen the SLA or widen the search space.[/]"
        )
    else:
        c = summary.recommended
        console.print(
            f"Recommendation: max_batch_size={c.max_batch_size} "
            f"max_queue_time_ms={c.max_queue_time_ms:g}: {summary.recommendation}",
            highlight=False,
        )
    for edge in summary.edges:
        console.print(f"[yellow]Edge of the space: {edge}.[/]", highlight=False)
    runtime = summary.runtime
    if runtime is not None and runtime.recommended is not None and runtime.persist_snippet:
        native = " ".join(f"{k}={v:g}" for k, v in runtime.recommended.items())
        console.print(
            f"In {runtime.name}'s terms: {native}. To keep it, {runtime.persist_where}:",
            highlight=False,
        )
        console.print(runtime.persist_snippet, highlight=False, markup=False)
    if summary.interrupted:
        console.print("[yellow]Interrupted: this is the best so far.[/]")
