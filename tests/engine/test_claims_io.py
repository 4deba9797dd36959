"""Pods with ResourceClaims (DRA) over in-memory API servers: the engine starts a pod only once
its claims are reserved for it, as the kubelet does; otherwise the pod waits, saying why once,
and starts as soon as they are."""

from __future__ import annotations

from typing import Any

from operators.engine import claims
from operators.k8s.client import Client
from tests.engine.harness import PODS, POOLS, Fleet, pod, pool

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
EVENTS = "/api/v1/namespaces/default/events"
UID = "pod-uid-1"


def gpu_pod(name: str = "train", *, template: bool = True, made: str | None = "train-gpus-x",
            status: bool = True) -> dict[str, Any]:
    """A pod on h100-0 with one claim: from a template (the claim the controller-manager made
    for it is ``made``), or named directly."""
    obj = pod(name, "h100-0")
    obj["metadata"]["uid"] = UID
    ref: dict[str, Any] = {"name": "gpus"}
    if template:
        ref["resourceClaimTemplateName"] = "two-gpus"
        if status:
            obj["status"] = {"resourceClaimStatuses": [{"name": "gpus",
                                                        "resourceClaimName": made}]}
    else:
        ref["resourceClaimName"] = "shared"
    obj["spec"]["resourceClaims"] = [ref]
    return obj


def claim(name: str = "train-gpus-x", *, owner: str | None = UID,
          reserved: str | None = UID) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"claim-{name}"}
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "train",
                                        "uid": owner, "controller": True}]
    status: dict[str, Any] = {}
    if reserved:
        status = {"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": "gpu.fakefleet.dev", "pool": "h100-0",
             "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "train", "uid": reserved}]}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.fakefleet.dev", "count": 1}}]}},
            "status": status}


def started(fleet: Fleet) -> None:
    fleet.host.put(POOLS, pool("h100", replicas=1, gpu={"preset": "H100-SXM5-80GB",
                                                         "allocation": "dra", "count": 2}))


def phase(fleet: Fleet, name: str = "train") -> str:
    return str(fleet.pod(name).get("status", {}).get("phase", ""))


def waiting(fleet: Fleet, name: str = "train") -> str:
    statuses = fleet.pod(name).get("status", {}).get("containerStatuses") or [{}]
    return str((statuses[0].get("state") or {}).get("waiting", {}).get("reason", ""))


def refusals(fleet: Fleet) -> list[str]:
    return [e["message"] for e in fleet.member.objects(EVENTS)
            if e["reason"] == claims.EVENT_REASON]


async def test_a_pod_whose_claim_is_reserved_for_it_runs() -> None:
    fleet = Fleet()
    started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(CLAIMS, claim())
        fleet.member.put(PODS, gpu_pod())
        await fleet.clock.advance(1)
        assert phase(fleet) == "Running"
        assert len(fleet.member.sent("GET", f"{CLAIMS}/train-gpus-x")) == 1
        assert refusals(fleet) == []
        # The controller-manager's record of the claims it made stays as it wrote it.
        assert fleet.pod("train")["status"]["resourceClaimStatuses"] == [
            {"name": "gpus", "resourceClaimName": "train-gpus-x"}]


async def test_a_claim_not_reserved_keeps_the_pod_waiting_until_it_is() -> None:
    """A pod made with spec.nodeName set: nobody allocated its claim. It waits in
    ContainerCreating with the kubelet's reason, said once, and starts once reserved."""
    fleet = Fleet()
    started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(CLAIMS, claim("shared", owner=None, reserved=None))
        fleet.member.put(PODS, gpu_pod(template=False))
        await fleet.clock.advance(30)
        assert phase(fleet) == "Pending"
        assert waiting(fleet) == "ContainerCreating"
        assert refusals(fleet) == [claims.event_message(
            f"pod train ({UID}) is not allowed to use ResourceClaim shared (claim-shared)")]
        assert len(fleet.member.sent("GET", f"{CLAIMS}/shared")) >= 3, "looked at again"
        await Client(fleet.member, clock=fleet.clock).patch(
            f"{CLAIMS}/shared", {"status": claim("shared")["status"]})
        await fleet.clock.advance(10.5)  # at most the back-off's cap
        assert phase(fleet) == "Running"
        assert len(refusals(fleet)) == 1


async def test_a_claim_made_for_the_pod_later_is_looked_at_as_soon_as_it_is_named() -> None:
    fleet = Fleet()
    started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, gpu_pod(status=False))
        await fleet.clock.advance(20)  # the back-off has grown
        assert refusals(fleet) == [claims.event_message(
            'pod "default/train": ResourceClaim not created yet')]
        fleet.member.put(CLAIMS, claim())
        await Client(fleet.member, clock=fleet.clock).patch(f"{PODS}/train/status", {
            "status": {"resourceClaimStatuses": [{"name": "gpus",
                                                  "resourceClaimName": "train-gpus-x"}]}})
        await fleet.clock.advance(0.5)
        assert phase(fleet) == "Running"


async def test_a_claim_the_pod_does_not_own_or_that_is_gone_is_refused() -> None:
    fleet = Fleet()
    started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(CLAIMS, claim(owner="someone-else"))
        fleet.member.put(PODS, gpu_pod())
        second = gpu_pod("other", made="missing")
        second["metadata"]["uid"] = "pod-uid-2"
        fleet.member.put(PODS, second)
        await fleet.clock.advance(2)
        assert (phase(fleet), phase(fleet, "other")) == ("Pending", "Pending")
        assert sorted(refusals(fleet)) == sorted([
            claims.event_message("ResourceClaim default/train-gpus-x was not created for Pod "
                                 "default/train (Pod is not owner)"),
            claims.event_message('fetch ResourceClaim missing: '
                                 'resourceclaims.resource.k8s.io "missing" not found')])


async def test_a_failing_api_is_retried_without_a_word_to_the_user() -> None:
    fleet = Fleet()
    started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(CLAIMS, claim())
        fleet.member.fail("GET", f"{CLAIMS}/train-gpus-x", status=503, times=2)
        fleet.member.put(PODS, gpu_pod())
        await fleet.clock.advance(1)
        assert phase(fleet) == ""
        await fleet.clock.advance(3)
        assert phase(fleet) == "Running"
        assert refusals(fleet) == []


async def test_a_restarted_engine_does_not_prepare_a_running_pod_again() -> None:
    fleet = Fleet()
    started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(CLAIMS, claim())
        fleet.member.put(PODS, gpu_pod())
        await fleet.clock.advance(1)
    await Client(fleet.member, clock=fleet.clock).delete(f"{CLAIMS}/train-gpus-x")
    fleet.member.requests.clear()
    async with fleet.running(fleet.engine(seed=2)):
        await fleet.clock.advance(5)
    assert phase(fleet) == "Running"
    assert fleet.member.sent("GET", f"{CLAIMS}/.*") == []


async def test_a_pod_the_scheduler_could_not_place_keeps_its_reason() -> None:
    """Unbound pods are the scheduler's: nothing of the engine's writes to them."""
    fleet = Fleet()
    started(fleet)
    unschedulable = gpu_pod("waiting")
    del unschedulable["spec"]["nodeName"]
    unschedulable["status"]["conditions"] = [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 cannot allocate all claims."}]
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, unschedulable)
        await fleet.clock.advance(20)
    assert fleet.member.sent("PATCH", f"{PODS}/waiting.*") == []
    assert fleet.pod("waiting")["status"]["conditions"] == unschedulable["status"]["conditions"]
