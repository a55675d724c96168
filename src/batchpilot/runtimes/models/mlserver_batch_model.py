"""The tiny model `tune --local --runtime mlserver` serves: a three-layer MLP in numpy on
CPU. Memory-bound at small batches, like an accelerator, so batching pays. It runs inside
MLServer's own environment (never imported by BatchPilot itself).

Every answer reports, in the response parameters, what the serving model instance really
does: the rows of the batch it computed the request in, its max_batch_size and
max_batch_time, whether MLServer's adaptive batcher is wrapped around it, and its
version. BatchPilot reads these to verify a change (MLServer exposes none of it)."""

from __future__ import annotations

import numpy as np
from mlserver import MLModel  # type: ignore[import-not-found]
from mlserver.codecs import NumpyCodec  # type: ignore[import-not-found]
from mlserver.types import (  # type: ignore[import-not-found]
    InferenceRequest,
    InferenceResponse,
    Parameters,
)

FEATURES = 8
HIDDEN = 1024
# set on the model instance by MLServer's load_batching hook when adaptive batching is on
_BATCHER_ATTRIBUTE = "__adaptive_batching__"


class BatchRecordingMLP(MLModel):  # type: ignore[misc]
    async def load(self) -> bool:
        rng = np.random.default_rng(0)
        self._layers = [
            (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
            for n_in, n_out in ((FEATURES, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1))
        ]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        x = x.reshape(x.shape[0], -1)
        if x.shape[1] != FEATURES:
            raise ValueError(f"expected {FEATURES} features per row, got {x.shape[1]}")
        h = x
        for layer in self._layers[:-1]:
            h = np.maximum(h @ layer, 0.0)
        y = h @ self._layers[-1]
        settings = self.settings
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output("OUTPUT", y)],
            parameters=Parameters(
                batch_rows=int(x.shape[0]),
                max_batch_size=int(settings.max_batch_size),
                max_batch_time=float(settings.max_batch_time),
                adaptive_batching=getattr(self, _BATCHER_ATTRIBUTE, None) is not None,
            ),
        )
