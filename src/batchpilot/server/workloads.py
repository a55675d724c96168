"""The built-in models and the rules for their inputs.

Both are deterministic (seeded weights, nothing downloaded). The MLP is the default: at
batch 1 its cost is dominated by reading the weights, so a batch costs far less than
its size times one request, as on an accelerator. The encoder takes token sequences of
different lengths, so request size matters: a batch is padded to its longest sequence
and the padding is masked out.

Requests are checked on the event loop in plain Python (`parse`, `synthetic_input`)
and become tensors only on the inference worker thread (`forward`): every PyTorch call
releases and retakes the GIL, and on the event loop that would make the loop and the
worker wait on each other.
"""

from __future__ import annotations

import abc
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

SEED = 20240611
NUM_CLASSES = 16

MLP_FEATURES = 64
MLP_HIDDEN = 2048
MLP_MAX_ROWS = 4096

ENCODER_VOCAB = 1000
ENCODER_DIM = 128
ENCODER_HEADS = 4
ENCODER_LAYERS = 2
ENCODER_FF = 512
ENCODER_MAX_TOKENS = 512

# The encoder's eval fast path converts padded batches to nested tensors and warns, on
# every batch, that the API is a prototype; the conversion is what skips the padding.
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype")


FLOAT32_MAX = 3.4028234663852886e38


class InputError(ValueError):
    """The request's inputs do not fit the model; the message says what is allowed."""


@dataclass(frozen=True, slots=True)
class ModelInput:
    """One request's checked input: `size` units (rows or tokens) of `values`, or of the
    model's deterministic synthetic input when `values` is None."""

    size: int
    values: list[Any] | None = None


class Workload(abc.ABC):
    """One built-in model with its input rules. `size` of an input is rows for the MLP
    and tokens for the encoder."""

    name: ClassVar[str]
    unit: ClassVar[str]
    max_size: ClassVar[int]

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @abc.abstractmethod
    def input_schema(self) -> str:
        """What `inputs` must look like, for error messages and docs."""

    @abc.abstractmethod
    def parse(self, raw: object) -> ModelInput:
        """Check the JSON `inputs` value (plain Python); InputError when it does not fit."""

    @abc.abstractmethod
    def synthetic(self, size: int) -> torch.Tensor:
        """A deterministic input of `size` units (a view of a cached tensor: no copy)."""

    @abc.abstractmethod
    def to_tensor(self, values: list[Any]) -> torch.Tensor:
        """The tensor of values that `parse` accepted."""

    @abc.abstractmethod
    def forward_tensors(self, inputs: Sequence[torch.Tensor]) -> list[list[int]]:
        """Run one batch of input tensors; for each its predicted classes."""

    def synthetic_input(self, size: int) -> ModelInput:
        self.check_size(size)
        return ModelInput(size)

    def forward(self, inputs: Sequence[ModelInput]) -> list[list[int]]:
        """Run one batch of requests (on the worker thread); for each its classes."""
        return self.forward_tensors(
            [
                self.synthetic(i.size) if i.values is None else self.to_tensor(i.values)
                for i in inputs
            ]
        )

    def check_size(self, size: int) -> None:
        if not 1 <= size <= self.max_size:
            raise InputError(
                f"size {size} is out of range: the {self.name} model takes 1 to "
                f"{self.max_size} {self.unit} per request"
            )


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


class MLPWorkload(Workload):
    name = "mlp"
    unit = "rows"
    max_size = MLP_MAX_ROWS

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        torch.manual_seed(SEED)
        self.net = nn.Sequential(
            nn.Linear(MLP_FEATURES, MLP_HIDDEN),
            nn.ReLU(),
            nn.Linear(MLP_HIDDEN, MLP_HIDDEN),
            nn.ReLU(),
            nn.Linear(MLP_HIDDEN, NUM_CLASSES),
        ).eval()
        self.net.to(device)
        self._synthetic = torch.randn(MLP_MAX_ROWS, MLP_FEATURES, generator=_generator())

    def input_schema(self) -> str:
        return f"a list of 1 to {MLP_MAX_ROWS} rows, each a list of {MLP_FEATURES} numbers"

    def parse(self, raw: object) -> ModelInput:
        if not isinstance(raw, list) or not raw:
            raise InputError(f"`inputs` must be {self.input_schema()}")
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

    def to_tensor(self, values: list[Any]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32)

    def synthetic(self, size: int) -> torch.Tensor:
        self.check_size(size)
        return self._synthetic[:size]

    def forward_tensors(self, inputs: Sequence[torch.Tensor]) -> list[list[int]]:
        batch = torch.cat(list(inputs)) if len(inputs) > 1 else inputs[0]
        classes = self.net(batch.to(self.device)).argmax(dim=1).cpu()
        sizes = [int(x.shape[0]) for x in inputs]
        return [part.tolist() for part in torch.split(classes, sizes)]


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(ENCODER_VOCAB, ENCODER_DIM, padding_idx=0)
        self.position = nn.Embedding(ENCODER_MAX_TOKENS, ENCODER_DIM)
        layer = nn.TransformerEncoderLayer(
            ENCODER_DIM, ENCODER_HEADS, ENCODER_FF, dropout=0.0, batch_first=True
        )
        # Nested tensors let the eval fast path skip the padded positions entirely.
        self.encoder = nn.TransformerEncoder(layer, ENCODER_LAYERS, enable_nested_tensor=True)
        self.head = nn.Linear(ENCODER_DIM, NUM_CLASSES)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        padding = positions[None, :] >= lengths[:, None]
        hidden = self.embed(tokens) + self.position(positions)[None, :, :]
        hidden = self.encoder(hidden, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * keep).sum(dim=1) / lengths[:, None].to(hidden.dtype)
        logits: torch.Tensor = self.head(pooled)
        return logits


class EncoderWorkload(Workload):
    name = "encoder"
    unit = "tokens"
    max_size = ENCODER_MAX_TOKENS

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        torch.manual_seed(SEED)
        self.net = _Encoder().eval()
        self.net.to(device)
        # Token 0 is padding, so synthetic tokens are drawn from 1..vocab-1.
        self._synthetic = torch.randint(
            1, ENCODER_VOCAB, (ENCODER_MAX_TOKENS,), generator=_generator()
        )

    def input_schema(self) -> str:
        return (
            f"a list of 1 to {ENCODER_MAX_TOKENS} token ids, integers from 1 to "
            f"{ENCODER_VOCAB - 1} (0 is padding)"
        )

    def parse(self, raw: object) -> ModelInput:
        if not isinstance(raw, list) or not raw:
            raise InputError(f"`inputs` must be {self.input_schema()}")
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

    def to_tensor(self, values: list[Any]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long)

    def synthetic(self, size: int) -> torch.Tensor:
        self.check_size(size)
        return self._synthetic[:size]

    def forward_tensors(self, inputs: Sequence[torch.Tensor]) -> list[list[int]]:
        lengths = torch.tensor([int(x.shape[0]) for x in inputs], dtype=torch.long)
        tokens = nn.utils.rnn.pad_sequence(list(inputs), batch_first=True, padding_value=0)
        logits = self.net(tokens.to(self.device), lengths.to(self.device))
        return [[int(c)] for c in logits.argmax(dim=1).cpu().tolist()]


WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (MLPWorkload, EncoderWorkload)}


def resolve_device(requested: str) -> torch.device:
    """`auto` picks CUDA when present; asking for CUDA without it is an error."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    return torch.device(requested)
