"""Nothing fails unless a FaultPlan says so, on a real control plane: the engine's pods heal
from the real node-lifecycle controller's NotReady once their node is back, as a kubelet's do;
and the engine writes with its own identity, which the API server's priority and fairness
serves as it serves kubelets, and RBAC grants exactly what it writes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import (
    CLUSTER,
    POOL,
    SHORT_GRACE,
    Fleet,
    eventually,
    kubectl,
    kubectl_json,
    processes_mentioning,
    with_short_grace,
)
from operators.controlplane.state import StateDir
from operators.reconciling.clusters import cluster_key

NODES = ("work-0", "work-1")
REPLICAS = 6


@pytest.fixture(scope="module")
def omega(fleet: Fleet) -> Iterator[Path]:
    # The node-lifecycle controller marks the nodes NotReady after 20 s, not 50 s.
    fleet.apply(with_short_grace(CLUSTER.format(name="omega")))
    fleet.apply(POOL.format(name="work", cluster="omega", replicas=3, extra=""))
    fleet.wait_cluster_ready("omega")
    fleet.wait_pool("work", 3)
    member = fleet.member("omega")
    eventually(lambda: kubectl(member, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield member
    fleet.release("omega", "work")


def ready(obj: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in obj.get("status", {}).get("conditions", []))


def dispatched(member: Path) -> dict[tuple[str, str], float]:
    """The API server's APF counters: (flow schema, priority level) → requests dispatched."""
    found: dict[tuple[str, str], float] = {}
    for line in kubectl(member, "get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            pairs = dict(part.split("=", 1) for part in labels[labels.index("{") + 1:-1]
                         .split(","))
            found[(pairs["flow_schema"].strip('"'), pairs["priority_level"].strip('"'))] = \
                float(value)
    return found


def test_the_engine_is_served_as_kubelets_are_with_exactly_its_rights(
        fleet: Fleet, omega: Path) -> None:
    key = cluster_key("default", "omega")
    engine_kubeconfig = StateDir(fleet.state).kubeconfig(key, "engine")
    engines = [pid for pid in processes_mentioning("operators.engine") if
               str(engine_kubeconfig) in Path(f"/proc/{pid}/cmdline").read_text()]
    assert engines, "the engine runs with its own kubeconfig"
    before = dispatched(omega)
    time.sleep(15)  # a Lease renewal per node at least (every 4 s, a fifth of the grace)
    after = dispatched(omega)

    def grew(flow: tuple[str, str]) -> float:
        return after.get(flow, 0.0) - before.get(flow, 0.0)
    assert grew(("system-node-high", "node-high")) >= 3, "Lease renewals at node-high"
    assert after.get(("system-nodes", "system"), 0.0) > 0, "its pod watch and writes at system"
    identity = ["--as", "fakefleet-engine", "--as-group", "system:nodes"]

    def may(*args: str) -> bool:
        return kubectl(omega, "auth", "can-i", *args, *identity,
                       check=False).stdout.strip() == "yes"
    assert may("patch", "pods", "--subresource=status")
    assert may("patch", "leases", "-n", "kube-node-lease")
    assert may("delete", "nodes")
    assert not may("get", "secrets")
    assert not may("patch", "leases", "-n", "kube-system"), "leases of kube-node-lease only"
    assert not may("create", "pods")
    log = StateDir(fleet.state).engine_log(key).read_text()
    assert "forbidden" not in log.lower(), "no request of the engine refused"


def test_pods_marked_not_ready_by_the_node_lifecycle_controller_heal_after_recovery(
        fleet: Fleet, omega: Path) -> None:
    """Defect: the node-lifecycle controller's NotReady stayed for good, and the Deployment
    never completed."""
    assert f"--node-monitor-grace-period={SHORT_GRACE}" in fleet.command_line(
        "omega", "kube-controller-manager")
    assert f"--node-monitor-grace {SHORT_GRACE.removesuffix('s')} " in \
        fleet.command_line("omega", "engine") + " ", "the engine paces renewals by it"
    kubectl(omega, "create", "deployment", "web", "--image=nginx:1.27",
            f"--replicas={REPLICAS}")
    eventually(lambda: kubectl_json(omega, "get", "deployment", "web")["status"].get(
        "readyReplicas") == REPLICAS, timeout=120, what=f"{REPLICAS} ready replicas")
    plan = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": "gone", "namespace": "default"},
            "spec": {"seed": 3, "steps": [{
                "name": "gone", "at": "0s", "duration": "45s", "fault": {"type": "Unreachable"},
                "target": {"clusters": {"names": ["omega"]},
                           "nodes": {"names": list(NODES)}}}]}}
    fleet.apply(json.dumps(plan))

    def marked() -> list[str]:
        return [p["metadata"]["name"] for p in kubectl_json(omega, "get", "pods", "-l",
                                                            "app=web")["items"]
                if p["spec"]["nodeName"] in NODES and not ready(p)]
    eventually(marked, timeout=45, what="the node-lifecycle controller to mark pods NotReady "
                                        f"(its grace: {SHORT_GRACE})")
    # The nodes come back as soon as the controller has marked the pods: deleting the plan
    # recovers its fault (its finalizer) instead of waiting out the rest of its 45 s.
    kubectl(fleet.host, "delete", "fp", "gone", "--timeout=120s")

    def back() -> bool:
        return all(ready(kubectl_json(omega, "get", "node", name)) for name in NODES)
    eventually(back, timeout=120, what="the nodes Ready again")
    recovered = time.monotonic()

    def healed() -> bool:
        pods = kubectl_json(omega, "get", "pods", "-l", "app=web")["items"]
        return len(pods) == REPLICAS and all(ready(p) for p in pods)
    eventually(healed, timeout=15, what="every pod Ready again within 15 s of its node")
    took = time.monotonic() - recovered
    status = kubectl_json(omega, "get", "deployment", "web")["status"]
    assert (status.get("readyReplicas"), status.get("availableReplicas"),
            status.get("updatedReplicas")) == (REPLICAS, REPLICAS, REPLICAS), (status, took)
    assert any(c["type"] == "Available" and c["status"] == "True"
               for c in status["conditions"])
