"""The built-in models: deterministic, input rules enforced, batching does not change
a request's answer."""

from __future__ import annotations

import pytest
import torch

from batchpilot.server.inputs import (
    ENCODER_MAX_TOKENS,
    MLP_FEATURES,
    MLP_MAX_ROWS,
    EncoderInputs,
    InputError,
    MLPInputs,
    ModelInput,
)
from batchpilot.server.workloads import EncoderWorkload, MLPWorkload, resolve_device

CPU = torch.device("cpu")

# The encoder's padded batches go through nested tensors, which warn that they are a
# prototype on every call; the server filters that warning, pytest resets the filters.
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


@pytest.fixture(scope="module")
def mlp() -> MLPWorkload:
    return MLPWorkload(CPU)


@pytest.fixture(scope="module")
def encoder() -> EncoderWorkload:
    return EncoderWorkload(CPU)


def run(workload: MLPWorkload | EncoderWorkload, inputs: list[ModelInput]) -> list[list[int]]:
    with torch.inference_mode():
        return workload.forward(inputs)


def real(workload: MLPWorkload | EncoderWorkload, size: int) -> ModelInput:
    """The synthetic input of `size` sent as real data."""
    return workload.rules.parse(workload.synthetic(size).tolist())


def test_mlp_is_deterministic(mlp: MLPWorkload) -> None:
    again = MLPWorkload(CPU)
    assert torch.equal(mlp.synthetic(8), again.synthetic(8))
    assert run(mlp, [MLPInputs.synthetic_input(8)]) == run(again, [MLPInputs.synthetic_input(8)])


def test_mlp_answers_are_the_argmax_of_the_network(mlp: MLPWorkload) -> None:
    with torch.inference_mode():
        expected = mlp.net(mlp.synthetic(5)).argmax(dim=1).tolist()
    assert run(mlp, [MLPInputs.synthetic_input(5)]) == [expected]


def test_mlp_batch_answers_match_single(mlp: MLPWorkload) -> None:
    parts = [MLPInputs.synthetic_input(n) for n in (1, 5, 3)]
    batched = run(mlp, parts)
    assert [len(p) for p in batched] == [1, 5, 3]
    assert batched == [run(mlp, [p])[0] for p in parts]


def test_mlp_assembles_rows_in_request_order(mlp: MLPWorkload) -> None:
    rows = [[float(i)] * MLP_FEATURES for i in range(2)]
    synthetic = MLPInputs.synthetic_input
    batch = mlp.assemble([synthetic(2), MLPInputs.parse(rows), synthetic(1)])
    assert batch.dtype == torch.float32
    assert torch.equal(batch[0:2], mlp.synthetic(2))
    assert torch.equal(batch[2:4], torch.tensor(rows))
    assert torch.equal(batch[4:5], mlp.synthetic(1))
    assert torch.equal(mlp.assemble([MLPInputs.parse(rows)]), torch.tensor(rows))


def test_mlp_parse_real_rows() -> None:
    rows = [[0.5] * MLP_FEATURES, [1] * MLP_FEATURES]
    assert MLPInputs.parse(rows) == ModelInput(2, rows)


def test_requests_of_both_forms_run_together(mlp: MLPWorkload) -> None:
    synthetic = MLPInputs.synthetic_input
    answers = run(mlp, [real(mlp, 3), synthetic(3), synthetic(1), real(mlp, 2)])
    assert answers[0] == answers[1]
    assert answers[2] == answers[0][:1]
    assert answers[3] == answers[0][:2]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([], "a list of 1 to"),
        ({"a": 1}, "a list of 1 to"),
        ([[1.0] * (MLP_FEATURES - 1)], f"has {MLP_FEATURES - 1} values"),
        ([[1.0] * MLP_FEATURES, "row"], "`inputs[1]` has str"),
        ([[1.0] * (MLP_FEATURES - 1) + [True]], "holds True"),
        ([[1.0] * (MLP_FEATURES - 1) + [1e300]], "within float32"),
        ([[1.0] * (MLP_FEATURES - 1) + [float("nan")]], "must be finite"),
        ([[0.0] * MLP_FEATURES] * (MLP_MAX_ROWS + 1), f"at most {MLP_MAX_ROWS} are allowed"),
    ],
)
def test_mlp_parse_refuses(raw: object, expected: str) -> None:
    with pytest.raises(InputError) as info:
        MLPInputs.parse(raw)
    assert expected in str(info.value)


@pytest.mark.parametrize("size", [0, MLP_MAX_ROWS + 1])
def test_synthetic_size_is_bounded(size: int) -> None:
    with pytest.raises(InputError, match=f"takes 1 to {MLP_MAX_ROWS} rows"):
        MLPInputs.synthetic_input(size)


def test_encoder_padding_does_not_change_answers(encoder: EncoderWorkload) -> None:
    parts = [EncoderInputs.synthetic_input(n) for n in (3, 40, 1)]
    batched = run(encoder, parts)
    assert batched == [run(encoder, [p])[0] for p in parts]
    assert all(len(classes) == 1 for classes in batched)


def test_encoder_real_and_synthetic_tokens_agree(encoder: EncoderWorkload) -> None:
    answers = run(encoder, [real(encoder, 7), EncoderInputs.synthetic_input(7), real(encoder, 2)])
    assert answers[0] == answers[1]
    assert answers[2] == run(encoder, [EncoderInputs.synthetic_input(2)])[0]


def test_encoder_parse() -> None:
    assert EncoderInputs.parse([1, 2, 999]) == ModelInput(3, [1, 2, 999])
    for raw, expected in (
        ([0], "run from 1 to 999"),
        ([1000], "run from 1 to 999"),
        ([1.5], "must be integers"),
        ([True], "must be integers"),
        ([1] * (ENCODER_MAX_TOKENS + 1), f"at most {ENCODER_MAX_TOKENS}"),
        ("text", "a list of 1 to"),
    ):
        with pytest.raises(InputError) as info:
            EncoderInputs.parse(raw)
        assert expected in str(info.value)


def test_encoder_synthetic_tokens_are_not_padding(encoder: EncoderWorkload) -> None:
    tokens = encoder.synthetic(ENCODER_MAX_TOKENS)
    assert int(tokens.min()) >= 1


def test_resolve_device() -> None:
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type in {"cpu", "cuda"}
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")
