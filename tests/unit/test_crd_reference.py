"""The committed CRD reference page is exactly what the CRD's schema renders, and the
rendering leaves no field of the schema out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from batchpilot.operator import crd, crdref

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / crd.CRD_FILE
PAGE = ROOT / "docs" / "operator" / "crd-reference.md"


def test_committed_reference_matches_the_crd() -> None:
    assert PAGE.read_text() == crdref.render(CRD_PATH), (
        f"{PAGE.relative_to(ROOT)} is stale: run `{crdref.COMMAND}`"
    )


def _paths(schema: dict[str, Any], path: str) -> set[str]:
    """Every property below `schema` as a dotted path, `[]` after an array of objects."""
    found: set[str] = set()
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}"
        found.add(child_path)
        found |= _paths(child, child_path)
        items = child.get("items", {})
        if child.get("type") == "array" and "properties" in items:
            found |= _paths(items, f"{child_path}[]")
    return found


def test_every_field_of_the_schema_has_a_row() -> None:
    document = yaml.safe_load(CRD_PATH.read_text())
    root = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = _paths(root["properties"]["spec"], "spec") | _paths(
        root["properties"]["status"], "status"
    )
    rows = set(re.findall(r"^\| `([^`]+)` \| ", crdref.render(CRD_PATH), flags=re.MULTILINE))
    assert fields - rows == set()
    assert {"spec.load.requests[].size", "status.trials[].state"} <= rows


def _page(schema: dict[str, Any]) -> str:
    document = {
        "metadata": {"name": "things.example.dev"},
        "spec": {
            "names": {"kind": "Thing", "shortNames": ["th"]},
            "versions": [{"name": "v1", "schema": {"openAPIV3Schema": schema}}],
        },
    }
    return crdref.render_document(document)


def test_a_field_shows_type_default_range_and_description() -> None:
    page = _page(
        {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 64},
                        "mode": {
                            "type": "string",
                            "enum": ["Fast", "Safe"],
                            "default": "Safe",
                            "description": "How it runs; `a|b` is\n  one value.",
                        },
                        "rate": {"type": "number", "minimum": 0.0, "exclusiveMinimum": True},
                        "items": {
                            "type": "array",
                            "maxItems": 3,
                            "items": {"type": "object", "properties": {"n": {"type": "integer"}}},
                        },
                    },
                    "x-kubernetes-validations": [{"rule": "self.size > 0 || true", "message": "m"}],
                }
            },
        }
    )
    assert "| `spec.size` | integer | required | 1 to 64 |  |" in page
    assert (
        "| `spec.mode` | string | `Safe` | `Fast`, `Safe` | How it runs; <code>a&#124;b</code> is"
        " one value. |"
    ) in page
    assert "| `spec.rate` | number |  | > 0 |  |" in page
    assert "| `spec.items` | [array of object](#specitems) |  | ≤ 3 items |  |" in page
    assert "## `spec.items[]`" in page
    assert "| `spec.items[].n` | integer |  |  |  |" in page
    assert "- m: `self.size > 0 || true`" in page


def test_anchors_are_those_of_mkdocs_and_github() -> None:
    assert crdref.anchor("`spec.load.requests[]`") == "specloadrequests"
    assert crdref.anchor("`status.confirmation.measurements[]`") == "statusconfirmationmeasurements"
