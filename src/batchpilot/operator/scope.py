"""What a study's cleanup needs of the spec it started with. Kept in status when the
study starts, so that after an edit (or an operator restart between the edit and the
cleanup) the canary and the original configuration are undone on the workload the study
changed, the way it changed it, and not on whatever the spec names now."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from batchpilot.operator.spec import ApplySpec, InferenceServiceSpec, RuntimeSpec, TargetRef

# spec sections cleanup reads: the workload, how values reach it, and what was tuned
_SECTIONS = ("target", "runtime", "apply")
# bounds the status field: apply and runtime are small, a target is a few names
MAX_SCOPE_CHARS = 8192


class ScopeUnreadable(ValueError):
    """The recorded scope cannot be read back (written by another version)."""


def scope_of(spec: InferenceServiceSpec) -> str:
    """The cleanup's part of `spec`, as compact JSON for status.startedWith."""
    raw: dict[str, Any] = {
        name: getattr(spec, name).model_dump(mode="json", by_alias=True, exclude_none=True)
        for name in _SECTIONS
    }
    raw["strategy"] = spec.tuning.strategy
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SCOPE_CHARS:
        raise ValueError(f"the study's scope is {len(text)} characters, over {MAX_SCOPE_CHARS}")
    return text


def cleanup_spec(spec: InferenceServiceSpec, scope: str | None) -> InferenceServiceSpec:
    """`spec` with the sections the study started with put back (`spec` itself when no
    scope was recorded, by a study older than this record). ScopeUnreadable when the
    record does not parse."""
    if scope is None:
        return spec
    try:
        raw = json.loads(scope)
        target = TargetRef.model_validate(raw["target"])
        runtime = RuntimeSpec.model_validate(raw["runtime"])
        apply = ApplySpec.model_validate(raw["apply"])
        strategy = raw["strategy"]
        if strategy not in ("Canary", "InPlace"):
            raise ValueError(f"strategy {strategy!r}")
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        raise ScopeUnreadable(f"status.startedWith cannot be read: {exc}") from None
    tuning = spec.tuning.model_copy(update={"strategy": strategy})
    started = spec.model_copy(
        update={"target": target, "runtime": runtime, "apply": apply, "tuning": tuning}
    )
    return spec if started == spec else started
