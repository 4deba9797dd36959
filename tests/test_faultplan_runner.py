"""The FaultPlan runner's I/O over in-memory API servers: victims recorded before anything is
written, one fault set per cluster written once (a restart between the record and the write,
or between the write and the status, injects nothing twice and skips nothing), recovery
confirmed only once the engine marked the set done, a plan deleted mid-step recovering what
its sets hold; spec.startAt as time zero, spec.clusters keeping a plan to its clusters, and
hub-link faults recovered by the plan alone."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any, cast

import kopf
import pytest

from operators.api import faultsets
from operators.api.faultplans import FaultPlan
from operators.api.faultsets import FaultSet
from operators.api.injections import HubLinkFaults, hub_link_faults
from operators.faults.deciding import MEMBER_WAIT
from operators.faults.evaluating import CelWorkers
from operators.handlers.faultplans import PlanRunner, delete
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.errors import K8sError
from operators.k8s.times import micro_time, parse
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

CLUSTERS = "/apis/fakefleet.dev/v1alpha1/namespaces/default/fakeclusters"
PLANS = "/apis/fakefleet.dev/v1alpha1/namespaces/default/faultplans"
NODES = "/api/v1/nodes"
SETS = faultsets.CONFIGMAPS


class World:
    """A host API server with FakeClusters (west, and any added) and a plan, and each cluster's
    member API server."""

    def __init__(self, nodes: int = 3) -> None:
        self.clock = FakeClock()
        self.host_api = MemoryTransport(self.clock)
        self.host = Client(self.host_api, clock=self.clock)
        self.member_apis: dict[str, MemoryTransport] = {}
        self.members: dict[str, Client] = {}
        self.member = self.add_cluster("west", nodes)
        self.member_api = self.member_apis["west"]
        locks: dict[str, asyncio.Lock] = {}
        self.runtime = cast(Runtime, types.SimpleNamespace(
            host=self.host, substrate=types.SimpleNamespace(clusters={}), plans=set(),
            cel=CelWorkers(),
            lock=lambda key: locks.setdefault(key, asyncio.Lock())))

    def add_cluster(self, name: str, nodes: int = 3) -> Client:
        """A FakeCluster in the host and its member API server with ``nodes`` pool nodes."""
        self.host_api.put(CLUSTERS, {"apiVersion": "fakefleet.dev/v1alpha1",
                                     "kind": "FakeCluster", "metadata": {"name": name},
                                     "spec": {}})
        self.member_apis[name] = MemoryTransport(self.clock)
        self.members[name] = Client(self.member_apis[name], clock=self.clock)
        for index in range(nodes):
            self.member_apis[name].put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": f"n-{index}", "labels": {"fakefleet.dev/pool": "p"}},
                "status": {"capacity": {"nvidia.com/gpu": "8"}}})
        return self.members[name]

    def plan(self, *steps: dict[str, Any], **spec: Any) -> None:
        self.host_api.put(PLANS, {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
                                  "metadata": {"name": "p", "uid": "0123456789abcdef"},
                                  "spec": {"seed": 1, "steps": list(steps), **spec}})

    async def runner(self) -> PlanRunner:
        """A runner as the daemon makes one: from the plan as the API shows it now."""
        plan = FaultPlan.model_validate(await self.host.get(f"{PLANS}/p"))
        return PlanRunner(self.runtime, plan, connect=lambda _, name: self.members[name])

    def sets(self) -> list[FaultSet]:
        return [faultsets.read(item) for item in self.member_api.objects(SETS)]

    def targets(self) -> list[str]:
        """The nodes the fault sets in west name."""
        return sorted(t for found in self.sets() for group in found.groups
                      for t in group.targets)

    async def engine_marks_done(self) -> None:
        """What the engine does once every target ran a set's recovery."""
        for found in self.sets():
            if found.state == "recover":
                await self.member.patch(f"{SETS}/{found.name}", {"data": {"state": "done"}})


CORDON = {"name": "cordon", "target": {"nodes": {}, "mode": "fixed", "count": 2},
          "fault": {"type": "Cordon"}, "at": "0s", "duration": "10s"}


async def started(world: World, seconds_ago: float) -> PlanRunner:
    """A runner whose plan started ``seconds_ago`` (so its steps are due)."""
    runner = await world.runner()
    await runner.start()
    runner.status = runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - seconds_ago)})
    await runner.write()
    return runner


