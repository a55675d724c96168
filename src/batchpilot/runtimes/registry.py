"""Runtime adapters by name (`--runtime NAME`). Each entry is imported only when it is
asked for, so a runtime's module costs nothing to a run that does not use it."""

from __future__ import annotations

import importlib

from batchpilot.runtimes.base import Runtime

# name -> "module:class"; the class is a `Runtime` subclass with a no-argument constructor
_ADAPTERS: dict[str, str] = {
    "reference": "batchpilot.runtimes.reference:ReferenceRuntime",
    "mlserver": "batchpilot.runtimes.mlserver.adapter:MLServerRuntime",
    "triton": "batchpilot.runtimes.triton.adapter:TritonRuntime",
    "ray": "batchpilot.runtimes.rayserve.adapter:RayServeRuntime",
    "torchserve": "batchpilot.runtimes.torchserve.adapter:TorchServeRuntime",
    "vllm": "batchpilot.runtimes.vllm.adapter:VllmRuntime",
}
DEFAULT_RUNTIME = "reference"


def runtime_names() -> list[str]:
    return sorted(_ADAPTERS)


def get_runtime(name: str) -> Runtime:
    """The adapter registered as `name` (case-insensitive). ValueError lists the names."""
    spec = _ADAPTERS.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown runtime {name!r}; known: {', '.join(runtime_names())}")
    module_name, _, class_name = spec.partition(":")
    adapter = getattr(importlib.import_module(module_name), class_name)
    runtime = adapter()
    if not isinstance(runtime, Runtime):
        raise TypeError(f"{spec} is not a Runtime")
    return runtime
