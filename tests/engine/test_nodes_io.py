"""Node writes that fail, nodes that are not the engine's, and what the pool status says."""

from __future__ import annotations

import json
from typing import Any

import pytest

from operators.engine.registering import remove_all
from operators.k8s import requests
from operators.k8s.client import Client
from operators.k8s.errors import Unauthorized
from tests.engine.harness import ENGINE_NAME, LEASES, NODES, POOLS, Fleet, pool, ready


def foreign_node(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"fakefleet.dev/pool": "cpu"}},
            "spec": spec, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


async def test_a_failed_delete_keeps_the_node_counted_until_it_succeeds() -> None:
    """Defect: a failed node DELETE forgot the node anyway; counts said 0 while it existed."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(2)
        fleet.member.fail("DELETE", f"{NODES}/cpu-1", status=500, times=3)
        await fleet.host_client_patch(f"{POOLS}/cpu", {"spec": {"replicas": 1}})
        await fleet.clock.advance(1.2)
        assert len(fleet.member.sent("DELETE", f"{NODES}/cpu-1")) >= 1
        assert "cpu-1" in fleet.nodes()
        assert engine.book.counts("cpu") == (2, 2), "still there, still counted"
        assert fleet.pool_status("cpu")["replicas"] == 2
        await fleet.clock.advance(10)  # back-off, then the delete goes through
        assert sorted(fleet.nodes()) == ["cpu-0"]
        assert sorted(fleet.leases()) == ["cpu-0"]
        assert engine.book.counts("cpu") == (1, 1)
        await fleet.clock.advance(2)
        assert fleet.pool_status("cpu")["replicas"] == 1


async def test_ready_replicas_are_the_nodes_the_api_shows_ready() -> None:
    """Defect: readyReplicas counted nodes created, not nodes Ready."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=3))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(2)
        assert fleet.pool_status("cpu")["readyReplicas"] == 3
        # The node-lifecycle controller marks cpu-2 Unknown while the engine is away from it,
        # and someone asks cpu-1 to be NotReady: the count follows the API, not the engine.
        fleet.member.fail("PATCH", f"{NODES}/cpu-2/status", status=503, times=3)
        await fleet.member_client_patch(f"{NODES}/cpu-2/status", {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}},
            strategic=True, bypass_faults=True)
        await fleet.member_client_patch(
            f"{NODES}/cpu-1", {"metadata": {"annotations": {"fakefleet.dev/state": "NotReady"}}})
        await fleet.clock.advance(1.5)
        status = fleet.pool_status("cpu")
        assert (status["replicas"], status["readyReplicas"]) == (3, 1)
        assert ready(fleet.nodes()["cpu-1"]) == "False"
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
        await fleet.clock.advance(20)  # the kubelet posts Ready again once it can write
        assert ready(fleet.nodes()["cpu-2"]) == "True"
        await fleet.member_client_patch(
            f"{NODES}/cpu-1", {"metadata": {"annotations": {"fakefleet.dev/state": None}}})
        await fleet.clock.advance(2)
        assert fleet.pool_status("cpu")["readyReplicas"] == 3


async def test_an_unreachable_node_stops_renewing_its_lease_and_resumes_when_healed() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        await fleet.member_client_patch(
            f"{NODES}/cpu-0", {"metadata": {"annotations": {"fakefleet.dev/state": "Unreachable"}}})
        await fleet.clock.advance(1)
        fleet.member.requests.clear()
        await fleet.clock.advance(60)
        assert fleet.member.sent("PATCH", f"{LEASES}/cpu-0") == [], "no renewal while away"
        await fleet.member_client_patch(
            f"{NODES}/cpu-0", {"metadata": {"annotations": {"fakefleet.dev/state": None}}})
        await fleet.clock.advance(1)
        assert len(fleet.member.sent("PATCH", f"{LEASES}/cpu-0")) == 1, "renewed at once"


