"""A user's own MLServer model (`tune --local --runtime mlserver --model-dir DIR`): the
folder as MLServer serves it, `model-settings.json` beside the model's code.

MLServer reads `max_batch_size` (requests) and `max_batch_time` (SECONDS) from the
model's `model-settings.json`, and those take precedence over the MLSERVER_MODEL_*
variables, so every trial writes its values there: into a copy of the folder, never the
user's own. The values the user's file holds are the baseline; absent ones are
MLServer's defaults (0 and 0.0: no adaptive batching, the same as a cap of 1).

Everything here is pure but `load_user_model` (which reads the folder) and
`copy_model` (which copies it)."""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchpilot.runtimes.base import NativeValues

SETTINGS_FILE = "model-settings.json"
# what a model folder must hold, for the errors
EXPECTED = (
    f"a folder holding {SETTINGS_FILE} (a JSON object with at least "
    '"implementation": "<module>.<MLModel class>", and "name") and the Python file of '
    "that module"
)

# what `tune --model-dir` takes, for its help and the README
USER_MODEL_DIR = (
    f"an MLServer model folder: {SETTINGS_FILE} (name, implementation, the inputs for "
    "requests built from the metadata; its max_batch_size and max_batch_time are the "
    "baseline) and the model's Python file"
)


class UserModelError(ValueError):
    """The model folder cannot be served: what was wrong and what is expected."""


@dataclass(frozen=True)
class UserModel:
    """A user's MLServer model folder: its settings as read (never written back), the
    model's name and the batching values it starts from (`baseline`, MLServer's names
    and units: requests and seconds)."""

    folder: Path
    settings: dict[str, Any]
    name: str
    baseline: NativeValues


def _number(settings: dict[str, Any], key: str, *, integer: bool, path: Path) -> float:
    value = settings.get(key, 0)
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < 0:
        kind = "a whole number" if integer else "a number of seconds"
        raise UserModelError(f"{path}: {key} is {value!r}; MLServer takes {kind} >= 0 there")
    return float(value)


def parse_settings(text: str, *, path: Path, folder_name: str) -> UserModel:
    """The model of `text`, the content of the `model-settings.json` at `path` in a
    folder named `folder_name` (MLServer's default name). UserModelError says what is
    wrong: not JSON, not an object, no implementation, a name or batching value of the
    wrong type."""
    try:
        settings = json.loads(text)
    except ValueError as exc:
        raise UserModelError(f"{path} is not valid JSON ({exc}); expected {EXPECTED}") from None
    if not isinstance(settings, dict):
        raise UserModelError(
            f"{path} holds {type(settings).__name__}, not a JSON object; expected {EXPECTED}"
        )
    implementation = settings.get("implementation")
    if not isinstance(implementation, str) or "." not in implementation.strip("."):
        found = (
            "has no implementation"
            if implementation is None
            else (f"has implementation {implementation!r}")
        )
        raise UserModelError(
            f"{path} {found}: MLServer needs the model's class as "
            '"implementation": "<module>.<class>" (e.g. "my_model.MyModel", with '
            "my_model.py in the folder)"
        )
    name = settings.get("name", folder_name)
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise UserModelError(
            f"{path}: name is {name!r}; give the model's name as a non-empty string "
            "without '/' (MLServer serves it at /v2/models/<name>)"
        )
    size = _number(settings, "max_batch_size", integer=True, path=path)
    wait = _number(settings, "max_batch_time", integer=False, path=path)
    # MLServer batches only with a cap above 1: 0 (its default) runs as a cap of 1
    baseline: NativeValues = {"max_batch_size": max(1, int(size)), "max_batch_time": wait}
    return UserModel(folder=path.parent, settings=settings, name=name, baseline=baseline)


def load_user_model(folder: Path) -> UserModel:
    """The model in `folder`, validated. UserModelError says what is missing or wrong
    and what is expected."""
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise UserModelError(f"{folder} {what}; expected {EXPECTED}")
    path = folder / SETTINGS_FILE
    if not path.is_file():
        raise UserModelError(f"{folder} has no {SETTINGS_FILE}; expected {EXPECTED}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserModelError(f"cannot read {path}: {exc}") from None
    return parse_settings(text, path=path, folder_name=folder.resolve().name)


def trial_settings(
    model: UserModel, native: Mapping[str, float], *, version: int
) -> dict[str, Any]:
    """The user's settings with a trial's values where MLServer reads them:
    `max_batch_size` (requests) and `max_batch_time` (seconds), the name spelled out (the
    copy lives in a folder of another name) and `parameters.version` set to the copy's
    version, so each load is a new version (MLServer's path that wraps the batcher)."""
    settings = copy.deepcopy(model.settings)
    settings["name"] = model.name
    settings["max_batch_size"] = int(native["max_batch_size"])
    settings["max_batch_time"] = float(native["max_batch_time"])
    parameters = settings.get("parameters")
    parameters = dict(parameters) if isinstance(parameters, dict) else {}
    parameters["version"] = str(version)
    settings["parameters"] = parameters
    return settings


def persisted_settings(model: UserModel, native: Mapping[str, float]) -> dict[str, Any]:
    """The user's settings with `native`'s values in MLServer's units and nothing else
    changed: what to write into their own model-settings.json to keep a winner."""
    settings = copy.deepcopy(model.settings)
    settings["max_batch_size"] = int(native["max_batch_size"])
    settings["max_batch_time"] = float(native["max_batch_time"])
    return settings


def copy_model(
    model: UserModel, folder: Path, native: Mapping[str, float], *, version: int
) -> None:
    """Copy the user's folder to `folder` (which must not exist) and write the trial's
    settings into the copy's model-settings.json. The user's folder is only read."""
    shutil.copytree(model.folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    settings = trial_settings(model, native, version=version)
    (folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def settings_native(settings: object) -> NativeValues:
    """`max_batch_size` and `max_batch_time` of a model-settings.json BatchPilot wrote.
    ValueError when they are not there."""
    if not isinstance(settings, dict):
        raise ValueError("model-settings.json is not a JSON object")
    try:
        return {
            "max_batch_size": int(settings["max_batch_size"]),
            "max_batch_time": float(settings["max_batch_time"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"model-settings.json lacks the batching values: {exc}") from None
