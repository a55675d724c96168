"""Which spec edits restart a study and which the running (or finished) study adopts.

A study's trials are only comparable while what they measured stays the same: the
target, the SLA, the search space, how values reach the pods and how the load is made.
Edits to those start a new study. Edits that only steer the study (how many trials,
patience, what to do with the result, deadlines) are taken over by the study in place.
Unknown or new fields restart it: the safe default for anything not listed here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pydantic.alias_generators import to_camel

from batchpilot.operator.spec import InferenceServiceSpec

# tuning fields (Python names) that a study adopts without starting over
ADOPTED_TUNING_FIELDS = frozenset(
    {
        "write_back",
        "max_trials",
        "patience",
        "max_failures",
        "trial_deadline_seconds",
        "window",
        "write_back_deadline_seconds",
        "restore_deadline_seconds",
        "retune",
        "retune_window",
    }
)
# top-level fields likewise: suspend pauses and resumes the same study
ADOPTED_FIELDS = frozenset({"suspend"})


def _study_part(spec: InferenceServiceSpec) -> dict[str, Any]:
    data = spec.model_dump(mode="json", by_alias=True)
    adopted = {to_camel(f) for f in ADOPTED_TUNING_FIELDS}
    data["tuning"] = {k: v for k, v in data["tuning"].items() if k not in adopted}
    for name in ADOPTED_FIELDS:
        data.pop(to_camel(name), None)
    return data


def study_fingerprint(spec: InferenceServiceSpec) -> str:
    """A digest of the fields a study's results depend on."""
    canonical = json.dumps(_study_part(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _changed(old: Any, new: Any, path: str) -> list[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += _changed(old.get(key), new.get(key), f"{path}.{key}" if path else key)
        return out
    return [] if old == new else [path]


def restarting_changes(old: InferenceServiceSpec, new: InferenceServiceSpec) -> list[str]:
    """The spec paths (camelCase, e.g. `sla.p99LatencyMs`) whose change restarts the
    study; empty when the study may adopt `new` as it is."""
    return _changed(_study_part(old), _study_part(new), "")


def restarts_study(old: InferenceServiceSpec, new: InferenceServiceSpec) -> bool:
    return bool(restarting_changes(old, new))
