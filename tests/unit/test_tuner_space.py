"""The search space: bounds validation and the encoding of the knobs for Optuna."""

from __future__ import annotations

import math
import random

import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from pydantic import ValidationError

from batchpilot.models import BatchingConfig
from batchpilot.tuner.space import QUEUE_INTERNAL, ParameterSpec, SearchSpace


def _space() -> SearchSpace:
    return SearchSpace.from_bounds(max_batch_size=(1, 64), max_queue_time_ms=(0, 100))


def test_batch_size_is_an_integer_on_a_log_scale() -> None:
    dist = _space().distributions()["max_batch_size"]
    assert isinstance(dist, IntDistribution)
    assert (dist.low, dist.high, dist.log) == (1, 64, True)


def test_queue_time_encoding_reaches_zero_and_the_upper_bound() -> None:
    space = _space()
    dist = space.distributions()[QUEUE_INTERNAL]
    assert isinstance(dist, FloatDistribution)
    assert not dist.log
    assert space.decode_queue(dist.low) == 0.0
    assert space.decode_queue(dist.high) == 100.0


def test_queue_time_encoding_is_log_like_above_a_few_ms() -> None:
    space = _space()
    # equal steps in the encoded space cover 5->10 ms and 50->100 ms alike (roughly)
    low_octave = space.encode_queue(10) - space.encode_queue(5)
    high_octave = space.encode_queue(100) - space.encode_queue(50)
    assert high_octave == pytest.approx(low_octave, rel=0.15)
    # while all of 0 -> 1 ms takes no more room than one doubling, where a log scale
    # from 0.01 ms would spend more on it than on the whole of 5 -> 100 ms
    sub_ms = space.encode_queue(1) - space.encode_queue(0)
    assert sub_ms <= math.log(2)
    assert math.log(1 / 0.01) > space.encode_queue(100) - space.encode_queue(5) > sub_ms


def test_snapped_values_round_trip_exactly() -> None:
    space = _space()
    dist = space.distributions()[QUEUE_INTERNAL]
    assert isinstance(dist, FloatDistribution)
    rng = random.Random(7)
    for _ in range(2000):
        u = space.snap(QUEUE_INTERNAL, rng.uniform(dist.low, dist.high))
        q = space.decode_queue(float(u))
        assert q == round(q, 2)
        assert space.encode_queue(q) == u  # bit for bit: rebuilds rely on it
        assert dist.low <= u <= dist.high


def test_bounds_are_moved_onto_the_hundredth_of_a_ms_grid() -> None:
    space = SearchSpace.from_bounds(max_batch_size=(2, 8), max_queue_time_ms=(0.004, 33.333))
    assert space.queue_bounds == (0.01, 33.33)


@pytest.mark.parametrize(
    ("batch", "queue", "message"),
    [
        ((0, 8), (0, 10), "1 <= min <= max"),
        ((16, 8), (0, 10), "1 <= min <= max"),
        ((1, 100_000), (0, 10), "1 <= min <= max"),
        ((1.5, 8), (0, 10), "integers"),
        ((1, 8), (-1, 10), "0 <= min <= max"),
        ((1, 8), (20, 10), "0 <= min <= max"),
        ((1, 8), (0, math.inf), "finite"),
        ((1, 8), (0.001, 0.002), "no multiple of 0.01"),
    ],
)
def test_bad_bounds_are_rejected_with_what_is_allowed(
    batch: tuple[int, int], queue: tuple[float, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SearchSpace.from_bounds(max_batch_size=batch, max_queue_time_ms=queue)


def test_extra_parameters_come_from_configuration() -> None:
    space = SearchSpace.from_bounds(
        max_batch_size=(1, 8),
        max_queue_time_ms=(0, 10),
        extra=[
            ParameterSpec("max_num_seqs", "int", 8, 256, True),
            ParameterSpec("x", "float", 0, 1),
        ],
    )
    assert space.names == ("max_batch_size", "max_queue_time_ms", "max_num_seqs", "x")
    dists = space.distributions()
    assert dists["max_num_seqs"] == IntDistribution(8, 256, log=True)
    assert dists["x"] == FloatDistribution(0, 1)
    internal = space.to_internal(
        {"max_batch_size": 4, "max_queue_time_ms": 2.5, "max_num_seqs": 32}
    )
    assert space.from_internal(internal) == {
        "max_batch_size": 4,
        "max_queue_time_ms": 2.5,
        "max_num_seqs": 32,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("max_batch_size", "int", 1, 8, False), "reserved"),
        (("bad name", "int", 1, 8, False), "identifier"),
        (("n", "int", 8, 1, False), "low 8 must be <= high 1"),
        (("n", "float", 0, 1, True), "log scale needs low > 0"),
        (("n", "int", 0.5, 4, False), "integer bounds"),
        (("n", "bool", 0, 1, False), "int"),
    ],
)
def test_bad_extra_parameters_are_rejected(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ParameterSpec(*args)  # type: ignore[arg-type]


def test_duplicate_extra_names_are_rejected() -> None:
    spec = ParameterSpec("n", "int", 1, 4)
    with pytest.raises(ValueError, match="more than once: n"):
        SearchSpace.from_bounds(max_batch_size=(1, 8), max_queue_time_ms=(0, 1), extra=[spec, spec])


def test_unknown_parameter_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown parameters max_num_seqs"):
        _space().to_internal({"max_batch_size": 2, "max_num_seqs": 3})


def test_out_of_bounds_fixed_values_widen_only_their_trial_distribution() -> None:
    space = _space()
    internal = space.to_internal(
        SearchSpace.params_of(BatchingConfig(max_batch_size=256, max_queue_time_ms=500))
    )
    dists = space.distributions_for(internal)
    assert dists["max_batch_size"] == IntDistribution(1, 256, log=True)
    widened = dists[QUEUE_INTERNAL]
    assert isinstance(widened, FloatDistribution)
    assert widened.high == math.log1p(500)
    assert space.distributions()["max_batch_size"] == IntDistribution(1, 64, log=True)
    assert not space.contains(BatchingConfig(max_batch_size=256, max_queue_time_ms=500))
