"""What a predict request may hold for each built-in model, checked in plain Python.

The server's HTTP process checks requests with these rules and never imports PyTorch:
the models live in the model process (`model_process`), which receives only checked
inputs."""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

MLP_FEATURES = 64
MLP_MAX_ROWS = 4096

ENCODER_VOCAB = 1000
ENCODER_MAX_TOKENS = 512

FLOAT32_MAX = 3.4028234663852886e38


class InputError(ValueError):
    """The request's inputs do not fit the model; the message says what is allowed."""


class ModelInput(NamedTuple):
    """One request's checked input: `size` units (rows or tokens) of `values`, or of the
    model's deterministic synthetic input when `values` is None. A named tuple: batches
    of them are pickled to the model process, four times faster than a dataclass."""

    size: int
    values: list[Any] | None = None


class InputRules:
    """One model's input rules. `size` of an input is rows for the MLP and tokens for
    the encoder."""

    name: ClassVar[str]
    unit: ClassVar[str]
    max_size: ClassVar[int]
    schema: ClassVar[str]  # what `inputs` must look like, for error messages and docs

    @classmethod
    def parse(cls, raw: object) -> ModelInput:
        """Check the JSON `inputs` value; InputError when it does not fit."""
        raise NotImplementedError

    @classmethod
    def synthetic_input(cls, size: int) -> ModelInput:
        cls.check_size(size)
        return ModelInput(size)

    @classmethod
    def check_size(cls, size: int) -> None:
        if not 1 <= size <= cls.max_size:
            raise InputError(
                f"size {size} is out of range: the {cls.name} model takes 1 to "
                f"{cls.max_size} {cls.unit} per request"
            )


class MLPInputs(InputRules):
    name = "mlp"
    unit = "rows"
    max_size = MLP_MAX_ROWS
    schema = f"a list of 1 to {MLP_MAX_ROWS} rows, each a list of {MLP_FEATURES} numbers"

    @classmethod
    def parse(cls, raw: object) -> ModelInput:
        if not isinstance(raw, list) or not raw:
            raise InputError(f"`inputs` must be {cls.schema}")
        if len(raw) > MLP_MAX_ROWS:
            raise InputError(f"`inputs` has {len(raw)} rows: at most {MLP_MAX_ROWS} are allowed")
        for index, row in enumerate(raw):
            if not isinstance(row, list) or len(row) != MLP_FEATURES:
                got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
                raise InputError(
                    f"`inputs[{index}]` has {got}: each row must be a list of "
                    f"{MLP_FEATURES} numbers"
                )
            for value in row:
                # bool is an int to Python, but true/false is not a feature value.
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InputError(
                        f"`inputs[{index}]` holds {value!r}: rows must hold only numbers"
                    )
                if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
                    raise InputError(
                        f"`inputs[{index}]` holds {value!r}: numbers must be finite and "
                        f"within float32 (magnitude at most {FLOAT32_MAX:.4g})"
                    )
        return ModelInput(len(raw), raw)


class EncoderInputs(InputRules):
    name = "encoder"
    unit = "tokens"
    max_size = ENCODER_MAX_TOKENS
    schema = (
        f"a list of 1 to {ENCODER_MAX_TOKENS} token ids, integers from 1 to "
        f"{ENCODER_VOCAB - 1} (0 is padding)"
    )

    @classmethod
    def parse(cls, raw: object) -> ModelInput:
        if not isinstance(raw, list) or not raw:
            raise InputError(f"`inputs` must be {cls.schema}")
        if len(raw) > ENCODER_MAX_TOKENS:
            raise InputError(
                f"`inputs` has {len(raw)} tokens: at most {ENCODER_MAX_TOKENS} are allowed"
            )
        for index, token in enumerate(raw):
            if isinstance(token, bool) or not isinstance(token, int):
                raise InputError(f"`inputs[{index}]` is {token!r}: token ids must be integers")
            if not 1 <= token < ENCODER_VOCAB:
                raise InputError(
                    f"`inputs[{index}]` is {token}: token ids run from 1 to {ENCODER_VOCAB - 1}"
                )
        return ModelInput(len(raw), raw)


INPUT_RULES: dict[str, type[InputRules]] = {r.name: r for r in (MLPInputs, EncoderInputs)}
