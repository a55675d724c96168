"""The confirmation phase: the finalists and the incumbent measured again, interleaved
round by round, each round with its own load seed. A measurement that fails (the
target refused, a pod restarted, the deadline passed) scores 0 req/s for that round,
so that configuration cannot win; one an autoscaler disturbed is measured again."""

from __future__ import annotations

import asyncio

from batchpilot.errors import TargetError
from batchpilot.operator import decisions
from batchpilot.operator.cleanup import Cleanup
from batchpilot.operator.finish import Finish
from batchpilot.operator.slots import StudySlot
from batchpilot.operator.spec import Params, batching_config
from batchpilot.operator.status import Confirmation, RoundMeasurement
from batchpilot.operator.studystate import StudyState
from batchpilot.operator.world import TargetProblem
from batchpilot.tuner.confirm import probes_light_load

# a confirmation measurement disturbed by an autoscaler is taken again at most this
# often in a row; past it the round scores 0 like any failure (the fleet never held still)
MAX_DISTURBED_ROUNDS = 3


class ConfirmationRounds:
    def __init__(
        self, state: StudyState, slot: StudySlot, finish: Finish, cleanup: Cleanup
    ) -> None:
        self._state = state
        self._slot = slot
        self._finish = finish
        self._cleanup = cleanup
        # confirmation measurements in a row that an autoscaler disturbed
        self._disturbed_rounds = 0

    async def step(self, reason: str) -> None:
        """One step of the confirmation phase: start it, or take its next measurement."""
        state = self._state
        confirmation = state.status.confirmation
        if confirmation is None:
            await self._start(reason)
            return
        upcoming = decisions.next_measurement(confirmation, state.spec)
        if upcoming is None:
            return
        round_index, params = upcoming
        measured = await self._measure(confirmation, round_index, params)
        if measured is None:
            return
        rps, why = measured
        self._disturbed_rounds = 0
        await self._record(confirmation, round_index, params, rps, why)
        await self._cleanup.fail_if_stopping()

    async def _start(self, reason: str) -> None:
        state = self._state
        confirmation = decisions.start_confirmation(state.spec, state.status.trials, reason)
        if confirmation is None:  # plan() only confirms when there is something to
            await self._finish.run(reason)
            return
        finalists = ", ".join(decisions.describe_params(p) for p in confirmation.finalists)
        message = (
            f"{reason}; confirming: the finalists ({finalists}) and the incumbent "
            f"{decisions.describe_params(confirmation.incumbent)} measured again, "
            f"interleaved, {confirmation.rounds} rounds"
        )
        await state.save(confirmation=confirmation, phase="Confirming", message=message)
        state.event("Normal", "Confirming", message)

    async def _measure(
        self, confirmation: Confirmation, round_index: int, params: Params
    ) -> tuple[float, str] | None:
        """The round's req/s and why it scores 0 (empty when it does not); None when an
        autoscaler disturbed it and it is measured again."""
        state = self._state
        seed = state.spec.tuning.seed + decisions.ROUND_SEED_STRIDE * (round_index + 1)
        rps, why = 0.0, ""
        async with self._slot.measuring():
            started = state.clock()
            state.condition("Measuring", "True", "Confirming", f"round {round_index + 1}")
            await state.save()
            deadline = state.spec.tuning.trial_deadline_seconds
            try:
                async with asyncio.timeout(deadline):
                    await state.world.trials.apply(params)
                    config = batching_config(params)
                    incumbent = batching_config(confirmation.incumbent)
                    result = await state.world.trials.measure(
                        config,
                        must_beat=None,
                        since=started,
                        seed=seed,
                        light_load=probes_light_load(config, incumbent, round_index),
                    )
                rps = result.effective_rps
                if result.light_load:
                    # broke the SLA below its capacity: it cannot be written back
                    rps, why = 0.0, result.light_load
            except TargetProblem as exc:
                why = f"{exc.reason}: {exc.message}"
                if exc.stops_study:
                    state.stop_with(exc)
                if exc.invalid and self._disturbed_rounds < MAX_DISTURBED_ROUNDS:
                    # an autoscaler changed the fleet under it: the round is measured
                    # again, a few times at most, before it scores 0 like a failure
                    self._disturbed_rounds += 1
                    state.event(
                        "Normal", exc.reason, f"{exc.message}; measured again (confirmation round)"
                    )
                    return None
            except TimeoutError:
                why = f"deadline of {deadline} s passed"
            except (OSError, TargetError, ValueError) as exc:
                why = str(exc)
        return rps, why

    async def _record(
        self, confirmation: Confirmation, round_index: int, params: Params, rps: float, why: str
    ) -> None:
        state = self._state
        measured = RoundMeasurement(
            round=round_index, params=params, effective_rps=round(rps, 1), reason=why[:500]
        )
        confirmation = confirmation.model_copy(
            update={"measurements": [*confirmation.measurements, measured]}
        )
        extra = round_index >= confirmation.rounds  # an adaptive round: still undecided
        text = (
            f"confirming, round {round_index + 1}"
            + (
                f" (undecided after {confirmation.rounds}, up to {confirmation.max_rounds})"
                if extra
                else f"/{confirmation.rounds}"
            )
            + ": "
            f"{decisions.describe_params(params)} → {rps:.0f} req/s"
            + (f" (failed: {why[:200]})" if why else "")
        )
        await state.save(confirmation=confirmation, phase="Confirming", message=text)
        state.event("Warning" if why else "Normal", "Confirmation", text)