async def test_an_answer_lost_after_a_create_adopts_the_node_instead_of_looping() -> None:
    """Defect: an AlreadyExists on create looped with no delay."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    fleet.member.fail("POST", NODES, reset=True, applied=True)  # created, answer lost
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(5)
        assert sorted(fleet.nodes()) == ["cpu-0", "cpu-1"]
        assert sorted(engine.book.records) == ["cpu-0", "cpu-1"]
    assert len(fleet.member.sent("POST", NODES)) <= 4


async def test_foreign_and_unusable_nodes_are_left_alone_with_a_warning() -> None:
    """Defects: a labelled node with an IPv6 pod CIDR ended the engine; a foreign node with
    the pool label was deleted; a create hitting a foreign name looped with no delay."""
    fleet = Fleet()
    fleet.member.put(NODES, foreign_node("cpu-1", podCIDR="fd00::/64",
                                         providerID="aws:///eu-west-1a/i-0abc"))
    fleet.member.put(NODES, foreign_node("cpu-7", podCIDR="fd00:1::/64"))
    fleet.host.put(POOLS, pool("cpu", replicas=3))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(120)
        assert sorted(engine.book.records) == ["cpu-0", "cpu-2"]
        status = fleet.pool_status("cpu")
    assert sorted(fleet.nodes()) == ["cpu-0", "cpu-1", "cpu-2", "cpu-7"], "nothing deleted"
    assert fleet.member.sent("POST", NODES).__len__() == 2, "no create of a foreign name"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Stalled"] == "True"
    assert "cpu-1" in status["conditions"][2]["message"]
    events = fleet.member.objects("/api/v1/namespaces/default/events")
    warned = sorted(e["involvedObject"]["name"] for e in events if e["reason"] == "NodeNotManaged")
    assert warned == ["cpu-1", "cpu-7"]
    assert "not made by this engine" in events[0]["message"]


async def test_a_name_held_by_a_node_without_the_pool_label_stalls_the_pool_until_it_goes(
) -> None:
    """Defect: a node without the pool label holding a pool's name (someone's node, or ours
    with the label taken off) failed every reconcile and said nothing."""
    fleet = Fleet()
    unlabelled = foreign_node("cpu-1")
    del unlabelled["metadata"]["labels"]
    fleet.member.put(NODES, unlabelled)
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(120)
        assert sorted(engine.book.records) == ["cpu-0"]
        stalled = {c["type"]: c for c in fleet.pool_status("cpu")["conditions"]}["Stalled"]
        assert stalled["status"] == "True"
        assert "node cpu-1 exists and was not made by this engine" in stalled["message"]
        posts = [json.loads(r.body or b"{}")["metadata"]["name"]
                 for r in fleet.member.sent("POST", NODES)]
        assert posts.count("cpu-1") <= 1 + 120 / 30, "tried again once per resync, no faster"
        await fleet.member.send(requests.delete(f"{NODES}/cpu-1"))  # the user deletes it
        await fleet.clock.advance(35)
        assert sorted(engine.book.records) == ["cpu-0", "cpu-1"]
        node = fleet.member.object(f"{NODES}/cpu-1")
        assert node is not None
        assert node["metadata"]["labels"]["fakefleet.dev/pool"] == "cpu"
        stalled = {c["type"]: c for c in fleet.pool_status("cpu")["conditions"]}["Stalled"]
        assert stalled["status"] == "False"


async def test_a_full_pod_network_stalls_the_pool_with_a_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("operators.engine.nodes.MAX_NODES_PER_CLUSTER", 3)
    fleet = Fleet()
    fleet.host.put(POOLS, pool("a", replicas=2))
    fleet.host.put(POOLS, pool("b", replicas=2))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(3)
        assert len(fleet.nodes()) == 3
        status = fleet.pool_status("b")
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True"
    assert "has room for 3 nodes" in stalled["message"]
    assert "lower the replicas" in stalled["message"]


async def test_one_pool_whose_status_cannot_be_written_holds_back_no_other() -> None:
    """Defect: the first pool whose status write failed (a 403, say) stopped the status writes
    of every pool after it until it succeeded."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("a", replicas=1))
    fleet.host.put(POOLS, pool("b", replicas=2))
    fleet.host.fail("PATCH", f"{POOLS}/a/status", status=403, times=1000)
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(30)
        assert fleet.pool_status("a") == {}
        assert fleet.pool_status("b")["readyReplicas"] == 2


