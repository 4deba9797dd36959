"""Pod faults over in-memory API servers: the stages of the fault entries a pod's fault sets
carry come before its defaults; a hold keeps it as it is; a set is marked done once its
targets ran the stage that ends it, with one conditional write."""

from __future__ import annotations

from typing import Any

from operators.api import faultsets
from tests.engine.harness import (
    PODS,
    POOLS,
    Fleet,
    entry,
    fault_set,
    pod,
    pool,
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


async def test_a_one_shot_exit_happens_once_and_its_set_alone_is_marked_done() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        await fleet.clock.advance(1)
        assert fleet.pod("train")["status"]["phase"] == "Running"
        fleet.inject(OTHER, "train", kind="Pod")
        fleet.inject(entry("ns/plan/exit/0", [EXIT], END), "train", kind="Pod")
        await fleet.clock.advance(1)
        train = fleet.pod("train")
        assert container(train)["lastState"]["terminated"]["exitCode"] == 3
        assert container(train)["lastState"]["terminated"]["message"] == \
            "NCCL communicator aborted"
        assert fleet.set_state("ns/plan/exit/0") == "done"
        assert fleet.set_state("other/plan/step/0") == "inject", "the other plan's is as it was"
        assert fleet.engine_sent("PATCH", f"{PODS}/train") == [], "nothing written to the pod"
        (marked,) = fleet.engine_sent("PATCH", f"{faultsets.CONFIGMAPS}/.*")
        assert marked.json()["data"] == {"state": "done"}, "once"
        assert marked.json()["metadata"]["resourceVersion"], "conditionally"
        await fleet.clock.advance(60)  # restarted by the defaults after the back-off
        assert fleet.pod("train")["status"]["phase"] == "Running"
        assert container(fleet.pod("train"))["restartCount"] == 1
    assert exits(fleet, "train", 3) == 1


async def test_marking_a_set_done_reads_it_again_after_a_conflict_and_minds_its_state(
) -> None:
    """A 409 on the write that marks a set done: the set is read again, and marked done if it
    is still in the state its targets finished; the plan turned it meanwhile: not marked."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("a", "cpu-0"))
        fleet.member.put(PODS, pod("b", "cpu-0"))
        await fleet.clock.advance(1)
        path = f"{faultsets.CONFIGMAPS}/{faultsets.set_name('ns/plan/exit/0', 0)}"
        fleet.member.fail("PATCH", path, status=409, reason="Conflict")
        fleet.inject(entry("ns/plan/exit/0", [EXIT], END), "a", kind="Pod")
        await fleet.clock.advance(1)
        assert fleet.set_state("ns/plan/exit/0") == "done"
        assert len(fleet.engine_sent("GET", path)) == 1, "read again after the 409"
        assert len(fleet.engine_sent("PATCH", path)) == 2
        # Another set: the plan turns it to its recovery while the engine marks it done.
        fleet.member.fail("PATCH", ".*/configmaps/.*", delay=1)
        fleet.inject(entry("ns/plan/exit/1", [EXIT], END), "b", kind="Pod")
        await fleet.clock.advance(0.5)
        await fleet.recover("ns/plan/exit/1")
        await fleet.clock.advance(2)
        assert fleet.set_state("ns/plan/exit/1") == "done", \
            "done after its recovery ran, not because its exit did"
        turned = f"{faultsets.CONFIGMAPS}/{faultsets.set_name('ns/plan/exit/1', 0)}"
        assert len(fleet.engine_sent("GET", turned)) == 1, "the 409: read, in recover now"
        assert len(fleet.engine_sent("PATCH", turned)) == 2, "refused, then after recovery"
        assert exits(fleet, "b", 3) == 1


async def test_an_evicted_pod_fails_as_the_kubelet_reports_it_whatever_its_restart_policy(
) -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("web", "cpu-0"))
        fleet.inject(entry("ns/plan/evict/0", [EVICT], END), "web", kind="Pod")
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
    assert fleet.set_state("ns/plan/evict/0") == "done"
    writes = len(fleet.member.sent("PATCH", f"{PODS}/web/status"))
    async with fleet.running(fleet.engine(seed=7)):  # a restart keeps it as it is
        await fleet.clock.advance(30)
    assert fleet.pod("web")["status"] == status
    assert len(fleet.member.sent("PATCH", f"{PODS}/web/status")) == writes


async def test_a_stuck_pod_is_held_until_the_fault_recovers_then_starts() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("stuck", "cpu-0"))
        fleet.inject(entry("ns/plan/stuck/0", STUCK, END), "stuck", kind="Pod")
        await fleet.clock.advance(120)
        stuck = fleet.pod("stuck")
        assert stuck["status"]["phase"] == "Pending"
        assert container(stuck)["state"]["waiting"]["reason"] == "ImagePullBackOff"
        assert len(fleet.member.sent("PATCH", f"{PODS}/stuck/status")) == 1, "then held"
        assert fleet.set_state("ns/plan/stuck/0") == "inject"
        await fleet.recover("ns/plan/stuck/0")
        await fleet.clock.advance(1)
        assert fleet.set_state("ns/plan/stuck/0") == "done"
        assert fleet.pod("stuck")["status"]["phase"] == "Running"


async def test_a_restart_neither_repeats_a_one_shot_exit_nor_loses_a_held_fault() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        fleet.member.put(PODS, pod("stuck", "cpu-0"))
        fleet.inject(entry("ns/plan/stuck/0", STUCK, END), "stuck", kind="Pod")
        await fleet.clock.advance(1)
    # Injected while the engine is away: it happens when the engine is back, once.
    fleet.inject(entry("ns/plan/exit/0", [EXIT], END), "train", kind="Pod")
    async with fleet.running(fleet.engine(seed=2)):
        await fleet.clock.advance(60)
        assert fleet.set_state("ns/plan/exit/0") == "done"
    async with fleet.running(fleet.engine(seed=3)):
        await fleet.clock.advance(60)
    assert exits(fleet, "train", 3) == 1
    assert container(fleet.pod("train"))["restartCount"] == 1
    assert fleet.pod("stuck")["status"]["phase"] == "Pending"
    assert container(fleet.pod("stuck"))["state"]["waiting"]["reason"] == "ImagePullBackOff"


async def test_an_unreadable_fault_set_is_ignored_with_one_warning() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("odd", "cpu-0"))
        odd = fault_set(entry("ns/plan/exit/0", [EXIT], END), fleet.pod_target("odd"),
                        kind="Pod")
        odd["data"]["state"] = "later"
        fleet.member.put(faultsets.CONFIGMAPS, odd)
        await fleet.clock.advance(1)
        await fleet.member_client_patch(f"{faultsets.CONFIGMAPS}/{odd['metadata']['name']}",
                                        {"metadata": {"labels": {"a": "b"}}})
        await fleet.clock.advance(1)
    assert fleet.pod("odd")["status"]["phase"] == "Running", "by the defaults"
    assert exits(fleet, "odd", 3) == 0
    events = fleet.member.objects(f"/api/v1/namespaces/{faultsets.NAMESPACE}/events")
    assert [(e["reason"], e["involvedObject"]["kind"], e["involvedObject"]["name"])
            for e in events] == [("InvalidFaultSet", "ConfigMap", odd["metadata"]["name"])]
    assert "data.state is 'later'" in events[0]["message"]


async def test_an_exit_written_during_the_back_off_of_another_happens_once_it_runs() -> None:
    """Plans' steps hit one pod: a first exit restarts it at once (the kubelet has no back-off
    for it yet) with the fault's status kept in lastState, a second waits 10 s, and a third
    arriving during that back-off happens once the pod runs again, its set alone marked done."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await started(fleet)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        await fleet.clock.advance(1)
        fleet.inject(entry("ns/plan/exit/0", [EXIT], END), "train", kind="Pod")
        await fleet.clock.advance(1)
        assert fleet.set_state("ns/plan/exit/0") == "done"
        first = container(fleet.pod("train"))
        assert (first["restartCount"], list(first["state"])) == (1, ["running"])
        assert first["lastState"]["terminated"]["message"] == "NCCL communicator aborted"
        fleet.inject(entry("ns/plan/exit-again/0", [EXIT], END), "train", kind="Pod")
        await fleet.clock.advance(1)
        waiting = container(fleet.pod("train"))["state"]["waiting"]
        assert waiting["message"].startswith("back-off 10s restarting failed container=main")
        assert fleet.pod("train")["status"]["phase"] == "Running"  # BackOff shows as Running
        fleet.inject(entry("ns/plan/exit-third/0", [EXIT], END), "train", kind="Pod")
        await fleet.clock.advance(5)
        assert container(fleet.pod("train"))["restartCount"] == 2  # still backing off
        await fleet.clock.advance(10)  # the back-off (10 s) passed: it runs, and exits again
        assert fleet.set_state("ns/plan/exit-third/0") == "done"
        await fleet.clock.advance(30)
        assert container(fleet.pod("train"))["restartCount"] == 3
    assert exits(fleet, "train", 3) == 3
