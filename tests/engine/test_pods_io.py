"""The pod half over in-memory API servers: failed writes, restarts, broken watches."""

from __future__ import annotations

from typing import Any

from operators.k8s import requests
from operators.k8s.times import parse
from tests.engine.harness import NODES, PODS, POOLS, Fleet, pod, pool


def state(obj: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = obj["status"]["containerStatuses"][0]
    return status


async def started(fleet: Fleet, replicas: int = 1, **pool_fields: Any) -> None:
    fleet.host.put(POOLS, pool("cpu", replicas=replicas, **pool_fields))


async def test_a_failed_status_write_does_not_skip_an_init_container() -> None:
    """Defect: a failed PATCH re-applied the stage on retry (an init container skipped)."""
    fleet = Fleet()
    await started(fleet, pods={"initDelay": "2s"})
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("p", "cpu-0", init=[{"name": "one", "image": "i"},
                                                      {"name": "two", "image": "i"}]))
        fleet.member.fail("PATCH", f"{PODS}/p/status", status=500)
        await fleet.clock.advance(2.2)  # the first init step fails to write
        assert fleet.pod("p")["status"] == {}
        await fleet.clock.advance(1)  # retried: exactly one init container done
        inits = fleet.pod("p")["status"]["initContainerStatuses"]
        assert [list(s["state"]) for s in inits] == [["terminated"], ["running"]]
        await fleet.clock.advance(2)
        inits = fleet.pod("p")["status"]["initContainerStatuses"]
        assert [list(s["state"]) for s in inits] == [["terminated"], ["terminated"]]
        await fleet.clock.advance(1)
        assert fleet.pod("p")["status"]["phase"] == "Running"


async def test_a_failed_write_of_a_crash_counts_the_restart_once() -> None:
    """Defect: restartCount counted twice when the PATCH of a crash was retried."""
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("c", "cpu-0", annotations={
            "fakefleet.dev/run-time": "5s", "fakefleet.dev/exit-code": "1"}))
        await fleet.clock.advance(1)
        assert fleet.pod("c")["status"]["phase"] == "Running"
        fleet.member.fail("PATCH", f"{PODS}/c/status", status=503, times=2)
        await fleet.clock.advance(8)
        container = state(fleet.pod("c"))  # a first crash restarts at once, as the kubelet
        assert list(container["state"]) == ["running"]
        assert container["restartCount"] == 1
        assert container["lastState"]["terminated"]["exitCode"] == 1


async def test_a_job_pod_resumes_its_run_time_after_an_engine_restart() -> None:
    """Pod timers resume from the status: 60 s run time, 40 s before the restart → exits
    20 s after it, once."""
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("job", "cpu-0", restart="Never", job=True,
                                   annotations={"fakefleet.dev/run-time": "60s"}))
        await fleet.clock.advance(40)
        assert fleet.pod("job")["status"]["phase"] == "Running"
    began = parse(state(fleet.pod("job"))["state"]["running"]["startedAt"])
    async with fleet.running(fleet.engine(seed=9)):
        await fleet.clock.advance(15)
        assert fleet.pod("job")["status"]["phase"] == "Running", "not early"
        await fleet.clock.advance(7)
        assert fleet.pod("job")["status"]["phase"] == "Succeeded"
        await fleet.clock.advance(120)
    terminated = state(fleet.pod("job"))["state"]["terminated"]
    assert parse(terminated["finishedAt"]) - began == 60
    exits = [r for r in fleet.member.sent("PATCH", f"{PODS}/job/status")
             if r.json()["status"]["phase"] == "Succeeded"]
    assert len(exits) == 1, "completed once"


async def test_an_adopted_pod_keeps_its_address_and_no_other_pod_gets_it() -> None:
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("a", "cpu-0"))
        await fleet.clock.advance(1)
    first = fleet.pod("a")["status"]["podIP"]
    async with fleet.running(fleet.engine(seed=5)):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("b", "cpu-0"))
        await fleet.clock.advance(1)
    assert fleet.pod("a")["status"]["podIP"] == first
    assert fleet.pod("b")["status"]["podIP"] != first


async def test_broken_watches_and_failing_lists_lose_no_timer() -> None:
    """Defects: 5xx/403 on a list or watch, or a 410 on a paginated list, ended the engine and
    lost the timers in flight."""
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("job", "cpu-0", restart="Never",
                                   annotations={"fakefleet.dev/run-time": "30s"}))
        await fleet.clock.advance(1)
        for index in range(600):  # a list of more than one page
            fleet.member.put(PODS, pod(f"other-{index}", "elsewhere"))
        fleet.member.fail("GET", "/api/v1/pods", status=500, times=2)
        fleet.member.fail("GET", NODES, status=403, times=2)
        fleet.member.break_watches()
        fleet.member.put(PODS, pod("late", "elsewhere"))
        fleet.member.compact()  # resumes are refused (410): relist, through the failures
        await fleet.clock.advance(10)
        assert len(engine.pods) == 1
        assert fleet.pod("job")["status"]["phase"] == "Running"
        await fleet.clock.advance(25)
        assert fleet.pod("job")["status"]["phase"] == "Succeeded", "its exit still came"
    pages = [r for r in fleet.member.sent("GET", "/api/v1/pods") if "continue" in r.query]
    assert pages, "the pod list was paginated"


