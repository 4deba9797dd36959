"""The Karpenter add-on's pure parts: its tool, CRDs read from a module tree, the instance types
and NodePools it renders from fakefleet's GPU presets, the planner and its KarpenterReady
condition, and its NodePools applied and pruned over the in-memory API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.addons import lifecycle
from operators.addons.karpenter import TOOL, planning, rendering, running, source
from operators.addons.karpenter.planning import ApplyNodePools, NodePoolState, Observed
from operators.addons.lifecycle import Build, Hook, Start, Stop
from operators.api.clusters import FakeCluster, KarpenterSpec
from operators.api.instancetypes import BY_NAME, CATALOGUE
from operators.api.nodepools import FakeNodePoolSpec
from operators.cli import views
from operators.engine import nodes
from operators.k8s.client import Client
from operators.reconciling.clusters import AddonState
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

PORTS = rendering.KarpenterPorts(metrics=18080, health=18081)


def cluster(**addon: Any) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": "west", "namespace": "default", "generation": 1, "uid": "u"},
        "spec": {"addons": {"karpenter": addon}}})


def spec(**fields: Any) -> FakeNodePoolSpec:
    return FakeNodePoolSpec.model_validate({"clusterRef": "west", "provisioner": "karpenter",
                                            **fields})


H100 = spec(gpu={"preset": "H100-SXM5-80GB"})
RUNNING = Observed(control_plane_running=True, binary=True, installed=True, supervised=True,
                   ready=True, hooked=True, ports=PORTS,
                   settings=planning.settings(KarpenterSpec()))


# -- the tool and the module source ------------------------------------------------------------

def test_the_tool_is_the_kwok_provider_kept_under_its_own_name(tmp_path: Path) -> None:
    assert TOOL.install_argv("go")[-1] == "sigs.k8s.io/karpenter/kwok@v1.14.1"
    assert TOOL.installs == "kwok"
    assert TOOL.cache_path(tmp_path) == tmp_path / "karpenter" / "v1.14.1" / "karpenter"


def test_crds_are_read_from_the_chart_and_the_provider_s_apis(tmp_path: Path) -> None:
    for path in source.CRD_FILES:
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        name = Path(path).name.removesuffix(".yaml")
        file.write_text(f"---\napiVersion: apiextensions.k8s.io/v1\n"
                        f"kind: CustomResourceDefinition\nmetadata: {{name: {name}}}\n")
    loaded = source.load(tmp_path)
    assert [crd["metadata"]["name"] for crd in loaded.crds] == [
        "karpenter.sh_nodepools", "karpenter.sh_nodeclaims", "karpenter.sh_nodeoverlays",
        "karpenter.kwok.sh_kwoknodeclasses"]


# -- rendering ----------------------------------------------------------------------------------

def test_the_environment_is_all_karpenter_reads() -> None:
    env = rendering.environment(kubeconfig=Path("/s/admin.kubeconfig"), ports=PORTS,
                                instance_types=Path("/s/it.json"), node_repair=True)
    assert env == {"KUBECONFIG": "/s/admin.kubeconfig", "DISABLE_LEADER_ELECTION": "true",
                   "METRICS_PORT": "18080", "HEALTH_PROBE_PORT": "18081",
                   "INSTANCE_TYPES_FILE_PATH": "/s/it.json", "FEATURE_GATES": "NodeRepair=true",
                   "LOG_LEVEL": "info"}


def test_instance_types_are_the_catalogue_with_offerings_in_the_current_format() -> None:
    types = rendering.instance_types(["zone-a", "zone-b"])
    by_name = {t["name"]: t for t in types}
    assert set(by_name) == set(BY_NAME)
    h100 = by_name["h100-sxm5-80gb-8gpu"]
    assert h100["resources"] == {"cpu": "192", "memory": "1920Gi", "ephemeral-storage": "8Ti",
                                 "pods": "110", "nvidia.com/gpu": "8"}
    assert h100["architecture"] == "amd64"
    assert h100["operatingSystems"] == ["linux"]
    # The keys of KWOKOffering as encoding/json reads them; zone and capacity type only in
    # Requirements (the stale zone/capacityType keys are ignored by v1.14.1).
    assert h100["offerings"] == [
        {"Price": 98.4, "Available": True, "Requirements": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]}
        for zone in ("zone-a", "zone-b")]
    assert "nvidia.com/gpu" not in by_name["cpu-16"]["resources"]
    json.dumps(types)  # what the file holds


def test_a_gpu_pool_s_nodepool_carries_the_preset_s_labels_and_taint() -> None:
    pool = spec(gpu={"preset": "H100-SXM5-80GB", "count": 4},
                template={"labels": {"team": "ml"}, "annotations": {"note": "x"},
                          "taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
                topology={"zones": ["zone-b"], "region": "west"})
    made = rendering.nodepool("gpu", pool, KarpenterSpec(consolidateAfter="5s"))
    assert made["metadata"] == {"name": "gpu",
                                "labels": {"app.kubernetes.io/managed-by": "fakefleet"}}
    template = made["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert labels["fakefleet.dev/pool"] == "gpu"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["team"] == "ml"
    assert labels["topology.kubernetes.io/region"] == "west"
    # What the NodePool CRD's rules refuse in template labels.
    assert not any(key.split("/")[0].endswith(("karpenter.sh", "karpenter.kwok.sh"))
                   for key in labels)
    assert "kubernetes.io/hostname" not in labels
    assert all(len(value) <= 63 for value in labels.values())
    assert template["metadata"]["annotations"] == {"note": "x"}
    node = template["spec"]
    assert node["nodeClassRef"] == {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                    "name": "gpu"}
    assert node["taints"] == [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                              {"key": "nvidia.com/gpu", "value": "present",
                               "effect": "NoSchedule"}]
    assert node["requirements"] == [
        {"key": "node.kubernetes.io/instance-type", "operator": "In",
         "values": ["h100-sxm5-80gb-4gpu"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b"]}]
    assert made["spec"]["disruption"] == {"consolidationPolicy": "WhenEmptyOrUnderutilized",
                                          "consolidateAfter": "5s",
                                          "budgets": [{"nodes": "10%"}]}
    assert rendering.nodeclass("gpu") == {
        "apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
        "metadata": {"name": "gpu", "labels": {"app.kubernetes.io/managed-by": "fakefleet"}},
        "spec": {}}


def test_a_cpu_pool_may_have_any_cpu_type_and_its_own_taints_only() -> None:
    made = rendering.nodepool("cpu", spec(), KarpenterSpec())
    assert made["spec"]["template"]["spec"]["requirements"][0]["values"] == [
        "cpu-4", "cpu-16", "cpu-64"]
    assert made["spec"]["template"]["spec"]["taints"] == []


def test_the_engine_sizes_a_node_by_the_type_karpenter_chose() -> None:
    """The catalogue both sides read: what Karpenter offers is what the engine writes back."""
    for instance_type in CATALOGUE:
        assert nodes.instance_capacity(
            {"node.kubernetes.io/instance-type": instance_type.name}) == instance_type.resources
    assert nodes.instance_capacity({"node.kubernetes.io/instance-type": "m5.large"}) is None


# -- planning -----------------------------------------------------------------------------------

def test_no_addon_no_actions_no_condition() -> None:
    plain = FakeCluster.model_validate({"metadata": {"name": "west"}})
    assert planning.plan(plain, Observed()) == []
    assert planning.condition(plain, Observed()) is None


def test_karpenter_is_built_started_and_hooked_with_nothing_to_hook() -> None:
    wanted = cluster()
    assert planning.plan(wanted, Observed(control_plane_running=True)) == [Build()]
    building = Observed(control_plane_running=True, building_for=300.0)
    state = planning.condition(wanted, building)
    assert state is not None
    assert state.reason == "Building"
    assert "about 17 minutes" in state.message
    assert planning.plan(wanted, Observed(control_plane_running=True, binary=True)) == [Start()]
    ready = Observed(control_plane_running=True, binary=True, supervised=True, ready=True,
                     settings=planning.settings(KarpenterSpec()))
    assert planning.plan(wanted, ready) == [Hook()]


def test_a_change_of_zones_or_node_repair_restarts_it() -> None:
    for changed in ({"zones": ["us-1a"]}, {"nodeRepair": True}):
        assert planning.plan(cluster(**changed), RUNNING) == [Stop(unhook=False), Start()]
    assert planning.plan(cluster(consolidateAfter="5s"), RUNNING) != [Stop(unhook=False),
                                                                     Start()]


def test_disabled_karpenter_stops() -> None:
    assert planning.plan(cluster(enabled=False), RUNNING) == [Stop()]


def test_nodepools_follow_the_provisioner_pools() -> None:
    observed = Observed(**{**RUNNING.__dict__, "pools": {"gpu": H100}})
    (action,) = planning.plan(cluster(), observed)
    assert isinstance(action, ApplyNodePools)
    assert [(o["kind"], o["metadata"]["name"]) for o in action.objects] == [
        ("KWOKNodeClass", "gpu"), ("NodePool", "gpu")]
    assert action.keep == {"gpu"}
    applied = Observed(**{**observed.__dict__, "applied": action.fingerprint,
                          "nodepools": (NodePoolState("gpu", ready=True),)})
    assert planning.plan(cluster(), applied) == []
    # A NodePool someone deleted is applied again; one of a pool that went is pruned.
    assert planning.plan(cluster(), Observed(**{**applied.__dict__, "nodepools": ()}))
    gone = Observed(**{**applied.__dict__, "pools": {}})
    (prune,) = planning.plan(cluster(), gone)
    assert isinstance(prune, ApplyNodePools)
    assert prune.objects == ()
    assert prune.keep == frozenset()
    # The consolidation settings reach the NodePools without a restart.
    (again,) = planning.plan(cluster(consolidateAfter="5s"), applied)
    assert isinstance(again, ApplyNodePools)


def test_the_condition_says_where_it_listens_and_which_nodepools_wait() -> None:
    state = planning.condition(cluster(), RUNNING)
    assert state == AddonState(True, "Running", (
        "Karpenter v1.14.1 (KWOK provider) running (health http://127.0.0.1:18081/readyz, "
        "metrics on port 18080 (both on every interface)); no FakeNodePool of this cluster "
        "has provisioner: karpenter, so it makes no nodes"))
    waiting = Observed(**{**RUNNING.__dict__, "pools": {"gpu": H100}, "nodepools": (
        NodePoolState("gpu", message="NodeClassReady=False"),)})
    state = planning.condition(cluster(), waiting)
    assert state is not None
    assert (state.ready, state.reason) == (False, "NodePoolNotReady")
    assert state.message.endswith("its NodePool gpu is not Ready: NodeClassReady=False")
    ready = Observed(**{**waiting.__dict__, "nodepools": (NodePoolState("gpu", ready=True),)})
    state = planning.condition(cluster(), ready)
    assert state is not None
    assert state.ready
    assert state.message.endswith("NodePools: gpu")


def test_a_crash_is_said_from_karpenter_s_json_log() -> None:
    log = ('{"level":"INFO","message":"Unable to read vcs.revision from binary"}\n'
           '{"level":"ERROR","logger":"controller","message":"unable to get kubeconfig",'
           '"error":"invalid configuration"}\n')
    assert lifecycle.crash_summary(log) == "unable to get kubeconfig: invalid configuration"


# -- I/O: the NodePools through the client, on the in-memory API --------------------------------

async def test_nodepools_are_applied_and_those_of_pools_gone_pruned_but_never_a_user_s() -> None:
    api = MemoryTransport(FakeClock())
    client = Client(api, clock=FakeClock())
    label = {"app.kubernetes.io/managed-by": "fakefleet"}
    owned = {"fakefleet.dev/owned-by": "Addon/karpenter"}
    api.put(f"{running.NODEPOOLS}/old", {"metadata": {"name": "old", "labels": label,
                                                      "annotations": owned}})
    api.put(f"{running.NODECLASSES}/old", {"metadata": {"name": "old", "labels": label,
                                                        "annotations": owned}})
    api.put(f"{running.NODEPOOLS}/users", {"metadata": {"name": "users", "labels": label}})
    observed = Observed(**{**RUNNING.__dict__, "pools": {"gpu": H100}})
    (action,) = planning.plan(cluster(), observed)
    assert isinstance(action, ApplyNodePools)
    await running.apply_nodepools(client, action, key="default.west")
    assert sorted(o["metadata"]["name"] for o in api.objects(running.NODEPOOLS)) == [
        "gpu", "users"]
    assert sorted(o["metadata"]["name"] for o in api.objects(running.NODECLASSES)) == ["gpu"]
    applies = api.sent("PATCH")
    assert {r.content_type for r in applies} == {"application/apply-patch+yaml"}
    assert ("fieldManager", "fakefleet-karpenter") in applies[0].params
    await running.apply_nodepools(client, action, key="default.west")
    assert not api.sent("DELETE", f"{running.NODEPOOLS}/gpu")


@pytest.mark.parametrize("path", ["examples/karpenter/cluster.yaml"])
def test_the_example_is_valid(path: str) -> None:
    documents = list(yaml.safe_load_all((Path(__file__).parent.parent / path).read_text()))
    kinds = {doc["kind"]: doc for doc in documents}
    assert FakeCluster.model_validate(kinds["FakeCluster"]).spec.karpenter is not None
    pool = FakeNodePoolSpec.model_validate(kinds["FakeNodePool"]["spec"])
    assert pool.provisioner == "karpenter"


def test_fakefleet_wait_counts_the_nodes_karpenter_made_not_spec_replicas() -> None:
    """Defect: 'fakefleet wait' waited for spec.replicas (1, the default) nodes of a
    provisioner pool, which has none until pods wait for them."""
    def cluster_(ready: int) -> dict[str, Any]:
        return {"metadata": {"namespace": "default", "name": "west", "generation": 1},
                "status": {"observedGeneration": 1, "phase": "Ready", "readyNodes": ready}}

    def pool(name: str, status: dict[str, int], **spec: Any) -> dict[str, Any]:
        return {"metadata": {"namespace": "default", "name": name, "generation": 1},
                "spec": {"clusterRef": "west", "replicas": 1, **spec},
                "status": {"observedGeneration": 1, **status}}

    empty = pool("gpu", {"replicas": 0, "readyReplicas": 0}, provisioner="karpenter")
    cpu = pool("cpu", {"replicas": 1, "readyReplicas": 1})
    assert views.readiness([cluster_(1)], [empty, cpu]) == (1, 1, 1, 1)
    grown = pool("gpu", {"replicas": 1, "readyReplicas": 0}, provisioner="karpenter")
    assert views.readiness([cluster_(1)], [grown, cpu]) == (0, 1, 1, 2)
