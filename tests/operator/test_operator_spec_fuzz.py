"""The spec space driven through the operator (Kopf against KMock, the fake world): for
every spec Hypothesis draws, valid or not, the operator writes a status that says where
the study stands and ends in a state a person can read (SpecValid=False, Suspended,
Converged or Failed), never a study that retries forever while holding a canary or an
InPlace target's trial values.

Many drawn specs are valid (a valid spec reaches the study's paths, an invalid one only
the validation); others carry one value out of its bounds. The examples are drawn once,
derandomized (CI runs the same ones every time), and go through one running operator one
after another: stopping Kopf takes seconds, a study of the fake world a fraction of one."""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from opsupport import (
    ISVC_URL,
    ORIGINAL,
    FakeCluster,
    GenerateNameEmulator,
    Operator,
    eventually,
    isvc,
    obj_of,
    status_of,
)
from pydantic import ValidationError

from batchpilot.operator.spec import InferenceServiceSpec, parse_spec

pytestmark = [
    pytest.mark.operator,
    pytest.mark.timeout(300),
    pytest.mark.kmock(cls=GenerateNameEmulator),
]

EXAMPLES = 16
ENDED = ("Converged", "Failed", "RolledBack")

# one value out of its bounds each: what a hand-written manifest gets wrong
MUTATIONS: dict[str, tuple[tuple[str, ...], Any]] = {
    "batch below 1": (("parameters", "maxBatchSize", "min"), 0),
    "batch above its cap": (("parameters", "maxBatchSize", "max"), 5000),
    "batch min above max": (("parameters", "maxBatchSize", "min"), 4000),
    "wait above its cap": (("parameters", "maxQueueTimeMs", "max"), 60_001.0),
    "wait min above max": (("parameters", "maxQueueTimeMs", "min"), 59_000.0),
    "no trials": (("tuning", "maxTrials"), 0),
    "unknown sampler": (("tuning", "sampler"), "QMC"),
    "rate cap of zero": (("load", "maxRps"), 0),
    "negative gain": (("tuning", "minGainPercent"), -1.0),
    "rounds above the cap": (("tuning", "confirmRounds"), 21),
    "rounds below the adaptive cap": (("tuning", "confirmRounds"), 6),
}


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    batch_min = draw(st.integers(1, 64))
    wait_min = draw(st.sampled_from([0.0, 0.5, 2.0]))
    max_rps = draw(st.sampled_from([None, 500.0]))
    load: dict[str, Any] = {"endpoint": {"port": 8080, "path": "/v1/predict"}}
    if max_rps is not None:
        load["maxRps"] = max_rps
    tuning: dict[str, Any] = {
        "strategy": draw(st.sampled_from(["Canary", "InPlace"])),
        "maxTrials": draw(st.integers(1, 3)),
        "sampler": draw(st.sampled_from(["TPE", "Random", "GP"])),
        "writeBack": draw(st.sampled_from(["Apply", "Recommend"])),
        "finalists": draw(st.integers(0, 1)),
        "confirmRounds": 3,
        "maxConfirmRounds": draw(st.integers(3, 4)),
        "minGainPercent": draw(st.sampled_from([0.0, 5.0])),
    }
    patience = draw(st.sampled_from([None, 1, 2]))
    if patience is not None:
        tuning["patience"] = patience
    resource = isvc(
        "fuzz",
        parameters={
            "maxBatchSize": {"min": batch_min, "max": batch_min + draw(st.integers(0, 2048))},
            "maxQueueTimeMs": {"min": wait_min, "max": wait_min + draw(st.sampled_from([1, 50]))},
        },
        load=load,
        tuning=tuning,
        suspend=draw(st.integers(0, 5)) == 5,
    )
    if draw(st.integers(0, 2)) == 2:
        path, value = MUTATIONS[draw(st.sampled_from(sorted(MUTATIONS)))]
        field: dict[str, Any] = resource["spec"]
        for key in path[:-1]:
            field = field.setdefault(key, {})
        field[path[-1]] = value
    return resource


def drawn_specs() -> list[dict[str, Any]]:
    drawn: list[dict[str, Any]] = []

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(spec=specs())
    def collect(spec: dict[str, Any]) -> None:
        drawn.append(spec)

    collect()
    return drawn


def parsed_or_none(spec: dict[str, Any]) -> InferenceServiceSpec | None:
    try:
        return parse_spec(spec["spec"])
    except ValidationError:
        return None


def settled(k: kmock.KubernetesEmulator, name: str, valid: bool, suspended: bool) -> bool:
    status = status_of(k, name)
    conditions: dict[str, str] = {c["type"]: c["status"] for c in status.get("conditions", [])}
    if not valid:
        return conditions.get("SpecValid") == "False"
    if suspended:
        return conditions.get("Suspended") == "True"
    return status.get("phase") in ENDED


def test_the_drawn_specs_reach_both_the_study_and_the_validation() -> None:
    parsed = [parsed_or_none(spec) for spec in drawn_specs()]
    valid = [p for p in parsed if p is not None]
    assert len(valid) >= len(parsed) // 3
    assert len(valid) < len(parsed)
    assert any(not p.suspend and p.tuning.strategy == "InPlace" for p in valid)
    assert any(not p.suspend and p.tuning.strategy == "Canary" for p in valid)


async def test_every_drawn_spec_ends_readable_and_releases_what_it_held(
    kmock: kmock.KubernetesEmulator, operator: Operator, cluster: FakeCluster
) -> None:
    async with operator():
        for index, spec in enumerate(drawn_specs()):
            name = f"fuzz-{index}"
            spec["metadata"]["name"] = name
            spec["metadata"]["uid"] = f"uid-{name}"
            parsed = parsed_or_none(spec)
            suspended = parsed is not None and parsed.suspend
            cluster.target = dict(ORIGINAL)
            cluster.canaries.clear()
            cluster.applied.clear()
            cluster.written_back.clear()
            created = await kmock.post(ISVC_URL, json=spec)
            assert created.status in (200, 201)
            await eventually(
                lambda: settled(kmock, name, parsed is not None, suspended),  # noqa: B023
                what=f"a settled status for {spec['spec']}",
            )
            status = status_of(kmock, name)
            # deleted as a user deletes it: the next example's study needs the target free
            deleted = await kmock.delete(f"{ISVC_URL}/{name}")
            assert deleted.status == 200
            await eventually(lambda: obj_of(kmock, name) == {}, what="finalizer released")  # noqa: B023
            assert status.get("message"), (spec["spec"], status)  # every state says why
            if parsed is None or suspended:
                assert cluster.written_back == [], spec["spec"]
                continue
            assert cluster.canaries == set(), spec["spec"]  # an ended study holds no canary
            if parsed.tuning.strategy == "InPlace" and status["phase"] != "Converged":
                assert cluster.target == ORIGINAL, spec["spec"]  # no trial values left behind
            if status["phase"] == "Converged" and parsed.tuning.write_back == "Recommend":
                assert cluster.written_back == [], spec["spec"]