async def test_a_node_made_again_while_the_watch_was_away_is_adopted_under_its_new_uid() -> None:
    """Defect: a relist showing a node of the same name with a new uid kept the old uid, so
    its new Lease named a gone owner (and the garbage collector deleted it again)."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(5)
        node = fleet.member.object(f"{NODES}/cpu-0")
        assert node is not None
        old_uid = node["metadata"]["uid"]
        fleet.member.break_watches()
        await fleet.member.send(requests.delete(f"{NODES}/cpu-0"))
        await fleet.member.send(requests.delete(f"{LEASES}/cpu-0"))
        for field in ("uid", "resourceVersion", "creationTimestamp"):
            node["metadata"].pop(field, None)
        new_uid = fleet.member.put(NODES, node)["metadata"]["uid"]
        assert new_uid != old_uid
        fleet.member.compact()  # the watch cannot resume: the engine sees only a new list
        await fleet.clock.advance(60)
        assert engine.book.records["cpu-0"].uid == new_uid
        lease = fleet.member.object(f"{LEASES}/cpu-0")
        assert lease is not None
        assert lease["metadata"]["ownerReferences"][0]["uid"] == new_uid


async def test_a_change_while_a_node_stage_is_written_does_not_write_it_twice() -> None:
    """Defect: a node update during a slow stage write chose the same stage again from the
    uncommitted state and wrote it twice."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(5)
        status_path = f"{NODES}/cpu-0/status"
        before = len(fleet.member.sent("PATCH", status_path))
        fleet.member.fail("PATCH", status_path, delay=3)
        await fleet.member.send(requests.patch(
            f"{NODES}/cpu-0", {"metadata": {"annotations": {"fakefleet.dev/state": "NotReady"}}}))
        await fleet.clock.advance(1)  # NotReady is being written, slowly
        await fleet.member.send(requests.patch(
            f"{NODES}/cpu-0", {"metadata": {"labels": {"example.com/team": "ml"}}}))
        await fleet.clock.advance(5)
        assert len(fleet.member.sent("PATCH", status_path)) - before == 1
        node = fleet.member.object(f"{NODES}/cpu-0")
        assert node is not None
        ready = {c["type"]: c for c in node["status"]["conditions"]}["Ready"]
        assert ready["status"] == "False"


async def test_a_template_change_removes_what_the_old_template_gave_and_nothing_else() -> None:
    """Defect: reshaping merged the new template over the old one, so a pool that dropped its
    GPUs kept nvidia.com labels and capacity (the scheduler kept placing GPU pods there), and
    the taint list was replaced whole, wiping the controllers' taints."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", replicas=1, gpu={"preset": "H100-SXM5-80GB"},
                               template={"labels": {"team": "a"}}))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(5)
        await fleet.member.send(requests.patch(f"{NODES}/gpu-0", {
            "metadata": {"labels": {"example.com/owner": "ml"}},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}))
        await fleet.host.send(requests.patch(f"{POOLS}/gpu", {"metadata": {"generation": 2},
            "spec": {"gpu": None, "template": {"labels": {"team": None, "tier": "b"}}}}))
        await fleet.clock.advance(35)
        node = fleet.member.object(f"{NODES}/gpu-0")
        assert node is not None
        labels = node["metadata"]["labels"]
        assert not [key for key in labels if key.startswith("nvidia.com/")]
        assert "team" not in labels
        assert labels["tier"] == "b"
        assert labels["example.com/owner"] == "ml", "a label someone else set stays"
        assert [t["key"] for t in node["spec"]["taints"]] == ["node.kubernetes.io/unschedulable"]
        assert "nvidia.com/gpu" not in node["status"]["capacity"]
        assert "nvidia.com/gpu" not in node["status"]["allocatable"]


async def test_removing_an_adopted_cluster_s_nodes_says_why_a_delete_is_refused() -> None:
    """Defect: a node DELETE refused for good (403: the kubeconfig may not delete nodes) was
    counted as 'still being deleted', and the FakeCluster's finalizer looped without a cause."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(5)
    client = Client(fleet.member, clock=fleet.clock)
    fleet.member.fail("DELETE", f"{NODES}/cpu-1", status=503)
    assert await remove_all(client, ENGINE_NAME) == 1, "a 503 is tried again"
    assert sorted(fleet.nodes()) == ["cpu-1"]
    fleet.member.fail("DELETE", f"{NODES}/cpu-1", status=403, reason="Forbidden")
    with pytest.raises(Unauthorized, match="Forbidden"):
        await remove_all(client, ENGINE_NAME)
    assert await remove_all(client, ENGINE_NAME) == 0
    assert fleet.nodes() == {}
