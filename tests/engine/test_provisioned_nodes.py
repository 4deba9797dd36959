"""Nodes a provisioner (Karpenter's KWOK provider) makes for a pool with ``provisioner:
karpenter``: taken over by the engine as a kubelet would, played like its own, let go when
Karpenter deletes them; never created, deleted or relabelled by the engine."""

from __future__ import annotations

import copy
from typing import Any

from operators.engine.registering import remove_all
from operators.k8s.client import Client
from tests.engine.harness import LEASES, NODES, PODS, POOLS, Fleet, pod, pool, ready

H100 = {"preset": "H100-SXM5-80GB"}
TYPE = "h100-sxm5-80gb-8gpu"
LABELS = {"fakefleet.dev/pool": "gpu", "karpenter.sh/nodepool": "gpu",
          "node.kubernetes.io/instance-type": TYPE, "kubernetes.io/arch": "amd64",
          "karpenter.kwok.sh/kwoknodeclass": "gpu", "kubernetes.io/hostname": "gpu-abcde",
          "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "kwok.x-k8s.io/node": "fake"}
TAINTS = [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
          {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
          {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def karpenter_node(name: str, *, pool_name: str = "gpu", **spec: Any) -> dict[str, Any]:
    """A Node as Karpenter's KWOK provider creates it (kwok/cloudprovider/cloudprovider.go
    toNode): capacity is what its pods request, no addresses, conditions or pod CIDR."""
    labels = {**LABELS, "fakefleet.dev/pool": pool_name, "karpenter.sh/nodepool": pool_name}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "finalizers": ["karpenter.sh/termination"],
                     "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                                          "name": "gpu-abcde", "uid": "claim-uid"}]},
        "spec": {"providerID": f"kwok://{name}", "taints": copy.deepcopy(TAINTS), **spec},
        "status": {"capacity": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8",
                                "pods": "1"},
                   "allocatable": {"cpu": "191900m", "memory": "1966070Mi",
                                   "nvidia.com/gpu": "8", "pods": "110"},
                   "phase": "Pending"},
    }


def mine(node: dict[str, Any]) -> dict[str, Any]:
    """What is Karpenter's on a node: the engine must leave it as it is."""
    metadata = node["metadata"]
    return {"labels": metadata.get("labels"), "finalizers": metadata.get("finalizers"),
            "ownerReferences": metadata.get("ownerReferences"),
            "taints": node["spec"].get("taints"), "allocatable": node["status"]["allocatable"]}


async def test_a_karpenter_node_of_a_provisioner_pool_is_taken_over_as_a_kubelet_would() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", replicas=3, gpu=H100))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(2)
        assert fleet.nodes() == {}, "the engine makes no node of a provisioner's pool"
        before = fleet.member.put(NODES, karpenter_node("kwok-gpu-abcde-1"))
        await fleet.clock.advance(2)
        node = fleet.nodes()["kwok-gpu-abcde-1"]
        assert node["spec"]["podCIDR"] == "10.128.0.0/24"
        assert node["spec"]["podCIDRs"] == ["10.128.0.0/24"]
        assert ready(node) == "True"
        assert {a["type"]: a["address"] for a in node["status"]["addresses"]} == {
            "InternalIP": "127.64.0.1", "Hostname": "kwok-gpu-abcde-1"}
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
        assert node["status"]["phase"] == "Running"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
        # The real size of its instance type, where Karpenter wrote its pods' requests.
        assert node["status"]["capacity"] == {
            "cpu": "192", "memory": "1920Gi", "ephemeral-storage": "8Ti", "pods": "110",
            "nvidia.com/gpu": "8"}
        assert mine(node) == mine(before)
        assert sorted(fleet.leases()) == ["kwok-gpu-abcde-1"]
        assert engine.book.records["kwok-gpu-abcde-1"].slot == 0
        assert fleet.engine_sent("POST", NODES) == []
        assert fleet.engine_sent("DELETE", ".*") == []
        await fleet.clock.advance(2)
        status = fleet.pool_status("gpu")
        assert (status["replicas"], status["readyReplicas"]) == (1, 1)
        assert {c["type"]: c["message"] for c in status["conditions"]}["Ready"] == \
            "1/1 nodes Ready, made by Karpenter"


async def test_karpenter_s_later_changes_to_labels_and_taints_are_never_undone() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()):
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(2)
        # Karpenter registers and initialises it; the node-lifecycle controller lifts not-ready.
        await fleet.member_client_patch(f"{NODES}/kwok-gpu-x", {
            "metadata": {"labels": {"karpenter.sh/registered": "true",
                                    "karpenter.sh/initialized": "true"}},
            "spec": {"taints": [TAINTS[2], {"key": "karpenter.sh/disrupted",
                                            "effect": "NoSchedule"}]}})
        changed = fleet.nodes()["kwok-gpu-x"]
        await fleet.clock.advance(400)  # leases, a status report, resyncs
        node = fleet.nodes()["kwok-gpu-x"]
        assert mine(node) == mine(changed)
        assert ready(node) == "True"
        assert len(fleet.engine_sent("PATCH", f"{NODES}/kwok-gpu-x")) == 1, "its pod CIDR"


async def test_a_node_karpenter_deletes_is_drained_and_let_go_with_its_lease() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100,
                               pods={"terminationGracePeriodCap": "2s"}))
    async with fleet.running(fleet.engine()) as engine:
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(2)
        fleet.member.put(PODS, pod("p", "kwok-gpu-x"))
        await fleet.clock.advance(1)
        assert fleet.pod("p")["status"]["podIP"] == "10.128.0.2"
        # Karpenter's termination: the Node is deleted (its finalizer holds it), its pods
        # evicted (deleted with their grace period); the engine finishes them like a kubelet.
        member = Client(fleet.member, clock=fleet.clock)
        await member.delete(f"{NODES}/kwok-gpu-x")
        await member.delete(f"{PODS}/p")
        await fleet.clock.advance(3)
        assert fleet.member.object(f"{PODS}/p") is None
        assert "kwok-gpu-x" in engine.book.records, "played until it is gone"
        await fleet.member_client_patch(f"{NODES}/kwok-gpu-x", {"metadata": {"finalizers": []}})
        await fleet.clock.advance(2)
        assert fleet.nodes() == {}
        assert fleet.leases() == {}
        assert engine.book.records == {}
        assert engine.book.by_slot == {}
        assert engine.book.released == set()
        fleet.member.requests.clear()
        await fleet.clock.advance(60)
        assert fleet.member.sent("PATCH", f"{LEASES}/.*") == [], "no heartbeat for it"
        # Its slot is free for the next one.
        fleet.member.put(NODES, karpenter_node("kwok-gpu-y"))
        await fleet.clock.advance(2)
        assert fleet.nodes()["kwok-gpu-y"]["spec"]["podCIDR"] == "10.128.0.0/24"
        assert fleet.engine_sent("DELETE", NODES + "/.*") == []


