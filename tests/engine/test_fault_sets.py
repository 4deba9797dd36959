"""Fault sets in the engine over in-memory API servers: one set's entry runs on every target and
the set is marked done with one write; chunks of one occurrence are sets of their own; targets
that went count as done (pods only once the watch had time to show them); a restart between the
stages and the mark neither repeats a fault nor skips a target."""

from __future__ import annotations

from typing import Any

from operators.api import faultsets
from operators.engine.faultsets import GONE_AFTER
from tests.engine.harness import (
    LEASES,
    NODES,
    PODS,
    POOLS,
    Fleet,
    entry,
    fault_set,
    pod,
    pool,
    ready,
)
from tests.engine.test_node_faults import CORDON, NOT_READY, RECOVER, UNCORDON, UNREACHABLE

SETS = f"{faultsets.CONFIGMAPS}/.*"
END = [{"name": "fault-end", "resource": "Pod", "effect": {"endFault": True}}]
EXIT = [{"name": "fault-exit", "resource": "Pod", "selector": {"phases": ["Running"]},
         "effect": {"exit": {"exitCode": 3, "reason": "Error"}, "endFault": True}}]


def transition(node: dict[str, Any]) -> str:
    return str(next(c["lastTransitionTime"] for c in node["status"]["conditions"]
                    if c["type"] == "Ready"))


def marked(fleet: Fleet, name: str = ".*") -> list[dict[str, Any]]:
    """The engines' writes to fault sets."""
    return [r.json() for r in fleet.engine_sent("PATCH", f"{faultsets.CONFIGMAPS}/{name}")]


async def test_one_set_reaches_every_node_and_is_marked_done_with_one_write() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=30))
    names = [f"cpu-{index}" for index in range(30)]
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        fleet.inject(entry("ns/plan/nr/0", NOT_READY, RECOVER), *names[:20])
        await fleet.clock.advance(1)
        nodes = fleet.nodes()
        assert {ready(nodes[name]) for name in names[:20]} == {"False"}
        assert {ready(nodes[name]) for name in names[20:]} == {"True"}
        assert marked(fleet) == [], "held: not done while it is injected"
        await fleet.recover("ns/plan/nr/0")
        await fleet.clock.advance(1)
        assert {ready(node) for node in fleet.nodes().values()} == {"True"}
        assert fleet.set_state("ns/plan/nr/0") == "done"
        (done,) = marked(fleet)
        assert done["data"] == {"state": "done"}
        await fleet.clock.advance(30)
    assert len(marked(fleet)) == 1, "once, for all twenty"


async def test_an_engine_restarted_between_the_recovery_and_its_mark_repeats_nothing(
) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=4))
    names = [f"cpu-{index}" for index in range(4)]
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        fleet.inject(entry("ns/plan/nr/0", NOT_READY, RECOVER), *names)
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", SETS, status=500, reason="InternalError", times=100)
        await fleet.recover("ns/plan/nr/0")
        await fleet.clock.advance(1)
        back = fleet.nodes()
        assert {ready(node) for node in back.values()} == {"True"}
        assert fleet.set_state("ns/plan/nr/0") == "recover", "the mark did not get through"
    fleet.member.faults.clear()
    writes = len(fleet.engine_sent("PATCH", f"{NODES}/.*/status"))
    async with fleet.running(fleet.engine(seed=4)):
        await fleet.clock.advance(2)
        assert fleet.set_state("ns/plan/nr/0") == "done"
        again = fleet.nodes()
    assert {name: transition(node) for name, node in again.items()} == \
        {name: transition(node) for name, node in back.items()}, \
        "written again, the recovery changes nothing the API shows"
    statuses = [r.json()["status"] for r in fleet.engine_sent("PATCH", f"{NODES}/.*/status")
                [writes:]]
    assert len(statuses) == 4, "the recovery written again, once per node"
    assert all(c["status"] == "True" for status in statuses
               for c in status.get("conditions", ()) if c["type"] == "Ready"), \
        "never NotReady again"
    assert [m["data"] for m in marked(fleet) if "state" in m["data"]][-1:] == [
        {"state": "done"}]


