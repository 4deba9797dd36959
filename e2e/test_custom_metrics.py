"""HPA on an application metric end to end, through the path a platform team runs: real
Prometheus 3.16.0 discovers the pods in the member's API server and scrapes the metric their
annotations declare (through their nodes: the engine serves it), fakefleet's custom-metrics
adapter (on sigs.k8s.io/custom-metrics-apiserver v1.37.0) serves it as custom.metrics.k8s.io
through the member's real aggregation layer, and the controller-manager's real HPA controller
scales a Deployment on it (type Pods): up when the queue grows, back down when it drains.

One FakeCluster for the module (two CPU nodes), spec.addons.customMetrics with its defaults
(scrape every 5 s, every metric served); the pods opt in with prometheus.io/scrape: "true".
The binaries are built beforehand (``make setup``): a build is not what this tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import KUBECTL, Fleet, eventually, kubectl, kubectl_json

CLUSTER = "queued"
METRIC = "vllm_num_requests_waiting"
ANNOTATION = f"fakefleet.dev/metric.{METRIC}"
RAW = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/{METRIC}"
MANIFESTS = f"""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {CLUSTER}}}
spec:
  addons: {{customMetrics: {{}}}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: queued-cpu}}
spec:
  clusterRef: {CLUSTER}
  replicas: 2
  pods: {{terminationGracePeriodCap: 0s}}
"""


def condition(fleet: Fleet, kind: str) -> dict[str, Any]:
    found = fleet.get("fc", CLUSTER)
    return next((c for c in (found.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})


@pytest.fixture(scope="module")
def member(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(MANIFESTS)
    fleet.wait_cluster_ready(CLUSTER)
    fleet.wait_pool("queued-cpu", 2)
    eventually(lambda: all(condition(fleet, kind).get("status") == "True"
                           for kind in ("PrometheusReady", "CustomMetricsReady")),
               timeout=180, what="PrometheusReady and CustomMetricsReady")
    path = fleet.member(CLUSTER)
    eventually(lambda: kubectl(path, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield path
    # Prometheus and the adapter are the heaviest members' add-ons: not kept for later modules.
    kubectl(fleet.host, "delete", "fnp", "queued-cpu", "--wait=false", check=False)
    kubectl(fleet.host, "delete", "fc", CLUSTER, "--wait=false", check=False)


def create(kubeconfig: Path, *manifests: dict[str, Any]) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "create", "-f", "-"],
                   input="\n---\n".join(json.dumps(m) for m in manifests), text=True,
                   check=True, capture_output=True, timeout=60)


def served(kubeconfig: Path) -> dict[str, str]:
    """What custom.metrics.k8s.io answers for the Deployment's pods: pod → value."""
    done = kubectl(kubeconfig, "get", "--raw", f"{RAW}?labelSelector=app%3Dvllm", check=False)
    if done.returncode != 0:
        return {}
    return {item["describedObject"]["name"]: item["value"]
            for item in json.loads(done.stdout)["items"]}


def hpa(kubeconfig: Path) -> dict[str, Any]:
    found: dict[str, Any] = kubectl_json(kubeconfig, "get", "hpa", "vllm")
    return found


def replicas(kubeconfig: Path) -> int:
    return int(kubectl_json(kubeconfig, "get", "deployment", "vllm")["spec"]["replicas"])


def set_queue(kubeconfig: Path, value: str) -> None:
    """The queue every pod of the Deployment reports from now on: its template's annotation
    (a rollout: the new pods say it)."""
    kubectl(kubeconfig, "patch", "deployment", "vllm", "--type=merge", "-p", json.dumps(
        {"spec": {"template": {"metadata": {"annotations": {ANNOTATION: value}}}}}))


