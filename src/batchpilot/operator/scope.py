"""What a study's cleanup needs of the spec it started with. Kept in status when the
study starts, so that after an edit (or an operator restart between the edit and the
cleanup) the canary and the original configuration are undone on the workload the study
changed, the way it changed it, and not on whatever the spec names now; and so that a
deletion undoes them even when the spec has become invalid meanwhile."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from batchpilot.operator import decisions
from batchpilot.operator.spec import (
    MAX_CA_BUNDLE_CHARS,
    ApplySpec,
    InferenceServiceSpec,
    LoadSpec,
    ParametersSpec,
    RuntimeSpec,
    SLASpec,
    TargetRef,
    TuningSpec,
    parse_spec,
)
from batchpilot.operator.status import InferenceServiceStatus

# spec sections cleanup reads: the workload, how values reach it, and what was tuned
_SECTIONS = ("target", "runtime", "apply")
# of load, what cleanup reads: the port a live restore reaches the server on, and the
# load workers to remove (the rest, a request trace above all, may be large)
_LOAD_FIELDS = ("endpoint", "workers")
# bounds the status field: apply and runtime are small, a target is a few names, but
# load.endpoint.caBundle (which a live restore over https verifies with) may hold up to
# 64 KiB of PEM, each line's newline escaped in JSON; 16 KiB for all the rest
MAX_SCOPE_CHARS = MAX_CA_BUNDLE_CHARS + MAX_CA_BUNDLE_CHARS // 64 + 16384

_Model = TypeVar("_Model", bound=BaseModel)


class ScopeUnreadable(ValueError):
    """The recorded scope cannot be read back (written by another version)."""


@dataclass(frozen=True)
class _Scope:
    target: TargetRef
    runtime: RuntimeSpec
    apply: ApplySpec
    strategy: Literal["Canary", "InPlace"]
    # what load cleanup reads, as recorded (camelCase); None in records of older versions
    load: dict[str, Any] | None


def scope_of(spec: InferenceServiceSpec) -> str:
    """The cleanup's part of `spec`, as compact JSON for status.startedWith."""
    raw: dict[str, Any] = {
        name: getattr(spec, name).model_dump(mode="json", by_alias=True, exclude_none=True)
        for name in _SECTIONS
    }
    raw["strategy"] = spec.tuning.strategy
    load = spec.load.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["load"] = {name: load[name] for name in _LOAD_FIELDS}
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SCOPE_CHARS:
        raise ValueError(f"the study's scope is {len(text)} characters, over {MAX_SCOPE_CHARS}")
    return text


def _read(scope: str) -> _Scope:
    try:
        raw = json.loads(scope)
        strategy = raw["strategy"]
        if strategy not in ("Canary", "InPlace"):
            raise ValueError(f"strategy {strategy!r}")
        load = raw.get("load")
        if load is not None:
            LoadSpec.model_validate(load)  # read back now, not halfway through a cleanup
        return _Scope(
            target=TargetRef.model_validate(raw["target"]),
            runtime=RuntimeSpec.model_validate(raw["runtime"]),
            apply=ApplySpec.model_validate(raw["apply"]),
            strategy=strategy,
            load=None if load is None else dict(load),
        )
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
        raise ScopeUnreadable(f"status.startedWith cannot be read: {exc}") from None


def cleanup_spec(spec: InferenceServiceSpec, scope: str | None) -> InferenceServiceSpec:
    """`spec` with the sections the study started with put back (`spec` itself when no
    scope was recorded, by a study older than this record). ScopeUnreadable when the
    record does not parse."""
    if scope is None:
        return spec
    recorded = _read(scope)
    update: dict[str, Any] = {
        "target": recorded.target,
        "runtime": recorded.runtime,
        "apply": recorded.apply,
        "tuning": spec.tuning.model_copy(update={"strategy": recorded.strategy}),
    }
    if recorded.load is not None:
        current = spec.load.model_dump(mode="json", by_alias=True, exclude_none=True)
        update["load"] = LoadSpec.model_validate({**current, **recorded.load})
    started = spec.model_copy(update=update)
    return spec if started == spec else started


