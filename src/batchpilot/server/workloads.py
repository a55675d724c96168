"""The built-in models, run in the model process.

Both are deterministic (seeded weights, nothing downloaded). The MLP is the default: at
batch 1 its cost is dominated by reading the weights, so a batch costs far less than
its size times one request, as on an accelerator. The encoder takes token sequences of
different lengths, so request size matters: a batch is padded to its longest sequence
and the padding is masked out. What a request may hold is in `inputs`.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from batchpilot.server.inputs import (
    ENCODER_MAX_TOKENS,
    ENCODER_VOCAB,
    MLP_FEATURES,
    MLP_MAX_ROWS,
    EncoderInputs,
    InputRules,
    MLPInputs,
    ModelInput,
)

SEED = 20240611
NUM_CLASSES = 16

MLP_HIDDEN = 2048

ENCODER_DIM = 128
ENCODER_HEADS = 4
ENCODER_LAYERS = 2
ENCODER_FF = 512

# The encoder's eval fast path converts padded batches to nested tensors and warns, on
# every batch, that the API is a prototype; the conversion is what skips the padding.
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype")


class Workload(abc.ABC):
    """One built-in model on one device, with the input rules it was built for."""

    rules: ClassVar[type[InputRules]]

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @abc.abstractmethod
    def synthetic(self, size: int) -> torch.Tensor:
        """A deterministic input of `size` units (a view of a cached tensor: no copy)."""

    @abc.abstractmethod
    def forward(self, inputs: Sequence[ModelInput]) -> list[list[int]]:
        """Run one batch of checked requests; for each its classes.

        The batch is assembled and answered with a fixed handful of PyTorch calls,
        never one per request: the Python between calls is overhead."""


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


class MLPWorkload(Workload):
    rules = MLPInputs

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

    def synthetic(self, size: int) -> torch.Tensor:
        self.rules.check_size(size)
        return self._synthetic[:size]

    def assemble(self, inputs: Sequence[ModelInput]) -> torch.Tensor:
        """The batch's rows in request order: a synthetic input of size n is the first n
        rows of the synthetic table, a real one its own rows."""
        synthetic_at: list[int] = []
        synthetic_rows: list[int] = []
        real_at: list[int] = []
        real_rows: list[Any] = []
        position = 0
        for item in inputs:
            at = range(position, position + item.size)
            if item.values is None:
                synthetic_at.extend(at)
                synthetic_rows.extend(range(item.size))
            else:
                real_at.extend(at)
                real_rows.extend(item.values)
            position += item.size
        if not real_rows:
            return self._synthetic[synthetic_rows]
        real = torch.tensor(real_rows, dtype=torch.float32)
        if not synthetic_rows:
            return real
        batch = torch.empty(position, MLP_FEATURES)
        batch[synthetic_at] = self._synthetic[synthetic_rows]
        batch[real_at] = real
        return batch

    def forward(self, inputs: Sequence[ModelInput]) -> list[list[int]]:
        batch = self.assemble(inputs).to(self.device)
        classes: list[int] = self.net(batch).argmax(dim=1).tolist()
        answers = []
        start = 0
        for item in inputs:
            answers.append(classes[start : start + item.size])
            start += item.size
        return answers


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
    rules = EncoderInputs

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        torch.manual_seed(SEED)
        self.net = _Encoder().eval()
        self.net.to(device)
        # Token 0 is padding, so synthetic tokens are drawn from 1..vocab-1.
        self._synthetic = torch.randint(
            1, ENCODER_VOCAB, (ENCODER_MAX_TOKENS,), generator=_generator()
        )
        self._synthetic_tokens: list[int] = self._synthetic.tolist()

    def synthetic(self, size: int) -> torch.Tensor:
        self.rules.check_size(size)
        return self._synthetic[:size]

    def forward(self, inputs: Sequence[ModelInput]) -> list[list[int]]:
        lengths = [item.size for item in inputs]
        longest = max(lengths)
        rows = [
            (self._synthetic_tokens[: item.size] if item.values is None else item.values)
            + [0] * (longest - item.size)
            for item in inputs
        ]
        tokens = torch.tensor(rows, dtype=torch.long, device=self.device)
        logits = self.net(tokens, torch.tensor(lengths, dtype=torch.long, device=self.device))
        return [[int(c)] for c in logits.argmax(dim=1).tolist()]


WORKLOADS: dict[str, type[Workload]] = {w.rules.name: w for w in (MLPWorkload, EncoderWorkload)}


def resolve_device(requested: str) -> torch.device:
    """`auto` picks CUDA when present; asking for CUDA without it is an error."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    return torch.device(requested)
