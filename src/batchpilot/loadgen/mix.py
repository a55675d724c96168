"""Parse a request mix from a compact spec ("8:16,2:256") or a YAML/JSON file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from batchpilot.datafiles import load_yaml_or_json
from batchpilot.models import RequestClass, RequestMix

_FILE_SUFFIXES = (".yaml", ".yml", ".json")
_SPEC_HELP = "expected WEIGHT:SIZE pairs separated by commas, e.g. '8:16,2:256'"


def parse_mix(spec_or_path: str) -> RequestMix:
    """A mix from `spec_or_path`: a file path (YAML or JSON holding a list of
    {weight, size}, or a mapping with that list under `requests`) or an inline spec of
    WEIGHT:SIZE pairs. A bare SIZE means weight 1. Raises ValueError saying what was
    wrong and what is allowed."""
    text = spec_or_path.strip()
    if not text:
        raise ValueError(f"empty request mix: {_SPEC_HELP}, or a YAML/JSON file")
    path = Path(text)
    if text.endswith(_FILE_SUFFIXES) or path.is_file():
        return _from_file(path)
    return _from_spec(text)


def _from_spec(spec: str) -> RequestMix:
    classes: list[RequestClass] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"empty item in request mix {spec!r}: {_SPEC_HELP}")
        weight_text, _, size_text = item.rpartition(":")
        weight = _number(weight_text or "1", float, f"weight in mix item {item!r}")
        size = _number(size_text, int, f"size in mix item {item!r}")
        classes.append(_request_class(weight, size, f"mix item {item!r}"))
    return RequestMix(classes=tuple(classes))


def _from_file(path: Path) -> RequestMix:
    data = load_yaml_or_json(path, "request mix file")
    if isinstance(data, dict) and "requests" in data:
        data = data["requests"]
    if not isinstance(data, list) or not data:
        raise ValueError(
            f"request mix file {str(path)!r} must hold a non-empty list of "
            "{weight, size} entries (or such a list under 'requests')"
        )
    classes: list[RequestClass] = []
    for index, entry in enumerate(data):
        where = f"entry {index} of {str(path)!r}"
        if not isinstance(entry, dict) or set(entry) - {"weight", "size"} or "size" not in entry:
            raise ValueError(f"{where} must be a mapping with 'size' and optional 'weight'")
        classes.append(_request_class(entry.get("weight", 1), entry["size"], where))
    return RequestMix(classes=tuple(classes))


def _number(text: str, kind: type[float] | type[int], what: str) -> Any:
    try:
        return kind(text.strip())
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise ValueError(f"{what} must be {noun}, got {text.strip()!r}: {_SPEC_HELP}") from None


def _request_class(weight: Any, size: Any, where: str) -> RequestClass:
    if isinstance(weight, float) and not math.isfinite(weight):
        raise ValueError(f"{where}: weight must be a finite number > 0, got {weight}")
    try:
        return RequestClass(weight=weight, size=size)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])} {err['msg'].lower()}" for err in e.errors()
        )
        raise ValueError(
            f"{where}: {problems} (weight must be > 0, size an integer in 1..65536)"
        ) from None


def format_mix(mix: RequestMix) -> str:
    """The inline spec of a mix, the inverse of parse_mix for inline specs."""
    return ",".join(f"{c.weight:g}:{c.size}" for c in mix.classes)
