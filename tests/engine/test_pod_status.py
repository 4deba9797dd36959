"""The pod status the engine owns, as a kubelet owns it: what another writer changes there (the
node-lifecycle controller marking pods NotReady) is written back within one sync, from what
the pod watch shows; a terminal phase never goes back; a fault's status is kept; a pod deleted
meanwhile is left alone."""

from __future__ import annotations

from typing import Any

from operators.engine import owning
from operators.k8s import requests
from operators.k8s.client import Client
from tests.engine.harness import NODES, PODS, POOLS, Fleet, entry, pod, pool, ready
from tests.engine.test_node_faults import NOT_READY, RECOVER, UNREACHABLE

#: The kubelet's status manager syncs every 10 s: a change is written back within that.
SYNC = 10.0


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def status_writes(fleet: Fleet, name: str) -> list[dict[str, Any]]:
    """The engine's status writes of pod ``name``."""
    return [r.json()["status"] for r in fleet.engine_sent("PATCH", f"{PODS}/{name}/status")]


async def mark_not_ready(fleet: Fleet, name: str) -> None:
    """What the node-lifecycle controller's MarkPodsNotReady does: Ready False, nothing else."""
    await fleet.member_client_patch(f"{PODS}/{name}/status", {"status": {"conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:30Z"}]}},
        strategic=True)


async def delete(fleet: Fleet, name: str, grace: int | None = None) -> None:
    """Someone else deletes the pod (kubectl delete)."""
    await Client(fleet.member, clock=fleet.clock).send(requests.delete(
        f"{PODS}/{name}", body=requests.delete_options(grace_period=grace), decode=False))


async def running(fleet: Fleet, name: str = "web", **fields: Any) -> None:
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    await fleet.clock.advance(1)
    fleet.member.put(PODS, pod(name, "cpu-0", **fields))
    await fleet.clock.advance(1)
    assert fleet.pod(name)["status"]["phase"] == "Running"