def test_an_hpa_scales_a_deployment_up_and_down_on_an_application_metric(
        fleet: Fleet, member: Path) -> None:
    create(member, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vllm"}}, "template": {
            "metadata": {"labels": {"app": "vllm"},
                         "annotations": {"prometheus.io/scrape": "true", ANNOTATION: "0"}},
            "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai"}]}}}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
         "metadata": {"name": "vllm"},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "vllm"},
                  "minReplicas": 1, "maxReplicas": 4,
                  "metrics": [{"type": "Pods", "pods": {
                      "metric": {"name": METRIC},
                      "target": {"type": "AverageValue", "averageValue": "10"}}}],
                  "behavior": {"scaleDown": {"stabilizationWindowSeconds": 15, "policies": [
                      {"type": "Percent", "value": 100, "periodSeconds": 15}]}}}})

    eventually(lambda: list(served(member).values()) == ["0"], timeout=90,
               what="custom.metrics.k8s.io serving the pod's queue, 0")

    def measuring() -> bool:
        status = hpa(member).get("status") or {}
        current = (status.get("currentMetrics") or [{}])[0].get("pods", {})
        active: dict[str, Any] = next((c for c in status.get("conditions") or ()
                                       if c["type"] == "ScalingActive"), {})
        return current.get("current", {}).get("averageValue") == "0" and \
            active.get("status") == "True"
    eventually(measuring, timeout=60, what="the HPA measuring the queue at 0")
    assert replicas(member) == 1

    stepped = time.monotonic()
    set_queue(member, "30")
    eventually(lambda: int((hpa(member).get("status") or {}).get("desiredReplicas") or 0) > 1,
               timeout=90, what="the HPA wanting more than 1 replica for a queue of 30")
    print(f"\nqueue 0 -> 30 to the HPA's new desired replicas: "
          f"{time.monotonic() - stepped:.1f}s")
    eventually(lambda: replicas(member) == 4, timeout=120,
               what="the HPA scaling the Deployment to its maximum, 4")
    eventually(lambda: list(served(member).values()) == ["30"] * 4, timeout=90,
               what="custom.metrics.k8s.io serving 30 for each of the 4 pods")

    drained = time.monotonic()
    set_queue(member, "0")
    eventually(lambda: replicas(member) == 1, timeout=180,
               what="the HPA scaling the Deployment back to 1 once the queue drained")
    print(f"queue 30 -> 0 to 1 replica (15 s stabilization window): "
          f"{time.monotonic() - drained:.1f}s")


def test_prometheus_scraped_the_pods_through_their_nodes_with_their_labels(
        fleet: Fleet, member: Path) -> None:
    message = condition(fleet, "PrometheusReady")["message"]
    match = re.search(r"at (http://127\.0\.0\.1:\d+) ", message)
    assert match is not None, message
    query = urllib.parse.urlencode({"query": f"{METRIC} or up"})

    def read() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{match.group(1)}/api/v1/query?{query}",
                                    timeout=10) as answer:
            return json.loads(answer.read())["data"]["result"]  # type: ignore[no-any-return]

    def all_up() -> list[dict[str, Any]] | None:
        # Right after the scale-down a pod being deleted may still be a target whose last
        # scrape found it gone (up 0); once discovery drops it, its series goes stale.
        result = read()
        return result if all(entry["value"][1] == "1" for entry in result
                             if entry["metric"]["__name__"] == "up") else None

    result = eventually(all_up, timeout=60, what="every target of a live pod up")
    series = [entry["metric"] for entry in result if entry["metric"]["__name__"] == METRIC]
    assert series, result
    for labels in series:
        assert labels["job"] == "kubernetes-pods"
        assert labels["namespace"] == "default"
        assert labels["pod"].startswith("vllm-")
        assert labels["container"] == "engine"
        assert labels["node"].startswith("queued-cpu-")
        assert not any(name.startswith("exported_") for name in labels), labels
        assert labels["instance"].startswith("127."), "scraped at a node's address"
    listed = json.loads(kubectl(member, "get", "--raw",
                                "/apis/custom.metrics.k8s.io/v1beta2").stdout)
    assert f"pods/{METRIC}" in {resource["name"] for resource in listed["resources"]}, \
        "the metric listed in discovery"


def test_disabling_the_path_removes_its_apiservices(fleet: Fleet, member: Path) -> None:
    fleet.apply(MANIFESTS.replace("customMetrics: {}", "customMetrics: {enabled: false}"))
    eventually(lambda: kubectl(member, "get", "apiservice", "v1beta2.custom.metrics.k8s.io",
                               check=False).returncode != 0, timeout=60,
               what="the custom.metrics.k8s.io APIServices removed")
    assert kubectl(member, "get", "apiservice", "v1beta1.custom.metrics.k8s.io",
                   check=False).returncode != 0
    eventually(lambda: not condition(fleet, "CustomMetricsReady")
               and not condition(fleet, "PrometheusReady"), timeout=60,
               what="both conditions gone from the status")
