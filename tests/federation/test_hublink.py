"""The hub link of the operator: hub commands made FaultPlans and FaultPlans made results
(pure), the member acting on an in-memory host API with injected faults on a fake clock, and
the link's conversation with an in-process hub through partitions, hub restarts and refusals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from federation.api import common_pb2, fleet_pb2, member_pb2
from federation.client import member as link_module
from federation.client import tokens
from federation.client.fleet import FleetClient
from federation.client.member import NO_FAULTS, LinkFaults, MemberLink
from federation.client.simulated import SimulatedMember
from federation.hub import validation
from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.faultplans import FaultPlan
from operators.api.nodepools import FakeNodePool
from operators.hublink import convert
from operators.hublink import member as host_module
from operators.hublink.member import HostMember
from operators.k8s.client import Client
from primitives import keys
from primitives.clocks import SYSTEM_CLOCK, Clock
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport
from tests.federation.hubs import GRACE, RunningHub, running_hub

T = TypeVar("T")

NAMESPACE = "default"
BASE = f"/apis/{API_VERSION}/namespaces/{NAMESPACE}"
CLUSTERS = f"{BASE}/fakeclusters"
PLANS = f"{BASE}/faultplans"
POOLS = f"{BASE}/fakenodepools"
SPEC = {"steps": [{"name": "xid", "target": {"nodes": {}}, "fault": {"type": "GPUXid",
                                                                     "xid": 79}}]}
PLAN = json.dumps(SPEC)
#: 2026-01-01T00:01:00.25Z: a quarter second into a minute, to see the fraction kept.
START_AT = 1_767_225_660_250_000_000
RUNNING = member_pb2.COMMAND_PHASE_RUNNING
SUCCEEDED = member_pb2.COMMAND_PHASE_SUCCEEDED
FAILED = member_pb2.COMMAND_PHASE_FAILED
REFUSED = member_pb2.COMMAND_PHASE_REFUSED
READY = common_pb2.MEMBER_STATE_READY
UNREACHABLE = common_pb2.MEMBER_STATE_UNREACHABLE


# -- objects -----------------------------------------------------------------------------------

def start(run_id: str = "r1", cluster: str = "west", plan: str = PLAN) -> member_pb2.Command:
    command = member_pb2.Command(id=f"{run_id}/{cluster}/start", run_id=run_id,
                                 start_plan=member_pb2.StartPlan(plan=plan))
    command.start_plan.start_at.FromNanoseconds(START_AT)
    return command


def stop(run_id: str = "r1", cluster: str = "west") -> member_pb2.Command:
    return member_pb2.Command(id=f"{run_id}/{cluster}/stop", run_id=run_id,
                              stop_plan=member_pb2.StopPlan(command_id=f"{run_id}/{cluster}/start"))


def fake_cluster(name: str = "west", **status: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "FakeCluster",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"labels": {"gpu": "h100", "region": "eu"}},
            "status": {"phase": "Ready", "endpoint": "https://127.0.0.1:6443",
                       "kubernetesVersion": "v1.36.3+fakefleet", **status}}


def pool(name: str, cluster: str, *, replicas: int, ready: int | None,
         **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "FakeNodePool",
                           "metadata": {"name": name, "namespace": NAMESPACE},
                           "spec": {"clusterRef": cluster, "replicas": replicas, **spec}}
    if ready is not None:
        obj["status"] = {"replicas": replicas, "readyReplicas": ready}
    return obj


def fleet_plan(cluster: str = "west", run_id: str = "r1", *, annotated: bool = True,
               status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A FaultPlan as the hub link makes one (``annotated``: with its command's id)."""
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION, "kind": "FaultPlan",
        "metadata": {"name": convert.plan_name(run_id, cluster), "namespace": NAMESPACE,
                     "labels": {keys.FLEET_RUN: run_id, keys.CLUSTER: cluster}},
        "spec": SPEC | {"clusters": [cluster]}}
    if annotated:
        obj["metadata"]["annotations"] = {
            keys.FLEET_COMMAND: f"{run_id}/{cluster}/start"}
    if status is not None:
        obj["status"] = status
    return obj


