"""Pure parts of the reference server: request bodies, metric buckets, the batch
profile, warm-up shapes."""

from __future__ import annotations

import gc
import itertools
import math
import pickle

import pytest

from batchpilot.models import BatchingConfig
from batchpilot.server.api import (
    ApiError,
    BatchingUpdate,
    PredictRequest,
    parse_body,
    parse_json_object,
    validate,
)
from batchpilot.server.engine import default_threads, exit_description
from batchpilot.server.inputs import ModelInput
from batchpilot.server.metrics import LATENCY_BUCKETS, geometric_buckets
from batchpilot.server.model_process import HEADER, Request, encode, warm_up_batch_sizes
from batchpilot.server.profile import BatchProfile
from batchpilot.server.runner import GC_YOUNG_THRESHOLD, collect_garbage_rarely

ALLOWED = "ALLOWED-TEXT"


def test_parse_json_object_accepts_object() -> None:
    assert parse_json_object(b'{"a": 1}', ALLOWED) == {"a": 1}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", "empty"),
        (b"{", "not valid JSON"),
        (b"\x80", "not valid JSON"),
        (b"3", "JSON int"),
        (b"null", "JSON NoneType"),
    ],
)
def test_parse_json_object_refuses(body: bytes, expected: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_json_object(body, ALLOWED)
    assert info.value.status == 400
    assert expected in info.value.message
    assert ALLOWED in info.value.message


def test_predict_request_needs_exactly_one_form() -> None:
    assert validate(PredictRequest, {"synthetic": {"size": 4}}, ALLOWED).synthetic is not None
    assert validate(PredictRequest, {"inputs": [[1.0]]}, ALLOWED).inputs == [[1.0]]
    for bad in ({}, {"inputs": [1], "synthetic": {"size": 1}}):
        with pytest.raises(ApiError, match='exactly one of "inputs"'):
            validate(PredictRequest, bad, ALLOWED)


def test_validation_message_names_field_and_allowed() -> None:
    with pytest.raises(ApiError) as info:
        validate(PredictRequest, {"synthetic": {"size": 1.5}}, ALLOWED)
    assert info.value.message.startswith("synthetic.size: ")
    assert info.value.message.endswith(f"allowed: {ALLOWED}")


def test_batching_update_is_partial() -> None:
    current = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
    assert BatchingUpdate(max_batch_size=16).merged(current) == BatchingConfig(
        max_batch_size=16, max_queue_time_ms=5.0
    )
    assert BatchingUpdate(max_queue_time_ms=0).merged(current) == BatchingConfig(
        max_batch_size=8, max_queue_time_ms=0.0
    )
    assert BatchingUpdate().merged(current) == current


@pytest.mark.parametrize(
    "update", [{"max_batch_size": 0}, {"max_batch_size": 4097}, {"max_queue_time_ms": -0.5}]
)
def test_batching_update_out_of_range_is_422(update: dict[str, float]) -> None:
    current = BatchingConfig(max_batch_size=8, max_queue_time_ms=5.0)
    with pytest.raises(ApiError) as info:
        BatchingUpdate.model_validate(update).merged(current)
    assert info.value.status == 422
    assert "max_batch_size an integer 1 to 4096" in info.value.message


@pytest.mark.parametrize("update", [{"max_batch_size": "8"}, {"max_batch_size": 8.5}, {"other": 1}])
def test_batching_update_wrong_types_are_400(update: dict[str, object]) -> None:
    with pytest.raises(ApiError) as info:
        validate(BatchingUpdate, update, ALLOWED)
    assert info.value.status == 400


def test_latency_buckets_resolve_p99_between_1ms_and_5s() -> None:
    assert LATENCY_BUCKETS[0] <= 0.001
    assert LATENCY_BUCKETS[-1] >= 5.0
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))
    steps = [b / a for a, b in itertools.pairwise(LATENCY_BUCKETS)]
    assert max(steps) <= 1.11  # a quantile lands within about 10 %


def test_geometric_buckets_shape_and_validation() -> None:
    assert geometric_buckets(1.0, 8.0, 2.0) == (1.0, 2.0, 4.0, 8.0)
    with pytest.raises(ValueError, match="factor > 1"):
        geometric_buckets(1.0, 8.0, 1.0)


def test_profile_means_per_batch_size_and_reset() -> None:
    profile = BatchProfile()
    profile.record(4, 0.010, 4)
    profile.record(4, 0.020, 12)
    profile.record(1, 0.003, 1)
    report = profile.report("mlp", "cpu")
    assert [(b.batch_size, b.count) for b in report.batches] == [(1, 1), (4, 2)]
    four = report.batches[1]
    assert math.isclose(four.mean_compute_ms, 15.0)
    assert four.mean_rows == 8.0
    profile.reset()
    assert profile.report("mlp", "cpu").batches == []


def test_warm_up_sizes_cover_powers_of_two_and_cap() -> None:
    assert warm_up_batch_sizes(1) == [1]
    assert warm_up_batch_sizes(8) == [1, 2, 4, 8]
    assert warm_up_batch_sizes(12) == [1, 2, 4, 8, 12]


def test_default_threads_leaves_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    assert default_threads() == 1
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0})
    assert default_threads() == 1
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    assert default_threads() == 7


def test_exit_description_names_the_signal() -> None:
    assert exit_description(-9) == "was killed by SIGKILL"
    assert exit_description(1) == "exited with code 1"
    assert exit_description(-200) == "was killed by signal 200"


def test_model_process_messages_round_trip() -> None:
    request = Request("forward", inputs=(ModelInput(3), ModelInput(1, [[0.0] * 64])))
    frame = encode(request)
    (length,) = HEADER.unpack(frame[: HEADER.size])
    assert length == len(frame) - HEADER.size
    assert pickle.loads(frame[HEADER.size :]) == request


@pytest.mark.parametrize(
    "body",
    [
        b'{"synthetic": {"size": 3}}',
        b'{"inputs": [[1, 2.5]]}',
        b'{"synthetic": {"size": 1}, "synthetic": {"size": 2}}',
        b'{"synthetic": {"size": 1.0}}',
        b'{"synthetic": {"size": true}}',
        b'{"synthetic": {"size": "3"}}',
        b'{"inputs": [NaN]}',
        b'{"inputs": [[1]], "extra": 0}',
        b"{}",
        b"[]",
        b"",
        b"{bad",
        '{"synthetic": {"size": 2}}'.encode("utf-16"),
    ],
)
def test_parse_body_agrees_with_step_by_step_parsing(body: bytes) -> None:
    """The fast path must accept exactly what json.loads + validation accepts, with the
    same result, and refuse with the step-by-step message."""
    try:
        expected: PredictRequest | str = validate(
            PredictRequest, parse_json_object(body, ALLOWED), ALLOWED
        )
    except ApiError as exc:
        expected = exc.message
    try:
        got: PredictRequest | str = parse_body(PredictRequest, body, ALLOWED)
    except ApiError as exc:
        got = exc.message
    assert repr(got) == repr(expected)  # repr: NaN is not equal to itself


def test_collect_garbage_rarely_freezes_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        collect_garbage_rarely()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
