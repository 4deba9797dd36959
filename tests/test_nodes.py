"""The node planner and the Node objects it asks for: pure, no cluster."""

from __future__ import annotations

import dataclasses

from operators.api.nodepools import FakeNodePoolSpec
from operators.engine import nodes
from operators.engine.nodes import Create, Delete, NodeFacts, Reshape
from primitives import keys


def spec(**fields: object) -> FakeNodePoolSpec:
    return FakeNodePoolSpec.model_validate({"clusterRef": "c", **fields})


def observed(pool: str, *indices: int, spec_: FakeNodePoolSpec | None = None) -> list[
        NodeFacts]:
    template = nodes.template_hash(spec_) if spec_ else ""
    return [NodeFacts(nodes.node_name(pool, i), pool, template, i,
                      kubelet=(nodes.node_ip(i), nodes.KUBELET_PORT)) for i in indices]


def test_empty_cluster_creates_every_replica() -> None:
    assert nodes.plan({"cpu": spec(replicas=3)}, []) == [
        Create("cpu", 0), Create("cpu", 1), Create("cpu", 2)]


def test_scale_up_creates_only_missing_indices() -> None:
    wanted = spec(replicas=4)
    assert nodes.plan({"cpu": wanted}, observed("cpu", 0, 2, spec_=wanted)) == [
        Create("cpu", 1), Create("cpu", 3)]


def test_scale_down_deletes_the_highest_indices() -> None:
    wanted = spec(replicas=2)
    actions = nodes.plan({"cpu": wanted}, observed("cpu", 0, 1, 2, 3, 10, spec_=wanted))
    assert actions == [Delete("cpu-10"), Delete("cpu-2"), Delete("cpu-3")]


def test_adoption_after_restart_changes_nothing() -> None:
    """An engine that restarts and lists its nodes must not create them again."""
    wanted = spec(replicas=3)
    assert nodes.plan({"cpu": wanted}, observed("cpu", 0, 1, 2, spec_=wanted)) == []


def test_nodes_of_a_removed_pool_are_deleted() -> None:
    assert nodes.plan({}, observed("gone", 0, 1)) == [Delete("gone-0"), Delete("gone-1")]


def test_template_change_reshapes_existing_nodes() -> None:
    old, new = spec(replicas=2), spec(replicas=2, template={"labels": {"team": "a"}})
    assert nodes.plan({"cpu": new}, observed("cpu", 0, 1, spec_=old)) == [
        Reshape("cpu", 0), Reshape("cpu", 1)]


def test_a_node_whose_kubelet_is_elsewhere_is_reshaped() -> None:
    """An older engine's node addresses, or another kubelet port, make a reshape: the node's
    status must say where its kubelet endpoints are served."""
    wanted = spec(replicas=2)
    facts = observed("cpu", 0, 1, spec_=wanted)
    assert nodes.plan({"cpu": wanted}, facts, kubelet_port=40123) == [
        Reshape("cpu", 0), Reshape("cpu", 1)]
    old = [dataclasses.replace(facts[0], kubelet=("172.16.0.1", nodes.KUBELET_PORT)), facts[1]]
    assert nodes.plan({"cpu": wanted}, old) == [Reshape("cpu", 0)]


def test_node_addresses_are_loopback_and_map_back_to_their_slot() -> None:
    assert nodes.node_ip(0) == "127.64.0.1"
    assert nodes.node_ip(nodes.MAX_NODES_PER_CLUSTER - 1) == "127.64.128.0"
    for slot in (0, 1, 255, 256, nodes.MAX_NODES_PER_CLUSTER - 1):
        assert nodes.slot_of(nodes.node_ip(slot)) == slot
    assert nodes.slot_of("127.0.0.1") is None
    assert nodes.slot_of("127.64.0.0") is None
    assert nodes.slot_of("::1") is None


def test_replica_count_is_not_part_of_the_template() -> None:
    assert nodes.template_hash(spec(replicas=1)) == nodes.template_hash(spec(replicas=9))


def test_held_nodes_are_deleted_and_not_made_while_held() -> None:
    """A Delete fault holds names: deleted if present, not created, the rest as a scale-up."""
    wanted = spec(replicas=4)
    held = {"cpu": frozenset({"cpu-1", "cpu-3"}), "other": frozenset({"cpu-2"})}
    assert nodes.plan({"cpu": wanted}, observed("cpu", 0, 1, spec_=wanted), held) == [
        Delete("cpu-1"), Create("cpu", 2)]
    assert nodes.plan({"cpu": wanted}, observed("cpu", 0, 2, spec_=wanted), held) == []
    assert nodes.plan({"cpu": wanted}, observed("cpu", 0, 2, spec_=wanted)) == [
        Create("cpu", 1), Create("cpu", 3)], "released: made again"


def test_deletions_come_before_creations() -> None:
    actions = nodes.plan({"new": spec(replicas=1)}, observed("old", 0))
    assert actions == [Delete("old-0"), Create("new", 0)]


def test_node_index_parses_only_its_own_pool() -> None:
    assert nodes.node_index("cpu", "cpu-12") == 12
    assert nodes.node_index("cpu", "cpu-gpu-1") is None
    assert nodes.node_index("cpu", "gpu-1") is None


LIFE = nodes.healthy_life("2026-01-01T00:00:00Z")