async def test_an_address_given_for_a_failed_write_is_given_again() -> None:
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", f"{PODS}/a/status", status=500)
        fleet.member.put(PODS, pod("a", "cpu-0"))
        await fleet.clock.advance(3)
        assert fleet.pod("a")["status"]["podIP"] == "10.128.0.2"
        assert len(engine.pods.addresses) == 1


async def test_transitions_due_together_are_one_write() -> None:
    fleet = Fleet()
    await started(fleet)  # no init delay, no start delay
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("quick", "cpu-0", init=[{"name": "a", "image": "i"},
                                                          {"name": "b", "image": "i"}]))
        await fleet.clock.advance(1)
    writes = fleet.member.sent("PATCH", f"{PODS}/quick/status")
    assert len(writes) == 1, "two init containers and the start in one PATCH"
    status = writes[0].json()["status"]
    assert status["phase"] == "Running"
    assert [list(s["state"]) for s in status["initContainerStatuses"]] == [
        ["terminated"], ["terminated"]]


async def test_a_pod_made_again_under_its_name_never_gets_the_old_one_s_status() -> None:
    """Defect: a write for a pod that was deleted and made again under the same name (a
    StatefulSet's) landed on the new pod, which then carried the old one's status."""
    fleet = Fleet()
    await started(fleet, replicas=2)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web-0", "cpu-0", annotations={
            "fakefleet.dev/run-time": "5s"}))
        await fleet.clock.advance(1)
        old = fleet.pod("web-0")
        assert old["status"]["phase"] == "Running"
        fleet.member.fail("PATCH", f"{PODS}/web-0/status", delay=3)  # its exit, in flight
        await fleet.clock.advance(4.5)
        await fleet.member.send(requests.delete(f"{PODS}/web-0",
                                                body={"gracePeriodSeconds": 0}))
        fleet.member.put(PODS, pod("web-0", "cpu-1"))
        await fleet.clock.advance(3)
        new = fleet.pod("web-0")
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        assert new["status"].get("phase") != "Succeeded", "the old pod's exit is not written"
        await fleet.clock.advance(2)
        assert fleet.pod("web-0")["status"]["phase"] == "Running"
        assert fleet.pod("web-0")["status"]["hostIP"] != old["status"]["hostIP"]


async def test_a_change_while_a_step_is_written_does_not_write_it_twice() -> None:
    """Defect: a pod update (a finalizer added) during a slow status write started the same
    step again from the same state: two writes, two addresses taken, one of them leaked."""
    fleet = Fleet()
    await started(fleet)
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", f"{PODS}/p/status", delay=3)
        fleet.member.put(PODS, pod("p", "cpu-0"))
        await fleet.clock.advance(1.5)  # its start is being written, slowly
        await fleet.member.send(requests.patch(
            f"{PODS}/p", {"metadata": {"finalizers": ["example.com/keep"]}}))
        await fleet.clock.advance(5)
        assert len(fleet.member.sent("PATCH", f"{PODS}/p/status")) == 1
        assert fleet.pod("p")["status"]["phase"] == "Running"
        assert len(engine.pods.addresses) == 1


async def test_a_pod_bound_to_a_node_whose_create_is_not_answered_yet_runs_once_it_is() -> None:
    """The pod watch shows a pod bound to a node of the engine's before the node is played
    (its create answered late): a kubelet runs every pod bound to its node, whenever it was
    bound; the pod is not left Pending until the pod watch lists again."""
    fleet = Fleet()
    fleet.member.fail("POST", NODES, delay=2)
    await started(fleet)
    async with fleet.running(fleet.engine()) as engine:
        assert "cpu-0" not in engine.book.records
        fleet.member.put(PODS, pod("p", "cpu-0"))
        await fleet.clock.advance(0.5)
        assert "cpu-0" not in engine.book.records, "the pod came first"
        await fleet.clock.advance(10)
        status = fleet.pod("p")["status"]
        assert status["phase"] == "Running"
        assert status["podIP"] == "10.128.0.2"
        lists = [r for r in fleet.engine_sent("GET", "/api/v1/pods")
                 if "watch" not in dict(r.params)]
        assert len(lists) == 1, "listed once, not again"
        assert engine.pods.unplayed == {}