async def test_an_engine_restarted_while_a_fault_is_in_force_skips_no_target() -> None:
    """Stopped after the cordon reached some nodes: the next engine cordons the others, and
    the ones cordoned already are not written again."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=3))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        fleet.member.fail("PATCH", f"{NODES}/cpu-2", status=500, reason="InternalError",
                          times=100)
        fleet.inject(entry("ns/plan/c/0", CORDON, UNCORDON), "cpu-0", "cpu-1", "cpu-2")
        await fleet.clock.advance(1)
        assert [bool(fleet.nodes()[f"cpu-{i}"]["spec"].get("unschedulable"))
                for i in range(3)] == [True, True, False]
    fleet.member.faults.clear()
    before = len(fleet.engine_sent("PATCH", f"{NODES}/cpu-[01]"))
    async with fleet.running(fleet.engine(seed=9)):
        await fleet.clock.advance(2)
        assert all(node["spec"].get("unschedulable") for node in fleet.nodes().values())
        assert len(fleet.engine_sent("PATCH", f"{NODES}/cpu-[01]")) == before, \
            "the ones cordoned already are left as they are"


async def test_the_chunks_of_one_occurrence_run_and_are_marked_each() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=4))
    written = entry("ns/plan/c/0", CORDON, UNCORDON)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        fleet.member.put(faultsets.CONFIGMAPS, fault_set(written, "cpu-0", "cpu-1"))
        fleet.member.put(faultsets.CONFIGMAPS, fault_set(written, "cpu-2", chunk=1))
        await fleet.clock.advance(1)
        assert [bool(node["spec"].get("unschedulable")) for _, node in
                sorted(fleet.nodes().items())] == [True, True, True, False]
        await fleet.recover("ns/plan/c/0")
        await fleet.clock.advance(1)
        assert not any(node["spec"].get("unschedulable") for node in fleet.nodes().values())
        states = {s["metadata"]["name"]: s["data"]["state"]
                  for s in fleet.member.objects(faultsets.CONFIGMAPS)}
    assert states == {faultsets.set_name("ns/plan/c/0", 0): "done",
                      faultsets.set_name("ns/plan/c/0", 1): "done"}
    assert len(marked(fleet)) == 2, "one write per chunk"


async def test_a_node_that_went_counts_as_done() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        fleet.inject(entry("ns/plan/c/0", CORDON, UNCORDON), "cpu-0", "cpu-1", "cpu-9")
        await fleet.clock.advance(1)
        await fleet.recover("ns/plan/c/0")
        await fleet.clock.advance(3)
        assert fleet.set_state("ns/plan/c/0") == "done", "cpu-9 is no node of this engine"


async def test_a_pod_not_seen_counts_as_gone_only_once_the_watch_had_time_to_show_it(
) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        await fleet.clock.advance(1)
        fleet.member.put(faultsets.CONFIGMAPS, fault_set(
            entry("ns/plan/exit/0", EXIT, END), fleet.pod_target("train"),
            "default/late/uid-late", kind="Pod"))
        await fleet.clock.advance(3)
        assert fleet.set_state("ns/plan/exit/0") == "inject", \
            "the other pod may not have reached the watch yet"
        await fleet.clock.advance(GONE_AFTER)
        assert fleet.set_state("ns/plan/exit/0") == "done"
    assert len(marked(fleet)) == 1


async def test_a_restarted_engine_runs_no_stage_before_it_knows_the_faults() -> None:
    """The sets are listed slowly after a restart: until then the defaults must not make the
    NotReady node Ready, nor the Unreachable one heartbeat."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        fleet.inject(entry("ns/plan/nr/0", NOT_READY, RECOVER), "cpu-0")
        fleet.inject(entry("ns/plan/u/0", UNREACHABLE, RECOVER), "cpu-1")
        await fleet.clock.advance(1)
        assert ready(fleet.nodes()["cpu-0"]) == "False"
    fleet.member.fail("GET", faultsets.CONFIGMAPS, delay=10)
    status_writes = len(fleet.member.sent("PATCH", f"{NODES}/cpu-0/status"))
    async with fleet.running(fleet.engine(seed=6)):
        await fleet.clock.advance(20)
        assert ready(fleet.nodes()["cpu-0"]) == "False"
        assert len(fleet.member.sent("PATCH", f"{NODES}/cpu-0/status")) == status_writes
        assert fleet.member.sent("PATCH", f"{LEASES}/cpu-1") == [], "still silent"
        assert fleet.member.sent("PATCH", f"{LEASES}/cpu-0"), "the sets known: renewed"


async def test_a_set_turned_to_its_recovery_is_the_same_set_seen_as_long() -> None:
    """The wait before a pod the engine never saw counts as gone runs from when the set was
    first seen, not from its turn to recovery."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        fleet.member.put(PODS, pod("train", "cpu-0"))
        await fleet.clock.advance(1)
        fleet.member.put(faultsets.CONFIGMAPS, fault_set(
            entry("ns/plan/stuck/0", [], END), fleet.pod_target("train"),
            "default/late/uid-late", kind="Pod"))
        await fleet.clock.advance(GONE_AFTER - 10)
        await fleet.recover("ns/plan/stuck/0")
        await fleet.clock.advance(5)
        assert fleet.set_state("ns/plan/stuck/0") == "recover", "seen 25 s: not gone yet"
        await fleet.clock.advance(8)
        assert fleet.set_state("ns/plan/stuck/0") == "done", "seen 33 s: gone"
