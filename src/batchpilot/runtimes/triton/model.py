"""The bundled tiny model for Triton's python backend: copied into the model repository
the launcher writes (as `<model>/1/model.py`) and run by Triton's stub process, never
imported by BatchPilot itself.

Each request carries one FP32 row of any length (shape [1, N]); the model scores it
against a fixed seeded weight matrix, so a batch costs one matrix product plus the
per-execution overhead of the python backend, and batching pays as on an accelerator.
The model records the batch sizes it runs: every response carries BATCH_SIZE (the number
of requests Triton handed to the execution that served it), and a counter per batch size
(`batchpilot_model_batches_total{model="M",batch_size="N"}`) appears among Triton's own metrics."""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

WIDTH = 256
CLASSES = 16
_SEED = 1234
BATCHES_METRIC = "batchpilot_model_batches_total"


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        rng = np.random.default_rng(_SEED)
        self.weights = rng.standard_normal((WIDTH, CLASSES)).astype(np.float32)
        self.batches = pb_utils.MetricFamily(
            name=BATCHES_METRIC,
            description="Batches the model executed, by their size in requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.model_name = str(args["model_name"])
        self.by_size: dict[int, Any] = {}

    def execute(self, requests: list[Any]) -> list[Any]:
        rows = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            # Fold any row length onto the model's width: the work per request grows
            # with its size, the weights are read once per batch.
            flat = np.resize(data.astype(np.float32).reshape(-1), WIDTH)
            rows.append(flat)
        scores = np.tanh(np.stack(rows) @ self.weights)
        size = len(requests)
        counter = self.by_size.get(size)
        if counter is None:
            counter = self.by_size[size] = self.batches.Metric(
                labels={"model": self.model_name, "batch_size": str(size)}
            )
        counter.increment(1)
        batch = np.array([[size]], dtype=np.int32)
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("OUTPUT0", scores[i : i + 1]),
                    pb_utils.Tensor("BATCH_SIZE", batch),
                ]
            )
            for i in range(len(requests))
        ]