async def test_a_fault_on_a_karpenter_node_is_played_and_healed() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()):
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(2)
        await fleet.member_client_patch(f"{NODES}/kwok-gpu-x", {
            "metadata": {"annotations": {"fakefleet.dev/state": "NotReady"}}})
        await fleet.clock.advance(40)  # resyncs do not take it over again as if new
        assert ready(fleet.nodes()["kwok-gpu-x"]) == "False"
        await fleet.member_client_patch(f"{NODES}/kwok-gpu-x", {
            "metadata": {"annotations": {"fakefleet.dev/state": None}}})
        await fleet.clock.advance(2)
        assert ready(fleet.nodes()["kwok-gpu-x"]) == "True"


async def test_nodes_of_pools_without_a_provisioner_are_left_alone() -> None:
    """A node that looks like Karpenter's but whose pool has no provisioner (or no pool at
    all) is neither taken over nor deleted."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()) as engine:
        fleet.member.put(NODES, karpenter_node("kwok-cpu-x", pool_name="cpu"))
        fleet.member.put(NODES, karpenter_node("kwok-gone-x", pool_name="gone"))
        await fleet.clock.advance(40)
        assert sorted(fleet.nodes()) == ["cpu-0", "kwok-cpu-x", "kwok-gone-x"]
        assert sorted(engine.book.records) == ["cpu-0"]
        assert fleet.engine_sent("PATCH", f"{NODES}/kwok-.*") == []
        assert fleet.nodes()["kwok-cpu-x"]["status"]["phase"] == "Pending"


async def test_a_restarted_engine_plays_the_node_it_took_without_taking_it_again() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()):
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(2)
    taken = fleet.nodes()["kwok-gpu-x"]
    fleet.engine_requests.clear()
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(30)
        assert engine.book.records["kwok-gpu-x"].slot == 0
        assert fleet.engine_sent("PATCH", f"{NODES}/kwok-gpu-x(/status)?") == []
        assert fleet.engine_sent("PATCH", f"{LEASES}/kwok-gpu-x"), "its Lease renewed"
        assert fleet.nodes()["kwok-gpu-x"]["spec"] == taken["spec"]


async def test_a_node_whose_take_over_was_cut_short_is_finished_after_a_restart() -> None:
    """The engine wrote the pod CIDR and stopped before the status: a restarted engine plays
    the node on that slot and writes the rest."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    fleet.member.put(NODES, karpenter_node("kwok-gpu-x", podCIDR="10.128.5.0/24",
                                           podCIDRs=["10.128.5.0/24"]))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(3)
        node = fleet.nodes()["kwok-gpu-x"]
        assert engine.book.records["kwok-gpu-x"].slot == 5
        assert ready(node) == "True"
        assert node["status"]["addresses"][0]["address"] == "127.64.0.6"
        assert node["status"]["capacity"]["cpu"] == "192"


