"""The FaultPlan runner's I/O over in-memory API servers: victims recorded before anything is
written, entries written once (a restart between the writes and the status injects nothing
twice), conflicts retried, recovery confirmed only once the engine marked the entries done,
victims that vanished counted as recovered."""

from __future__ import annotations

import time
import types
from typing import Any, cast

import kopf
import pytest

from operators.api.faultplans import FaultPlan
from operators.api.injections import FAULTS, FaultEntry, read_entries, render_entries
from operators.handlers.faultplans import PlanRunner, delete
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.clock import FakeClock
from operators.k8s.memory import MemoryTransport
from operators.k8s.times import micro_time

CLUSTERS = "/apis/fakefleet.dev/v1alpha1/namespaces/default/fakeclusters"
PLANS = "/apis/fakefleet.dev/v1alpha1/namespaces/default/faultplans"
NODES = "/api/v1/nodes"


class World:
    """A host API server with a FakeCluster and a plan, and the cluster's member API server."""

    def __init__(self, nodes: int = 3) -> None:
        self.clock = FakeClock()
        self.host_api = MemoryTransport(self.clock)
        self.member_api = MemoryTransport(self.clock)
        self.host = Client(self.host_api, clock=self.clock)
        self.member = Client(self.member_api, clock=self.clock)
        self.host_api.put(CLUSTERS, {"apiVersion": "fakefleet.dev/v1alpha1",
                                     "kind": "FakeCluster", "metadata": {"name": "west"},
                                     "spec": {}})
        for index in range(nodes):
            self.member_api.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": f"n-{index}", "labels": {"fakefleet.dev/pool": "p"}},
                "status": {"capacity": {"nvidia.com/gpu": "8"}}})
        self.runtime = cast(Runtime, types.SimpleNamespace(
            host=self.host, substrate=types.SimpleNamespace(clusters={}), plans=set()))

    def plan(self, *steps: dict[str, Any]) -> None:
        self.host_api.put(PLANS, {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
                                  "metadata": {"name": "p", "uid": "0123456789abcdef"},
                                  "spec": {"seed": 1, "steps": list(steps)}})

    async def runner(self) -> PlanRunner:
        """A runner as the daemon makes one: from the plan as the API shows it now."""
        plan = FaultPlan.model_validate(await self.host.get(f"{PLANS}/p"))
        return PlanRunner(self.runtime, plan, connect=lambda *_: self.member)

    async def entries(self, node: str) -> list[FaultEntry]:
        found = await self.member.get(f"{NODES}/{node}")
        return read_entries(found["metadata"].get("annotations"))[0]

    async def engine_marks_done(self, node: str) -> None:
        """What the engine does once a recovery (or a one-shot fault) was written."""
        found = await self.member.get(f"{NODES}/{node}")
        entries = [e.model_copy(update={"state": "done"}) if e.state == "recover" else e
                   for e in read_entries(found["metadata"].get("annotations"))[0]]
        await self.member.patch(f"{NODES}/{node}", {"metadata": {"annotations": {
            FAULTS: render_entries(entries)}}})


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


async def test_victims_are_recorded_before_their_entries_are_written() -> None:
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    await runner.write()
    injection = runner.status.injections[0]
    assert injection.state == "Injected"
    assert len(injection.targets) == 2
    victims = [t.rsplit("/", 1)[-1] for t in injection.targets]
    for node in victims:
        (entry,) = await world.entries(node)
        assert entry.state == "inject"
        assert entry.id.endswith("/cordon/0")
    status_writes = [r.json()["status"] for r in world.host_api.sent("PATCH", f"{PLANS}/p/status")]
    first_with_targets = next(s for s in status_writes if s["injections"][0]["targets"])
    assert first_with_targets["injections"][0]["state"] == "Scheduled", \
        "the victims were recorded before anything was written to them"
    node_writes = world.member_api.sent("PATCH", f"{NODES}/.*")
    assert len(node_writes) == 2, "no read before each write: the list gave resourceVersions"


async def test_a_conflict_reads_the_node_again_and_keeps_what_others_wrote() -> None:
    world = World(nodes=1)
    world.plan({**CORDON, "target": {"nodes": {}}})
    runner = await started(world, 1)
    # Someone else's entry lands between the list and our write: ours is refused (409).
    other = FaultEntry(id="other/plan/x/0")
    original = runner.fleet

    async def fleet_then_change(step: Any) -> Any:
        found = await original(step)
        await world.member.patch(f"{NODES}/n-0", {"metadata": {"annotations": {
            FAULTS: render_entries([other])}}})
        return found
    runner.fleet = fleet_then_change  # type: ignore[method-assign]
    await runner.advance()
    assert [e.id for e in await world.entries("n-0")] == ["other/plan/x/0",
                                                          runner._id(runner.status.injections[0])]
    assert world.member_api.sent("GET", f"{NODES}/n-0"), "read again after the conflict"


async def test_a_restart_between_the_writes_and_the_status_injects_nothing_twice() -> None:
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
    successor = await world.runner()
    assert successor.status.injections[0].targets == injection.targets
    await successor.advance()
    assert successor.status.injections[0].state == "Injected"
    for text in injection.targets:
        assert len(await world.entries(text.rsplit("/", 1)[-1])) == 1


async def test_recovery_waits_for_the_engine_then_removes_the_entries() -> None:
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    victims = [t.rsplit("/", 1)[-1] for t in runner.status.injections[0].targets]
    runner.status = runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 20)})  # the duration is over
    await runner.advance()
    assert runner.status.injections[0].state == "Recovering"
    assert {e.state for node in victims for e in await world.entries(node)} == {"recover"}
    await runner.advance()
    assert runner.status.injections[0].state == "Recovering", "the engine has not written yet"
    for node in victims:
        await world.engine_marks_done(node)
    await runner.advance()
    assert runner.status.injections[0].state == "Recovered"
    assert runner.status.injections[0].recoveredAt
    for node in victims:
        assert await world.entries(node) == []
    assert runner.status.phase == "Succeeded"


async def test_a_victim_deleted_meanwhile_counts_as_recovered() -> None:
    world = World()
    world.plan(CORDON)
    runner = await started(world, 1)
    await runner.advance()
    victims = [t.rsplit("/", 1)[-1] for t in runner.status.injections[0].targets]
    await world.member.delete(f"{NODES}/{victims[0]}")
    runner.status = runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 20)})
    await runner.advance()
    await world.engine_marks_done(victims[1])
    await runner.advance()
    assert runner.status.injections[0].state == "Recovered"


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


async def test_an_entry_not_written_is_tried_again_before_the_step_counts_as_injected() -> None:
    world = World(nodes=2)
    world.plan({**CORDON, "target": {"nodes": {}}})
    runner = await started(world, 1)
    world.member_api.fail("PATCH", f"{NODES}/n-1", status=500, reason="InternalError")
    await runner.advance()
    injection = runner.status.injections[0]
    assert injection.state == "Scheduled", "not Injected while a victim lacks its entry"
    assert "1 of 2 entries not written yet" in injection.message
    await runner.advance()
    assert runner.status.injections[0].state == "Injected"
    for node in ("n-0", "n-1"):
        assert len(await world.entries(node)) == 1


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