async def test_victims_are_recorded_before_their_fault_set_is_written() -> None:
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    await runner.write()
    injection = runner.status.injections[0]
    assert injection.state == "Injected"
    assert len(injection.targets) == 2
    victims = sorted(t.rsplit("/", 1)[-1] for t in injection.targets)
    (found,) = world.sets()
    assert (found.state, found.id) == ("inject", runner._id(injection))
    assert found.id.endswith("/cordon/0")
    assert world.targets() == victims
    status_writes = [r.json()["status"] for r in world.host_api.sent("PATCH", f"{PLANS}/p/status")]
    first_with_targets = next(s for s in status_writes if s["injections"][0]["targets"])
    assert first_with_targets["injections"][0]["state"] == "Scheduled", \
        "the victims were recorded before anything was written to them"
    assert len(world.member_api.sent("POST", SETS)) == 1
    assert world.member_api.sent("PATCH", f"{NODES}/.*") == [], "nothing written to a victim"


async def test_a_restart_between_the_record_and_the_write_writes_the_set_once() -> None:
    """The victims are in the status; the runner's create of the set never arrived, or arrived
    and its answer was lost, and the runner stopped there: the successor writes the set once,
    for exactly those victims."""
    for applied in (False, True):
        world = World()
        world.plan(CORDON)
        runner = await started(world, 1)
        world.member_api.fail("POST", SETS, reset=True, applied=applied)
        await runner.advance()
        assert runner.status.injections[0].state == "Scheduled"
        recorded = (await world.runner()).status.injections[0]
        assert recorded.state == "Scheduled"
        assert len(recorded.targets) == 2
        successor = await world.runner()
        await successor.advance()
        assert successor.status.injections[0].state == "Injected"
        assert successor.status.injections[0].targets == recorded.targets, "none chosen twice"
        assert world.targets() == sorted(t.rsplit("/", 1)[-1] for t in recorded.targets)
        assert len(world.sets()) == 1


async def test_a_restart_between_the_write_and_the_status_injects_nothing_twice() -> None:
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    # The status write that says Injected never happened: the successor sees only targets.
    injection = runner.status.injections[0]
    await world.host.patch(f"{PLANS}/p/status", {"status": {**runner.status.model_dump(
        mode="json"), "injections": [{**injection.model_dump(mode="json"),
                                      "state": "Scheduled", "injectedAt": "",
                                      "expectations": []}]}})
    written = world.member_api.objects(SETS)
    successor = await world.runner()
    assert successor.status.injections[0].targets == injection.targets
    await successor.advance()
    assert successor.status.injections[0].state == "Injected"
    assert world.member_api.objects(SETS) == written, "the set as it was"


async def test_recovery_waits_for_the_engine_then_deletes_the_set() -> None:
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    runner.status = runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 20)})  # the duration is over
    await runner.advance()
    assert runner.status.injections[0].state == "Recovering"
    assert [found.state for found in world.sets()] == ["recover"]
    assert len(world.member_api.sent("PATCH", f"{SETS}/.*")) == 1, "one write"
    await runner.advance()
    assert runner.status.injections[0].state == "Recovering", "the engine has not written yet"
    await world.engine_marks_done()
    await runner.advance()
    assert runner.status.injections[0].state == "Recovered"
    assert runner.status.injections[0].recoveredAt
    assert world.sets() == []
    assert runner.status.phase == "Succeeded"


async def test_a_plan_deleted_mid_step_recovers_what_its_sets_hold() -> None:
    world = World()
    world.plan({**CORDON, "duration": "1h"})
    runner = await started(world, 1)
    await runner.advance()
    assert runner.status.injections[0].state == "Injected"
    # The finalizer's rounds (handlers.faultplans.delete), each from the plan as it is then.
    left = await (await world.runner()).abort()
    assert [i.step for i in left] == ["cordon"], "the finalizer waits for it"
    assert [found.state for found in world.sets()] == ["recover"]
    await world.engine_marks_done()
    assert await (await world.runner()).abort() == []
    assert world.sets() == [], "recovered, then deleted: nothing left in the member"


