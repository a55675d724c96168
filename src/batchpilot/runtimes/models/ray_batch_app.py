"""The tiny Ray Serve application `tune --local --runtime ray` serves: one deployment
whose `@serve.batch` method scores a batch of requests with a seeded matrix product in
numpy on CPU. It runs inside Ray's own environment (never imported by BatchPilot itself).

Its batching knobs come from the deployment's `user_config`: Ray Serve calls
`reconfigure(user_config)` on the running replica whenever the user_config changes, and
it sets `max_batch_size` (requests) and `batch_wait_timeout_s` (seconds) on the batcher.

Request: POST / with {"size": N}. Every answer reports what the serving replica really
does: the size of the batch the request ran in, the batcher's max_batch_size and
batch_wait_timeout_s at that moment, and the replica's process id. BatchPilot reads
these to verify a change (Ray's own batch metrics arrive about 10 s late)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from ray import serve  # type: ignore[import-not-found]
from starlette.requests import Request  # type: ignore[import-not-found]
from starlette.responses import JSONResponse  # type: ignore[import-not-found]

WIDTH = 256
CLASSES = 16
_SEED = 1234
# The starting values; the deployment's user_config replaces them at once.
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_WAIT_S = 0.005


class BatchModel:
    def __init__(self) -> None:
        rng = np.random.default_rng(_SEED)
        self.weights = rng.standard_normal((WIDTH, CLASSES)).astype(np.float32)

    def reconfigure(self, config: dict[str, Any]) -> None:
        unknown = set(config) - {"max_batch_size", "batch_wait_timeout_s"}
        if unknown:
            raise ValueError(f"unknown user_config keys {sorted(unknown)}")
        if "max_batch_size" in config:
            self.infer.set_max_batch_size(int(config["max_batch_size"]))
        if "batch_wait_timeout_s" in config:
            self.infer.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    @serve.batch(  # type: ignore[untyped-decorator]
        max_batch_size=DEFAULT_MAX_BATCH_SIZE, batch_wait_timeout_s=DEFAULT_WAIT_S
    )
    async def infer(self, sizes: list[int]) -> list[dict[str, Any]]:
        # Fold any request size onto the model's width: the work per request grows with
        # its size, the weights are read once per batch.
        rows = np.stack([np.resize(np.ones(size, dtype=np.float32), WIDTH) for size in sizes])
        scores = np.tanh(rows @ self.weights)
        record = {
            "batch_size": len(sizes),
            "max_batch_size": self.infer._get_max_batch_size(),
            "batch_wait_timeout_s": self.infer._get_batch_wait_timeout_s(),
            "pid": os.getpid(),
        }
        return [{"scores": scores[i].tolist(), **record} for i in range(len(sizes))]

    async def __call__(self, request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            body = None
        size = body.get("size") if isinstance(body, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            return JSONResponse(
                {"error": f'expected a JSON object {{"size": N}} with N >= 1, got {body!r}'},
                status_code=400,
            )
        return await self.infer(size)


# Serve would cap every batch at its default of 5 requests in flight per replica.
app = serve.deployment(BatchModel, max_ongoing_requests=1024).bind()
