"""DRA on real control planes: fake GPUs published as ResourceSlices, allocated by the real
scheduler to ResourceClaims, their pods run by the engine; a GPU Xid takes a device out of
service for new claims, and its recovery puts it back.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import (
    CLUSTER,
    KUBECTL,
    POOL,
    Fleet,
    eventually,
    fakefleet,
    kubectl,
    kubectl_json,
)
from operators.api.gpus import DEVICE_CLASS, DRA_DRIVER, gpu_uuid
from operators.engine.devices import UNHEALTHY

NAMESPACE = "dra"
GPUS_PER_NODE = 2
NODES = ("h100-0", "h100-1")
TEMPLATES = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: two-gpus, namespace: work}}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {{deviceClassName: {DEVICE_CLASS}, count: 2}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: one-gpu, namespace: work}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: {DEVICE_CLASS}, count: 1}}
"""


def claiming_pod(name: str, template: str) -> str:
    """A pod using a claim made from ``template``; it tolerates every node taint (the GPU
    nodes' own, an Xid's), so only the devices decide where it goes."""
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: work, labels: {{app: {template}}}}}
spec:
  tolerations: [{{operator: Exists}}]
  resourceClaims: [{{name: gpus, resourceClaimTemplateName: {template}}}]
  containers:
  - name: main
    image: trainer
    resources: {{claims: [{{name: gpus}}]}}
"""


def apply_member(member: Path, manifest: str) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(member), "apply", "-f", "-"],
                   input=manifest, text=True, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def member(fleet: Fleet) -> Iterator[Path]:
    """FakeCluster dra: 2 nodes of 2 H100 each, offered through DRA only."""
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    fleet.apply(CLUSTER.format(name="dra").replace(
        "metadata: {name: dra}", f"metadata: {{name: dra, namespace: {NAMESPACE}}}"))
    gpu = f"  gpu: {{preset: H100-SXM5-80GB, count: {GPUS_PER_NODE}, allocation: dra}}"
    fleet.apply(POOL.format(name="h100", cluster="dra", replicas=len(NODES), extra=gpu)
                .replace("metadata: {name: h100}",
                         f"metadata: {{name: h100, namespace: {NAMESPACE}}}"))
    eventually(lambda: fleet.get("fnp", "h100", "-n", NAMESPACE).get("status", {}).get(
        "readyReplicas") == len(NODES), timeout=120, what="pool h100 Ready")
    path = fleet.state / "dra.kubeconfig"
    path.write_text(fakefleet("kubeconfig", "--state-dir", str(fleet.state),
                              f"{NAMESPACE}/dra").stdout)
    kubectl(path, "create", "namespace", "work")
    eventually(lambda: kubectl(path, "-n", "work", "get", "serviceaccount", "default",
                               check=False).returncode == 0, timeout=60,
               what="ServiceAccount work/default")
    apply_member(path, TEMPLATES)
    yield path
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


def slices(member: Path) -> dict[str, dict[str, Any]]:
    found = kubectl_json(member, "get", "resourceslices")["items"]
    return {s["spec"]["nodeName"]: s for s in found}


def pods(member: Path, app: str) -> dict[str, dict[str, Any]]:
    found = kubectl_json(member, "-n", "work", "get", "pods", "-l", f"app={app}")["items"]
    return {p["metadata"]["name"]: p for p in found}


def claim_of(member: Path, pod: dict[str, Any]) -> dict[str, Any]:
    name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    found: dict[str, Any] = kubectl_json(member, "-n", "work", "get", "resourceclaim", name)
    return found


def allocated(claim: dict[str, Any]) -> list[tuple[str, str]]:
    """(pool, device) of each device the scheduler allocated to ``claim``."""
    results = claim["status"]["allocation"]["devices"]["results"]
    return [(r["pool"], r["device"]) for r in results]


def unschedulable(pod: dict[str, Any]) -> str:
    """The scheduler's message on a pod it could not place ("": placed, or not yet tried)."""
    condition = next((c for c in pod["status"].get("conditions") or ()
                      if c["type"] == "PodScheduled"), {})
    if condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
        return str(condition.get("message", ""))
    return ""


def delete_pods(member: Path, app: str) -> None:
    kubectl(member, "-n", "work", "delete", "pods", "-l", f"app={app}", "--wait=true",
            "--timeout=60s")
    # The controller-manager deletes the claims made for them, which frees their devices.
    eventually(lambda: not kubectl_json(member, "-n", "work", "get", "resourceclaims")["items"],
               timeout=60, what=f"the claims of the {app} pods gone")


