"""ResourceSlices of DRA nodes over in-memory API servers: written once after their nodes,
adopted after a restart, kept in step with the pool, retried through 409/429/5xx, withdrawn
with their nodes; GPUs taken out of service and back."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from operators.api.faultplans import Fault
from operators.engine.devices import DEVICE_CLASSES, SLICES, UNHEALTHY
from operators.engine.publishing import NOT_SERVED, TAINTS_DROPPED
from operators.faults import catalogue
from operators.k8s.client import Client
from operators.k8s.requests import Request, encode
from operators.k8s.transport import Response, StreamResponse
from primitives import keys
from tests.engine.harness import NODES, POOLS, Fleet, as_written, pool
from tests.fakes.k8s import MemoryTransport

H100 = {"preset": "H100-SXM5-80GB", "allocation": "dra", "count": 4}


def gpu_pool(replicas: int = 2, **gpu: Any) -> dict[str, Any]:
    return pool("h100", replicas=replicas, gpu={**H100, **gpu})


def slices(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """The member's slices by node name."""
    return {s["spec"]["nodeName"]: s for s in fleet.member.objects(SLICES)}


def writes(fleet: Fleet) -> list[str]:
    return [f"{r.method} {r.path}" for r in fleet.member.requests
            if r.path.startswith(SLICES) and r.method in ("POST", "PATCH", "PUT", "DELETE")]


def taints(slice_: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {d["name"]: d["taints"] for d in slice_["spec"]["devices"] if d.get("taints")}


async def test_a_dra_pool_publishes_a_slice_per_node_after_it_and_the_device_class() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool())
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        published = slices(fleet)
        assert sorted(published) == ["h100-0", "h100-1"], "the cpu pool publishes nothing"
        uids = fleet.uids()
        for node, found in published.items():
            assert found["metadata"]["ownerReferences"][0]["uid"] == uids[node]
            assert [d["name"] for d in found["spec"]["devices"]] == [f"gpu-{i}" for i in range(4)]
        assert "nvidia.com/gpu" not in fleet.nodes()["h100-0"]["status"]["capacity"]
        classes = fleet.member.objects(DEVICE_CLASSES)
        assert [c["metadata"]["name"] for c in classes] == ["gpu.fakefleet.dev"]
        order = [(r.method, r.path) for r in fleet.member.requests if r.method == "POST"]
        assert order.index(("POST", NODES)) < order.index(("POST", SLICES)), "node first"
        fleet.member.requests.clear()
        await fleet.clock.advance(95)  # resyncs and heartbeats write no slice again
        assert writes(fleet) == []
        assert fleet.pool_status("h100")["readyReplicas"] == 2


async def test_a_restarted_engine_adopts_the_slices_and_writes_none() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool())
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
    before = {node: s["metadata"]["uid"] for node, s in slices(fleet).items()}
    fleet.member.requests.clear()
    async with fleet.running(fleet.engine(seed=2)):
        await fleet.clock.advance(40)
    assert writes(fleet) == []
    assert {node: s["metadata"]["uid"] for node, s in slices(fleet).items()} == before
    # The DeviceClass is asked for again and found: the same class, nothing to do.
    assert len(fleet.member.sent("POST", DEVICE_CLASSES)) == 1
    assert len(fleet.member.objects(DEVICE_CLASSES)) == 1


async def test_a_pool_change_patches_each_slice_once_at_the_next_generation() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool())
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        uids = {node: s["metadata"]["uid"] for node, s in slices(fleet).items()}
        fleet.member.requests.clear()
        await fleet.host_client_patch(f"{POOLS}/h100", {"spec": {"gpu": {
            "driverVersion": "580.65.6"}}})
        await fleet.clock.advance(2)
        assert sorted(writes(fleet)) == [f"PATCH {SLICES}/h100-{i}-gpu.fakefleet.dev"
                                         for i in range(2)]
        for node, found in slices(fleet).items():
            assert found["metadata"]["uid"] == uids[node], "updated, not made again"
            assert found["spec"]["pool"]["generation"] == 2
            assert found["spec"]["devices"][0]["attributes"]["driverVersion"] == {
                "version": "580.65.6"}
        fleet.member.requests.clear()
        await fleet.clock.advance(35)
        assert writes(fleet) == []


async def test_scaling_down_withdraws_the_slices_of_the_nodes_that_go() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=3))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        gone = slices(fleet)["h100-2"]["metadata"]["uid"]
        await fleet.host_client_patch(f"{POOLS}/h100", {"spec": {"replicas": 1}})
        await fleet.clock.advance(2)
        assert sorted(slices(fleet)) == ["h100-0"]
        deletes = fleet.member.sent("DELETE", f"{SLICES}/h100-2-gpu.fakefleet.dev")
        assert deletes[0].json()["preconditions"]["uid"] == gone


