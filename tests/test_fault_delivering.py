"""A plan's writes into the fleet over in-memory API servers and a fake clock, channel by
channel: node and pod faults as one fault set per cluster (one create, however many victims;
written again after a restart, it changes nothing; chunked past its size; never over a
ConfigMap or namespace fakefleet did not make), turned to recovery with one write, confirmed
once the engine marked it done and then deleted, a lost turn written again; a Delete's hold in
its pool, a FakeCluster's entry applied at once; and the Events about victims."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from operators.api import faultsets
from operators.api.clusters import FakeCluster
from operators.api.faultplans import Fault
from operators.api.faultsets import FaultSet
from operators.api.injections import FaultEntry, read_entries, read_held
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
SETS = faultsets.CONFIGMAPS
ENTRY = "default/p-01234567/step/0"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
LATER = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
CORDON = Fault.model_validate({"type": "Cordon"})
DELETE = Fault.model_validate({"type": "Delete"})


class Fleet:
    """The host with FakeClusters west (and east), their member APIs with pool nodes, and what
    a Delivery needs of the runner (:class:`~operators.faults.delivering.Members`)."""

    def __init__(self, nodes: int = 2, *, backend: str = "local", east: int = 0,
                 name: str = "p-{index}") -> None:
        self.clock = FakeClock()
        self.host_api = MemoryTransport(self.clock)
        self.host = Client(self.host_api, clock=self.clock)
        self.apis: dict[str, MemoryTransport] = {}
        self.clients: dict[str, Client] = {}
        control_plane: dict[str, Any] = {"backend": backend}
        if backend == "external":
            control_plane["kubeconfigSecretRef"] = {"name": "west"}
        for cluster, count in (("west", nodes), ("east", east)):
            if cluster == "east" and not east:
                continue
            self.host_api.put(CLUSTERS, {"apiVersion": "fakefleet.dev/v1alpha1",
                                         "kind": "FakeCluster", "metadata": {"name": cluster},
                                         "spec": {"controlPlane": control_plane}})
            self.apis[cluster] = MemoryTransport(self.clock)
            self.clients[cluster] = Client(self.apis[cluster], clock=self.clock)
            for index in range(count):
                self.apis[cluster].put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
                    "name": name.format(index=index), "labels": {keys.POOL: "p"}}})
        self.member_api = self.apis["west"]
        self.client = self.clients["west"]
        self.host_api.put(POOLS, {"apiVersion": "fakefleet.dev/v1alpha1",
                                  "kind": "FakeNodePool", "metadata": {"name": "p"},
                                  "spec": {"clusterRef": "west", "replicas": nodes}})
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
        return self.clients.get(name)

    async def apply(self, cluster: str) -> None:
        self.applied.append(cluster)

    def running(self, cluster: str, component: str) -> bool | None:
        return self.components.get(component)

    async def entries(self, path: str, api: MemoryTransport | None = None) -> list[FaultEntry]:
        found = (api or self.member_api).object(path)
        assert found is not None
        return read_entries(found["metadata"].get("annotations"))[0]

    def sets(self, cluster: str = "west") -> list[FaultSet]:
        return [faultsets.read(item) for item in self.apis[cluster].objects(SETS)]

    async def engine_marks_done(self, cluster: str = "west") -> None:
        for found in self.sets(cluster):
            await self.clients[cluster].patch(f"{SETS}/{found.name}",
                                              {"data": {"state": "done"}})


def node(name: str, cluster: str = "west") -> Victim:
    return Victim(cluster, "Node", name)


WEST = Victim("west", "Cluster", "west")


# -- node and pod faults: a fault set per cluster -----------------------------------------------

async def test_a_thousand_victims_are_one_write_per_cluster() -> None:
    fleet = Fleet(nodes=1000, east=500)
    victims = [node(f"p-{i}") for i in range(1000)] + [node(f"p-{i}", "east")
                                                          for i in range(500)]
    await fleet.delivery.observe(victims)
    before = {cluster: len(api.requests) for cluster, api in fleet.apis.items()}
    delivered = await fleet.delivery.inject(CORDON, ENTRY, victims, TRACE)
    assert (delivered.problems, delivered.failed) == ([], [])
    for cluster, count in (("west", 1000), ("east", 500)):
        sent = fleet.apis[cluster].requests[before[cluster]:]
        assert [(r.method, r.path) for r in sent] == [
            ("GET", "/api/v1/namespaces/fakefleet-system"),
            ("POST", "/api/v1/namespaces"),
            ("POST", SETS)], "its namespace made once, then one set: nothing per victim"
        (found,) = fleet.sets(cluster)
        assert (found.id, found.kind, found.state, found.traceparent) == (ENTRY, "Node",
                                                                          "inject", TRACE)
        assert found.targets == count
        assert found.groups[0].entry.stages[0].name == "fault-cordon"
        namespace = fleet.apis[cluster].object("/api/v1/namespaces/fakefleet-system")
        assert namespace is not None
        assert namespace["metadata"]["annotations"][keys.OWNED_BY] == "fakefleet"
        owned = fleet.apis[cluster].objects(SETS)[0]["metadata"]["annotations"]
        assert owned[keys.OWNED_BY] == "FaultPlan/default/p"
    again = len(fleet.member_api.requests)
    await fleet.delivery.look(victims[:2])
    await fleet.delivery.inject(CORDON, "default/p-01234567/step/1", victims[:2], "")
    assert [r.method for r in fleet.member_api.requests[again:]] == ["GET", "POST"], \
        "the namespace is known now: the victims listed again, and one create"


async def test_a_set_written_before_a_restart_is_not_written_again() -> None:
    fleet = Fleet()
    victims = [node("p-0"), node("p-1")]
    await fleet.delivery.observe(victims)
    await fleet.delivery.inject(CORDON, ENTRY, victims, TRACE)
    successor = Delivery(plan="default/p", namespace="default", host=fleet.host,
                         members=fleet, apply=fleet.apply, running=fleet.running)
    await successor.observe(victims)
    before = len(fleet.member_api.requests)
    delivered = await successor.inject(CORDON, ENTRY, victims, LATER)
    assert (delivered.problems, delivered.failed) == ([], [])
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in fleet.member_api.requests[before:]
            ] == [("GET", "fakefleet-system"), ("POST", "configmaps"),
                  ("GET", faultsets.set_name(ENTRY, 0))], "409: read, and it is ours"
    (found,) = fleet.sets()
    assert found.traceparent == TRACE, "as it was first written"


async def test_a_configmap_or_namespace_fakefleet_did_not_make_is_left_alone() -> None:
    fleet = Fleet(east=1)
    fleet.member_api.put(SETS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": faultsets.set_name(ENTRY, 0)}, "data": {"mine": "yes"}})
    fleet.apis["east"].put("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": "fakefleet-system"}})
    victims = [node("p-0"), node("p-0", "east")]
    await fleet.delivery.observe(victims)
    delivered = await fleet.delivery.inject(CORDON, ENTRY, victims, "")
    assert delivered.failed == []
    west, east = delivered.problems
    assert west.startswith("west: Node p-0: ConfigMap fakefleet-system/fault-")
    assert "exists and FaultPlan/default/p did not make it" in west
    assert east.startswith("east: Node p-0: Namespace fakefleet-system exists and fakefleet "
                           "did not make it")
    assert fleet.member_api.objects(SETS)[0]["data"] == {"mine": "yes"}
    assert fleet.apis["east"].objects(SETS) == []


async def test_api_errors_are_to_try_again_and_gone_victims_are_problems() -> None:
    fleet = Fleet()
    fleet.member_api.fail("POST", SETS, status=500, reason="InternalError")
    victims = [node("p-0"), node("p-1"), node("nope"), Victim("east", "Node", "e-0")]
    await fleet.delivery.observe(victims)
    delivered = await fleet.delivery.inject(CORDON, ENTRY, victims, "")
    assert delivered.failed == ["west: Node p-0: 500 InternalError: injected fault",
                                "west: Node p-1: 500 InternalError: injected fault"]
    assert sorted(delivered.problems) == ["east: Node e-0: the cluster is not reachable",
                                          "west: Node nope: not found"]
    await fleet.delivery.observe(victims)  # the next round lists them again
    delivered = await fleet.delivery.inject(CORDON, ENTRY, victims, "")
    assert delivered.failed == []
    assert fleet.sets()[0].groups[0].targets == ("p-0", "p-1")


async def test_victims_past_a_set_s_size_go_to_further_chunks() -> None:
    long = "n" * 240 + "-{index}"
    fleet = Fleet(nodes=2200, name=long)
    victims = [node(long.format(index=i)) for i in range(2200)]
    await fleet.delivery.observe(victims)
    delivered = await fleet.delivery.inject(CORDON, ENTRY, victims, TRACE)
    assert (delivered.problems, delivered.failed) == ([], [])
    found = sorted(fleet.sets(), key=lambda each: each.name)
    assert [each.name for each in found] == [faultsets.set_name(ENTRY, 0),
                                             faultsets.set_name(ENTRY, 1)]
    assert sum(each.targets for each in found) == 2200
    assert {each.id for each in found} == {ENTRY}
    assert len(fleet.member_api.sent("POST", SETS)) == 2
    await fleet.delivery.recover(CORDON, ENTRY, victims, LATER)
    assert {(each.state, each.traceparent) for each in fleet.sets()} == {("recover", LATER)}
    assert len(fleet.member_api.sent("PATCH", f"{SETS}/.*")) == 2, "one write per chunk"


async def test_a_pod_s_entry_counts_its_restarts_and_the_exits_still_waiting_on_it() -> None:
    fleet = Fleet()
    fleet.member_api.put("/api/v1/namespaces/ml/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
        "spec": {"nodeName": "p-0", "containers": [{"name": "main"}]},
        "status": {"containerStatuses": [{"name": "main", "restartCount": 2}]}})
    uid = fleet.member_api.objects("/api/v1/namespaces/ml/pods")[0]["metadata"]["uid"]
    pod = Victim("west", "Pod", "train", "ml")
    fault = Fault.model_validate({"type": "ContainerExit", "exitCode": 1})
    await fleet.delivery.observe([pod])
    delivered = await fleet.delivery.inject(fault, ENTRY, [pod], TRACE)
    assert delivered == type(delivered)([], [])
    (found,) = fleet.sets()
    assert (found.kind, found.groups[0].targets) == ("Pod", (f"ml/train/{uid}",))

    def restarts(each: FaultSet) -> list[str]:
        return [r.values[0] for stage in each.groups[0].entry.stages
                for r in stage.selector.matchExpressions if r.key == "restarts"]
    assert restarts(found) == ["2"]
    await fleet.delivery.observe([pod])
    await fleet.delivery.inject(fault, "default/p-01234567/again/0", [pod], TRACE)
    later = next(each for each in fleet.sets() if each.id != ENTRY)
    assert restarts(later) == ["3"], "after the exit still waiting to fire"


# -- recovery ----------------------------------------------------------------------------------

async def test_recovery_is_one_write_and_confirmed_once_the_engine_marked_the_set_done() -> None:
    fleet = Fleet(nodes=1000)
    victims = [node(f"p-{i}") for i in range(1000)]
    await fleet.delivery.observe(victims)
    await fleet.delivery.inject(CORDON, ENTRY, victims, TRACE)
    before = len(fleet.member_api.requests)
    delivered = await fleet.delivery.recover(CORDON, ENTRY, victims, LATER)
    assert delivered.failed == []
    sent = fleet.member_api.requests[before:]
    assert [(r.method, r.path) for r in sent] == [
        ("GET", SETS), ("PATCH", f"{SETS}/{faultsets.set_name(ENTRY, 0)}")]
    assert sent[0].query == {"labelSelector": faultsets.selector(ENTRY)}
    assert sent[1].json()["metadata"]["resourceVersion"], "conditional"
    (found,) = fleet.sets()
    assert (found.state, found.traceparent) == ("recover", LATER)
    assert not await fleet.delivery.recovered(CORDON, ENTRY, victims), "not written back yet"
    await fleet.engine_marks_done()
    before = len(fleet.member_api.requests)
    assert await fleet.delivery.recovered(CORDON, ENTRY, victims)
    assert fleet.sets() == [], "deleted once done"
    assert [r.method for r in fleet.member_api.requests[before:]] == ["GET", "GET", "DELETE"], \
        "listed, then read and deleted as the plan's own: nothing per victim"
    assert await fleet.delivery.recovered(CORDON, ENTRY, victims), "gone: nothing to undo"


async def test_a_lost_turn_to_recover_is_written_again_and_a_vanished_cluster_is_back() -> None:
    fleet = Fleet()
    victims = [node("p-0"), node("p-1")]
    await fleet.delivery.observe(victims)
    await fleet.delivery.inject(CORDON, ENTRY, victims, TRACE)
    # A restart between the decision and the flip: the set is still inject.
    assert not await fleet.delivery.recovered(CORDON, ENTRY, victims)
    (found,) = fleet.sets()
    assert (found.state, found.traceparent) == ("recover", TRACE), "it keeps its trace"
    await fleet.engine_marks_done()
    assert await fleet.delivery.recovered(CORDON, ENTRY, victims)
    assert await fleet.delivery.recovered(CORDON, ENTRY, [Victim("east", "Node", "e-0")]), \
        "a FakeCluster that is gone took its nodes with it"


async def test_a_turn_that_conflicts_is_computed_again_from_the_set_as_it_is() -> None:
    fleet = Fleet()
    victims = [node("p-0")]
    await fleet.delivery.observe(victims)
    await fleet.delivery.inject(CORDON, ENTRY, victims, TRACE)
    fleet.member_api.fail("PATCH", f"{SETS}/.*", status=409, reason="Conflict")
    delivered = await fleet.delivery.recover(CORDON, ENTRY, victims, LATER)
    assert delivered.failed == []
    assert fleet.sets()[0].state == "recover"
    assert len(fleet.member_api.sent("GET", f"{SETS}/.*")) == 1, "read again after the 409"


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


async def test_a_fakecluster_that_keeps_changing_is_given_up_on_with_a_message() -> None:
    fleet = Fleet()
    path = f"{CLUSTERS}/west"
    fleet.host_api.fail("PATCH", path, status=409, reason="Conflict", times=CONFLICT_RETRIES)
    problem = await edit_entries(fleet.host, path, lambda entries, _: [
        *entries, FaultEntry(id=ENTRY)], "FakeCluster west")
    assert problem == "FakeCluster west: changed by others 8 times in a row; not written"
    assert len(fleet.host_api.sent("GET", path)) == 1 + CONFLICT_RETRIES, "read, then again"
    assert await edit_entries(fleet.host, f"{CLUSTERS}/gone", lambda entries, _: entries,
                              "FakeCluster gone") == "FakeCluster gone: not found"


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

async def test_a_fault_set_s_victims_hear_of_it_in_one_event_per_cluster() -> None:
    fleet = Fleet(nodes=8)
    victims = [node(f"p-{i}") for i in range(8)]
    await fleet.delivery.observe(victims)
    await fleet.delivery.inject(CORDON, ENTRY, victims, "")
    await fleet.delivery.events(CORDON, ENTRY, [*victims, WEST], "Warning", "FaultInjected",
                                "Cordon injected by FaultPlan default/p (step step)",
                                fleet.clock.now())
    (event,) = fleet.member_api.objects("/api/v1/namespaces/fakefleet-system/events")
    (found,) = fleet.sets()
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "ConfigMap",
                                       "name": found.name, "namespace": "fakefleet-system",
                                       "uid": found.uid}
    assert (event["type"], event["reason"]) == ("Warning", "FaultInjected")
    assert event["message"] == ("Cordon injected by FaultPlan default/p (step step) on 8 "
                                "node(s): p-0, p-1, p-2, p-3, p-4 (and 3 more)")
    assert event["source"] == {"component": "fakefleet-faultplan"}
    assert event["reportingComponent"] == "fakefleet-faultplan"
    assert event["lastTimestamp"] == "2026-01-01T00:00:00Z", "stamped by the clock given"
    assert fleet.member_api.objects("/api/v1/namespaces/default/events") == [], \
        "none per victim"


async def test_each_deleted_node_hears_of_it_in_its_cluster() -> None:
    fleet = Fleet()
    await fleet.delivery.observe([node("p-0")])
    await fleet.delivery.events(DELETE, ENTRY, [node("p-0"), WEST], "Warning",
                                "FaultInjected", "Delete injected by FaultPlan default/p "
                                "(step step)", fleet.clock.now())
    (event,) = fleet.member_api.objects("/api/v1/namespaces/default/events")
    victim = fleet.member_api.object(f"{NODES}/p-0")
    assert victim is not None
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "p-0",
                                       "uid": victim["metadata"]["uid"]}
    await fleet.delivery.events(DELETE, ENTRY, [node("p-0")], "Warning", "FaultInjected",
                                "Delete injected by FaultPlan default/p (step step)",
                                fleet.clock.now())
    assert len(fleet.member_api.objects("/api/v1/namespaces/default/events")) == 1, \
        "a repeat is refused as AlreadyExists, and that is fine"
