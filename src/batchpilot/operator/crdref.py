"""Render the InferenceService CRD's schema as a Markdown reference page: one table per
object (field path, type, default, allowed values, description) and the object's CEL
rules, read from the CRD's openAPIV3Schema, so the page can never miss a field.

    python -m batchpilot.operator.crdref > docs/operator/crd-reference.md

reads `crds/inferenceservices.batchpilot.dev.yaml` (another CRD file as the argument). A
test fails when the committed page and this output differ.
"""

from __future__ import annotations

import html
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchpilot.operator import crd

Schema = dict[str, Any]

DEFAULT_CRD_PATH = Path("crds") / crd.CRD_FILE
COMMAND = "python -m batchpilot.operator.crdref > docs/operator/crd-reference.md"

# the standard fields every Kubernetes object has; the page covers spec and status
_STANDARD = ("apiVersion", "kind", "metadata")


@dataclass(frozen=True)
class Section:
    """One object of the schema: its dotted path (`spec.load.requests[]`) and schema."""

    path: str
    schema: Schema


def _is_object(schema: Schema) -> bool:
    return schema.get("type") == "object" and "properties" in schema


def _items(schema: Schema) -> Schema | None:
    """The item schema of an array, or None for anything else."""
    if schema.get("type") != "array":
        return None
    items = schema.get("items")
    return items if isinstance(items, dict) else None


def sections(schema: Schema, path: str) -> list[Section]:
    """Every object below `schema` (itself included), depth first in schema order; an
    array of objects contributes its item as `path[]`."""
    found = [Section(path, schema)]
    for name, child in schema["properties"].items():
        child_path = f"{path}.{name}"
        items = _items(child)
        if _is_object(child):
            found.extend(sections(child, child_path))
        elif items is not None and _is_object(items):
            found.extend(sections(items, f"{child_path}[]"))
    return found


def anchor(title: str) -> str:
    """The heading id MkDocs (Python-Markdown's toc) and GitHub both derive from a heading
    whose text is `title`: punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", title).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _escape(text: str) -> str:
    """Plain text for a table cell: Markdown's emphasis and HTML characters escaped
    outside code spans, pipes escaped everywhere, whitespace runs made single spaces."""
    text = " ".join(text.split())
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: all of it is plain text
        parts = [text.replace("`", "'")]
    out: list[str] = []
    for index, part in enumerate(parts):
        if index % 2:  # inside a code span
            out.append(_code(part))
            continue
        part = re.sub(r"([\\*])", r"\\\1", part)
        # an underscore inside a word (max_batch_size) is no emphasis; others may be
        part = re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", part)
        out.append(part.replace("<", "&lt;").replace("|", "\\|"))
    return "".join(out)


def _code(text: str, *, in_table: bool = True) -> str:
    """`text` as a code span. In a table cell a pipe would end the cell on GitHub, and the
    `\\|` that GitHub wants shows as `\\|` in MkDocs, so text with a pipe becomes an HTML
    `<code>` element with the pipe (and the backslash) as character references, which
    both render alike."""
    if in_table and "|" in text:
        escaped = html.escape(text, quote=False).replace("|", "&#124;").replace("\\", "&#92;")
        return f"<code>{escaped}</code>"
    fence, pad = ("``", " ") if "`" in text else ("`", "")
    return f"{fence}{pad}{text}{pad}{fence}"


def _value(value: Any) -> str:
    """A default or enum value as the user writes it in YAML."""
    if isinstance(value, str):
        return value or '""'
    return json.dumps(value, separators=(", ", ": "))


def _number(value: Any) -> str:
    """A bound as written: 3600000, not 3.6e+06; 0.5 as 0.5."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def type_of(schema: Schema, path: str, titles: dict[str, str]) -> str:
    """The field's type; an object or an array of objects links to its own table."""
    kind = str(schema.get("type", "any"))
    items = _items(schema)
    if _is_object(schema):
        text = f"[object](#{anchor(titles[path])})"
    elif items is not None:
        if _is_object(items):
            text = f"[array of object](#{anchor(titles[f'{path}[]'])})"
        else:
            text = f"array of {type_of(items, f'{path}[]', titles)}"
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        text = f"map of {type_of(schema['additionalProperties'], path, titles)}"
    else:
        text = kind
        if "format" in schema:
            text += f" ({schema['format']})"
    if schema.get("nullable"):
        text += " or null"
    return text