def _section(model: type[_Model], raw: Any, put_back: Mapping[str, Any]) -> _Model | None:
    """`raw` read as `model` with `put_back` over it; None when that is invalid."""
    base = dict(raw) if isinstance(raw, Mapping) else {}
    try:
        return model.model_validate({**base, **put_back})
    except ValidationError:
        return None


def spec_from_scope(raw: Any, scope: str) -> InferenceServiceSpec:
    """A spec for the cleanup of a study whose spec has become invalid (an edit that
    the API server's schema let through, or one made while no operator ran): what
    cleanup reads comes from the record; the rest from `raw` where it is valid.

    Sections cleanup never reads are left out (the SLA) or at their defaults (the
    search space) when `raw` has them wrong, so the result is for cleanup only, never
    for a study.
    ScopeUnreadable when the record does not parse."""
    recorded = _read(scope)
    sections = {
        "target": recorded.target.model_dump(mode="json", by_alias=True, exclude_none=True),
        "runtime": recorded.runtime.model_dump(mode="json", by_alias=True, exclude_none=True),
        "apply": recorded.apply.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    given = dict(raw) if isinstance(raw, Mapping) else {}
    tuning_raw = given.get("tuning")
    load_raw = given.get("load")
    merged = {
        **given,
        **sections,
        "tuning": {
            **(dict(tuning_raw) if isinstance(tuning_raw, Mapping) else {}),
            "strategy": recorded.strategy,
        },
    }
    if recorded.load is not None:
        merged["load"] = {
            **(dict(load_raw) if isinstance(load_raw, Mapping) else {}),
            **recorded.load,
        }
    try:
        return parse_spec(merged)
    except ValidationError:
        pass
    strategy = {"strategy": recorded.strategy}
    tuning = _section(TuningSpec, tuning_raw, strategy) or TuningSpec.model_validate(strategy)
    load = _section(LoadSpec, load_raw, recorded.load or {})
    if load is None and recorded.load is not None:
        load = _section(LoadSpec, {}, recorded.load)
    fields: dict[str, Any] = {
        "target": recorded.target,
        "runtime": recorded.runtime,
        "apply": recorded.apply,
        "tuning": tuning,
        "suspend": False,
    }
    optional: dict[str, BaseModel | None] = {
        "load": load,
        "sla": _section(SLASpec, given.get("sla"), {}),
        "parameters": _section(ParametersSpec, given.get("parameters"), {}),
    }
    fields.update({name: value for name, value in optional.items() if value is not None})
    if load is None:
        # a record older than its load part, and a load section that is invalid now
        raise ScopeUnreadable("status.startedWith has no load and spec.load is invalid")
    # not validated as a whole: the invalid part is what made the spec unusable, and
    # cleanup reads only the sections validated above
    return InferenceServiceSpec.model_construct(**fields)


def cleanup_plan(status: InferenceServiceStatus, spec: InferenceServiceSpec) -> str:
    """What a cleanup under `spec` is about to undo, for the event a person reads."""
    delete_canary, restore = decisions.needs_cleanup(status, spec.tuning.strategy)
    undone: list[str] = []
    if delete_canary:
        undone.append(f"canary {status.canary} deleted")
    if restore:
        undone.append(
            f"{spec.target.kind} {spec.target.name} restored to its original configuration"
        )
    return ", ".join(undone) or "nothing was left to undo"


def leftovers(status: InferenceServiceStatus) -> str:
    """What a study left that no cleanup could undo, when no spec says where it is."""
    left: list[str] = []
    if status.canary is not None:
        left.append(f"canary {status.canary} (garbage-collected with its owner)")
    if status.original is not None and not status.restored and not status.applied:
        shown = status.original.env or status.original.params
        left.append(f"the target may still run a trial's configuration; its original was {shown}")
    return "; ".join(left) or "nothing"
