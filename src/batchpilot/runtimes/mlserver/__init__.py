"""MLServer 1.7.1 through the adapter seam: the versioned model repository and the
control (a new model version per change, verified by the bundled model's answers, or for
a user's own model folder by MLServer's repository index and counters), the local
launcher and the adapter."""

from batchpilot.runtimes.mlserver.adapter import INFER_PATH, MLServerRuntime
from batchpilot.runtimes.mlserver.control import (
    FEATURES,
    IMPLEMENTATION,
    INPUT_NAME,
    KNOBS,
    MODEL,
    MODEL_FILE,
    MLServerControl,
    ModelRepository,
    Observed,
    UserModelControl,
    batching_on,
    check_observed,
    model_settings,
)
from batchpilot.runtimes.mlserver.process import VENV, MLServerProcess
from batchpilot.runtimes.mlserver.user import (
    SETTINGS_FILE,
    UserModel,
    UserModelError,
    load_user_model,
)

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
    "UserModel",
    "UserModelControl",
    "UserModelError",
    "batching_on",
    "check_observed",
    "load_user_model",
    "model_settings",
]
