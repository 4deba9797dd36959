"""Pod faults over in-memory API servers: the stages of a pod's fault entries come before its
defaults; a hold keeps it as it is; an entry ending its fault is marked done once written."""

from __future__ import annotations

import json
from typing import Any

from primitives import keys
from tests.engine.harness import (
    PODS,
    POOLS,
    Fleet,
    entries_of,
    entry,
    faults,
    pod,
    pool,
    states,
)

NOT_DELETING = {"key": "deleting", "operator": "In", "values": ["false"]}
EXIT = {"name": "fault-exit", "resource": "Pod",
        "selector": {"phases": ["Running"], "matchExpressions": [NOT_DELETING]},
        "effect": {"exit": {"exitCode": 3, "reason": "Error",
                            "message": "NCCL communicator aborted"}, "endFault": True}}
EVICT = {"name": "fault-evict", "resource": "Pod",
         "selector": {"phases": ["Pending", "Initializing", "Running", "BackOff"],
                      "matchExpressions": [NOT_DELETING]},
         "effect": {"evict": {"message": "The node was low on resource: memory."},
                    "endFault": True}}
STUCK = [
    {"name": "fault-wait", "resource": "Pod",
     "selector": {"phases": ["Pending"], "matchExpressions": [
         NOT_DELETING, {"key": "waiting", "operator": "NotIn", "values": ["ImagePullBackOff"]}]},
     "effect": {"wait": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}},
    {"name": "fault-hold", "resource": "Pod",
     "selector": {"phases": ["Pending"], "matchExpressions": [NOT_DELETING]},
     "effect": {"hold": True}},
]
END = [{"name": "fault-end", "resource": "Pod", "effect": {"endFault": True}}]
#: An entry of another plan whose stages never match: it must come through untouched.
OTHER = entry("other/plan/step/0", [
    {"name": "never", "resource": "Pod",
     "selector": {"matchExpressions": [{"key": "labels[never]", "operator": "Exists"}]},
     "effect": {"exit": {"exitCode": 9}}}], END)