async def test_switching_to_extended_withdraws_the_slices_and_gives_the_resource() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool())
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        await fleet.host_client_patch(f"{POOLS}/h100", {"spec": {"gpu": {
            "allocation": "extended"}}})
        await fleet.clock.advance(2)
        assert slices(fleet) == {}
        assert fleet.nodes()["h100-0"]["status"]["capacity"]["nvidia.com/gpu"] == "4"


async def test_a_node_made_again_gets_a_slice_of_its_own() -> None:
    """The slice of a deleted node is owned by a uid that is gone: the engine replaces it
    (the garbage collector, which the in-memory API lacks, would delete it too)."""
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool())
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        old = fleet.uids()["h100-1"]
        await Client(fleet.member, clock=fleet.clock).delete(f"{NODES}/h100-1")
        await fleet.clock.advance(3)
        new = fleet.uids()["h100-1"]
        assert new != old
        owners = [s["metadata"]["ownerReferences"][0]["uid"]
                  for s in fleet.member.objects(SLICES) if s["spec"]["nodeName"] == "h100-1"]
        assert owners == [new]


async def test_failed_and_throttled_writes_are_retried_and_a_lost_answer_makes_no_twin() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=3))
    fleet.member.fail("POST", f"{SLICES}", status=500, times=2)
    fleet.member.fail("POST", f"{SLICES}", status=429, headers={"Retry-After": "2"})
    fleet.member.fail("POST", f"{SLICES}", reset=True, applied=True)  # made, the answer lost
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        assert len(slices(fleet)) < 3
        await fleet.clock.advance(10)  # the reconcile loop's back-off, then all of them
        assert sorted(slices(fleet)) == ["h100-0", "h100-1", "h100-2"]
        assert len(fleet.member.objects(SLICES)) == 3
        assert fleet.pool_status("h100")["readyReplicas"] == 3


async def test_a_slice_there_but_not_seen_yet_is_adopted_when_its_post_finds_it() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=1))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(2)
        engine.publisher.slices.clear()  # as if the watch had not shown it yet
        fleet.member.requests.clear()
        assert await engine.publisher.reconcile(engine.pools.desired)
        assert writes(fleet) == [f"POST {SLICES}"], "AlreadyExists: read, the same, done"
        assert len(fleet.member.sent("GET", f"{SLICES}/h100-0-gpu.fakefleet.dev")) == 1
        assert "h100-0-gpu.fakefleet.dev" in engine.publisher.slices


async def test_a_slice_changed_meanwhile_is_read_again_before_it_is_patched() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        fleet.member.fail("PATCH", f"{SLICES}/.*", status=409, reason="Conflict")
        await fleet.host_client_patch(f"{POOLS}/h100", {"spec": {"gpu": {"count": 2}}})
        await fleet.clock.advance(2)
        found = slices(fleet)["h100-0"]
        assert [d["name"] for d in found["spec"]["devices"]] == ["gpu-0", "gpu-1"]
        assert len(fleet.member.sent("GET", f"{SLICES}/h100-0-gpu.fakefleet.dev")) == 1


async def test_a_slice_someone_deleted_is_published_again() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        await Client(fleet.member, clock=fleet.clock).delete(
            f"{SLICES}/h100-0-gpu.fakefleet.dev")
        await fleet.clock.advance(2)
        assert sorted(slices(fleet)) == ["h100-0"]


async def test_a_cluster_without_dra_says_so_in_the_pool_and_still_makes_its_nodes() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool())
    fleet.member.fail("GET", SLICES, status=404, reason="NotFound")
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        assert sorted(fleet.nodes()) == ["h100-0", "h100-1"]
        stalled = next(c for c in fleet.pool_status("h100")["conditions"]
                       if c["type"] == "Stalled")
        assert (stalled["status"], stalled["message"]) == ("True", NOT_SERVED)
        assert writes(fleet) == []


# -- GPUs out of service -----------------------------------------------------------------------