def allowed(schema: Schema) -> str:
    """Enum values, numeric range, length, pattern and item counts, as one cell."""
    found: list[str] = []
    if "enum" in schema:
        found.append(", ".join(_code(_value(v)) for v in schema["enum"]))
    low, high = schema.get("minimum"), schema.get("maximum")
    low_open, high_open = (
        schema.get("exclusiveMinimum", False),
        schema.get("exclusiveMaximum", False),
    )
    if low is not None and high is not None and not (low_open or high_open):
        found.append(f"{_number(low)} to {_number(high)}")
    else:
        if low is not None:
            found.append(f"{'>' if low_open else '≥'} {_number(low)}")
        if high is not None:
            found.append(f"{'<' if high_open else '≤'} {_number(high)}")
    if "minLength" in schema or "maxLength" in schema:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        length = f"{low} to {high}" if high is not None else f"≥ {low}"
        found.append(f"{length} characters")
    if "pattern" in schema:
        found.append(f"pattern {_code(schema['pattern'])}")
    if "minItems" in schema:
        found.append(f"≥ {schema['minItems']} items")
    if "maxItems" in schema:
        found.append(f"≤ {schema['maxItems']} items")
    items = _items(schema)
    if items is not None and not _is_object(items) and allowed(items):
        found.append(f"each: {allowed(items)}")
    return "; ".join(found)


def default_of(schema: Schema, required: bool) -> str:
    if required:
        return "required"
    if "default" not in schema:
        return ""
    if _is_object(schema):  # its own table gives each field's default
        return "its fields' defaults"
    return _code(_value(schema["default"]))


def table(section: Section, titles: dict[str, str]) -> list[str]:
    """The Markdown of one object: heading, description, fields, CEL rules."""
    schema = section.schema
    lines = [f"## {titles[section.path]}", ""]
    if schema.get("description"):
        lines += [_escape(schema["description"]), ""]
    lines += [
        "| field | type | default | allowed | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    required = set(schema.get("required", ()))
    for name, child in schema["properties"].items():
        path = f"{section.path}.{name}"
        cells = [
            _code(path),
            type_of(child, path, titles),
            default_of(child, name in required),
            allowed(child),
            _escape(child.get("description", "")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    rules = schema.get("x-kubernetes-validations", ())
    if rules:
        lines += ["", "Rules the API server checks (CEL):", ""]
        for rule in rules:
            rule_text = " ".join(rule["rule"].split())
            lines.append(f"- {_escape(rule['message'])}: {_code(rule_text, in_table=False)}")
    return [*lines, ""]


def render_document(document: Schema, source: str = DEFAULT_CRD_PATH.as_posix()) -> str:
    """The reference page for one CRD document (its first version)."""
    names = document["spec"]["names"]
    version = document["spec"]["versions"][0]
    root: Schema = version["schema"]["openAPIV3Schema"]
    found: list[Section] = []
    for name, child in root["properties"].items():
        if name not in _STANDARD and _is_object(child):
            found.extend(sections(child, name))
    titles = {s.path: f"`{s.path}`" for s in found}
    anchors = [anchor(title) for title in titles.values()]
    if len(set(anchors)) != len(anchors):
        raise ValueError(f"two objects of the schema share a heading anchor: {anchors}")
    short = ", ".join(f"`{n}`" for n in names.get("shortNames", ()))
    lines = [
        f"<!-- Generated by `{COMMAND}` from {source}. Do not edit by hand. -->",
        "",
        "# CRD reference",
        "",
        f"`{names['kind']}` (`{document['metadata']['name']}`, version `{version['name']}`, "
        f"short name {short}), generated from the CRD's schema: every field with its type, "
        "default, allowed values and description. What the operator does with each field "
        "is in [Spec and status](spec-status.md).",
        "",
        "| object | description |",
        "| --- | --- |",
    ]
    for section in found:
        description = _escape(section.schema.get("description", ""))
        lines.append(
            f"| [{titles[section.path]}](#{anchor(titles[section.path])}) | {description} |"
        )
    lines += ["", "## Printer columns", "", "| column | JSONPath | `-o wide` only | description |"]
    lines.append("| --- | --- | --- | --- |")
    for column in version.get("additionalPrinterColumns", ()):
        wide = "yes" if column.get("priority") else ""
        cells = [
            _code(column["name"]),
            _code(column["jsonPath"]),
            wide,
            _escape(column.get("description", "")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for section in found:
        lines += table(section, titles)
    return "\n".join(lines)


def render(crd_path: Path = DEFAULT_CRD_PATH) -> str:
    """The reference page for the CRD file at `crd_path`."""
    document = yaml.safe_load(crd_path.read_text())
    # the repository-relative name, wherever the file is read from
    return render_document(document, (Path("crds") / crd_path.name).as_posix())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        usage = "python -m batchpilot.operator.crdref [CRD_FILE] > docs/operator/crd-reference.md"
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    sys.stdout.write(render(Path(args[0]) if args else DEFAULT_CRD_PATH))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