async def test_a_failed_take_over_is_retried_and_its_slot_kept_once_its_cidr_is_written(
) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()) as engine:
        fleet.member.fail("PATCH", f"{NODES}/kwok-gpu-x/status", status=500, times=1)
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        fleet.member.put(NODES, karpenter_node("kwok-gpu-y"))
        await fleet.clock.advance(5)
        nodes = fleet.nodes()
        cidrs = {name: nodes[name]["spec"]["podCIDR"] for name in ("kwok-gpu-x", "kwok-gpu-y")}
        assert sorted(cidrs.values()) == ["10.128.0.0/24", "10.128.1.0/24"]
        assert all(ready(nodes[name]) == "True" for name in cidrs)
        assert {name: engine.book.records[name].slot for name in cidrs} == {
            name: int(cidr.split(".")[2]) for name, cidr in cidrs.items()}


async def test_removing_a_cluster_s_nodes_leaves_karpenter_s_to_karpenter() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()) as engine:
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(2)
    left = await remove_all(Client(fleet.member, clock=fleet.clock), engine.cluster)
    assert left == 0
    assert sorted(fleet.nodes()) == ["kwok-gpu-x"]


async def test_a_pool_deleted_meanwhile_keeps_its_played_nodes_until_karpenter_removes_them(
) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()) as engine:
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(2)
        await Client(fleet.host, clock=fleet.clock).delete(f"{POOLS}/gpu")
        fleet.member.put(NODES, karpenter_node("kwok-gpu-late"))
        await fleet.clock.advance(60)
        assert "kwok-gpu-x" in engine.book.records
        assert fleet.engine_sent("PATCH", f"{LEASES}/kwok-gpu-x")
        assert "kwok-gpu-late" not in engine.book.records, "none taken for a pool gone"
        assert fleet.engine_sent("DELETE", NODES + "/.*") == []


