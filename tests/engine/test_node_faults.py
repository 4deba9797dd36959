"""Node faults over in-memory API servers: conditions, heartbeat, taints, cordon, allocatable
and held (deleted) nodes, written around others' changes and kept across a restart; a fault
set on many nodes marked done once."""

from __future__ import annotations

import json
from typing import Any

from primitives import keys
from tests.engine.harness import (
    LEASES,
    NODES,
    POOLS,
    Fleet,
    entry,
    pool,
    ready,
)

READY = {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "kubelet is posting ready status"}
HOLD = {"name": "fault-hold", "resource": "Node", "effect": {"hold": True}}
NOT_READY = [
    {"name": "fault-not-ready", "resource": "Node",
     "selector": {"matchExpressions": [{"key": "ready", "operator": "NotIn",
                                        "values": ["False"]}]},
     "effect": {"heartbeat": True, "conditions": [
         {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
          "message": "PLEG is not healthy"}]}},
    HOLD]
UNREACHABLE = [
    {"name": "fault-unreachable", "resource": "Node",
     "selector": {"matchExpressions": [{"key": "heartbeat", "operator": "In",
                                        "values": ["true"]}]},
     "effect": {"heartbeat": False}},
    HOLD]
RECOVER = [{"name": "fault-recover", "resource": "Node",
            "effect": {"heartbeat": True, "conditions": [READY], "endFault": True}}]
XID = [{"name": "fault-xid", "resource": "Node",
        "selector": {"matchExpressions": [{"key": "conditions[GPUHealthy]", "operator": "NotIn",
                                           "values": ["False"]}]},
        "effect": {"conditions": [{"type": "GPUHealthy", "status": "False", "reason": "Xid79",
                                   "message": "GPU has fallen off the bus"}],
                   "events": [{"type": "Warning", "reason": "GPUXid",
                               "message": "Xid 79 on 1 GPU(s)"}],
                   "taints": [{"key": "fakefleet.dev/gpu-xid", "value": "79",
                               "effect": "NoExecute"}],
                   "allocatable": {"nvidia.com/gpu": "7"}}}]
XID_RECOVER = [{"name": "fault-recover", "resource": "Node",
                "effect": {"conditions": [{"type": "GPUHealthy", "status": "True",
                                           "reason": "GPUReset"}],
                           "removeTaints": ["fakefleet.dev/gpu-xid"],
                           "allocatable": {"nvidia.com/gpu": None}, "endFault": True}}]
CORDON = [{"name": "fault-cordon", "resource": "Node",
           "selector": {"matchExpressions": [{"key": "unschedulable", "operator": "NotIn",
                                              "values": ["true"]}]},
           "effect": {"unschedulable": True}}]
UNCORDON = [{"name": "fault-recover", "resource": "Node",
             "effect": {"unschedulable": False, "endFault": True}}]
CONTROLLER_TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}


def node(fleet: Fleet, name: str) -> dict[str, Any]:
    found = fleet.member.object(f"{NODES}/{name}")
    assert found is not None, f"node {name} is gone"
    return found


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


async def test_a_held_not_ready_node_stays_not_ready_across_a_restart_until_it_recovers(
) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        fleet.inject(entry("ns/plan/nr/0", NOT_READY, RECOVER), "cpu-0")
        await fleet.clock.advance(1)
        assert condition(node(fleet, "cpu-0"), "Ready")["reason"] == "KubeletNotReady"
        # Someone else says Unknown: the fault says NotReady again, where the defaults would
        # have the kubelet post Ready.
        await fleet.member_client_patch(f"{NODES}/cpu-0/status", {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}},
            strategic=True)
        await fleet.clock.advance(1)
        assert ready(node(fleet, "cpu-0")) == "False"
        await fleet.clock.advance(600)
        assert ready(node(fleet, "cpu-0")) == "False"
    writes = len(fleet.member.sent("PATCH", f"{NODES}/cpu-0/status"))
    async with fleet.running(fleet.engine(seed=5)):
        await fleet.clock.advance(600)
        assert ready(node(fleet, "cpu-0")) == "False", "still NotReady after the restart"
        assert len(fleet.member.sent("PATCH", f"{NODES}/cpu-0/status")) == writes
        assert ready(node(fleet, "cpu-1")) == "True"
        await fleet.recover("ns/plan/nr/0")
        await fleet.clock.advance(1)
        assert ready(node(fleet, "cpu-0")) == "True"
        assert fleet.set_state("ns/plan/nr/0") == "done"
        await fleet.clock.advance(600)
        assert ready(node(fleet, "cpu-0")) == "True"


async def test_an_unreachable_node_stays_silent_across_a_restart() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        fleet.inject(entry("ns/plan/u/0", UNREACHABLE, RECOVER), "cpu-0")
        await fleet.clock.advance(1)
        fleet.member.requests.clear()
        await fleet.clock.advance(60)
        assert fleet.member.sent("PATCH", f"{LEASES}/cpu-0") == []
    async with fleet.running(fleet.engine(seed=3)):
        await fleet.clock.advance(120)
        assert fleet.member.sent("PATCH", f"{LEASES}/cpu-0") == [], "silent after the restart"
        await fleet.recover("ns/plan/u/0")
        await fleet.clock.advance(1)
        assert len(fleet.member.sent("PATCH", f"{LEASES}/cpu-0")) == 1
        assert fleet.set_state("ns/plan/u/0") == "done"


