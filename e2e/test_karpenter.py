"""Real, unmodified Karpenter v1.14.1 (its KWOK cloud provider) on a FakeCluster, its nodes
played by fakefleet's engine: pending GPU pods make Karpenter provision NodeClaims, the engine
takes their nodes over and they go Ready, the pods run; a NotReady fault on one of them is
injected and healed (node repair is off: the node stays); once the pods are gone, consolidation
removes the empty nodes and the engine lets them go, Leases and all.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import KUBECTL, Fleet, eventually, fakefleet, kubectl, kubectl_json

NAMESPACE = "karp"
CLUSTER = "autoscaled"
POOL = "gpu"
PODS = 2  # of 8 GPUs each: a node each


def manifest() -> str:
    docs: list[dict[str, Any]] = [
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
         "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
         "spec": {"addons": {"karpenter": {"consolidateAfter": "5s",
                                           "disruptionBudget": "100%"}}}},
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
         "metadata": {"name": POOL, "namespace": NAMESPACE},
         "spec": {"clusterRef": CLUSTER, "provisioner": "karpenter",
                  "gpu": {"preset": "H100-SXM5-80GB"}, "leaseDurationSeconds": 10}},
    ]
    return "\n---\n".join(json.dumps(doc) for doc in docs)


def deployment(replicas: int) -> str:
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "trainer"}},
                 "template": {
                     "metadata": {"labels": {"app": "trainer"}},
                     "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                               "effect": "NoSchedule"}],
                              "containers": [{"name": "train", "image": "pytorch",
                                              "resources": {
                                                  "requests": {"cpu": "8", "memory": "64Gi"},
                                                  "limits": {"nvidia.com/gpu": "8"}}}]}}}})


def apply(kubeconfig: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
                          input=text, text=True, capture_output=True, timeout=60)


def karpenter_nodes(member: Path) -> list[dict[str, Any]]:
    return [n for n in kubectl_json(member, "get", "nodes")["items"]
            if n["spec"].get("providerID", "").startswith("kwok://")]


def is_ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node["status"].get("conditions") or ())


def condition(fleet: Fleet, kind: str) -> dict[str, Any]:
    found = fleet.get("fc", CLUSTER, "-n", NAMESPACE)
    return next((c for c in (found.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})


def pool_counts(fleet: Fleet) -> tuple[int, int]:
    status = fleet.get("fnp", POOL, "-n", NAMESPACE).get("status") or {}
    return status.get("replicas", 0), status.get("readyReplicas", 0)


def finished(fleet: Fleet, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] = fleet.get("fp", name, "-n", NAMESPACE)
    return found if (found.get("status") or {}).get("phase") in ("Succeeded", "Failed") \
        else None


@pytest.fixture(scope="module")
def member(fleet: Fleet) -> Iterator[Path]:
    """The cluster Ready with Karpenter running and its NodePool Ready; its kubeconfig."""
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    fleet.apply(manifest())
    eventually(lambda: condition(fleet, "KarpenterReady").get("status") == "True",
               timeout=300, what="KarpenterReady (its NodePool Ready)")
    path = fleet.state / f"{NAMESPACE}.{CLUSTER}.kubeconfig"
    path.write_text(fakefleet("kubeconfig", "--state-dir", str(fleet.state),
                              f"{NAMESPACE}/{CLUSTER}").stdout)
    eventually(lambda: kubectl(path, "get", "serviceaccount", "default",
                               check=False).returncode == 0, timeout=60,
               what="ServiceAccount default/default")
    yield path
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_a_provisioner_pool_says_what_it_cannot_do(fleet: Fleet, member: Path) -> None:
    scaled = kubectl(fleet.host, "-n", NAMESPACE, "scale", "fnp", POOL, "--replicas=3",
                     check=False)
    assert scaled.returncode != 0
    assert "replicas means nothing for a pool with provisioner karpenter" in scaled.stderr
    dra = json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
                      "metadata": {"name": "dra", "namespace": NAMESPACE},
                      "spec": {"clusterRef": CLUSTER, "provisioner": "karpenter",
                               "gpu": {"preset": "B200", "allocation": "dra"}}})
    refused = apply(fleet.host, dra)
    assert refused.returncode != 0
    assert "offers its GPUs as the extended resource nvidia.com/gpu only" in refused.stderr
    # The NodePool and KWOKNodeClass fakefleet wrote for the pool.
    nodepool = kubectl_json(member, "get", "nodepools.karpenter.sh", POOL)
    assert nodepool["metadata"]["annotations"]["fakefleet.dev/owned-by"] == "Addon/karpenter"
    labels = nodepool["spec"]["template"]["metadata"]["labels"]
    assert labels["fakefleet.dev/pool"] == POOL
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    kubectl_json(member, "get", "kwoknodeclasses.karpenter.kwok.sh", POOL)


def test_karpenter_provisions_the_engine_plays_faults_heal_and_consolidation_removes(
        fleet: Fleet, member: Path) -> None:
    started = time.monotonic()
    assert apply(member, deployment(PODS)).returncode == 0

    def running() -> list[dict[str, Any]] | None:
        pods = kubectl_json(member, "get", "pods", "-n", "default", "-l", "app=trainer")["items"]
        up = [p for p in pods if p["status"].get("phase") == "Running"
              and any(c["type"] == "Ready" and c["status"] == "True"
                      for c in p["status"].get("conditions") or ())]
        return up if len(up) == PODS else None

    pods = eventually(running, timeout=120, what=f"{PODS} GPU pods Running")
    print(f"\n{PODS} pending GPU pods to Running on Karpenter's nodes: "
          f"{time.monotonic() - started:.1f}s")
    claims = kubectl_json(member, "get", "nodeclaims.karpenter.sh")["items"]
    assert len(claims) == PODS

    # Karpenter labels a node initialized once its lifecycle controller has seen it Ready
    # with its resources registered; on a busy machine that comes after the pods run on it.
    def initialized() -> list[dict[str, Any]] | None:
        found = karpenter_nodes(member)
        return found if all(n["metadata"]["labels"].get("karpenter.sh/initialized") == "true"
                            for n in found) else None

    nodes = {n["metadata"]["name"]: n for n in eventually(
        initialized, timeout=60, what="Karpenter's nodes labelled initialized")}
    assert {p["spec"]["nodeName"] for p in pods} == set(nodes)
    for node in nodes.values():
        assert is_ready(node)
        labels = node["metadata"]["labels"]
        assert labels["karpenter.sh/nodepool"] == POOL
        assert labels["fakefleet.dev/pool"] == POOL
        assert labels["node.kubernetes.io/instance-type"] == "h100-sxm5-80gb-8gpu"
        assert node["spec"]["podCIDR"].startswith("10.1")
        assert node["status"]["capacity"]["cpu"] == "192"  # the machine, not its pods
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert "karpenter.sh/termination" in node["metadata"]["finalizers"]
    leases = {lease["metadata"]["name"] for lease in kubectl_json(
        member, "get", "leases", "-n", "kube-node-lease")["items"]}
    assert set(nodes) <= leases
    eventually(lambda: pool_counts(fleet) == (PODS, PODS), timeout=30,
               what=f"pool {POOL} counting {PODS} Ready nodes")

    # A NotReady fault on one of them, by pool name, as on any node; with node repair off,
    # Karpenter leaves the node be and the fault heals it.
    plan = json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": "karpenter-node", "namespace": NAMESPACE},
        "spec": {"seed": 3, "steps": [{
            "name": "not-ready", "at": "1s", "duration": "20s",
            "target": {"clusters": {"names": [CLUSTER]}, "nodes": {"pools": [POOL]},
                       "mode": "one"},
            "fault": {"type": "NotReady", "reason": "KubeletNotReady"},
            "expectations": [{"name": "ready-false", "within": "15s",
                              "objects": {"kind": "Node", "victims": True},
                              "condition": {"type": "Ready", "status": "False"}}]}]}})
    fleet.apply(plan)
    ended = eventually(lambda: finished(fleet, "karpenter-node"), timeout=120,
                       what="the fault plan finished")
    assert ended["status"]["verdict"] == "Passed", ended["status"]
    assert {i["state"] for i in ended["status"]["injections"]} == {"Recovered"}
    eventually(lambda: all(is_ready(n) for n in karpenter_nodes(member))
               and len(karpenter_nodes(member)) == PODS, timeout=60,
               what="every Karpenter node Ready again")
    assert {c["metadata"]["name"] for c in kubectl_json(
        member, "get", "nodeclaims.karpenter.sh")["items"]} == {
            c["metadata"]["name"] for c in claims}, "no node repaired away"

    # The pods go: consolidation removes the empty nodes, the engine lets them go.
    emptied = time.monotonic()
    kubectl(member, "-n", "default", "delete", "deployment", "trainer")
    eventually(lambda: not karpenter_nodes(member) and not kubectl_json(
        member, "get", "nodeclaims.karpenter.sh")["items"], timeout=150,
               what="Karpenter's nodes and NodeClaims gone")
    print(f"empty nodes removed by consolidation: {time.monotonic() - emptied:.1f}s")
    leases = {lease["metadata"]["name"] for lease in kubectl_json(
        member, "get", "leases", "-n", "kube-node-lease")["items"]}
    assert not set(nodes) & leases, "their Leases went with them"
    eventually(lambda: pool_counts(fleet) == (0, 0), timeout=30,
               what=f"pool {POOL} counting no nodes")

    # The pool goes: fakefleet's NodePool goes with it.
    kubectl(fleet.host, "-n", NAMESPACE, "delete", "fnp", POOL, "--timeout=60s")
    eventually(lambda: not kubectl_json(member, "get", "nodepools.karpenter.sh")["items"],
               timeout=30, what="the NodePool deleted with its pool")
