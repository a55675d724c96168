"""Kubernetes label selectors as plain data: whether one matches a set of labels, and
the query string that lists what it selects.

Two shapes exist: a Service's `spec.selector` (a map; empty or absent selects nothing)
and a LabelSelector (`matchLabels` and `matchExpressions`; empty selects everything,
absent selects nothing). Both are normalised into `Requirement`s here so that every
caller applies the API server's rules the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: frozenset[str] = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


class SelectorError(ValueError):
    """A selector this module cannot read (an unknown operator, a malformed entry)."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        return not present

    def query(self) -> str:
        if self.operator == "In":
            if len(self.values) == 1:
                return f"{self.key}={self.values[0]}"
            return f"{self.key} in ({','.join(self.values)})"
        if self.operator == "NotIn":
            return f"{self.key} notin ({','.join(self.values)})"
        if self.operator == "Exists":
            return self.key
        return f"!{self.key}"


@dataclass(frozen=True)
class Selector:
    """A conjunction of requirements. `everything` is an empty LabelSelector, which
    selects every pod; a selector that selects nothing is never built (None)."""

    requirements: tuple[Requirement, ...]

    @property
    def everything(self) -> bool:
        return not self.requirements

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(r.key for r in self.requirements)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def query(self) -> str:
        """The `labelSelector` query parameter. Refuses the empty selector: as a query
        it would list every pod of the namespace, never what a workload owns."""
        if self.everything:
            raise SelectorError("an empty selector selects every pod; refusing to use it")
        return ",".join(r.query() for r in self.requirements)


def from_map(selector: Mapping[str, Any] | None) -> Selector | None:
    """A Service's selector: None (selects nothing) when empty or absent."""
    if not selector:
        return None
    return Selector(tuple(Requirement(str(k), "In", (str(v),)) for k, v in selector.items()))


def from_label_selector(selector: Mapping[str, Any] | None) -> Selector | None:
    """A LabelSelector (`matchLabels`, `matchExpressions`): None when absent (selects
    nothing), an empty Selector when `{}` (selects everything)."""
    if selector is None:
        return None
    requirements = [
        Requirement(str(k), "In", (str(v),))
        for k, v in sorted((selector.get("matchLabels") or {}).items())
    ]
    expressions: Sequence[Mapping[str, Any]] = selector.get("matchExpressions") or []
    for expression in expressions:
        operator = expression.get("operator")
        key = expression.get("key")
        if operator not in OPERATORS or not isinstance(key, str):
            raise SelectorError(
                f"matchExpressions entry {dict(expression)}: the operator must be one of "
                f"{', '.join(sorted(OPERATORS))} and the key a string"
            )
        values = tuple(str(v) for v in expression.get("values") or [])
        requirements.append(Requirement(key, operator, values))
    return Selector(tuple(requirements))
