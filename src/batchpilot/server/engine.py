"""Runs a workload's forward passes on one dedicated worker thread per device, off the
event loop, under `torch.inference_mode`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Sequence

import torch

from batchpilot.server.workloads import WORKLOADS, ModelInput, Workload, resolve_device

log = logging.getLogger(__name__)


def default_threads() -> int:
    """Every usable core but one, which is left to the client; one on a 2-core machine."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def warm_up_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to `max_batch_size`, and `max_batch_size` itself: the shapes the
    first real batches will have, so none pays for first-call allocation."""
    sizes = {max_batch_size}
    size = 1
    while size < max_batch_size:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


class InferenceEngine:
    """One workload on one device, fed through a single worker thread."""

    def __init__(self, model: str, device: str, threads: int) -> None:
        if model not in WORKLOADS:
            raise ValueError(f"unknown model {model!r}: choose one of {', '.join(WORKLOADS)}")
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
        self.device = resolve_device(device)
        self.threads = threads
        self.workload: Workload = WORKLOADS[model](self.device)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"infer-{self.device.type}"
        )
        self._warmed = 0  # the largest batch size warmed up so far

    @property
    def model(self) -> str:
        return self.workload.name

    def _forward(self, inputs: Sequence[ModelInput]) -> list[list[int]]:
        # inference_mode is thread-local, so it is entered on the worker thread.
        with torch.inference_mode():
            outputs = self.workload.forward(inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return outputs

    async def run_batch(self, inputs: Sequence[ModelInput]) -> list[list[int]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._forward, inputs)

    def _warm_up(self, max_batch_size: int) -> float:
        started = time.perf_counter()
        unit = self.workload.synthetic_input(1)
        longer = self.workload.synthetic_input(min(16, self.workload.max_size))
        for size in warm_up_batch_sizes(max_batch_size):
            if size <= self._warmed:
                continue
            for _ in range(2):
                self._forward([unit] * size)
            self._forward([longer] * size)
        self._warmed = max(self._warmed, max_batch_size)
        return time.perf_counter() - started

    async def warm_up(self, max_batch_size: int) -> None:
        """Run the batch sizes up to `max_batch_size` not warmed yet (on the worker, so
        it serialises with real batches)."""
        if max_batch_size <= self._warmed:
            return
        loop = asyncio.get_running_loop()
        seconds = await loop.run_in_executor(self._executor, self._warm_up, max_batch_size)
        log.info(
            "warmed up %s on %s at batch sizes up to %d in %.2f s",
            self.model,
            self.device,
            max_batch_size,
            seconds,
        )

    def close(self) -> None:
        self._executor.shutdown(wait=True)