async def test_gpus_go_out_of_service_and_back_and_stay_out_across_a_restart() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=1))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(2)
        await engine.publisher.set_gpu_health("h100-0", [0, 1], healthy=False, reason="Xid79")
        found = slices(fleet)["h100-0"]
        assert taints(found) == {
            "gpu-0": [{"key": UNHEALTHY, "value": "Xid79", "effect": "NoExecute"}],
            "gpu-1": [{"key": UNHEALTHY, "value": "Xid79", "effect": "NoExecute"}]}
        assert found["spec"]["pool"]["generation"] == 2
        fleet.member.requests.clear()
        await engine.publisher.set_gpu_health("h100-0", [0], healthy=False, reason="Xid79")
        assert writes(fleet) == [], "already out: nothing to write"
    # The API server stamps the taint; a restarted engine changes the pool and keeps it.
    stamped = slices(fleet)["h100-0"]
    for device in stamped["spec"]["devices"][:2]:
        device["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    await Client(fleet.member, clock=fleet.clock).patch(
        f"{SLICES}/h100-0-gpu.fakefleet.dev", {"spec": {"devices": stamped["spec"]["devices"]}})
    await fleet.host_client_patch(f"{POOLS}/h100", {"spec": {"gpu": {
        "driverVersion": "580.65.6"}}})
    async with fleet.running(fleet.engine(seed=2)) as engine:
        await fleet.clock.advance(2)
        found = slices(fleet)["h100-0"]
        assert found["spec"]["devices"][0]["attributes"]["driverVersion"]["version"] == \
            "580.65.6"
        assert [t[0]["timeAdded"] for t in taints(found).values()] == [
            "2026-01-01T00:00:00Z"] * 2
        await engine.publisher.set_gpu_health("h100-0", [0, 1], healthy=True, reason="Xid79")
        assert taints(slices(fleet)["h100-0"]) == {}


class DropsDeviceTaints:
    """An API server without DRADeviceTaints (before 1.36): taints in slices are dropped."""

    def __init__(self, inner: MemoryTransport) -> None:
        self.inner = inner

    async def send(self, request: Request) -> Response:
        if request.path.startswith(SLICES) and request.method in ("POST", "PATCH"):
            body = request.json()
            for device in (body.get("spec") or {}).get("devices") or ():
                device.pop("taints", None)
            request = dataclasses.replace(request, body=encode(body))
        return await self.inner.send(request)

    def stream(self, request: Request) -> contextlib.AbstractAsyncContextManager[
            StreamResponse]:
        return self.inner.stream(request)

    def refresh_credentials(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_an_api_server_that_drops_device_taints_is_reported_on_the_node() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=1))
    engine = fleet.engine()
    engine.publisher.client = Client(DropsDeviceTaints(fleet.member), clock=fleet.clock)
    async with fleet.running(engine):
        await fleet.clock.advance(2)
        await engine.publisher.set_gpu_health("h100-0", [0], healthy=False, reason="Xid79")
        await engine.publisher.set_gpu_health("h100-0", [1], healthy=False, reason="Xid79")
        await fleet.clock.advance(1)
    events = [e for e in fleet.member.objects("/api/v1/namespaces/default/events")
              if e["reason"] == "DeviceTaintsDropped"]
    assert [(e["involvedObject"]["name"], e["message"]) for e in events] == [
        ("h100-0", TAINTS_DROPPED)], "said once"


async def test_a_node_without_devices_has_no_gpus_to_take_out() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=1, allocation="extended"))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(2)
        await engine.publisher.set_gpu_health("h100-0", [0], healthy=False, reason="Xid79")
        assert writes(fleet) == []


async def test_a_fatal_xid_on_a_dra_node_takes_its_first_gpus_out_until_it_recovers() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, gpu_pool(replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        node = fleet.nodes()["h100-0"]
        gpus, extended = catalogue.node_gpus(node)
        assert (gpus, extended) == (4, False)
        entry = as_written(catalogue.node_entry(
            "plan/xid/0", Fault(type="GPUXid", xid=79, gpus=2), gpus=gpus, extended=extended))
        fleet.member.fail("PATCH", f"{SLICES}/.*", status=503)  # the stage is retried
        fleet.inject(entry, "h100-0")
        await fleet.clock.advance(5)
        assert sorted(taints(slices(fleet)["h100-0"])) == ["gpu-0", "gpu-1"]
        status = fleet.nodes()["h100-0"]["status"]
        assert "nvidia.com/gpu" not in status["allocatable"], "no extended resource to lower"
        assert {c["type"]: c["status"] for c in status["conditions"]}["GPUHealthy"] == "False"
        await fleet.recover("plan/xid/0")
        await fleet.clock.advance(3)
        assert taints(slices(fleet)["h100-0"]) == {}
        assert slices(fleet)["h100-0"]["metadata"]["annotations"][keys.SLICE_DIGEST]
