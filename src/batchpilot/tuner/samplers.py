"""Optuna samplers made reproducible trial by trial.

A seeded Optuna sampler draws from one random stream for the whole study, so a study
rebuilt from its finished trials (after an operator restart) would continue from a
different point of that stream than the run that never stopped. Here every trial gets
a fresh inner sampler seeded from (study seed, trial number): what trial n suggests
depends only on the seed, n and the trials before it, however they got into the study.
The wrapper also snaps sampled values onto the search space's grid (see `space`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.samplers import BaseSampler, GPSampler, RandomSampler, TPESampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from batchpilot.tuner.space import BATCH, SearchSpace

# TPE's default of 10 random start-up trials is tuned for budgets of hundreds; a tuning
# run here has ~10-30 trials and its first ones are the baseline and warm starts, which
# already spread the observations, so the model takes over after a few.
STARTUP_TRIALS = 4


def _tpe(seed: int) -> BaseSampler:
    with warnings.catch_warnings():
        # multivariate TPE is marked experimental but is the better model for two
        # strongly interacting knobs (a longer wait only pays with a bigger batch)
        warnings.simplefilter("ignore", ExperimentalWarning)
        return TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS, multivariate=True)


def _gp(seed: int) -> BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return GPSampler(seed=seed, n_startup_trials=STARTUP_TRIALS)


def _random(seed: int) -> BaseSampler:
    return RandomSampler(seed=seed)


# Optuna's QMC sampler is left out: it numbers its points with a counter kept in the
# study's own attributes, which a study rebuilt from its trials does not carry, so a
# rebuilt study would restart the sequence (breaking rebuild equivalence, see above).
SAMPLERS: dict[str, Callable[[int], BaseSampler]] = {"TPE": _tpe, "GP": _gp, "Random": _random}


def sampler_factory(name: str) -> Callable[[int], BaseSampler]:
    for known, factory in SAMPLERS.items():
        if known.lower() == name.lower():
            return factory
    raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def trial_seed(seed: int, number: int) -> int:
    """A per-trial seed: distinct for every (seed, number) that matters here, stable
    across processes (unlike hash() of strings)."""
    return (seed * 1_000_003 + number * 7919 + 1) % (2**32)


BatchLimit = Callable[[Study], int | None]


def _no_limit(study: Study) -> int | None:
    return None


class PerTrialSampler(BaseSampler):
    """Delegates to a fresh inner sampler per trial number and snaps sampled values.

    A batch size at or above the study's batch limit (the smallest one that killed the
    server, read from the study's trials by `batch_limit`) is clamped to just below it,
    so no further trial is spent on the neighbours of a crash."""

    def __init__(
        self,
        factory: Callable[[int], BaseSampler],
        seed: int,
        space: SearchSpace,
        batch_limit: BatchLimit = _no_limit,
    ) -> None:
        self._factory = factory
        self._seed = seed
        self._space = space
        self._batch_limit = batch_limit
        self._number = -1
        self._inner: BaseSampler | None = None

    def _for(self, trial: FrozenTrial) -> BaseSampler:
        if self._inner is None or self._number != trial.number:
            self._inner = self._factory(trial_seed(self._seed, trial.number))
            self._number = trial.number
        return self._inner

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        sampled = self._for(trial).sample_relative(study, trial, search_space)
        return {name: self._fit(study, name, value) for name, value in sampled.items()}

    def _fit(self, study: Study, name: str, value: Any) -> Any:
        if name == BATCH:
            limit = self._batch_limit(study)
            if limit is not None and value >= limit:
                low, _ = self._space.batch_bounds
                return max(low, limit - 1)
        return self._space.snap(name, value)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        value = self._for(trial).sample_independent(study, trial, param_name, param_distribution)
        return self._fit(study, param_name, value)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._for(trial).before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._for(trial).after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        # Reproducibility comes from the per-trial seeds; nothing to reseed.
        return None


def make_sampler(
    name: str, seed: int, space: SearchSpace, *, batch_limit: BatchLimit = _no_limit
) -> optuna.samplers.BaseSampler:
    return PerTrialSampler(sampler_factory(name), seed, space, batch_limit)
