"""What Kopf keeps of the last-handled state: a digest whose size does not grow with
the spec, that changes with anything Kopf would have compared."""

from __future__ import annotations

import json
from typing import Any, cast

import kopf

from batchpilot.operator.diffbase import DIGEST_KEY, DigestDiffBaseStorage
from batchpilot.operator.spec import MAX_TRACE_TIMESTAMPS, parse_spec

KEY = "batchpilot.dev/last-handled-configuration"


def storage() -> DigestDiffBaseStorage:
    return DigestDiffBaseStorage(prefix="batchpilot.dev", key="last-handled-configuration")


def resource(**spec_changes: Any) -> dict[str, Any]:
    # the largest arrival trace the CRD takes, at a microsecond's precision
    timestamps = [round(k * 0.0123457, 6) + 86_400.0 for k in range(MAX_TRACE_TIMESTAMPS)]
    spec: dict[str, Any] = {
        "target": {"kind": "Deployment", "name": "resnet", "container": "server"},
        "sla": {"p99LatencyMs": 300},
        "load": {
            "endpoint": {"port": 8080, "path": "/v1/predict"},
            "arrival": {"process": "Trace", "timestamps": timestamps},
        },
        **spec_changes,
    }
    return {
        "apiVersion": "batchpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet", "namespace": "ml", "labels": {"team": "vision"}},
        "spec": spec,
        "status": {"phase": "Tuning"},
    }


def body_of(raw: dict[str, Any]) -> kopf.Body:
    return kopf.Body(cast(kopf.RawBody, raw))


def stored(raw: dict[str, Any]) -> str:
    body = body_of(raw)
    patch = kopf.Patch()
    storage().store(body=body, patch=patch, essence=storage().build(body=body))
    return str(patch["metadata"]["annotations"][KEY])


def test_the_stored_state_stays_small_whatever_the_specs_size() -> None:
    raw = resource()
    parse_spec(raw["spec"])  # a spec the operator takes
    # about half the 256 KiB all annotations share, kubectl's last-applied copy beside it
    assert len(json.dumps(raw["spec"], separators=(",", ":"))) > 120 * 1024
    small = resource()
    small["spec"]["load"]["arrival"] = {"process": "Poisson"}
    annotation = stored(raw)
    assert len(annotation) == len(stored(small)) < 100
    assert set(json.loads(annotation)) == {DIGEST_KEY}


def test_the_digest_changes_with_the_spec_labels_and_annotations_not_the_status() -> None:
    def essence(raw: dict[str, Any]) -> Any:
        return storage().build(body=body_of(raw))

    base = resource()
    assert essence(base) == essence(resource())
    edited = resource(sla={"p99LatencyMs": 250})
    relabelled = resource()
    relabelled["metadata"]["labels"] = {"team": "speech"}
    annotated = resource()
    annotated["metadata"]["annotations"] = {"owner": "ml-platform"}
    restatused = resource()
    restatused["status"] = {"phase": "Converged"}
    moved = resource()
    moved["spec"]["load"]["arrival"]["timestamps"][-1] += 0.000001
    assert essence(restatused) == essence(base)
    for changed in (edited, relabelled, annotated, moved):
        assert essence(changed) != essence(base)


def test_what_was_stored_reads_back_as_the_state_it_was_built_from() -> None:
    raw = resource()
    raw["metadata"]["annotations"] = {KEY: stored(raw)}
    body = body_of(raw)
    # the stored annotation itself is not part of the state: no change seen
    assert storage().fetch(body=body) == storage().build(body=body)
