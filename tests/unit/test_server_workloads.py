"""The built-in models: deterministic, input rules enforced, batching does not change
a request's answer."""

from __future__ import annotations

import pytest
import torch

from batchpilot.server.workloads import (
    ENCODER_MAX_TOKENS,
    MLP_FEATURES,
    MLP_MAX_ROWS,
    EncoderWorkload,
    InputError,
    MLPWorkload,
    ModelInput,
    resolve_device,
)

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


def run(workload: MLPWorkload | EncoderWorkload, inputs: list[torch.Tensor]) -> list[list[int]]:
    with torch.inference_mode():
        return workload.forward_tensors(inputs)


def test_mlp_is_deterministic(mlp: MLPWorkload) -> None:
    again = MLPWorkload(CPU)
    assert torch.equal(mlp.synthetic(8), again.synthetic(8))
    assert run(mlp, [mlp.synthetic(8)]) == run(again, [again.synthetic(8)])


def test_mlp_batch_answers_match_single(mlp: MLPWorkload) -> None:
    parts = [mlp.synthetic(n) for n in (1, 5, 3)]
    batched = run(mlp, parts)
    assert [len(p) for p in batched] == [1, 5, 3]
    assert batched == [run(mlp, [p])[0] for p in parts]


def test_mlp_parse_real_rows(mlp: MLPWorkload) -> None:
    rows = [[0.5] * MLP_FEATURES, [1] * MLP_FEATURES]
    checked = mlp.parse(rows)
    assert checked == ModelInput(2, rows)
    tensor = mlp.to_tensor(rows)
    assert tensor.shape == (2, MLP_FEATURES)
    assert tensor.dtype == torch.float32


def test_requests_of_both_forms_run_together(mlp: MLPWorkload) -> None:
    rows = mlp.synthetic(3).tolist()
    with torch.inference_mode():
        answers = mlp.forward([mlp.parse(rows), mlp.synthetic_input(3), mlp.synthetic_input(1)])
    assert answers[0] == answers[1]
    assert answers[2] == answers[0][:1]


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
def test_mlp_parse_refuses(mlp: MLPWorkload, raw: object, expected: str) -> None:
    with pytest.raises(InputError) as info:
        mlp.parse(raw)
    assert expected in str(info.value)


@pytest.mark.parametrize("size", [0, MLP_MAX_ROWS + 1])
def test_synthetic_size_is_bounded(mlp: MLPWorkload, size: int) -> None:
    with pytest.raises(InputError, match=f"takes 1 to {MLP_MAX_ROWS} rows"):
        mlp.synthetic_input(size)


def test_encoder_padding_does_not_change_answers(encoder: EncoderWorkload) -> None:
    parts = [encoder.synthetic(n) for n in (3, 40, 1)]
    batched = run(encoder, parts)
    assert batched == [run(encoder, [p])[0] for p in parts]
    assert all(len(classes) == 1 for classes in batched)


def test_encoder_parse(encoder: EncoderWorkload) -> None:
    assert encoder.parse([1, 2, 999]) == ModelInput(3, [1, 2, 999])
    assert encoder.to_tensor([1, 2, 999]).tolist() == [1, 2, 999]
    for raw, expected in (
        ([0], "run from 1 to 999"),
        ([1000], "run from 1 to 999"),
        ([1.5], "must be integers"),
        ([True], "must be integers"),
        ([1] * (ENCODER_MAX_TOKENS + 1), f"at most {ENCODER_MAX_TOKENS}"),
        ("text", "a list of 1 to"),
    ):
        with pytest.raises(InputError) as info:
            encoder.parse(raw)
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
