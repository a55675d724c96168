"""The hand-written Spec and Status tables of docs/operator/spec-status.md and the models
name the same fields: a field added to the models without a row, or a row left behind by a
removed field, fails here. (docs/operator/crd-reference.md is generated from the CRD and
complete by construction; these tables say what the operator does with each field.)"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.operator.status import InferenceServiceStatus

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operator" / "spec-status.md"


def schema_fields() -> set[str]:
    """Every leaf of the spec's JSON schema as a dotted path of its camelCase names,
    `[]` after a list of objects (`load.requests[].size`)."""
    schema = InferenceServiceSpec.model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        return node

    found: set[str] = set()

    def walk(node: dict[str, Any], path: str) -> None:
        node = resolve(node)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in node:
                for option in node[key]:
                    if resolve(option).get("type") != "null":
                        walk(option, path)
                return
        if node.get("type") == "object" and "properties" in node:
            for name, child in node["properties"].items():
                walk(child, f"{path}.{name}" if path else name)
            return
        items = resolve(node.get("items", {})) if node.get("type") == "array" else {}
        if items.get("type") == "object" and "properties" in items:
            walk(items, f"{path}[]")
            return
        found.add(path)

    walk(schema, "")
    return found


def section(title: str) -> str:
    """The text under the page's `## title` heading, up to the next heading of that level."""
    return PAGE.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def spec_rows() -> set[str]:
    """The first cell of every row of the page's Spec table, `{a,b}` spelled out."""
    text = section("Spec")
    rows: set[str] = set()
    for cell in re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE):
        parts = re.split(r"\{([^}]*)\}", cell)
        # split's odd parts are the alternatives inside braces
        choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
        rows.update("".join(combo) for combo in itertools.product(*choices))
    return rows


def documented(field: str, rows: set[str]) -> bool:
    """A row names the field itself or an object (or list) it is part of."""
    return any(field == row or field.startswith((f"{row}.", f"{row}[")) for row in rows)


def test_every_spec_field_has_a_row_in_the_page() -> None:
    rows = spec_rows()
    missing = sorted(f for f in schema_fields() if not documented(f, rows))
    assert not missing, f"spec fields with no row in {PAGE.name}'s Spec table: {missing}"


def test_every_row_of_the_page_names_a_spec_field() -> None:
    fields = schema_fields()
    stale = sorted(
        row
        for row in spec_rows()
        if not any(documented(field, {row.removesuffix("[]")}) for field in fields)
    )
    assert not stale, f"{PAGE.name}'s Spec table names fields the spec does not have: {stale}"


def test_the_check_sees_a_missing_row() -> None:
    rows = spec_rows() - {"tuning.seed"}
    assert not documented("tuning.seed", rows)
    assert documented("load.workers.image", rows)  # covered by its object's row
    assert documented("parameters.extra[].env", rows)


def status_rows() -> set[str]:
    """The names in the first cell of every row of the page's Status table (a row may
    name several: `canary`, `applied`, `restored`), `[]` dropped."""
    rows: set[str] = set()
    for cell in re.findall(r"^\| (`[^|]+) \|", section("Status"), flags=re.MULTILINE):
        rows.update(name.removesuffix("[]") for name in re.findall(r"`([^`]+)`", cell))
    return rows


def test_every_status_field_has_a_row_in_the_page_and_every_row_a_field() -> None:
    fields = {field.alias or name for name, field in InferenceServiceStatus.model_fields.items()}
    rows = status_rows()
    assert not sorted(fields - rows), f"status fields with no row in {PAGE.name}: {fields - rows}"
    assert not sorted(rows - fields), f"{PAGE.name}'s Status rows with no field: {rows - fields}"
