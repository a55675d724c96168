"""How a study ends with a result: the confirmation's verdict, or (with no
confirmation) the best trial against the gain gate; the winner written back or only
recommended, or the incumbent kept (NoSignificantGain); the knobs at an edge of the
searched space named in events."""

from __future__ import annotations

from batchpilot.operator import decisions
from batchpilot.operator import runtimes as operator_runtimes
from batchpilot.operator.cleanup import Cleanup
from batchpilot.operator.spec import batching_config
from batchpilot.operator.status import Confirmation, Result, TrialEntry
from batchpilot.operator.studystate import StudyState
from batchpilot.operator.trials import search_space
from batchpilot.operator.writeback import WriteBack
from batchpilot.tuner.edges import space_edges
from batchpilot.tuner.verdict import Estimate


class Finish:
    def __init__(self, state: StudyState, write_back: WriteBack, cleanup: Cleanup) -> None:
        self._state = state
        self._write_back = write_back
        self._cleanup = cleanup

    async def run(self, reason: str) -> None:
        state = self._state
        spec = state.spec
        self._report_edges()
        if state.status.confirmation is not None:
            await self._confirmed(state.status.confirmation)
            return
        best = decisions.best_trial(state.status.trials)
        if best is None:
            await self._cleanup.fail(f"{reason}, and no configuration met the SLA")
            return
        if decisions.incumbent_unbeaten(spec, state.status.trials, best):
            await self._keep_incumbent(reason, best)
            return
        shortfall = decisions.study_gain_shortfall(spec, state.status.trials, best)
        if shortfall is not None:
            await self._keep_incumbent(reason, best, shortfall)
            return
        await self._cleanup.remove_canary()
        if spec.tuning.write_back == "Apply":
            if not await self._write_back.write(dict(best.params)):
                return
        elif spec.tuning.write_back == "Recommend":
            await self._write_back.restore_in_place()
        message = (
            f"{reason}: best {decisions.describe_params(best.params)} → "
            f"{best.effective_rps or 0.0:.0f} req/s (trial {best.number})"
        )
        if spec.tuning.write_back == "Recommend":
            message += "; recommended only (writeBack: Recommend)"
        state.condition("Ready", "True", "Converged", message)
        state.condition("TargetReady", "True", "Done", "study finished")
        persist = operator_runtimes.persist_advice(spec, best.params)
        await state.save(phase="Converged", message=message, persist=persist)
        state.event("Normal", "Converged", message)

    async def write_adopted(self) -> None:
        """writeBack turned to Apply on a converged study: its result is written and
        verified (rolled back when it breaks the target), as at a study's own end."""
        state = self._state
        chosen = decisions.chosen_params(state.spec, state.status)
        if chosen is None:
            return
        if not await self._write_back.write(chosen):
            return
        message = (
            f"writeBack Apply: wrote {decisions.describe_params(chosen)} to "
            f"{state.spec.target.name}, watched for {state.spec.tuning.verify_seconds} s"
        )
        await state.save(restored=False, message=message)

    def _report_edges(self) -> None:
        """An event per knob of the study's best at an end of its searched range: the
        optimum may lie beyond it, and the event says which field widens it."""
        state = self._state
        best = decisions.best_trial(state.status.trials)
        if best is None:
            return
        edges = space_edges(batching_config(best.params), search_space(state.spec), operator=True)
        for edge in edges:
            state.event("Normal", "EdgeOfSpace", edge)

    async def _keep_incumbent(self, reason: str, best: TrialEntry, why: str = "") -> None:
        """The study's best is the configuration the target already runs, or (`why`) an
        unconfirmed best short of the gain gate: nothing is written (not even the same
        values, which would take the fields over), and the study ends as a confirmation
        that found no gain would."""
        state = self._state
        await self._cleanup.remove_canary()
        await self._write_back.restore_in_place()
        message = f"{reason}: the incumbent stays. NoSignificantGain: " + (
            why
            or "no other configuration measured above the incumbent "
            f"{decisions.describe_params(best.params)} → {best.effective_rps or 0.0:.0f} "
            f"req/s (trial {best.number}), nothing to confirm"
        )
        state.condition("Ready", "True", "NoSignificantGain", message)
        state.condition("TargetReady", "True", "Done", "study finished")
        await state.save(phase="Converged", message=message)
        state.event("Normal", "NoSignificantGain", message)

    async def _confirmed(self, confirmation: Confirmation) -> None:
        """Write back the winner only when the verdict proves its gain; otherwise keep
        the incumbent and say why (NoSignificantGain)."""
        state = self._state
        spec = state.spec
        verdict = decisions.verdict_of(confirmation, spec)
        generation = state.status.observed_generation
        trials = state.status.trials

        def result(estimate: Estimate) -> Result:
            params = decisions.params_of(confirmation, estimate.config)
            return decisions.estimate_result(
                verdict, estimate, params, generation, decisions.trial_of(trials, params)
            )

        best, baseline = result(verdict.winner), result(verdict.incumbent)
        await state.save(
            best=best,
            baseline=baseline,
            confirmation=confirmation.model_copy(update={"method": verdict.method}),
        )
        await self._cleanup.remove_canary()
        chosen = decisions.params_of(confirmation, verdict.chosen)
        reason = confirmation.reason
        if verdict.significant:
            apply = spec.tuning.write_back == "Apply"
            if apply:
                if not await self._write_back.write(chosen):
                    return
            else:
                await self._write_back.restore_in_place()
            message = (
                f"{reason}: best {decisions.describe_params(chosen)} → "
                f"{verdict.winner.estimate:.0f} req/s, {verdict.gain_percent:+.1f} % over the "
                f"incumbent (lower bound {verdict.gain_low_percent:+.1f} % ≥ "
                f"{verdict.min_gain_percent:g} %)"
            )
            if not apply:
                message += "; recommended only (writeBack: Recommend)"
            condition_reason, event_reason = "Converged", "Converged"
            await state.save(persist=operator_runtimes.persist_advice(spec, chosen))
        else:
            await self._write_back.restore_in_place()
            message = f"{reason}: the incumbent stays. {verdict.reason}"
            condition_reason, event_reason = "NoSignificantGain", "NoSignificantGain"
        state.condition("Ready", "True", condition_reason, message)
        state.condition("TargetReady", "True", "Done", "study finished")
        await state.save(phase="Converged", message=message)
        state.event("Normal", event_reason, message)
