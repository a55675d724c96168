"""A user's own TorchServe model (`tune --local --runtime torchserve --model-archive
FILE.mar`): the archive torch-model-archiver wrote, read and checked here, never changed.

TorchServe fixes batch_size and max_batch_delay when a model version is registered and
takes the version from the archive's MAR-INF/MANIFEST.json (registration has no version
parameter), so every trial serves a new version: a folder in the model store with the
archive's files (extracted once) and the manifest's modelVersion set to the trial's. The
archive's model-config.yaml (`configFile` in the manifest), where it sets batchSize or
maxBatchDelay above 0, gives the baseline, as TorchServe itself would run it; TorchServe's
defaults (1 request, 100 ms) otherwise. Explicit values at registration win over that
file, so every trial runs the values asked for.

Everything here is pure but `load_user_archive` (which reads the file) and
`extract_archive` (which unpacks it)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import zipfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchpilot.runtimes.base import NativeValues

MANIFEST = "MAR-INF/MANIFEST.json"
# what TorchServe 0.12 registers when neither the request nor the archive says
DEFAULT_BATCH_SIZE = 1
DEFAULT_MAX_BATCH_DELAY_MS = 100
# handlers TorchServe 0.12 ships (ts.torch_handler): an archive may name one without
# holding its file
BUILTIN_HANDLERS = frozenset(
    {
        "base_handler",
        "dali_handler",
        "dali_image_classifier",
        "densenet_handler",
        "image_classifier",
        "image_segmenter",
        "object_detector",
        "text_classifier",
        "text_handler",
        "trt_llm_handler",
        "vision_handler",
        "vllm_handler",
    }
)
_RUNTIMES = ("python", "python3")
# what --model-archive takes, for the errors, its help and the README
EXPECTED = (
    "a model archive (.mar) as torch-model-archiver writes it: a zip holding "
    f"{MANIFEST} (its model names modelName and handler) and the handler's .py file"
)
USER_MODEL_ARCHIVE = (
    "a TorchServe model archive (.mar, from torch-model-archiver) with the handler's file; "
    "batchSize and maxBatchDelay in its model-config.yaml are the baseline, else "
    "TorchServe's 1 and 100 ms; requests from --body-template (a handler's input is its own)"
)


class UserArchiveError(ValueError):
    """The archive cannot be served: what was wrong and what is expected."""


@dataclass(frozen=True)
class UserArchive:
    """A user's .mar: its manifest as read (never written back), the model's name, the
    version and handler the manifest names and the batching values TorchServe would
    register it with (`baseline`, TorchServe's names and units: requests and ms)."""

    path: Path
    manifest: dict[str, Any]
    name: str
    version: str
    handler: str
    baseline: NativeValues


def handler_module(handler: str) -> str:
    """The module TorchServe's worker imports for a manifest's `handler`
    ("my_handler.py:handle" -> "my_handler"), as ts/model_loader.py reads it."""
    module = handler.split(":", 1)[0]
    return module.removesuffix(".py").split("/")[-1]


def _whole(config: Mapping[str, Any], key: str, *, where: str) -> int:
    value = config.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserArchiveError(f"{where}: {key} is {value!r}; TorchServe takes a whole number")
    return value


def parse_model_config(text: str, *, where: str) -> NativeValues:
    """The batching values TorchServe registers an archive with when the request gives
    none, from its model-config.yaml (`where` names it for the errors): batchSize and
    maxBatchDelay where above 0, TorchServe's defaults otherwise."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserArchiveError(f"{where} is not valid YAML ({exc})") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise UserArchiveError(f"{where} holds {type(config).__name__}, not a YAML mapping")
    size = _whole(config, "batchSize", where=where)
    delay = _whole(config, "maxBatchDelay", where=where)
    return {
        "batch_size": size if size > 0 else DEFAULT_BATCH_SIZE,
        "max_batch_delay": delay if delay > 0 else DEFAULT_MAX_BATCH_DELAY_MS,
    }


def parse_archive(
    names: Collection[str], manifest_text: str | None, config_text: str | None, *, path: Path
) -> UserArchive:
    """The model of the archive at `path` from the names of its entries, its manifest's
    text (None: absent) and the text of the model-config.yaml it names (None: none).
    UserArchiveError says what is wrong: no manifest, not JSON, no modelName or handler,
    a handler file that is not in the archive, a runtime other than Python, a config
    file missing or malformed."""
    if manifest_text is None:
        raise UserArchiveError(f"{path} has no {MANIFEST}; expected {EXPECTED}")
    try:
        manifest = json.loads(manifest_text)
    except ValueError as exc:
        raise UserArchiveError(f"{path}: {MANIFEST} is not valid JSON ({exc})") from None
    model = manifest.get("model") if isinstance(manifest, dict) else None
    if not isinstance(model, dict):
        raise UserArchiveError(f'{path}: {MANIFEST} has no "model" object; expected {EXPECTED}')
    name = model.get("modelName")
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise UserArchiveError(
            f"{path}: {MANIFEST} names modelName {name!r}; torch-model-archiver --model-name "
            "sets it (non-empty, no '/': TorchServe serves it at /predictions/<name>)"
        )
    handler = model.get("handler")
    if not isinstance(handler, str) or not handler_module(handler):
        raise UserArchiveError(
            f"{path}: {MANIFEST} names no handler; torch-model-archiver --handler "
            "my_handler.py puts the handler's file into the archive and names it there"
        )
    module = handler_module(handler)
    if f"{module}.py" not in names and module not in BUILTIN_HANDLERS:
        raise UserArchiveError(
            f"{path}: the handler {handler!r} its manifest names is neither in the archive "
            f"({module}.py) nor one of TorchServe's own ({', '.join(sorted(BUILTIN_HANDLERS))})"
        )
    runtime = manifest.get("runtime", "python")
    if runtime not in _RUNTIMES:
        raise UserArchiveError(
            f"{path}: {MANIFEST} says runtime {runtime!r}; BatchPilot starts TorchServe's "
            "Python workers (runtime python)"
        )
    config_file = model.get("configFile")
    baseline = parse_model_config("", where=str(path))
    if config_file is not None:
        where = f"{path}: {config_file}"
        if config_text is None:
            raise UserArchiveError(
                f"{where}, the configFile its manifest names, is not in the archive"
            )
        baseline = parse_model_config(config_text, where=where)
    return UserArchive(
        path=path,
        manifest=manifest,
        name=name,
        version=str(model.get("modelVersion", "1.0")),
        handler=handler,
        baseline=baseline,
    )


def load_user_archive(path: Path) -> UserArchive:
    """The archive at `path`, validated. UserArchiveError says what is missing or wrong
    and what is expected."""
    if not path.exists():
        raise UserArchiveError(f"{path} does not exist; expected {EXPECTED}")
    if not path.is_file():
        raise UserArchiveError(f"{path} is not a file; expected {EXPECTED}")
    if path.suffix != ".mar":
        raise UserArchiveError(f"{path} is not a .mar file; expected {EXPECTED}")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())

            def text(name: str) -> str | None:
                return archive.read(name).decode("utf-8") if name in names else None

            manifest = text(MANIFEST)
            config_file = _config_file(manifest)
            config = text(config_file) if config_file is not None else None
    except zipfile.BadZipFile:
        raise UserArchiveError(f"{path} is not a zip archive; expected {EXPECTED}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserArchiveError(f"cannot read {path}: {exc}") from None
    return parse_archive(names, manifest, config, path=path)


def _config_file(manifest: str | None) -> str | None:
    """The configFile a manifest's text names, where it is readable at all."""
    try:
        model = json.loads(manifest or "").get("model")
        found = model.get("configFile") if isinstance(model, dict) else None
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def version_manifest(archive: UserArchive, version: int) -> dict[str, Any]:
    """The archive's manifest for one trial's version: modelVersion set, the rest as
    the user's."""
    manifest = copy.deepcopy(archive.manifest)
    manifest["model"]["modelVersion"] = str(version)
    return manifest


def extract_archive(archive: UserArchive, folder: Path) -> None:
    """Unpack the user's archive into `folder` (zipfile keeps every entry inside it)."""
    with zipfile.ZipFile(archive.path) as mar:
        mar.extractall(folder)


def link_tree(source: Path, folder: Path) -> None:
    """`source`'s files at the same places under `folder`: hard links where the file
    system allows (a version costs no copy of the weights), copies elsewhere."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, folder, copy_function=link)
