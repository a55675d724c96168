"""MLServer 1.7.1 through the adapter seam: the versioned model repository and the
control (a new model version per change, verified by the bundled model's answers), the
local launcher and the adapter."""

from batchpilot.runtimes.mlserver.adapter import INFER_PATH, MLServerRuntime
from batchpilot.runtimes.mlserver.control import (
    FEATURES,
    IMPLEMENTATION,
    INPUT_NAME,
    KNOBS,
    MODEL,
    MODEL_FILE,
    SETTINGS_FILE,
    MLServerControl,
    ModelRepository,
    Observed,
    batching_on,
    check_observed,
    model_settings,
)
from batchpilot.runtimes.mlserver.process import VENV, MLServerProcess

__all__ = [
    "FEATURES",
    "IMPLEMENTATION",
    "INFER_PATH",
    "INPUT_NAME",
    "KNOBS",
    "MODEL",
    "MODEL_FILE",
    "SETTINGS_FILE",
    "VENV",
    "MLServerControl",
    "MLServerProcess",
    "MLServerRuntime",
    "ModelRepository",
    "Observed",
    "batching_on",
    "check_observed",
    "model_settings",
]