async def test_a_step_with_nothing_to_hit_is_skipped_and_says_so() -> None:
    world = World()
    world.plan({**CORDON, "target": {"nodes": {"names": ["nope"]}}})
    runner = await started(world, 1)
    await runner.advance()
    injection = runner.status.injections[0]
    assert injection.state == "Skipped"
    assert "nothing matched" in injection.message
    assert runner.status.phase == "Succeeded"


async def test_a_plan_naming_an_unknown_cluster_says_which() -> None:
    world = World()
    world.plan({**CORDON, "target": {"clusters": {"names": ["east"]}, "nodes": {}}})
    runner = await started(world, 1)
    assert "no FakeCluster named east" in runner.status.injections[0].message
    await runner.advance()
    assert runner.status.injections[0].state == "Skipped"


async def test_a_plan_the_planner_refuses_fails_without_a_verdict() -> None:
    world = World()
    # A three-step cycle passes the API server's rules (they catch one and two steps).
    world.plan({**CORDON, "name": "a", "at": None, "after": ["c"]},
               {**CORDON, "name": "b", "at": None, "after": ["a"]},
               {**CORDON, "name": "c", "at": None, "after": ["b"]})
    runner = await world.runner()
    await runner.start()
    assert runner.status.phase == "Failed"
    assert runner.status.verdict == ""
    stalled = next(c for c in runner.status.conditions if c.type == "Stalled")
    assert stalled.status == "True"
    assert "cycle" in stalled.message
    written = await world.host.get(f"{PLANS}/p")
    assert written["status"]["phase"] == "Failed", "written, so kubectl and plan run see it"


async def test_a_set_not_written_is_tried_again_before_the_step_counts_as_injected() -> None:
    world = World(nodes=2)
    world.plan({**CORDON, "target": {"nodes": {}}})
    runner = await started(world, 1)
    world.member_api.fail("POST", SETS, status=500, reason="InternalError")
    await runner.advance()
    injection = runner.status.injections[0]
    assert injection.state == "Scheduled", "not Injected while its victims lack their fault"
    assert "2 of 2 entries not written yet" in injection.message
    await runner.advance()
    assert runner.status.injections[0].state == "Injected"
    assert world.targets() == ["n-0", "n-1"]


async def test_a_cluster_deleted_meanwhile_leaves_nothing_to_recover() -> None:
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    await world.host.delete(f"{CLUSTERS}/west")
    runner.status = runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 20)})
    await runner.advance()  # the flips fail: the member is gone with its cluster
    await runner.advance()
    assert runner.status.injections[0].state in ("Recovering", "Recovered")
    await runner.advance()
    assert runner.status.injections[0].state == "Recovered"


async def test_the_finalizer_waits_for_the_plan_s_daemon_to_stop() -> None:
    world = World()
    world.plan(CORDON)
    world.runtime.plans.add("default/p")
    body = kopf.Body(kopf.RawBody(await world.host.get(f"{PLANS}/p")))
    with pytest.raises(kopf.TemporaryError, match="daemon to stop"):
        await delete(body=body, memo=kopf.Memo(runtime=world.runtime))


async def test_start_at_is_the_plan_s_time_zero_and_steps_already_due_run_at_once() -> None:
    world = World()
    start_at = micro_time(time.time() - 100)
    world.plan({**CORDON, "at": "30s"}, {**CORDON, "name": "later", "at": "5m"},
               startAt=start_at)
    runner = await world.runner()
    await runner.start()
    assert runner.status.startedAt == start_at, "every member of a fleet run shares one clock"
    await runner.advance()
    assert [i.state for i in runner.status.injections] == ["Injected", "Scheduled"]
    injection = runner.status.injections[0]
    # Its duration counts from when it was in place, not from when it was due.
    assert injection.recoverAt == pytest.approx(
        parse(injection.injectedAt) - parse(start_at) + 10, abs=0.01)


async def test_a_start_in_the_future_waits_for_it() -> None:
    world = World()
    world.plan(CORDON, startAt=micro_time(time.time() + 3600))
    runner = await world.runner()
    await runner.start()
    await runner.advance()
    assert runner.status.injections[0].state == "Scheduled"
    assert runner.status.phase == "Running"
    assert not world.member_api.sent("POST", SETS)