def test_every_dra_node_publishes_its_gpus_as_a_slice_of_devices(member: Path) -> None:
    listed = kubectl(member, "get", "resourceslices").stdout
    assert all(f"{node}-{DRA_DRIVER}" in listed for node in NODES), listed
    published = slices(member)
    assert sorted(published) == list(NODES)
    nodes = {n["metadata"]["name"]: n for n in kubectl_json(member, "get", "nodes")["items"]}
    for node, found in published.items():
        assert found["spec"]["driver"] == DRA_DRIVER
        assert found["spec"]["pool"]["resourceSliceCount"] == 1
        assert found["metadata"]["ownerReferences"][0]["uid"] == nodes[node]["metadata"]["uid"]
        devices = found["spec"]["devices"]
        assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(GPUS_PER_NODE)]
        assert [d["attributes"]["uuid"]["string"] for d in devices] == [
            gpu_uuid(f"{NAMESPACE}.dra", node, i) for i in range(GPUS_PER_NODE)]
        assert devices[0]["attributes"]["driverVersion"] == {"version": "570.133.20"}
        assert devices[0]["capacity"]["memory"]["value"] == "81559Mi"
        # GPUs through DRA only: no extended resource for the device plugin's way.
        assert "nvidia.com/gpu" not in nodes[node]["status"]["capacity"]
        assert nodes[node]["metadata"]["labels"]["nvidia.com/gpu.count"] == str(GPUS_PER_NODE)
    device_class = kubectl_json(member, "get", "deviceclass", DEVICE_CLASS)
    assert device_class["spec"]["selectors"][0]["cel"]["expression"] == \
        f'device.driver == "{DRA_DRIVER}"'


def test_claims_run_where_devices_are_free_and_the_rest_wait_with_the_scheduler_s_reason(
        member: Path) -> None:
    apply_member(member, "---".join(claiming_pod(f"train-{i}", "two-gpus") for i in range(3)))

    def placed() -> dict[str, dict[str, Any]] | None:
        found = pods(member, "two-gpus")
        running = [p for p in found.values() if p["status"].get("phase") == "Running"]
        waiting = [p for p in found.values() if unschedulable(p)]
        return found if len(running) == 2 and len(waiting) == 1 else None

    found = eventually(placed, timeout=60, what="2 pods Running, 1 unschedulable")
    used: set[tuple[str, str]] = set()
    for pod in found.values():
        if pod["status"].get("phase") != "Running":
            message = unschedulable(pod)
            assert "cannot allocate all claims" in message, message
            assert pod["status"].get("containerStatuses") is None, "the engine left it alone"
            continue
        claim = claim_of(member, pod)
        devices = allocated(claim)
        # The claim names two devices of the pod's own node, used by no other claim.
        assert len(devices) == 2
        assert {node for node, _ in devices} == {pod["spec"]["nodeName"]}
        assert not used & set(devices)
        used |= set(devices)
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    assert used == {(node, f"gpu-{i}") for node in NODES for i in range(GPUS_PER_NODE)}
    # A pod that goes frees its devices: the one waiting gets them.
    first = next(name for name, pod in found.items() if pod["status"].get("phase") == "Running")
    kubectl(member, "-n", "work", "delete", "pod", first, "--wait=false")
    eventually(lambda: sum(p["status"].get("phase") == "Running"
                           for n, p in pods(member, "two-gpus").items() if n != first) == 2,
               timeout=60, what="the waiting pod Running on the freed devices")
    delete_pods(member, "two-gpus")


def test_an_xid_takes_a_device_out_for_new_claims_until_it_recovers(
        fleet: Fleet, member: Path) -> None:
    plan = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": "xid", "namespace": NAMESPACE},
            "spec": {"steps": [{
                "name": "xid", "at": "0s", "duration": "30s",
                "target": {"clusters": {"names": ["dra"]}, "nodes": {"names": ["h100-0"]}},
                "fault": {"type": "GPUXid", "xid": 79, "gpus": 1}}]}}
    fleet.apply(json.dumps(plan))

    def tainted() -> list[dict[str, Any]]:
        device = slices(member)["h100-0"]["spec"]["devices"][0]
        return list(device.get("taints") or ())

    taints = eventually(tainted, timeout=30, what="gpu-0 of h100-0 tainted")
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
        (UNHEALTHY, "Xid79", "NoExecute")]
    assert not slices(member)["h100-0"]["spec"]["devices"][1].get("taints")
    # Four claims of one GPU, three healthy GPUs: the tainted one goes to none of them.
    apply_member(member, "---".join(claiming_pod(f"infer-{i}", "one-gpu") for i in range(4)))

    def settled() -> dict[str, dict[str, Any]] | None:
        found = pods(member, "one-gpu")
        running = [p for p in found.values() if p["status"].get("phase") == "Running"]
        return found if len(running) == 3 and any(unschedulable(p) for p in found.values()) \
            else None

    found = eventually(settled, timeout=60, what="3 pods Running, 1 unschedulable")
    given = {device for pod in found.values() if pod["status"].get("phase") == "Running"
             for device in allocated(claim_of(member, pod))}
    assert ("h100-0", "gpu-0") not in given
    assert len(given) == 3
    # Recovered (the GPU reset): the device is offered again, and the waiting pod gets it.
    eventually(lambda: not tainted(), timeout=60, what="gpu-0 of h100-0 back in service")
    eventually(lambda: sum(p["status"].get("phase") == "Running"
                           for p in pods(member, "one-gpu").values()) == 4,
               timeout=60, what="the fourth pod Running on the GPU back in service")
    kubectl(fleet.host, "-n", NAMESPACE, "delete", "fp", "xid", "--timeout=60s")
    delete_pods(member, "one-gpu")