async def test_a_gpu_xid_taints_and_takes_a_gpu_away_keeping_others_taints() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", replicas=1, gpu={"preset": "H100-SXM5-80GB"}))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        before = node(fleet, "gpu-0")["spec"]["taints"]
        await fleet.member_client_patch(f"{NODES}/gpu-0", {"spec": {
            "taints": [*before, CONTROLLER_TAINT]}})
        fleet.member.fail("PATCH", f"{NODES}/gpu-0", status=409, reason="Conflict")
        fleet.inject(entry("ns/plan/xid/0", XID, XID_RECOVER), "gpu-0")
        await fleet.clock.advance(1)
        gpu = node(fleet, "gpu-0")
        assert condition(gpu, "GPUHealthy")["reason"] == "Xid79"
        assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "7"
        assert gpu["status"]["capacity"]["nvidia.com/gpu"] == "8"
        taints = gpu["spec"]["taints"]
        assert taints[:-1] == [*before, CONTROLLER_TAINT]
        assert {k: v for k, v in taints[-1].items() if k != "timeAdded"} == {
            "key": "fakefleet.dev/gpu-xid", "value": "79", "effect": "NoExecute"}
        assert fleet.set_state("ns/plan/xid/0") == "inject"
        events = fleet.member.objects("/api/v1/namespaces/default/events")
        assert [e["reason"] for e in events] == ["GPUXid"]
        status_writes = len(fleet.member.sent("PATCH", f"{NODES}/gpu-0/status"))
        await fleet.clock.advance(60)
        assert len(fleet.member.sent("PATCH", f"{NODES}/gpu-0/status")) == status_writes, \
            "once"
        await fleet.recover("ns/plan/xid/0")
        await fleet.clock.advance(1)
        gpu = node(fleet, "gpu-0")
    assert condition(gpu, "GPUHealthy")["status"] == "True"
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert gpu["spec"]["taints"] == [*before, CONTROLLER_TAINT]
    assert fleet.set_state("ns/plan/xid/0") == "done"


async def test_a_taint_added_while_the_node_is_read_again_survives() -> None:
    """A 409, then the read again is slow, and the node-lifecycle controller adds its taint
    meanwhile: the fault's taint is computed again from what is there now."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", replicas=1, gpu={"preset": "H100-SXM5-80GB"}))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        before = node(fleet, "gpu-0")["spec"]["taints"]
        fleet.member.fail("PATCH", f"{NODES}/gpu-0", status=409, reason="Conflict")
        fleet.member.fail("GET", f"{NODES}/gpu-0", delay=1)
        fleet.inject(entry("ns/plan/xid/0", XID, XID_RECOVER), "gpu-0")
        await fleet.clock.advance(0.5)
        await fleet.member_client_patch(f"{NODES}/gpu-0", {"spec": {
            "taints": [*before, CONTROLLER_TAINT]}}, bypass_faults=True)
        await fleet.clock.advance(2)
        taints = node(fleet, "gpu-0")["spec"]["taints"]
    assert [t["key"] for t in taints] == [t["key"] for t in before] + [
        CONTROLLER_TAINT["key"], "fakefleet.dev/gpu-xid"]


async def test_a_cordon_sets_unschedulable_once_and_the_recovery_removes_it() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        fleet.inject(entry("ns/plan/c/0", CORDON, UNCORDON), "cpu-0")
        await fleet.clock.advance(1)
        assert node(fleet, "cpu-0")["spec"]["unschedulable"] is True
        await fleet.clock.advance(60)
        ours = [r for r in fleet.member.sent("PATCH", f"{NODES}/cpu-0")
                if "spec" in r.json() and "unschedulable" in r.json()["spec"]]
        assert len(ours) == 1
        await fleet.recover("ns/plan/c/0")
        await fleet.clock.advance(1)
        cpu = node(fleet, "cpu-0")
    assert "unschedulable" not in cpu["spec"]
    assert fleet.set_state("ns/plan/c/0") == "done"


async def test_held_nodes_are_deleted_and_made_again_once_released() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=3))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(2)
        first = fleet.uids()["cpu-1"]
        await fleet.host_client_patch(f"{POOLS}/cpu", {"metadata": {"annotations": {
            keys.HELD_NODES: json.dumps({"ns/plan/del/0": ["cpu-1", "elsewhere-0"]})}}})
        await fleet.clock.advance(2)
        assert sorted(fleet.nodes()) == ["cpu-0", "cpu-2"]
        assert sorted(fleet.leases()) == ["cpu-0", "cpu-2"]
        await fleet.clock.advance(60)
        assert sorted(fleet.nodes()) == ["cpu-0", "cpu-2"], "not made again while held"
        assert engine.book.counts("cpu") == (2, 2)
        await fleet.host_client_patch(f"{POOLS}/cpu", {"metadata": {"annotations": {
            keys.HELD_NODES: None}}})
        await fleet.clock.advance(2)
        assert sorted(fleet.nodes()) == ["cpu-0", "cpu-1", "cpu-2"]
        assert fleet.uids()["cpu-1"] != first
        assert ready(node(fleet, "cpu-1")) == "True"