async def test_a_pod_another_writer_marked_not_ready_is_ready_again_within_one_sync() -> None:
    """Defect: the node-lifecycle controller's NotReady stayed for good (333 pods of 10000,
    and a Deployment stuck at 9667/10000)."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
        ready_since = condition(fleet.pod("web"), "Ready")["lastTransitionTime"]
        writes = len(status_writes(fleet, "web"))
        await mark_not_ready(fleet, "web")
        assert condition(fleet.pod("web"), "Ready")["status"] == "False"
        await fleet.clock.advance(SYNC)
        healed = fleet.pod("web")
        assert condition(healed, "Ready")["status"] == "True"
        assert condition(healed, "Ready")["lastTransitionTime"] == ready_since, \
            "the kubelet's own view, as it was"
        assert healed["status"]["phase"] == "Running"
        assert len(status_writes(fleet, "web")) == writes + 1, "one write back"
        await fleet.clock.advance(600)
        assert len(status_writes(fleet, "web")) == writes + 1, "and no write after it"
    assert not fleet.engine_sent("GET", f"{PODS}/web"), "no read: the watch showed it"


async def test_container_states_and_phase_others_change_are_written_back() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
        await fleet.member_client_patch(f"{PODS}/web/status", {"status": {
            "phase": "Pending", "containerStatuses": [
                {"name": "main", "ready": False, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}]}})
        await fleet.clock.advance(SYNC)
        status = fleet.pod("web")["status"]
        assert status["phase"] == "Running"
        assert "running" in status["containerStatuses"][0]["state"]
        assert status["containerStatuses"][0]["ready"] is True


async def test_what_others_own_changing_writes_nothing() -> None:
    """A condition of another's (a readiness gate's, a DisruptionTarget being considered) or
    times: not the engine's to write back."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
        writes = len(status_writes(fleet, "web"))
        await fleet.member_client_patch(f"{PODS}/web/status", {"status": {"conditions": [
            {"type": "example.com/Checked", "status": "True"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:40Z"}]}},
            strategic=True)
        await fleet.clock.advance(60)
        assert len(status_writes(fleet, "web")) == writes


async def test_a_terminal_phase_another_writer_set_never_goes_back() -> None:
    """Defect: a crash-looping pod another writer ended (Failed, as the pod garbage collector
    does) was restarted by the engine after its back-off: Failed went back to Running."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()) as engine:
        await running(fleet, "crash", annotations={"fakefleet.dev/run-time": "2s",
                                                   "fakefleet.dev/exit-code": "1"})
        await fleet.clock.advance(3)
        assert fleet.pod("crash")["status"]["containerStatuses"][0]["state"]["waiting"][
            "reason"] == "CrashLoopBackOff"
        await fleet.member_client_patch(f"{PODS}/crash/status", {"status": {
            "phase": "Failed", "reason": "NodeLost", "message": "the node was lost",
            "conditions": [{"type": "DisruptionTarget", "status": "True",
                            "reason": "DeletionByPodGC"}]}}, strategic=True)
        writes = len(status_writes(fleet, "crash"))
        await fleet.clock.advance(600)
        assert fleet.pod("crash")["status"]["phase"] == "Failed"
        assert len(status_writes(fleet, "crash")) == writes, "never written again"
        uid = fleet.pod("crash")["metadata"]["uid"]
        life = engine.pods.life(uid)
        assert life is not None
        assert life.phase == "Failed", "the engine keeps it ended"


async def test_a_pod_the_engine_ended_is_not_revived_by_a_write_back() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet, "job", restart="Never", job=True,
                      annotations={"fakefleet.dev/run-time": "2s"})
        await fleet.clock.advance(3)
        assert fleet.pod("job")["status"]["phase"] == "Succeeded"
        await fleet.member_client_patch(f"{PODS}/job/status", {"status": {"phase": "Running"}})
        await fleet.clock.advance(SYNC)
        assert fleet.pod("job")["status"]["phase"] == "Succeeded", "the end written back"
        assert all(write["phase"] == "Succeeded"
                   for write in status_writes(fleet, "job")[-1:])


async def test_an_end_written_while_the_engine_writes_is_kept() -> None:
    """Another writer ends the pod while the engine's write of its start is on its way: the
    end is the pod's, and what the engine's write said does not stand."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        fleet.host.put(POOLS, pool("cpu", replicas=1, pods={"startDelay": "2s"}))
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web", "cpu-0"))
        await fleet.clock.advance(1)  # pending, written once
        fleet.member.fail("PATCH", f"{PODS}/web/status", delay=3)  # the start goes slowly
        await fleet.clock.advance(2.5)
        await fleet.member_client_patch(f"{PODS}/web/status", {"status": {
            "phase": "Failed", "reason": "NodeLost", "message": "the node was lost"}},
            bypass_faults=True)
        await fleet.clock.advance(SYNC)
        status = fleet.pod("web")["status"]
        assert status["phase"] == "Failed"
        assert status["reason"] == "NodeLost"


async def test_pods_of_a_faulty_node_stay_not_ready_until_it_recovers() -> None:
    """A fault's status is kept: the pods of a NotReady node that the node-lifecycle
    controller marked NotReady stay so while the fault holds, and are Ready again within one
    sync once the node is."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
        fleet.inject(entry("ns/plan/nr/0", NOT_READY, RECOVER), "cpu-0")
        await fleet.clock.advance(1)
        assert ready(fleet.nodes()["cpu-0"]) == "False"
        await mark_not_ready(fleet, "web")
        writes = len(status_writes(fleet, "web"))
        await fleet.clock.advance(120)
        assert condition(fleet.pod("web"), "Ready")["status"] == "False", "the fault's"
        assert len(status_writes(fleet, "web")) == writes
        await fleet.recover("ns/plan/nr/0")
        await fleet.clock.advance(1)
        assert ready(fleet.nodes()["cpu-0"]) == "True"
        await fleet.clock.advance(SYNC)
        assert condition(fleet.pod("web"), "Ready")["status"] == "True"


async def test_an_unreachable_node_comes_back_with_a_new_transition_and_its_pods_ready(
) -> None:
    """Defect: a node back from Unknown kept the Ready transition time of before it went (the
    kubelet gives it a new one); and its pods stayed NotReady."""
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
        before = condition(fleet.nodes()["cpu-0"], "Ready")["lastTransitionTime"]
        fleet.inject(entry("ns/plan/gone/0", UNREACHABLE, RECOVER), "cpu-0")
        await fleet.clock.advance(60)
        # The node-lifecycle controller: the node Unknown, its pods NotReady.
        await fleet.member_client_patch(f"{NODES}/cpu-0/status", {"status": {"conditions": [
            {"type": kind, "status": "Unknown", "reason": "NodeStatusUnknown",
             "lastTransitionTime": "2026-01-01T00:01:00Z"}
            for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")]}},
            strategic=True)
        await mark_not_ready(fleet, "web")
        await fleet.clock.advance(60)
        assert condition(fleet.pod("web"), "Ready")["status"] == "False"
        await fleet.recover("ns/plan/gone/0")
        await fleet.clock.advance(1)
        node = fleet.nodes()["cpu-0"]
        back = condition(node, "Ready")
        assert back["status"] == "True"
        assert back["lastTransitionTime"] != before
        assert back["lastTransitionTime"] > "2026-01-01T00:01:00Z"
        memory = condition(node, "MemoryPressure")
        assert memory["status"] == "False", "every condition posted again"
        assert memory["lastTransitionTime"] > "2026-01-01T00:01:00Z"
        await fleet.clock.advance(SYNC)
        assert condition(fleet.pod("web"), "Ready")["status"] == "True"


async def test_a_node_marked_unknown_without_a_fault_is_ready_with_a_new_transition() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        fleet.host.put(POOLS, pool("cpu", replicas=1))
        await fleet.clock.advance(30)
        before = condition(fleet.nodes()["cpu-0"], "Ready")["lastTransitionTime"]
        await fleet.member_client_patch(f"{NODES}/cpu-0/status", {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
             "lastTransitionTime": "2026-01-01T00:00:25Z"}]}}, strategic=True)
        await fleet.clock.advance(1)
        back = condition(fleet.nodes()["cpu-0"], "Ready")
        assert back["status"] == "True"
        assert back["lastTransitionTime"] == "2026-01-01T00:00:30Z", (before, back)


async def test_a_pod_deleted_meanwhile_is_left_alone() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
        await mark_not_ready(fleet, "web")
        await fleet.clock.advance(1)
        writes = len(status_writes(fleet, "web"))
        await delete(fleet, "web", grace=0)
        await fleet.clock.advance(SYNC)
        assert fleet.member.object(f"{PODS}/web") is None
        assert len(status_writes(fleet, "web")) == writes, "nothing written to a pod gone"


async def test_a_pod_being_deleted_is_finalised_not_written_back() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        fleet.host.put(POOLS, pool("cpu", replicas=1, pods={"terminationGracePeriodCap": "8s"}))
        await fleet.clock.advance(1)
        kept = pod("web", "cpu-0")
        kept["metadata"]["finalizers"] = ["example.com/keep"]  # so that deleting it takes time
        fleet.member.put(PODS, kept)
        await fleet.clock.advance(1)
        await mark_not_ready(fleet, "web")
        await fleet.clock.advance(1)
        writes = len(status_writes(fleet, "web"))
        await delete(fleet, "web", grace=8)
        await fleet.clock.advance(SYNC)
        assert fleet.engine_sent("DELETE", f"{PODS}/web"), "finalised after its grace"
        assert len(status_writes(fleet, "web")) == writes, "not written back meanwhile"


async def test_a_restarted_engine_writes_back_what_others_changed_while_it_was_away() -> None:
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
    await mark_not_ready(fleet, "web")
    async with fleet.running(fleet.engine(seed=4)):
        await fleet.clock.advance(SYNC)
        assert condition(fleet.pod("web"), "Ready")["status"] == "True"


async def test_a_watch_showing_the_engine_s_own_write_late_makes_no_write() -> None:
    """The heal waits HEAL_AFTER: an event older than the engine's last write, followed by
    that write's own echo within it, writes nothing."""
    assert owning.HEAL_AFTER < SYNC
    fleet = Fleet()
    async with fleet.running(fleet.engine()):
        await running(fleet)
        writes = len(status_writes(fleet, "web"))
        await mark_not_ready(fleet, "web")
        await fleet.clock.advance(owning.HEAL_AFTER / 2)
        # The user (or the engine's own late echo) puts it back before the heal is due.
        await fleet.member_client_patch(f"{PODS}/web/status", {"status": {"conditions": [
            {"type": "Ready", "status": "True"}]}}, strategic=True)
        await fleet.clock.advance(SYNC)
        assert condition(fleet.pod("web"), "Ready")["status"] == "True"
        assert len(status_writes(fleet, "web")) == writes
