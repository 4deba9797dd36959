"""A plan's writes into the fleet over in-memory API servers and a fake clock, channel by
channel: node and pod entries (one conditional PATCH per victim, carrying the trace, without a
read when a list just showed the victim; conflicts read again; nothing written twice), a
Delete's hold in its pool, a FakeCluster's entry applied at once; recovery confirmed only once
the engine marked an entry done, a lost turn written again; and the Events about victims."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from operators.api.clusters import FakeCluster
from operators.api.faultplans import Fault
from operators.api.injections import FaultEntry, read_entries, read_held, render_entries
from operators.faults.delivering import CONFLICT_RETRIES, Delivery, edit_entries
from operators.faults.targets import Victim
from operators.k8s.client import Client
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

BASE = "/apis/fakefleet.dev/v1alpha1/namespaces/default"
CLUSTERS = f"{BASE}/fakeclusters"
POOLS = f"{BASE}/fakenodepools"
NODES = "/api/v1/nodes"
ENTRY = "default/p-01234567/step/0"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CORDON = Fault.model_validate({"type": "Cordon"})
DELETE = Fault.model_validate({"type": "Delete"})


class Fleet:
    """The host with FakeCluster west, west's member API with pool nodes, and what a Delivery
    needs of the runner (:class:`~operators.faults.delivering.Members`)."""

    def __init__(self, nodes: int = 2, *, backend: str = "local") -> None:
        self.clock = FakeClock()
        self.host_api = MemoryTransport(self.clock)
        self.host = Client(self.host_api, clock=self.clock)
        self.member_api = MemoryTransport(self.clock)
        self.client = Client(self.member_api, clock=self.clock)
        control_plane: dict[str, Any] = {"backend": backend}
        if backend == "external":
            control_plane["kubeconfigSecretRef"] = {"name": "west"}
        self.host_api.put(CLUSTERS, {"apiVersion": "fakefleet.dev/v1alpha1",
                                     "kind": "FakeCluster", "metadata": {"name": "west"},
                                     "spec": {"controlPlane": control_plane}})
        self.host_api.put(POOLS, {"apiVersion": "fakefleet.dev/v1alpha1",
                                  "kind": "FakeNodePool", "metadata": {"name": "p"},
                                  "spec": {"clusterRef": "west", "replicas": nodes}})
        for index in range(nodes):
            self.member_api.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": f"p-{index}", "labels": {keys.POOL: "p"}}})
        self.known: dict[str, FakeCluster] = {}
        self.applied: list[str] = []
        self.components: dict[str, bool] = {}
        self.delivery = Delivery(plan="default/p", namespace="default", host=self.host,
                                 members=self, apply=self.apply, running=self.running)

    async def clusters(self) -> Mapping[str, FakeCluster]:
        found = await self.host.get(CLUSTERS)
        self.known = {item["metadata"]["name"]: FakeCluster.model_validate(item)
                      for item in found["items"]}
        return self.known

    def cluster(self, name: str) -> FakeCluster | None:
        return self.known.get(name)

    def member(self, name: str) -> Client | None:
        return self.client if name == "west" else None

    async def apply(self, cluster: str) -> None:
        self.applied.append(cluster)

    def running(self, cluster: str, component: str) -> bool | None:
        return self.components.get(component)

    async def entries(self, path: str, api: MemoryTransport | None = None) -> list[FaultEntry]:
        found = (api or self.member_api).object(path)
        assert found is not None
        return read_entries(found["metadata"].get("annotations"))[0]

    async def engine_marks_done(self, node: str) -> None:
        entries = [e.model_copy(update={"state": "done"}) if e.state == "recover" else e
                   for e in await self.entries(f"{NODES}/{node}")]
        await self.client.patch(f"{NODES}/{node}", {"metadata": {"annotations": {
            keys.FAULTS: render_entries(entries)}}})


def node(name: str) -> Victim:
    return Victim("west", "Node", name)


WEST = Victim("west", "Cluster", "west")


# -- node and pod entries ----------------------------------------------------------------------

async def test_an_entry_is_one_conditional_traced_patch_per_victim_without_a_read() -> None:
    fleet = Fleet()
    victims = [node("p-0"), node("p-1")]
    await fleet.delivery.observe(victims)
    before = len(fleet.member_api.requests)
    delivered = await fleet.delivery.inject(CORDON, ENTRY, victims, TRACE)
    assert (delivered.problems, delivered.failed) == ([], [])
    sent = fleet.member_api.requests[before:]
    assert [r.method for r in sent] == ["PATCH", "PATCH"], "the list gave resourceVersions"
    for request in sent:
        metadata = request.json()["metadata"]
        assert metadata["resourceVersion"]
        assert metadata["annotations"][keys.TRACEPARENT] == TRACE
    for name in ("p-0", "p-1"):
        (entry,) = await fleet.entries(f"{NODES}/{name}")
        assert (entry.id, entry.state, entry.traceparent) == (ENTRY, "inject", TRACE)


async def test_an_entry_written_before_is_not_written_again() -> None:
    fleet = Fleet(nodes=1)
    await fleet.delivery.inject(CORDON, ENTRY, [node("p-0")], TRACE)
    writes = len(fleet.member_api.sent("PATCH"))
    delivered = await fleet.delivery.inject(CORDON, ENTRY, [node("p-0")], "")
    assert (delivered.problems, delivered.failed) == ([], [])
    assert len(fleet.member_api.sent("PATCH")) == writes, "a successor changes nothing"
    (entry,) = await fleet.entries(f"{NODES}/p-0")
    assert entry.traceparent == TRACE


async def test_a_conflict_reads_again_and_keeps_what_others_wrote() -> None:
    fleet = Fleet(nodes=1)
    await fleet.delivery.observe([node("p-0")])
    await fleet.client.patch(f"{NODES}/p-0", {"metadata": {"annotations": {
        keys.FAULTS: render_entries([FaultEntry(id="other")])}}})
    delivered = await fleet.delivery.inject(CORDON, ENTRY, [node("p-0")], "")
    assert delivered.problems == []
    assert [e.id for e in await fleet.entries(f"{NODES}/p-0")] == ["other", ENTRY]
    assert [r.method for r in fleet.member_api.requests[-3:]] == ["PATCH", "GET", "PATCH"]


async def test_an_object_that_keeps_changing_is_given_up_on_with_a_message() -> None:
    fleet = Fleet(nodes=1)
    fleet.member_api.fail("PATCH", f"{NODES}/p-0", status=409, reason="Conflict",
                          times=CONFLICT_RETRIES)
    problem = await edit_entries(fleet.client, f"{NODES}/p-0", lambda entries, _: [
        *entries, FaultEntry(id=ENTRY)], "west/Node//p-0")
    assert problem == "west/Node//p-0: changed by others 8 times in a row; not written"
    assert await edit_entries(fleet.client, f"{NODES}/gone", lambda entries, _: entries,
                              "west/Node//gone") == "west/Node//gone: not found"


async def test_api_errors_are_to_try_again_and_gone_victims_are_problems() -> None:
    fleet = Fleet()
    fleet.member_api.fail("PATCH", f"{NODES}/p-1", status=500, reason="InternalError")
    delivered = await fleet.delivery.inject(
        CORDON, ENTRY, [node("p-0"), node("p-1"), node("nope"),
                        Victim("east", "Node", "e-0")], "")
    assert delivered.failed == ["west: Node p-1: 500 InternalError: injected fault"]
    assert sorted(delivered.problems) == ["east: Node e-0: the cluster is not reachable",
                                          "west: Node nope: not found"]


async def test_a_pod_entry_counts_the_restarts_already_made() -> None:
    fleet = Fleet()
    fleet.member_api.put("/api/v1/namespaces/ml/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
        "spec": {"nodeName": "p-0", "containers": [{"name": "main"}]},
        "status": {"containerStatuses": [{"name": "main", "restartCount": 2}]}})
    pod = Victim("west", "Pod", "train", "ml")
    fault = Fault.model_validate({"type": "ContainerExit", "exitCode": 1})
    delivered = await fleet.delivery.inject(fault, ENTRY, [pod], TRACE)
    assert delivered == type(delivered)([], [])
    (entry,) = await fleet.entries("/api/v1/namespaces/ml/pods/train")
    assert (entry.id, entry.traceparent) == (ENTRY, TRACE)
    assert entry.stages, "the exit, as stages the engine runs"


# -- recovery ----------------------------------------------------------------------------------

async def test_a_recovery_is_confirmed_once_the_engine_marked_the_entry_done() -> None:
    fleet = Fleet()
    victims = [node("p-0"), node("p-1")]
    await fleet.delivery.inject(CORDON, ENTRY, victims, "")
    delivered = await fleet.delivery.recover(CORDON, ENTRY, victims, TRACE)
    assert delivered.failed == []
    for name in ("p-0", "p-1"):
        (entry,) = await fleet.entries(f"{NODES}/{name}")
        assert (entry.state, entry.traceparent) == ("recover", TRACE)
    assert not await fleet.delivery.recovered(CORDON, ENTRY, victims), "not written back yet"
    await fleet.engine_marks_done("p-0")
    assert not await fleet.delivery.recovered(CORDON, ENTRY, victims)
    await fleet.engine_marks_done("p-1")
    assert await fleet.delivery.recovered(CORDON, ENTRY, victims)
    for name in ("p-0", "p-1"):
        assert await fleet.entries(f"{NODES}/{name}") == [], "removed once done"


async def test_a_lost_turn_to_recover_is_written_again_and_a_vanished_victim_is_back() -> None:
    fleet = Fleet()
    await fleet.delivery.inject(CORDON, ENTRY, [node("p-0"), node("p-1")], TRACE)
    await fleet.client.delete(f"{NODES}/p-1")
    # A restart between the decision and the flip: the entry is still inject.
    assert not await fleet.delivery.recovered(CORDON, ENTRY, [node("p-0"), node("p-1")])
    (entry,) = await fleet.entries(f"{NODES}/p-0")
    assert (entry.state, entry.traceparent) == ("recover", TRACE), "it keeps its trace"
    assert await fleet.delivery.recovered(CORDON, ENTRY, [node("p-1")]), \
        "not listed: gone, nothing left to undo"
    assert await fleet.delivery.recovered(CORDON, ENTRY, [Victim("east", "Node", "e-0")]), \
        "a FakeCluster that is gone took its nodes with it"


# -- a node Delete: the pool holds it ----------------------------------------------------------

async def test_a_deleted_node_is_held_by_its_pool_until_released_and_made_again() -> None:
    fleet = Fleet()
    await fleet.clusters()
    delivered = await fleet.delivery.inject(DELETE, ENTRY, [node("p-1")], TRACE)
    assert (delivered.problems, delivered.failed) == ([], [])
    pool = fleet.host_api.object(f"{POOLS}/p")
    assert pool is not None
    assert read_held(pool["metadata"]["annotations"]) == {ENTRY: ["p-1"]}
    assert pool["metadata"]["annotations"][keys.TRACEPARENT] == TRACE
    await fleet.client.delete(f"{NODES}/p-1")  # what the engine does
    await fleet.delivery.recover(DELETE, ENTRY, [node("p-1")], "")
    pool = fleet.host_api.object(f"{POOLS}/p")
    assert pool is not None
    assert keys.HELD_NODES not in pool["metadata"]["annotations"], \
        "released, though the node is gone: its pool was found by the hold"
    assert not await fleet.delivery.recovered(DELETE, ENTRY, [node("p-1")]), \
        "its pool still serves it: not back until the engine made it again"
    fleet.member_api.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "p-1", "labels": {keys.POOL: "p"}}, "status": {"conditions": [
            {"type": "Ready", "status": "True"}]}})
    assert await fleet.delivery.recovered(DELETE, ENTRY, [node("p-1")])


async def test_a_node_of_no_pool_cannot_be_deleted() -> None:
    fleet = Fleet()
    fleet.member_api.put(NODES, {"apiVersion": "v1", "kind": "Node",
                                 "metadata": {"name": "real"}})
    delivered = await fleet.delivery.inject(DELETE, ENTRY, [node("real")], "")
    assert delivered.problems == ["west: Node real: not a node of a FakeNodePool, so it "
                                  "cannot be deleted and made again"]


# -- a cluster fault: the FakeCluster's entry --------------------------------------------------

async def test_a_cluster_fault_is_an_entry_on_the_fakecluster_applied_at_once() -> None:
    fleet = Fleet()
    await fleet.clusters()
    down = Fault.model_validate({"type": "APIServerDown"})
    delivered = await fleet.delivery.inject(down, ENTRY, [WEST], TRACE)
    assert (delivered.problems, delivered.failed) == ([], [])
    (entry,) = await fleet.entries(f"{CLUSTERS}/west", fleet.host_api)
    assert (entry.stop, entry.traceparent) == (["kube-apiserver"], TRACE)
    assert fleet.applied == ["west"], "the operator stops the component now"
    await fleet.delivery.recover(down, ENTRY, [WEST], "")
    assert await fleet.entries(f"{CLUSTERS}/west", fleet.host_api) == []
    assert fleet.applied == ["west", "west"]
    fleet.components["kube-apiserver"] = False
    assert not await fleet.delivery.recovered(down, ENTRY, [WEST]), "not running again yet"
    fleet.components["kube-apiserver"] = True
    fleet.member_api.fail("GET", "/readyz", status=503, reason="ServiceUnavailable")
    assert not await fleet.delivery.recovered(down, ENTRY, [WEST]), "running, not ready"
    assert await fleet.delivery.recovered(down, ENTRY, [WEST])


async def test_a_lost_removal_of_a_cluster_entry_is_made_again() -> None:
    fleet = Fleet()
    await fleet.clusters()
    slow = Fault.model_validate({"type": "APIServerSlow", "latency": "500ms"})
    await fleet.delivery.inject(slow, ENTRY, [WEST], "")
    assert not await fleet.delivery.recovered(slow, ENTRY, [WEST])
    assert await fleet.entries(f"{CLUSTERS}/west", fleet.host_api) == []
    assert await fleet.delivery.recovered(slow, ENTRY, [WEST]), \
        "a slowdown is over once its entry is gone"


async def test_an_adopted_cluster_takes_hub_faults_but_its_processes_are_not_ours() -> None:
    fleet = Fleet(backend="external")
    await fleet.clusters()
    down = Fault.model_validate({"type": "SchedulerDown"})
    delivered = await fleet.delivery.inject(down, ENTRY, [WEST], "")
    assert delivered.problems == ["west: SchedulerDown needs a local control plane; this "
                                  "cluster is adopted (backend external), its processes are "
                                  "not ours"]
    assert fleet.applied == []
    cut = Fault.model_validate({"type": "HubPartition", "direction": "toHub"})
    assert (await fleet.delivery.inject(cut, ENTRY, [WEST], "")).problems == []


# -- Events ------------------------------------------------------------------------------------

async def test_each_node_victim_hears_of_it_in_its_cluster() -> None:
    fleet = Fleet()
    await fleet.delivery.observe([node("p-0")])
    await fleet.delivery.events([node("p-0"), WEST], "Warning", "FaultInjected",
                                "Cordon injected by FaultPlan default/p (step step)",
                                fleet.clock.now())
    (event,) = fleet.member_api.objects("/api/v1/namespaces/default/events")
    victim = fleet.member_api.object(f"{NODES}/p-0")
    assert victim is not None
    uid = victim["metadata"]["uid"]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "p-0",
                                       "uid": uid}
    assert (event["type"], event["reason"]) == ("Warning", "FaultInjected")
    assert event["source"] == {"component": "fakefleet-faultplan"}
    assert event["reportingComponent"] == "fakefleet-faultplan"
    assert event["lastTimestamp"] == "2026-01-01T00:00:00Z", "stamped by the clock given"
    await fleet.delivery.events([node("p-0")], "Warning", "FaultInjected",
                                "Cordon injected by FaultPlan default/p (step step)",
                                fleet.clock.now())
    assert len(fleet.member_api.objects("/api/v1/namespaces/default/events")) == 1, \
        "a repeat is refused as AlreadyExists, and that is fine"