async def test_a_take_over_is_one_status_write_and_one_lease_even_if_the_watch_is_quicker(
) -> None:
    """The watch shows the pod CIDR while the status write is still under way (a busy API
    server answers it late): the node is not adopted from that half-written state, which would
    renew a Lease that does not exist yet (404, then a POST) and write its Ready condition a
    second time."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", f"{NODES}/kwok-gpu-x/status", delay=2)
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(5)
        assert ready(fleet.nodes()["kwok-gpu-x"]) == "True"
        assert len(fleet.engine_sent("PATCH", f"{NODES}/kwok-gpu-x")) == 1, "its pod CIDR"
        assert len(fleet.engine_sent("PATCH", f"{NODES}/kwok-gpu-x/status")) == 1
        assert len(fleet.engine_sent("POST", LEASES)) == 1
        assert fleet.engine_sent("PATCH", f"{LEASES}/kwok-gpu-x") == [], "renewed from 10 s"
        assert engine.book.records["kwok-gpu-x"].slot == 0
        await fleet.clock.advance(10)
        assert len(fleet.engine_sent("PATCH", f"{LEASES}/kwok-gpu-x")) == 1
        assert len(fleet.engine_sent("PATCH", f"{NODES}/kwok-gpu-x/status")) == 1


async def test_a_watch_behind_the_take_over_neither_takes_the_node_again_nor_posts_ready_twice(
) -> None:
    """Karpenter registers the node between the engine's two writes, and the watch shows that
    change only after the take-over's status write was answered (a busy API server's watch
    cache lags behind its answers): the engine keeps what its write answered until the watch
    catches up with it, rather than playing the older view (no status yet) as the node's."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", f"{NODES}/kwok-gpu-x/status", delay=2)
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(1)  # its pod CIDR written and seen, its status under way
        fleet.member.hold_watches()
        await fleet.member_client_patch(f"{NODES}/kwok-gpu-x", {
            "metadata": {"labels": {"karpenter.sh/registered": "true"}},
            "spec": {"taints": TAINTS[1:]}})
        registered = fleet.nodes()["kwok-gpu-x"]["metadata"]["resourceVersion"]
        await fleet.clock.advance(3)  # the status written and answered, not yet watched
        assert "kwok-gpu-x" in engine.book.records
        fleet.member.release_watches(through=registered)
        await fleet.clock.advance(35)  # a resync of the plan among them
        fleet.member.release_watches()
        await fleet.clock.advance(35)
        assert ready(fleet.nodes()["kwok-gpu-x"]) == "True"
        assert len(fleet.engine_sent("PATCH", f"{NODES}/kwok-gpu-x/status")) == 1
        assert len(fleet.engine_sent("PATCH", f"{NODES}/kwok-gpu-x")) == 1, "its pod CIDR"
        assert fleet.nodes()["kwok-gpu-x"]["metadata"]["labels"]["karpenter.sh/registered"] \
            == "true"


async def test_a_pod_bound_before_the_take_over_is_answered_runs_once_the_node_is_played(
) -> None:
    """A busy API server stores the take-over's Ready at once and answers it late: meanwhile
    Karpenter registers the node, kube-scheduler binds a pod to it, and the pod watch shows
    that pod before the node is played. A kubelet sees every pod bound to its node: the pod is
    kept and runs once the take-over's answer plays the node, not after the pod watch happens
    to list again (only on a 410)."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", f"{NODES}/kwok-gpu-x/status", late=2)
        fleet.member.put(NODES, karpenter_node("kwok-gpu-x"))
        await fleet.clock.advance(1)  # Ready stored and watched, its answer under way
        assert ready(fleet.nodes()["kwok-gpu-x"]) == "True"
        assert "kwok-gpu-x" not in engine.book.records
        fleet.member.put(PODS, pod("p", "kwok-gpu-x"))
        await fleet.clock.advance(0.5)
        assert "kwok-gpu-x" not in engine.book.records, "the pod came first"
        await fleet.clock.advance(10)
        status = fleet.pod("p")["status"]
        assert status["phase"] == "Running"
        assert status["podIP"] == "10.128.0.2"
        assert status["hostIP"] == "127.64.0.1"
        lists = [r for r in fleet.engine_sent("GET", "/api/v1/pods")
                 if "watch" not in dict(r.params)]
        assert len(lists) == 1, "listed once, not again"
        assert engine.pods.unplayed == {}


async def test_pods_bound_to_a_node_deleted_before_its_take_over_ends_are_let_go() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", provisioner="karpenter", gpu=H100))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.fail("PATCH", f"{NODES}/kwok-gpu-x/status", delay=2)
        node = karpenter_node("kwok-gpu-x")
        del node["metadata"]["finalizers"]
        fleet.member.put(NODES, node)
        await fleet.clock.advance(1)  # its take-over under way
        fleet.member.put(PODS, pod("p", "kwok-gpu-x"))
        fleet.member.put(PODS, pod("q", "kwok-gpu-x"))
        await fleet.clock.advance(0.5)
        assert sorted(engine.pods.unplayed["kwok-gpu-x"]) == sorted(
            fleet.pod(name)["metadata"]["uid"] for name in ("p", "q"))
        member = Client(fleet.member, clock=fleet.clock)
        await member.delete(f"{PODS}/q", body={"gracePeriodSeconds": 0})
        await fleet.clock.advance(0.1)
        assert sorted(engine.pods.unplayed["kwok-gpu-x"]) == [fleet.pod("p")["metadata"]["uid"]]
        await member.delete(f"{NODES}/kwok-gpu-x")
        await fleet.clock.advance(5)
        assert "kwok-gpu-x" not in engine.book.records
        assert engine.pods.unplayed == {}
