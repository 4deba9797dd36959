"""Usage metrics end to end: the real metrics-server v0.8.0 scrapes the engine's fake kubelets
through a real aggregation layer, so that real kubectl top and a real HorizontalPodAutoscaler
(the controller-manager's) act on usage the pods' annotations declare; and the cluster's DCGM
endpoint shows a FaultPlan's GPU Xid on the GPU it hit.

One FakeCluster for the module (two CPU nodes, one H100 node), metrics-server at its shortest
resolution (10 s).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.conftest import KUBECTL, Fleet, eventually, kubectl, kubectl_json
from operators.api.gpus import gpu_uuid

CLUSTER = "gauge"
ENGINE_CLUSTER = f"default.{CLUSTER}"  # the engine's name for it, as GPU UUIDs carry it
MANIFESTS = f"""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {CLUSTER}}}
spec:
  addons: {{metricsServer: {{resolution: 10s}}}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: gauge-cpu}}
spec:
  clusterRef: {CLUSTER}
  replicas: 2
  pods: {{terminationGracePeriodCap: 0s}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: gauge-gpu}}
spec:
  clusterRef: {CLUSTER}
  replicas: 1
  gpu: {{preset: H100-SXM5-80GB}}
"""


@pytest.fixture(scope="module")
def gauge(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(MANIFESTS)
    fleet.wait_cluster_ready(CLUSTER)
    fleet.wait_pool("gauge-cpu", 2)
    fleet.wait_pool("gauge-gpu", 1)

    def serving() -> bool:
        found = fleet.get("fc", CLUSTER)
        return any(c["type"] == "MetricsServerReady" and c["status"] == "True"
                   for c in found["status"]["conditions"])
    eventually(serving, timeout=120, what="metrics-server serving metrics.k8s.io")
    kubeconfig = fleet.member(CLUSTER)
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield kubeconfig
    fleet.release(CLUSTER, "gauge-cpu", "gauge-gpu")


def create(kubeconfig: Path, *manifests: dict[str, Any]) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "create", "-f", "-"],
                   input="\n---\n".join(json.dumps(m) for m in manifests), text=True,
                   check=True, capture_output=True, timeout=60)


def top(kubeconfig: Path, *args: str) -> dict[str, tuple[str, str]]:
    """``kubectl top ...`` as name → (CPU, memory); empty while metrics are not there yet."""
    done = kubectl(kubeconfig, "top", *args, "--no-headers", check=False)
    if done.returncode != 0:
        return {}
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    return {row[0]: (row[1], row[2] if args[0] == "pods" else row[3]) for row in rows}


ON_CPU_NODES = {"nodeSelector": {"fakefleet.dev/pool": "gauge-cpu"}}


def test_kubectl_top_shows_the_annotated_usage_of_pods_and_nodes(gauge: Path) -> None:
    create(gauge, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "annotations": {"fakefleet.dev/usage-cpu": "250m",
                                                    "fakefleet.dev/usage-memory": "1Gi"}},
        "spec": {**ON_CPU_NODES, "containers": [{"name": "app", "image": "nginx"}]}})
    shown = eventually(lambda: top(gauge, "pods").get("web") == ("250m", "1024Mi"),
                       timeout=60, what="kubectl top pods showing web at 250m and 1024Mi")
    assert shown
    node = kubectl_json(gauge, "get", "pod", "web")["spec"]["nodeName"]
    nodes = eventually(lambda: top(gauge, "nodes"), timeout=60, what="kubectl top nodes")
    assert set(nodes) == {"gauge-cpu-0", "gauge-cpu-1", "gauge-gpu-0"}
    # The node's own 100m (the pool's default) and its pod's 250m.
    assert nodes[node][0] == "350m"
    kubectl(gauge, "annotate", "pod", "web", "fakefleet.dev/usage-cpu=1", "--overwrite")
    eventually(lambda: top(gauge, "pods").get("web", ("", ""))[0] == "1000m", timeout=60,
               what="kubectl top pods following the annotation to 1 core")


def replicas(kubeconfig: Path) -> int:
    found = kubectl_json(kubeconfig, "get", "deployment", "scaled")
    return int(found["status"].get("readyReplicas") or 0)


def test_a_horizontal_pod_autoscaler_scales_on_the_annotated_cpu_and_back(gauge: Path) -> None:
    create(gauge, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "scaled"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "scaled"}}, "template": {
            "metadata": {"labels": {"app": "scaled"},
                         "annotations": {"fakefleet.dev/usage-cpu": "20m"}},
            "spec": {**ON_CPU_NODES, "containers": [{
                "name": "app", "image": "nginx",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
         "metadata": {"name": "scaled"},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "scaled"},
                  "minReplicas": 2, "maxReplicas": 8,
                  "metrics": [{"type": "Resource", "resource": {
                      "name": "cpu", "target": {"type": "Utilization",
                                                "averageUtilization": 50}}}],
                  "behavior": {
                      "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [
                          {"type": "Pods", "value": 10, "periodSeconds": 1}]},
                      "scaleDown": {"stabilizationWindowSeconds": 0, "policies": [
                          {"type": "Percent", "value": 100, "periodSeconds": 1}]}}}})

    def measured() -> bool:
        hpa = kubectl_json(gauge, "get", "hpa", "scaled")
        current = (hpa.get("status") or {}).get("currentMetrics") or [{}]
        return bool(current[0].get("resource", {}).get("current", {}).get(
            "averageUtilization") == 20)
    eventually(measured, timeout=60, what="the HPA measuring 20% CPU")
    assert replicas(gauge) == 2
    kubectl(gauge, "annotate", "pods", "-l", "app=scaled", "fakefleet.dev/usage-cpu=300m",
            "--overwrite")
    eventually(lambda: replicas(gauge) >= 6, timeout=60,
               what="the HPA scaling the Deployment to at least 6 replicas")
    kubectl(gauge, "annotate", "pods", "-l", "app=scaled", "fakefleet.dev/usage-cpu=5m",
            "--overwrite")
    eventually(lambda: replicas(gauge) == 2, timeout=60,
               what="the HPA scaling the Deployment back to 2 replicas")


def dcgm(fleet: Fleet) -> dict[str, dict[str, tuple[float, dict[str, str]]]]:
    """Metric → gpu index → (value, labels), from the URL the FakeCluster's status names."""
    url = fleet.get("fc", CLUSTER)["status"]["dcgmEndpoint"]
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, dict[str, tuple[float, dict[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[sample.labels["gpu"]] = (sample.value,
                                                                       sample.labels)
    return found


def test_a_faultplan_s_gpu_xid_79_shows_in_dcgm_for_the_gpu_it_hit(fleet: Fleet,
                                                                   gauge: Path) -> None:
    before = dcgm(fleet)
    xids = before["DCGM_FI_DEV_XID_ERRORS"]
    assert sorted(xids) == [str(i) for i in range(8)]
    assert {value for value, _ in xids.values()} == {0}
    labels = xids["0"][1]
    assert labels["UUID"] == gpu_uuid(ENGINE_CLUSTER, "gauge-gpu-0", 0)
    assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["Hostname"] == "gauge-gpu-0"
    fleet.apply(json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": "gauge-xid"},
        "spec": {"steps": [{"name": "xid", "at": "0s", "duration": "5m",
                            "target": {"clusters": {"names": [CLUSTER]},
                                       "nodes": {"names": ["gauge-gpu-0"]}},
                            "fault": {"type": "GPUXid", "xid": 79}}]}}))

    def raised() -> dict[str, tuple[float, dict[str, str]]] | None:
        found = dcgm(fleet)["DCGM_FI_DEV_XID_ERRORS"]
        return found if found["0"][0] == 79 else None
    after = eventually(raised, timeout=60, what="DCGM_FI_DEV_XID_ERRORS 79 on GPU 0")
    assert [after[str(i)][0] for i in range(1, 8)] == [0] * 7, "only the GPU it hit"
    kubectl(fleet.host, "delete", "faultplan", "gauge-xid", "--wait=true")
    eventually(lambda: dcgm(fleet)["DCGM_FI_DEV_XID_ERRORS"]["0"][0] == 0, timeout=60,
               what="the GPU reset once the plan is gone")