def test_cpu_node_object() -> None:
    node = nodes.render_node("c", "cpu", spec(topology={"region": "r", "zones": ["a", "b"],
                                                      "racks": 2}),
                             3, 5, life=LIFE, kubelet_version="v1.36.3")
    labels = node["metadata"]["labels"]
    assert node["metadata"]["name"] == "cpu-3"
    assert labels["fakefleet.dev/pool"] == "cpu"
    assert labels["topology.kubernetes.io/zone"] == "b"
    assert labels["topology.kubernetes.io/region"] == "r"
    assert labels["fakefleet.dev/rack"] == "rack-1"
    assert node["spec"]["podCIDR"] == "10.128.5.0/24"
    assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "127.64.0.6"}
    assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
    assert node["status"]["allocatable"]["pods"] == "110"


def test_gpu_preset_fills_labels_capacity_and_taint() -> None:
    node = nodes.render_node("c", "h100", spec(gpu={"preset": "H100-SXM5-80GB"}), 0, 0,
                             life=LIFE, kubelet_version="v")
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/cuda.driver-version.major"] == "570"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in (
        node["spec"]["taints"])


def test_gb200_has_four_gpus_and_a_clique() -> None:
    node = nodes.render_node("c", "gb", spec(gpu={"preset": "GB200", "taint": False}), 0, 0,
                             life=LIFE, kubelet_version="v")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.clique"] == "c.0"
    assert node["spec"]["taints"] == []


def test_observe_reads_back_what_render_wrote() -> None:
    wanted = spec()
    node = nodes.render_node("c", "cpu", wanted, 7, 300, life=LIFE, kubelet_version="v")
    node["metadata"]["uid"] = "u"
    fact = nodes.observe(node, "c")
    assert fact is not None
    assert (fact.name, fact.pool, fact.template_hash, fact.slot, fact.uid, fact.ready) == (
        "cpu-7", "cpu", nodes.template_hash(wanted), 300, "u", "True")
    assert not fact.foreign
    assert fact.problem == ""
    assert nodes.observe({"metadata": {"name": "other", "labels": {}}}, "c") is None
    assert nodes.life_from_node(node) == LIFE


def test_a_node_of_another_engine_or_without_a_usable_cidr_is_not_ours_to_use() -> None:
    node = nodes.render_node("c", "cpu", spec(), 1, 4, life=LIFE, kubelet_version="v")
    other = nodes.observe(node, "elsewhere")
    assert other is not None
    assert other.foreign
    assert "not made by this engine" in other.problem
    node["spec"]["podCIDR"] = "fd00::/64"
    ipv6 = nodes.observe(node, "c")
    assert ipv6 is not None
    assert not ipv6.foreign
    assert ipv6.slot is None
    assert "replaces it" in ipv6.problem
    assert nodes.plan({"cpu": spec(replicas=3)}, [other]) == [Create("cpu", 0), Create("cpu", 2)]
    assert nodes.plan({"cpu": spec(replicas=3)}, [ipv6]) == [
        Delete("cpu-1"), Create("cpu", 0), Create("cpu", 2)]


def test_pod_cidrs_address_exactly_the_nodes_a_cluster_may_have() -> None:
    assert 2 ** (24 - nodes.POD_NETWORK.prefixlen) == nodes.MAX_NODES_PER_CLUSTER
    assert nodes.pod_cidr(nodes.MAX_NODES_PER_CLUSTER - 1) == "10.255.255.0/24"


def test_a_long_cluster_name_still_gives_a_valid_clique_label() -> None:
    key = "n" * 63 + "." + "c" * 63
    node = nodes.render_node(key, "gb", spec(gpu={"preset": "GB200"}), 0, 0, life=LIFE,
                             kubelet_version="v")
    clique = node["metadata"]["labels"]["nvidia.com/gpu.clique"]
    assert len(clique) <= 63
    assert clique[0].isalnum()
    assert clique[-1].isalnum()


def test_reshape_removes_only_the_old_template_s_keys_and_guards_the_version() -> None:
    old = spec(template={"labels": {"team": "a"}, "capacity": {"example.com/fpga": 2}})
    new = spec(template={"labels": {"tier": "b"}})
    node = nodes.render_node("c", "cpu", old, 0, 0, life=LIFE, kubelet_version="v1.36.3")
    node["metadata"]["resourceVersion"] = "42"
    node["metadata"]["labels"]["example.com/owner"] = "ml"
    meta, status = nodes.reshape_patches("c", "cpu", new, 0, node, slot=0, kubelet_port=40123)
    assert meta["metadata"]["resourceVersion"] == "42"
    labels = meta["metadata"]["labels"]
    assert labels["team"] is None
    assert labels["tier"] == "b"
    assert "example.com/owner" not in labels, "others' labels are not touched"
    assert status["status"]["capacity"]["example.com/fpga"] is None
    assert status["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 40123}}
    assert status["status"]["addresses"] == [{"type": "InternalIP", "address": "127.64.0.1"},
                                             {"type": "Hostname", "address": "cpu-0"}]


def test_reshape_of_a_node_without_template_keys_removes_nothing() -> None:
    node = {"metadata": {"name": "cpu-0", "labels": {"team": "a"},
                         "annotations": {keys.TEMPLATE_KEYS: "not json"}}}
    meta, _ = nodes.reshape_patches("c", "cpu", spec(), 0, node, slot=0)
    assert None not in meta["metadata"]["labels"].values()
