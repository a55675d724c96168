"""What TorchServe reads from disk, as pure functions: a model archive (.mar, a zip of
the bundled handler and a manifest naming the model and its version), its config.properties
and the `models=` line that registers a model with its batching values at start."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from importlib import resources

HANDLER_FILE = "handler.py"
ARCHIVER_VERSION = "0.12.0"
# a fixed timestamp keeps an archive's bytes a function of its name and version alone
_ZIP_TIME = (2024, 1, 1, 0, 0, 0)


def archive_name(model: str, version: int) -> str:
    return f"{model}-v{version}.mar"


def manifest(model: str, version: int) -> dict[str, object]:
    """MAR-INF/MANIFEST.json as torch-model-archiver 0.12 writes it for a handler-only
    model (no serialized weights: the handler makes its own)."""
    return {
        "createdOn": "01/01/2024 00:00:00",
        "runtime": "python",
        "model": {"modelName": model, "handler": HANDLER_FILE, "modelVersion": str(version)},
        "archiverVersion": ARCHIVER_VERSION,
    }


def handler_source() -> bytes:
    return resources.files("batchpilot.runtimes.torchserve").joinpath(HANDLER_FILE).read_bytes()


def model_archive(model: str, version: int, handler: bytes) -> bytes:
    """The .mar of one version of the bundled model."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        entries = {
            "MAR-INF/MANIFEST.json": json.dumps(manifest(model, version), indent=4).encode(),
            HANDLER_FILE: handler,
        }
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=_ZIP_TIME), data)
    return buffer.getvalue()


def models_entry(
    model: str, version: str, mar: str, native: Mapping[str, float], *, workers: int = 1
) -> dict[str, dict[str, dict[str, object]]]:
    """The `models=` JSON of config.properties: `model` registered at start from archive
    `mar` as the default `version`, with its batching values."""
    return {
        model: {
            version: {
                "defaultVersion": True,
                "marName": mar,
                "minWorkers": workers,
                "maxWorkers": workers,
                "batchSize": int(native["batch_size"]),
                "maxBatchDelay": int(native["max_batch_delay"]),
                "responseTimeout": 120,
            }
        }
    }


def config_properties(
    *,
    host: str,
    ports: Mapping[str, int],
    model_store: str,
    load_models: str,
    models: Mapping[str, object],
) -> str:
    """A config.properties that binds every TorchServe listener to `host` (inference,
    management, metrics, both gRPC servers) on the given ports, turns token
    authorisation off (the listeners are loopback only) and registers `models` at
    start (`load_models`: the archive to load, `models`: its registration values).
    `ports` has inference, management, metrics, grpc_inference, grpc_management."""
    lines = {
        "inference_address": f"http://{host}:{ports['inference']}",
        "management_address": f"http://{host}:{ports['management']}",
        "metrics_address": f"http://{host}:{ports['metrics']}",
        "grpc_inference_address": host,
        "grpc_management_address": host,
        "grpc_inference_port": str(ports["grpc_inference"]),
        "grpc_management_port": str(ports["grpc_management"]),
        "disable_token_authorization": "true",
        "enable_model_api": "true",
        "metrics_mode": "prometheus",
        "model_store": model_store,
        "load_models": load_models,
        "models": json.dumps(models, separators=(",", ":")),
        "default_workers_per_model": "1",
        # the model's dependencies are in TorchServe's environment already
        "install_py_dep_per_model": "false",
        # the Java front end is small; its default heap is a quarter of the machine
        "vmargs": "-Xmx512m",
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())
