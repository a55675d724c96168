"""Reading the YAML or JSON files users hand in (a request mix, a tune configuration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def load_yaml_or_json(path: Path, what: str) -> Any:
    """The parsed content of `path`: JSON when it ends in .json, YAML otherwise. Raises
    ValueError naming `what` (e.g. "config file") and the path, with one line of reason,
    so every CLI can print it as is."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{what} {str(path)!r} is not valid YAML/JSON: {first}") from None