async def test_a_start_at_that_is_no_time_fails_the_plan_naming_the_field() -> None:
    world = World()
    world.plan(CORDON, startAt="2030-02-30T00:00:00Z")  # the pattern lets it through
    runner = await world.runner()
    await runner.start()
    assert runner.status.phase == "Failed"
    stalled = next(c for c in runner.status.conditions if c.type == "Stalled")
    assert "spec.startAt" in stalled.message
    assert "RFC 3339" in stalled.message


async def test_clusters_keep_every_step_to_the_plan_s_own_cluster() -> None:
    world = World()
    world.add_cluster("east")
    world.plan({**CORDON, "target": {"nodes": {}}},
               {**CORDON, "name": "elsewhere", "target": {"clusters": {"names": ["east"]},
                                                          "nodes": {}}},
               clusters=["west"])
    runner = await started(world, 1)
    assert runner.status.injections[1].message == "", \
        "east exists, and is another copy's business: no complaint"
    await runner.advance()
    mine, elsewhere = runner.status.injections
    assert mine.state == "Injected"
    assert {t.split("/")[0] for t in mine.targets} == {"west"}
    assert len(mine.targets) == 3
    assert elsewhere.state == "Skipped"
    assert "nothing matched" in elsewhere.message
    assert "no FakeCluster named" not in elsewhere.message
    assert world.member_apis["east"].requests == [], "east's API is not even looked at"


async def test_clusters_naming_a_missing_cluster_say_so() -> None:
    world = World()
    world.plan(CORDON, clusters=["gone"])
    runner = await started(world, 1)
    assert "no FakeCluster named gone" in runner.status.injections[0].message
    await runner.advance()
    assert runner.status.injections[0].state == "Skipped"
    assert world.member_api.requests == []


HUB_PARTITION = {"name": "cut", "target": {}, "fault": {"type": "HubPartition",
                                                       "direction": "toHub"},
                 "at": "0s", "duration": "10s"}


async def hub_faults(world: World, cluster: str = "west") -> HubLinkFaults:
    """What the hub link of ``cluster`` reads from its FakeCluster."""
    found = await world.host.get(f"{CLUSTERS}/{cluster}")
    return hub_link_faults(found["metadata"].get("annotations"))


async def test_a_hub_partition_is_recovered_by_the_plan_alone() -> None:
    world = World()
    world.plan(HUB_PARTITION)
    runner = await started(world, 1)
    await runner.advance()
    assert runner.status.injections[0].state == "Injected"
    assert runner.status.injections[0].targets == ["west/Cluster//west"]
    assert await hub_faults(world) == HubLinkFaults(to_hub_dropped=True)
    runner.status = runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 20)})  # the duration is over
    await runner.advance()
    # Nobody marks a FakeCluster entry done: the plan removes it, and the fault is over.
    assert await hub_faults(world) == HubLinkFaults()
    await runner.advance()
    assert runner.status.injections[0].state == "Recovered"
    assert runner.status.phase == "Succeeded"
    found = await world.host.get(f"{CLUSTERS}/west")
    assert keys.FAULTS not in (found["metadata"].get("annotations") or {})


async def test_hub_faults_reach_adopted_clusters_too() -> None:
    world = World()
    await world.host.patch(f"{CLUSTERS}/west", {"spec": {"controlPlane": {
        "backend": "external", "kubeconfigSecretRef": {"name": "west"}}}})
    world.plan({**HUB_PARTITION, "fault": {"type": "HubLatency", "latency": "2s"}})
    runner = await started(world, 1)
    await runner.advance()
    assert runner.status.injections[0].state == "Injected"
    assert runner.status.injections[0].message == ""
    assert (await hub_faults(world)).latency == 2.0


async def test_a_member_not_reachable_yet_is_waited_for_not_skipped() -> None:
    """After an operator restart a member's control plane is adopted a moment later: a step due
    meanwhile waits (the daemon retries) instead of being judged against nobody."""
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    runner._connect = lambda _, name: None
    with pytest.raises(K8sError, match="member cluster west cannot be reached yet"):
        await runner.advance()
    assert runner.status.injections[0].state == "Scheduled"
    late = await started(world, MEMBER_WAIT + 5)
    late._connect = lambda _, name: None
    await late.advance()
    assert late.status.injections[0].state == "Skipped"
    runner = await started(world, 1)
    await runner.advance()
    assert runner.status.injections[0].state == "Injected"
