"""The bundled tiny model `tune --local --runtime torchserve` serves: a TorchServe handler
(a module-level `handle`, no class) run by TorchServe's Python worker inside its own
environment, never imported by BatchPilot itself.

Each request is JSON `{"size": N}`: N rows of FEATURES values go through a three-layer
MLP in torch on CPU, the rows of every request of the batch in one pass, so the weights
are read once per batch and batching pays as on an accelerator. Every answer reports what
the worker really did (TorchServe exposes no batch-size metric): the requests and rows of
the batch it was computed in, the batch_size the worker was registered with, and the
model version that served it. BatchPilot verifies a change with these."""

from __future__ import annotations

import json
from typing import Any

import torch

FEATURES = 8
HIDDEN = 512
_SEED = 0
_layers: list[torch.Tensor] = []


def _weights() -> list[torch.Tensor]:
    if not _layers:
        generator = torch.Generator().manual_seed(_SEED)
        for n_in, n_out in ((FEATURES, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1)):
            _layers.append(torch.randn(n_in, n_out, generator=generator) / n_in**0.5)
    return _layers


def _size(request: dict[str, Any]) -> int:
    body = request.get("body", request.get("data"))
    if isinstance(body, (bytes, bytearray)):
        body = json.loads(body.decode("utf-8"))
    if not isinstance(body, dict) or not isinstance(body.get("size"), int) or body["size"] < 1:
        raise ValueError(f'expected a JSON body {{"size": N}} with N >= 1, got {body!r:.80}')
    size: int = body["size"]
    return size


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[str] | None:
    if data is None:  # TorchServe's load-time call without requests
        return None
    sizes = [_size(request) for request in data]
    h = torch.ones(sum(sizes), FEATURES)
    layers = _weights()
    with torch.inference_mode():
        for layer in layers[:-1]:
            h = torch.relu(h @ layer)
        scores = (h @ layers[-1]).reshape(-1)
    properties = context.system_properties
    record = {
        "batch_requests": len(data),
        "batch_rows": int(scores.numel()),
        "batch_size": int(properties.get("batch_size", 1)),
        "model_version": str(context.manifest["model"].get("modelVersion", "")),
    }
    answers = []
    start = 0
    for size in sizes:
        score = float(scores[start : start + size].mean())
        answers.append(json.dumps({"score": score, **record}))
        start += size
    return answers