def condition(kind: str, status: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": "Test", "message": message}


# -- convert -----------------------------------------------------------------------------------

def test_a_start_command_makes_a_fault_plan_for_this_cluster_only() -> None:
    cluster = FakeCluster.model_validate(fake_cluster())
    made = convert.fault_plan(start(), cluster)
    assert made["metadata"] == {
        "name": "r1-west", "namespace": NAMESPACE,
        "labels": {keys.FLEET_RUN: "r1", keys.CLUSTER: "west"},
        "annotations": {keys.FLEET_COMMAND: "r1/west/start"}}
    assert made["spec"] == SPEC | {"startAt": "2026-01-01T00:01:00.250000Z",
                                   "clusters": ["west"]}
    # What the API server would check of it, the models check too (startAt's pattern).
    parsed = FaultPlan.model_validate(made)
    assert parsed.spec.startAt == "2026-01-01T00:01:00.250000Z"
    assert parsed.spec.clusters == ["west"]


@pytest.mark.parametrize("plan", ["[]", '"steps"', "null"])
def test_a_plan_that_is_not_a_json_object_makes_no_fault_plan(plan: str) -> None:
    with pytest.raises(ValueError, match="not a JSON object"):
        convert.fault_plan(start(plan=plan), FakeCluster.model_validate(fake_cluster()))


@pytest.mark.parametrize(("status", "phase", "verdict", "steps", "message"), [
    (None, RUNNING, "", "", ""),
    ({"phase": "Pending"}, RUNNING, "", "", ""),
    ({"phase": "Running", "stepsDone": "0/1"}, RUNNING, "", "0/1", ""),
    ({"phase": "Succeeded", "stepsDone": "1/1", "verdict": "Passed",
      "conditions": [condition("Ready", "True", "every step is done")]},
     SUCCEEDED, "Passed", "1/1", "every step is done"),
    ({"phase": "Succeeded", "stepsDone": "1/1", "verdict": "Failed"},
     SUCCEEDED, "Failed", "1/1", ""),
    ({"phase": "Failed", "stepsDone": "0/1",
      "conditions": [condition("Ready", "False", "not finished"),
                     condition("Stalled", "True", "step xid: no node matches")]},
     FAILED, "", "0/1", "step xid: no node matches"),
    ({"phase": "Failed", "conditions": [condition("Stalled", "False", "was stalled"),
                                        condition("Ready", "False", "the plan failed")]},
     FAILED, "", "", "the plan failed"),
])
def test_a_fault_plan_status_makes_the_command_result(
        status: dict[str, Any] | None, phase: int, verdict: str, steps: str,
        message: str) -> None:
    result = convert.result(fleet_plan(status=status))
    assert result == member_pb2.CommandResult(
        command_id="r1/west/start", phase=phase, verdict=verdict, steps_done=steps,
        message=message, object="FaultPlan default/r1-west")
    assert validation.result(result, "result") == []


def test_a_fault_plan_of_no_fleet_run_has_no_result() -> None:
    assert convert.result(fleet_plan(annotated=False)) is None
    assert convert.result({"metadata": {"name": "mine"}, "spec": SPEC}) is None


def test_inventory_counts_nodes_and_sums_what_ready_nodes_offer() -> None:
    pools = [FakeNodePool.model_validate(p) for p in (
        pool("h100", "west", replicas=4, ready=3, gpu={"preset": "H100-SXM5-80GB"}),
        pool("gb200", "west", replicas=2, ready=2, gpu={"preset": "GB200"}),
        pool("cpu", "west", replicas=2, ready=1, template={"capacity": {
            "cpu": "16", "memory": "64Gi", "pods": "110", "example.com/fpga": "2"}}),
        pool("new", "west", replicas=5, ready=None, gpu={"preset": "A100-SXM4-80GB",
                                                          "count": 2}),
    )]
    inventory = convert.inventory(pools, convert.count_phases(
        [{"status": {"phase": "Running"}}] * 3 + [{"status": {}}, {"status": {"phase": "?"}}]))
    assert [(p.name, p.ready, p.total) for p in inventory.pools] == [
        ("cpu", 1, 2), ("gb200", 2, 2), ("h100", 3, 4), ("new", 0, 0)]
    assert (inventory.nodes_ready, inventory.nodes_total) == (6, 8)
    by_name = {p.name: p for p in inventory.pools}
    assert by_name["h100"].allocatable["nvidia.com/gpu"] == "8"
    assert by_name["gb200"].allocatable["nvidia.com/gpu"] == "4"
    assert by_name["new"].allocatable["nvidia.com/gpu"] == "2"
    assert by_name["cpu"].allocatable["memory"] == "64Gi"
    # Whole units of Ready nodes only; quantities with units (memory) are not summed.
    assert dict(inventory.allocatable) == {
        "nvidia.com/gpu": str(3 * 8 + 2 * 4),
        "cpu": str(3 * 32 + 2 * 32 + 16), "pods": str(6 * 110), "example.com/fpga": "2"}
    assert dict(inventory.pods_by_phase) == {"Running": 3, "Pending": 1, "Unknown": 1}
    assert validation.inventory(inventory, "capacity") == []


# -- the member over an in-memory host API -----------------------------------------------------

class Host:
    """A host API server (in memory, on a fake clock) with FakeClusters west and east, and the
    member that speaks for west."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.api = MemoryTransport(self.clock)
        self.client = Client(self.api, clock=self.clock)
        for name in ("west", "east"):
            self.api.put(CLUSTERS, fake_cluster(name))
        self.annotations: dict[str, str] = {}
        self.member = HostMember(self.client, NAMESPACE, "west", host_id="host-a",
                                 annotations=lambda: self.annotations, clock=self.clock)
        self.reports: list[member_pb2.CommandResult] = []
        self.member.report = self.reports.append

    @property
    def fake(self) -> FakeClock:
        assert isinstance(self.clock, FakeClock)
        return self.clock

    async def drive(self, work: Awaitable[T], *, limit: int = 600) -> T:
        """Await ``work`` while moving fake time on, a second at a time (its retries wait)."""
        task = asyncio.ensure_future(work)
        for _ in range(limit):
            if task.done():
                break
            await self.fake.advance(1.0)
        assert task.done(), f"still waiting after {limit} fake seconds"
        return task.result()

    def plans(self) -> list[str]:
        return [obj["metadata"]["name"] for obj in self.api.objects(PLANS)]

    def posts(self) -> int:
        return len(self.api.sent("POST", PLANS))


@pytest.fixture
def host() -> Host:
    return Host()


async def test_introduce_says_who_the_cluster_is_and_what_it_has(host: Host) -> None:
    host.api.put(POOLS, pool("h100", "west", replicas=2, ready=2,
                             gpu={"preset": "H100-SXM5-80GB"}))
    host.api.put(POOLS, pool("east-h100", "east", replicas=9, ready=9,
                             gpu={"preset": "H100-SXM5-80GB"}))
    request = await host.member.introduce()
    assert request.cluster == common_pb2.ClusterIdentity(
        name="west", namespace="default", host="host-a",
        labels={"gpu": "h100", "region": "eu"}, kubernetes_version="v1.36.3",
        endpoint="https://127.0.0.1:6443")
    assert (request.capacity.nodes_ready, request.capacity.nodes_total) == (2, 2)
    assert request.capacity.allocatable["nvidia.com/gpu"] == "16"
    assert validation.register(request) == []
    # The inventory goes out once, and again only when it changed (or a new session began).
    assert await host.member.inventory() == request.capacity
    assert await host.member.inventory() is None
    await host.member.resync()
    assert await host.member.inventory() == request.capacity


async def test_a_start_creates_its_fault_plan_once(host: Host) -> None:
    assert await host.member.execute(start()) is False
    assert host.plans() == ["r1-west"]
    [made] = host.api.objects(PLANS)
    assert made["spec"]["clusters"] == ["west"]
    assert made["spec"]["startAt"] == "2026-01-01T00:01:00.250000Z"
    assert host.reports == [convert.result(made)]
    assert host.reports[0].phase == RUNNING
    # Delivered again (the ack was lost): the plan is there, so it is a duplicate.
    assert await host.member.execute(start()) is True
    assert host.plans() == ["r1-west"]
    assert host.api.objects(PLANS)[0]["metadata"]["uid"] == made["metadata"]["uid"]
    assert len(host.reports) == 1


@pytest.mark.parametrize(("fault", "posts"), [
    ({"status": 500, "times": 3}, 4),
    ({"status": 503, "reason": "ServiceUnavailable"}, 2),
    ({"status": 429, "headers": {"Retry-After": "3"}, "times": 2}, 3),
    ({"reset": True}, 2),
], ids=["500", "503", "429", "reset"])
async def test_a_create_that_failed_on_the_way_is_sent_again(
        host: Host, fault: dict[str, Any], posts: int) -> None:
    host.api.fail("POST", PLANS, **fault)
    assert await host.drive(host.member.execute(start())) is False
    assert host.plans() == ["r1-west"]
    assert host.posts() == posts
    assert [r.phase for r in host.reports] == [RUNNING]


async def test_a_create_whose_answer_was_lost_counts_as_a_duplicate(host: Host) -> None:
    """The plan was created, the answer lost: the retry finds it (409) and creates no second."""
    host.api.fail("POST", PLANS, reset=True, applied=True)
    assert await host.drive(host.member.execute(start())) is True
    assert host.plans() == ["r1-west"]
    assert host.posts() == 2
    # observe() reports it (no result was sent for a duplicate).
    assert await host.member.resync() == [convert.result(host.api.objects(PLANS)[0])]


@pytest.mark.parametrize(("status", "reason"), [(422, "Invalid"), (400, "BadRequest")])
async def test_a_plan_the_api_server_refuses_is_reported_refused_once(
        host: Host, status: int, reason: str) -> None:
    host.api.fail("POST", PLANS, status=status, reason=reason)
    assert await host.drive(host.member.execute(start())) is False
    assert host.posts() == 1, "a refusal is not retried"
    assert host.plans() == []
    [refused] = host.reports
    assert refused.command_id == "r1/west/start"
    assert refused.phase == REFUSED
    assert "r1-west" in refused.message
    assert f"{status} {reason}: injected fault" in refused.message
    # Nothing exists to list, yet the next Hello says it was refused...
    assert await host.member.resync() == [refused]
    # ...and a second delivery is a duplicate that sends nothing.
    assert await host.member.execute(start()) is True
    assert host.posts() == 1
    # A stop of it forgets the refusal.
    assert await host.member.execute(stop()) is False
    assert await host.member.resync() == []


async def test_a_plan_that_is_no_json_object_is_refused_without_a_request(host: Host) -> None:
    assert await host.member.execute(start(plan="[1, 2]")) is False
    assert host.posts() == 0
    [refused] = host.reports
    assert refused.phase == REFUSED
    assert "not a FaultPlan spec" in refused.message


async def test_resync_reports_the_fleet_plans_of_this_cluster_only(host: Host) -> None:
    host.api.put(PLANS, fleet_plan("west", "r1", status={"phase": "Succeeded",
                                                         "verdict": "Passed",
                                                         "stepsDone": "1/1"}))
    host.api.put(PLANS, fleet_plan("west", "r2", status={"phase": "Running"}))
    host.api.put(PLANS, fleet_plan("east", "r1"))  # another member on the same host
    host.api.put(PLANS, fleet_plan("west", "r3", annotated=False))  # no command: not ours
    host.api.put(PLANS, {"apiVersion": API_VERSION, "kind": "FaultPlan",
                         "metadata": {"name": "by-hand", "labels": {keys.CLUSTER: "west"}},
                         "spec": SPEC})
    host.api.fail("POST", PLANS, status=422, reason="Invalid")
    await host.member.execute(start("r4"))
    results = await host.member.resync()
    assert [(r.command_id, r.phase) for r in results] == [
        ("r1/west/start", SUCCEEDED), ("r2/west/start", RUNNING), ("r4/west/start", REFUSED)]
    assert results[0].verdict == "Passed"


async def test_a_stop_deletes_the_plan_and_a_stop_without_one_succeeds(host: Host) -> None:
    await host.member.execute(start())
    host.api.fail("DELETE", f"{PLANS}/r1-west", status=500)
    assert await host.drive(host.member.execute(stop())) is False
    assert host.plans() == []
    stopped = host.reports[-1]
    assert (stopped.command_id, stopped.phase) == ("r1/west/stop", SUCCEEDED)
    assert "deleted" in stopped.message
    assert await host.member.execute(stop("r9")) is False
    missing = host.reports[-1]
    assert (missing.command_id, missing.phase) == ("r9/west/stop", SUCCEEDED)
    assert "was not there" in missing.message


async def test_observe_reports_a_result_when_it_changes_and_only_then(host: Host) -> None:
    await host.member.execute(start())
    host.reports.clear()
    host.api.put(PLANS, fleet_plan("east", "r2"))
    host.api.put(POOLS, pool("h100", "west", replicas=1, ready=1,
                             gpu={"preset": "H100-SXM5-80GB"}))
    stop_flag = asyncio.Event()
    observing = asyncio.create_task(host.member.observe(stop_flag))
    try:
        await host.fake.advance(3)
        assert host.reports == [], "nothing changed since the create"
        inventory = await host.member.inventory()
        assert inventory is not None
        assert inventory.nodes_ready == 1
        await host.client.patch(f"{PLANS}/r1-west", {"status": {"phase": "Running",
                                                                "stepsDone": "0/1"}})
        await host.client.patch(f"{PLANS}/r2-east", {"status": {"phase": "Succeeded"}})
        await host.fake.advance(1)
        assert [(r.command_id, r.phase, r.steps_done) for r in host.reports] == [
            ("r1/west/start", RUNNING, "0/1")]
        await host.fake.advance(5)
        assert len(host.reports) == 1
        # A failed list is waited out; the next look reports what changed meanwhile.
        host.api.fail("GET", PLANS, status=500)
        await host.client.patch(f"{PLANS}/r1-west", {"status": {
            "phase": "Succeeded", "stepsDone": "1/1", "verdict": "Passed"}})
        await host.fake.advance(1)
        assert len(host.reports) == 1
        await host.fake.advance(1)
        assert [(r.phase, r.verdict) for r in host.reports[1:]] == [(SUCCEEDED, "Passed")]
        await host.fake.advance(5)
        assert len(host.reports) == 2
    finally:
        stop_flag.set()
        await host.drive(observing)


async def test_link_faults_come_from_the_cluster_annotations(host: Host) -> None:
    assert host.member.faults() == NO_FAULTS
    host.annotations[keys.FAULTS] = json.dumps([
        {"id": "p/0", "state": "inject", "hub": {"partition": "toHub"}},
        {"id": "p/1", "state": "inject", "hub": {"latency": "1500ms"}},
        {"id": "p/2", "state": "inject", "hub": {"latency": "2s"}},
        {"id": "p/3", "state": "done", "hub": {"partition": "fromHub"}},
    ])
    assert host.member.faults() == LinkFaults(to_hub_dropped=True, from_hub_dropped=False,
                                              latency=2.0)
    host.annotations[keys.FAULTS] = json.dumps([
        {"id": "p/3", "state": "inject", "hub": {"partition": "both"}}])
    assert host.member.faults().partitioned
    assert host.member.faults() == LinkFaults(True, True, 0.0)
    host.annotations[keys.FAULTS] = "not json"
    assert host.member.faults() == NO_FAULTS


# -- the link and an in-process hub ------------------------------------------------------------

class Recording(SimulatedMember):
    """A simulated member that keeps what the link told it."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.states: list[tuple[bool, str]] = []

    def connected(self, up: bool, message: str) -> None:
        super().connected(up, message)
        self.states.append((up, message))


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            answer = check()
            if answer if isinstance(answer, bool) else await answer:
                return
            await asyncio.sleep(0.05)


async def states(hub: RunningHub) -> dict[str, tuple[int, str]]:
    async with hub.fleet() as fleet:
        return {m.cluster.name: (m.state, m.reason) for m in await fleet.list_clusters()}


async def all_ready(hub: RunningHub, count: int) -> bool:
    listed = await states(hub)
    return len(listed) == count and all(state == READY for state, _ in listed.values())


async def finished(fleet: FleetClient, run_id: str, timeout: float = 10.0) -> fleet_pb2.Run:
    async with asyncio.timeout(timeout):
        async for run in fleet.watch_run(run_id):
            if run.phase != fleet_pb2.RUN_PHASE_RUNNING:
                return run
    raise AssertionError("the watch ended before the run finished")


def start_links(hub: RunningHub, members: list[Recording],
                stop_flag: asyncio.Event) -> list[asyncio.Task[None]]:
    """A link for each member, to ``hub``'s address, running until ``stop_flag``."""
    tasks = []
    for member in members:
        member.link = MemberLink(hub.address, hub.member_token(member.name), member,
                                 member.name)
        tasks.append(asyncio.create_task(member.link.run(stop_flag)))
    return tasks


async def stop_links(tasks: list[asyncio.Task[None]], members: list[Recording],
                     stop_flag: asyncio.Event) -> None:
    stop_flag.set()
    await asyncio.gather(*tasks)
    for member in members:
        await member.stop()


async def test_a_partitioned_member_is_unreachable_and_gets_its_command_once_it_heals(
        tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = Recording("west")
        stop_flag = asyncio.Event()
        tasks = start_links(hub, [member], stop_flag)
        try:
            await eventually(lambda: all_ready(hub, 1))
            member.link_faults = LinkFaults(to_hub_dropped=True, from_hub_dropped=True)
            await eventually(lambda: not member.up, timeout=1.0)
            assert "partitioned" in member.states[-1][1]
            await eventually(lambda: _state_is(hub, "west", UNREACHABLE), timeout=GRACE * 4)
            # Both ways are cut: which staleness the hub notices first is a matter of timing.
            assert (await states(hub))["west"][1] in ("HeartbeatsStopped",
                                                      "HubHeartbeatsUnanswered")
            # A run during the partition: the hub sends its command into the void.
            run = await fleet.run_plan(PLAN, start_delay=0)
            await asyncio.sleep(GRACE)
            [part] = (await fleet.get_run(run.id)).members
            assert part.state == fleet_pb2.MEMBER_RUN_STATE_SENT
            assert member.deliveries == {}
            member.link_faults = NO_FAULTS
            done = await finished(fleet, run.id)
            assert done.phase == fleet_pb2.RUN_PHASE_SUCCEEDED
            await eventually(lambda: all_ready(hub, 1))
            await asyncio.sleep(GRACE)  # time for a stray second delivery, if there were one
            assert member.deliveries == {f"{run.id}/west/start": 1}
            assert list(member.executed) == [f"{run.id}/west/start"]
            assert member.up
            assert member.link is not None
            assert member.link.sessions == 2
        finally:
            await stop_links(tasks, [member], stop_flag)


async def _state_is(hub: RunningHub, name: str, state: int) -> bool:
    return (await states(hub)).get(name, (None, ""))[0] == state


async def test_links_reconnect_to_a_restarted_hub_and_nothing_runs_twice(
        tmp_path: Path) -> None:
    """The hub goes away while its members run a plan and comes back on its address: the
    links find it by themselves, their Hellos tell it what ran, and nothing runs again."""
    members = [Recording(name, run_seconds=1.5) for name in ("east", "west")]
    stop_flag = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
            address = hub.info.address
            tasks = start_links(hub, members, stop_flag)
            await eventually(lambda: all_ready(hub, 2))
            run = await fleet.run_plan(PLAN, start_delay=0)
            await eventually(lambda: all(len(m.executed) == 1 for m in members))
        # The hub is gone; the links keep trying, and the plans run on in the members.
        await eventually(lambda: not any(member.up for member in members))
        async with running_hub(tmp_path, listen=address) as hub, hub.fleet() as fleet:
            await eventually(lambda: all_ready(hub, 2), timeout=15)
            done = await finished(fleet, run.id)
            assert done.phase == fleet_pb2.RUN_PHASE_SUCCEEDED
            again = await fleet.run_plan(PLAN, start_delay=0)
            assert (await finished(fleet, again.id)).phase == fleet_pb2.RUN_PHASE_SUCCEEDED
            for member in members:
                assert member.deliveries == {f"{run.id}/{member.name}/start": 1,
                                             f"{again.id}/{member.name}/start": 1}
                assert member.link is not None
                assert member.link.sessions == 2
    finally:
        await stop_links(tasks, members, stop_flag)


async def test_a_wrong_token_is_reported_and_the_link_keeps_trying(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_module, "REFUSED_BACKOFF", 0.2)
    async with running_hub(tmp_path) as hub:
        member = Recording("west")
        stop_flag = asyncio.Event()
        member.link = MemberLink(hub.address, tokens.member_token(tokens.new_key(), "west"),
                                 member, "west")
        task = asyncio.create_task(member.link.run(stop_flag))
        await eventually(lambda: len(member.states) >= 3)
        assert not task.done()
        assert all(not up for up, _ in member.states)
        assert all(message.startswith("UNAUTHENTICATED: authorization: ")
                   and "was not made with this hub's key" in message
                   for _, message in member.states)
        assert member.link.sessions == 0
        assert await states(hub) == {}
        stop_flag.set()
        await task


async def test_a_result_that_finds_the_outbox_full_opens_a_new_session_and_is_not_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The link's queues are bounded; a result reported while the outbox is full is not
    dropped: the session ends, and the next one's Hello reports every result."""
    monkeypatch.setattr(link_module, "OUTBOX", 1)
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = Recording("west", run_seconds=60)
        stop_flag = asyncio.Event()
        [task] = start_links(hub, [member], stop_flag)
        try:
            await eventually(lambda: all_ready(hub, 1))
            run = await fleet.run_plan(PLAN, start_delay=0)
            await eventually(lambda: len(member.executed) == 1)
            assert member.link is not None
            sessions = member.link.sessions
            [executed] = member.executed.values()
            executed.result = member_pb2.CommandResult(
                command_id=executed.command.id, phase=SUCCEEDED, verdict="Passed")
            for _ in range(3):  # more than the outbox holds, at once
                member.link.report(executed.result)
            await eventually(lambda: member.link is not None
                             and member.link.sessions == sessions + 1)
            assert any("messages wait for the hub" in message for _, message in member.states)
            done = await finished(fleet, run.id)
            assert (done.phase, done.verdict) == (fleet_pb2.RUN_PHASE_SUCCEEDED, "Passed")
        finally:
            await stop_links([task], [member], stop_flag)


# -- the operator's member behind a real link ------------------------------------------------

async def test_a_fleet_run_becomes_a_fault_plan_in_the_host_and_its_status_the_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_module, "OBSERVE_EVERY", 0.05)
    world = Host(SYSTEM_CLOCK)
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        stop_flag = asyncio.Event()
        link = MemberLink(hub.address, hub.member_token("west"), world.member, "west")
        world.member.report = link.report
        tasks = [asyncio.create_task(link.run(stop_flag)),
                 asyncio.create_task(world.member.observe(stop_flag))]
        await eventually(lambda: all_ready(hub, 1))
        run = await fleet.run_plan(PLAN, start_delay=0)
        await eventually(lambda: world.plans() == [f"{run.id}-west"])
        await eventually(lambda: _part_state_is(fleet, run.id,
                                                fleet_pb2.MEMBER_RUN_STATE_RUNNING))
        await world.client.patch(f"{PLANS}/{run.id}-west", {"status": {
            "phase": "Succeeded", "stepsDone": "1/1", "verdict": "Passed"}})
        done = await finished(fleet, run.id)
        assert (done.phase, done.verdict) == (fleet_pb2.RUN_PHASE_SUCCEEDED, "Passed")
        assert done.members[0].object == f"FaultPlan default/{run.id}-west"
        assert world.posts() == 1
        stop_flag.set()
        await asyncio.gather(*tasks)


async def _part_state_is(fleet: FleetClient, run_id: str, state: int) -> bool:
    return (await fleet.get_run(run_id)).members[0].state == state