def container(obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = obj["status"]["containerStatuses"][0]
    return found


def exits(fleet: Fleet, name: str, code: int) -> int:
    """How many status writes reported a fresh exit with ``code``."""
    count = 0
    for request in fleet.member.sent("PATCH", f"{PODS}/{name}/status"):
        state = request.json()["status"]["containerStatuses"][0]
        if state.get("lastState", {}).get("terminated", {}).get("exitCode") == code and \
                "waiting" in state["state"]:
            count += 1
    return count


async def started(fleet: Fleet) -> None:
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    await fleet.clock.advance(1)


async def test_a_one_shot_exit_happens_once_and_its_entry_alone_is_marked_done() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        await fleet.clock.advance(1)
        assert fleet.pod("train")["status"]["phase"] == "Running"
        fleet.member.fail("PATCH", f"{PODS}/train", status=409, reason="Conflict")
        await fleet.member_client_patch(f"{PODS}/train", {"metadata": {"annotations": {
            keys.FAULTS: faults(OTHER, entry("ns/plan/exit/0", [EXIT], END))}}}, bypass_faults=True)
        await fleet.clock.advance(1)
        train = fleet.pod("train")
        assert container(train)["lastState"]["terminated"]["exitCode"] == 3
        assert container(train)["lastState"]["terminated"]["message"] == \
            "NCCL communicator aborted"
        assert states(train) == {"other/plan/step/0": "inject", "ns/plan/exit/0": "done"}
        assert entries_of(train)[0] == OTHER, "the other plan's entry is as it was"
        patches = [r.json() for r in fleet.member.sent("PATCH", f"{PODS}/train")]
        assert len(patches) == 3, "ours after the 409, read again, and the user's"
        assert all("resourceVersion" in p["metadata"] for p in patches[1:])
        assert fleet.member.sent("GET", f"{PODS}/train"), "read again after the 409"
        await fleet.clock.advance(60)  # restarted by the defaults after the back-off
        assert fleet.pod("train")["status"]["phase"] == "Running"
        assert container(fleet.pod("train"))["restartCount"] == 1
    assert exits(fleet, "train", 3) == 1


async def test_a_conflict_finding_the_entry_gone_writes_nothing_more() -> None:
    """On a 409 the pod is read again; the plan removed the entry meanwhile: nothing to flip,
    and the entry is not written back."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", f"{PODS}/train", status=409, reason="Conflict")
        fleet.member.fail("GET", f"{PODS}/train", delay=1)  # the read again is slow
        await fleet.member_client_patch(f"{PODS}/train", {"metadata": {"annotations": {
            keys.FAULTS: faults(OTHER, entry("ns/plan/exit/0", [EXIT], END))}}}, bypass_faults=True)
        await fleet.clock.advance(0.5)
        await fleet.member_client_patch(f"{PODS}/train", {"metadata": {"annotations": {
            keys.FAULTS: faults(OTHER)}}}, bypass_faults=True)
        await fleet.clock.advance(2)
        train = fleet.pod("train")
        assert entries_of(train) == [OTHER]
        assert len(fleet.member.sent("GET", f"{PODS}/train")) == 1
        assert len(fleet.member.sent("PATCH", f"{PODS}/train")) == 3, "the 409, and the user's"
        assert container(train)["lastState"]["terminated"]["exitCode"] == 3
        await fleet.clock.advance(60)
    assert exits(fleet, "train", 3) == 1


async def test_an_evicted_pod_fails_as_the_kubelet_reports_it_whatever_its_restart_policy(
) -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("web", "cpu-0", annotations={
            keys.FAULTS: faults(entry("ns/plan/evict/0", [EVICT], END))}))
        await fleet.clock.advance(1)
        web = fleet.pod("web")
    status = web["status"]
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed", "Evicted", "The node was low on resource: memory.")
    assert container(web)["state"] == {"terminated": {
        "exitCode": 137, "reason": "ContainerStatusUnknown",
        "message": "The container could not be located when the pod was terminated"}}
    assert "containerID" not in container(web)
    disruption = next(c for c in status["conditions"] if c["type"] == "DisruptionTarget")
    assert (disruption["status"], disruption["reason"]) == ("True", "TerminationByKubelet")
    assert states(web) == {"ns/plan/evict/0": "done"}
    writes = len(fleet.member.sent("PATCH", f"{PODS}/web/status"))
    async with fleet.running(fleet.engine(seed=7)):  # a restart keeps it as it is
        await fleet.clock.advance(30)
    assert fleet.pod("web")["status"] == status
    assert len(fleet.member.sent("PATCH", f"{PODS}/web/status")) == writes


async def test_a_stuck_pod_is_held_until_the_fault_recovers_then_starts() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("stuck", "cpu-0", annotations={
            keys.FAULTS: faults(entry("ns/plan/stuck/0", STUCK, END))}))
        await fleet.clock.advance(120)
        stuck = fleet.pod("stuck")
        assert stuck["status"]["phase"] == "Pending"
        assert container(stuck)["state"]["waiting"]["reason"] == "ImagePullBackOff"
        assert len(fleet.member.sent("PATCH", f"{PODS}/stuck/status")) == 1, "then held"
        recovering = entries_of(stuck)
        recovering[0]["state"] = "recover"
        await fleet.member_client_patch(f"{PODS}/stuck", {"metadata": {"annotations": {
            keys.FAULTS: json.dumps(recovering)}}})
        await fleet.clock.advance(1)
        assert states(fleet.pod("stuck")) == {"ns/plan/stuck/0": "done"}
        assert fleet.pod("stuck")["status"]["phase"] == "Running"


async def test_a_restart_neither_repeats_a_one_shot_exit_nor_loses_a_held_fault() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        fleet.member.put(PODS, pod("stuck", "cpu-0", annotations={
            keys.FAULTS: faults(entry("ns/plan/stuck/0", STUCK, END))}))
        await fleet.clock.advance(1)
    # Injected while the engine is away: it happens when the engine is back, once.
    await fleet.member_client_patch(f"{PODS}/train", {"metadata": {"annotations": {
        keys.FAULTS: faults(entry("ns/plan/exit/0", [EXIT], END))}}})
    async with fleet.running(fleet.engine(seed=2)):
        await fleet.clock.advance(60)
        assert states(fleet.pod("train")) == {"ns/plan/exit/0": "done"}
    async with fleet.running(fleet.engine(seed=3)):
        await fleet.clock.advance(60)
    assert exits(fleet, "train", 3) == 1
    assert container(fleet.pod("train"))["restartCount"] == 1
    assert fleet.pod("stuck")["status"]["phase"] == "Pending"
    assert container(fleet.pod("stuck"))["state"]["waiting"]["reason"] == "ImagePullBackOff"


async def test_an_unreadable_fault_annotation_is_ignored_with_one_warning() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("odd", "cpu-0", annotations={keys.FAULTS: "[{\"id\": 3}]"}))
        await fleet.clock.advance(1)
        await fleet.member_client_patch(f"{PODS}/odd", {"metadata": {"labels": {"a": "b"}}})
        await fleet.clock.advance(1)
    assert fleet.pod("odd")["status"]["phase"] == "Running", "by the defaults"
    events = fleet.member.objects("/api/v1/namespaces/default/events")
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [
        ("InvalidAnnotation", "odd")]
    assert keys.FAULTS in events[0]["message"]


async def test_an_exit_written_during_the_back_off_of_another_happens_once_it_runs() -> None:
    """Two plans' steps hit one pod: the second exit arrives while the first one's crash-loop
    back-off runs; it happens once the pod runs again, and its entry alone is marked done."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        await fleet.clock.advance(1)
        first = entry("ns/plan/exit/0", [EXIT], END)
        await fleet.member_client_patch(f"{PODS}/train", {"metadata": {"annotations": {
            keys.FAULTS: faults(first)}}}, bypass_faults=True)
        await fleet.clock.advance(1)
        assert states(fleet.pod("train")) == {"ns/plan/exit/0": "done"}
        assert fleet.pod("train")["status"]["phase"] == "Running"  # BackOff shows as Running
        current = entries_of(fleet.pod("train"))
        await fleet.member_client_patch(f"{PODS}/train", {"metadata": {"annotations": {
            keys.FAULTS: json.dumps([*current, entry("ns/plan/exit-again/0", [EXIT], END)])}}},
            bypass_faults=True)
        await fleet.clock.advance(5)
        assert container(fleet.pod("train"))["restartCount"] == 1  # still backing off
        await fleet.clock.advance(10)  # the back-off (10 s) passed: it runs, and exits again
        assert states(fleet.pod("train")) == {"ns/plan/exit/0": "done",
                                              "ns/plan/exit-again/0": "done"}
        await fleet.clock.advance(30)
        assert container(fleet.pod("train"))["restartCount"] == 2
    assert exits(fleet, "train", 3) == 2
