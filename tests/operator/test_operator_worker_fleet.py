"""The load-worker fleet against KMock: what WorkerFleet creates, waits for and deletes
on the API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kmock import ResourceInfo

from batchpilot.operator import workerjob
from batchpilot.operator.kube import Connection, Kube
from batchpilot.operator.spec import WorkersSpec
from batchpilot.operator.workerfleet import FleetError, WorkerFleet

pytestmark = [pytest.mark.operator, pytest.mark.timeout(60)]

NS = "ml"
JOBS = "batch/v1/jobs"
OWNER: dict[str, Any] = {
    "apiVersion": "batchpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "resnet", "namespace": NS, "uid": "uid-1"},
}


@pytest.fixture
async def kube(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Kube]:
    kmock.resources[JOBS] = ResourceInfo(kind="Job", namespaced=True)
    kmock.resources["v1/secrets"] = ResourceInfo(kind="Secret", namespaced=True)
    kmock.resources["v1/serviceaccounts"] = ResourceInfo(kind="ServiceAccount", namespaced=True)
    kmock.resources["v1/pods"] = ResourceInfo(kind="Pod", namespaced=True)
    client = Kube(Connection(server=str(kmock.url).rstrip("/")), backoff_base_s=0.01)
    yield client
    await client.close()


def fleet(kube: Kube, image: str | None = "img:1", **kwargs: Any) -> WorkerFleet:
    return WorkerFleet(
        kube, namespace=NS, owner=OWNER, spec=WorkersSpec(max=3), default_image=image,
        poll_s=0.01, **kwargs,
    )  # fmt: skip


def worker_pod(name: str, index: int, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {workerjob.WORKER_LABEL: workerjob.fleet_name("resnet", NS, "uid-1")},
            "annotations": {workerjob.INDEX_ANNOTATION: str(index)},
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def posted(kmock: kmock.KubernetesEmulator, plural: str) -> list[dict[str, Any]]:
    return [r.data for r in kmock["post"] if r.resource is not None and r.resource.plural == plural]


async def test_the_fleet_starts_waits_for_every_index_and_is_removed(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    f = fleet(kube)
    ensure = asyncio.ensure_future(f.ensure(2))
    async with asyncio.timeout(10):
        # KMock records requests but offers nothing to await one by
        while not posted(kmock, "jobs"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    # the Job controller's and the kubelet's part: the pods run, index 1 first
    kmock.objects["v1/pods", NS, "w-1"] = worker_pod("w-1", 1, "10.0.0.2")
    await asyncio.sleep(0.05)
    assert not ensure.done(), "index 0 is not ready yet"
    kmock.objects["v1/pods", NS, "w-0"] = worker_pod("w-0", 0, "10.0.0.1")
    addresses = await asyncio.wait_for(ensure, 10)
    assert addresses == ["10.0.0.1:8070", "10.0.0.2:8070"]

    [account] = posted(kmock, "serviceaccounts")
    assert account["automountServiceAccountToken"] is False
    [secret] = posted(kmock, "secrets")
    token = secret["stringData"][workerjob.TOKEN_KEY]
    assert len(token) >= 32
    [job] = posted(kmock, "jobs")
    assert job["spec"]["completions"] == 2
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert f.workers == 2

    # the same size again: no new Job
    assert await f.ensure(2) == addresses
    assert len(posted(kmock, "jobs")) == 1

    await f.remove()
    deleted = {(r.resource.plural, r.name) for r in kmock["delete"] if r.resource is not None}
    assert {("jobs", f.name), ("secrets", f.name), ("serviceaccounts", f.name)} <= deleted
    assert f.workers == 0


async def test_no_image_is_a_clear_problem(kube: Kube) -> None:
    with pytest.raises(FleetError, match="BATCHPILOT_WORKER_IMAGE"):
        await fleet(kube, image=None).ensure(2)


async def test_pods_that_never_get_ready_time_out_naming_the_job(
    kmock: kmock.KubernetesEmulator, kube: Kube
) -> None:
    f = fleet(kube, ready_timeout_s=0.3)
    with pytest.raises(FleetError, match=f"load-worker Job {f.name}: not ready"):
        await f.ensure(2)
