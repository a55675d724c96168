"""The model repository a local Triton serves: the bundled python-backend model with
dynamic batching, and the backends directory its python backend runs from."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from batchpilot.runtimes.triton.install import TritonInstall

MODEL_NAME = "batchpilot"
INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"
BATCH_SIZE_OUTPUT = "BATCH_SIZE"
# Triton caps max_queue_delay_microseconds at what a uint64 holds; BatchPilot's own limit
# on the wait (one minute) is far below it.
MAX_BATCH_SIZE_LIMIT = 4096


@dataclass(frozen=True)
class TritonBatching:
    """Triton's dynamic-batching knobs in its own names and units."""

    max_batch_size: int
    max_queue_delay_microseconds: int

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch_size <= MAX_BATCH_SIZE_LIMIT:
            raise ValueError(
                f"max_batch_size must be 1-{MAX_BATCH_SIZE_LIMIT} (0 turns batching off, "
                f"which is not a batching configuration), got {self.max_batch_size}"
            )
        if self.max_queue_delay_microseconds < 0:
            raise ValueError(
                "max_queue_delay_microseconds must be >= 0, got "
                f"{self.max_queue_delay_microseconds}"
            )


def batching_pbtxt(batching: TritonBatching, preferred: Sequence[int] = ()) -> str:
    """The lines of `config.pbtxt` that set the batching knobs: what a user pastes into
    their model's configuration (or its ConfigMap) to keep a configuration. `preferred`
    are the preferred batch sizes it ran with; none stands for the cap alone, which is
    what Triton fills in when a model pins none."""
    sizes = ", ".join(str(size) for size in (preferred or [batching.max_batch_size]))
    return (
        f"max_batch_size: {batching.max_batch_size}\n"
        "dynamic_batching {\n"
        f"  preferred_batch_size: [ {sizes} ]\n"
        f"  max_queue_delay_microseconds: {batching.max_queue_delay_microseconds}\n"
        "}\n"
    )


def model_pbtxt(batching: TritonBatching, *, instances: int = 1) -> str:
    """The whole `config.pbtxt` of the bundled model. Requests hold one row each (shape
    [1, N], any N); ragged batching lets rows of different lengths share a batch, so
    `max_batch_size` counts requests, as BatchPilot's own knob does."""
    return (
        f'name: "{MODEL_NAME}"\n'
        'backend: "python"\n'
        + batching_pbtxt(batching)
        + f'input [ {{ name: "{INPUT_NAME}" data_type: TYPE_FP32 dims: [ -1 ] '
        "allow_ragged_batch: true } ]\n"
        f'output [ {{ name: "{OUTPUT_NAME}" data_type: TYPE_FP32 dims: [ 16 ] }}, '
        f'{{ name: "{BATCH_SIZE_OUTPUT}" data_type: TYPE_INT32 dims: [ 1 ] }} ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n"
    )


def write_repository(
    root: Path, install: TritonInstall, batching: TritonBatching, *, instances: int = 1
) -> Path:
    """Lay out `root/models/<model>/{config.pbtxt,1/model.py}` and `root/backends/python`
    (the backend library, its utilities and the stub matching the venv's Python); returns
    `root`."""
    model_dir = root / "models" / MODEL_NAME
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        model_pbtxt(batching, instances=instances), encoding="utf-8"
    )
    source = resources.files("batchpilot.runtimes.triton").joinpath("model.py")
    (model_dir / "1" / "model.py").write_text(source.read_text(encoding="utf-8"), "utf-8")
    return write_backends(root, install)


def write_backends(root: Path, install: TritonInstall) -> Path:
    """Lay out `root/backends/python` alone, for a model repository of the user's own
    (its python-backend models run from it); returns `root`."""
    backend = root / "backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    for path in (
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ):
        shutil.copy2(path, backend / path.name)
    return root
