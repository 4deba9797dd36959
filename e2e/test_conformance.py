"""``fakefleet conformance run`` on a GPU FakeCluster with Kueue, Karpenter and custom metrics:
every automatable MUST is Implemented with its evidence (pod autoscaling: an HPA of type Pods
scaled up and down on the serving queue, through the real Prometheus and adapter), PRODUCT.yaml
passes the offline subset of upstream's validator, junit.xml has a case per requirement and
DRA's; then each check is shown to fail when its component is broken (Kueue stopped, the metrics
endpoint off, Karpenter absent, custom metrics off), so that none of them can only pass.

Then gang scheduling again under an Xid 79 FaultPlan, reported in junit.xml and the evidence.

One cluster for the module: a static H100 node (Kueue's gangs, DCGM, the RayCluster, the HPA's
GPU pods), a pool Karpenter makes H100 nodes for, and a node offering its GPUs through DRA.
KubeRay is on, so robust_controller must hold.
"""

from __future__ import annotations

import json
import socket
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import FAKEFLEET, Fleet, eventually, kubectl
from operators.conformance import checklists, validating

NAMESPACE = "ffc"
CLUSTER = "rehearsal"
METRIC = "vllm_num_requests_waiting"


def manifest() -> str:
    addons: dict[str, Any] = {"kueue": {}, "karpenter": {"consolidateAfter": "5s",
                                                         "disruptionBudget": "100%"},
                              "customMetrics": {}, "kuberay": {}}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
         "metadata": {"name": CLUSTER, "namespace": NAMESPACE}, "spec": {"addons": addons}},
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
         "metadata": {"name": "h100", "namespace": NAMESPACE},
         "spec": {"clusterRef": CLUSTER, "replicas": 1, "gpu": {"preset": "H100-SXM5-80GB"}}},
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
         "metadata": {"name": "burst", "namespace": NAMESPACE},
         "spec": {"clusterRef": CLUSTER, "provisioner": "karpenter",
                  "gpu": {"preset": "H100-SXM5-80GB"}, "leaseDurationSeconds": 10}},
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
         "metadata": {"name": "dra", "namespace": NAMESPACE},
         "spec": {"clusterRef": CLUSTER, "replicas": 1,
                  "gpu": {"preset": "H100-SXM5-80GB", "allocation": "dra"}}},
    ]
    return "\n---\n".join(json.dumps(doc) for doc in docs)


def conditions(fleet: Fleet) -> dict[str, str]:
    found = fleet.get("fc", CLUSTER, "-n", NAMESPACE)
    return {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}


@pytest.fixture(scope="module")
def cluster(fleet: Fleet) -> Iterator[str]:
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    fleet.apply(manifest())
    wanted = {"Ready", "KueueReady", "KarpenterReady", "PrometheusReady",
              "CustomMetricsReady", "KubeRayReady"}
    eventually(lambda: all(conditions(fleet).get(kind) == "True" for kind in wanted),
               timeout=300, what=f"{CLUSTER} Ready with its add-ons")
    eventually(lambda: (fleet.get("fnp", "h100", "-n", NAMESPACE).get("status") or {}).get(
        "readyReplicas") == 1, timeout=120, what="the static H100 node Ready")
    yield f"{NAMESPACE}/{CLUSTER}"
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


def rehearse(fleet: Fleet, cluster: str, output: Path, *args: str) -> tuple[
        int, dict[str, dict[str, Any]], str]:
    """Run it; (exit code, PRODUCT.yaml's requirements by id, what it printed)."""
    # Its checks' deadlines bound it; the subprocess' own timeout only guards against a hang.
    done = subprocess.run([str(FAKEFLEET), "conformance", "run", "--cluster", cluster, "-o",
                           str(output), "--state-dir", str(fleet.state), *args],
                          capture_output=True, text=True, timeout=1200)
    product = yaml.safe_load((output / "PRODUCT.yaml").read_text())
    assert validating.validate(product, checklists.load(), output) == [], done.stderr
    items = {i["id"]: i for section in product["spec"].values() for i in section}
    return done.returncode, items, done.stdout + done.stderr


def test_a_full_run_implements_what_main_can_check_with_evidence(
        fleet: Fleet, cluster: str, tmp_path: Path) -> None:
    code, items, printed = rehearse(fleet, cluster, tmp_path)
    assert "rehearsal on simulated hardware, not a certification" in printed
    for header in ("requirement", "level", "status", "time"):
        assert header in printed
    implemented = ["gang_scheduling", "cluster_autoscaling", "pod_autoscaling",
                   "accelerator_metrics", "ai_service_metrics", "robust_controller"]
    for id in implemented:
        assert items[id]["status"] == "Implemented", (id, items[id]["notes"], printed[-3000:])
        assert items[id]["evidence"], id
        for path in items[id]["evidence"]:
            assert (tmp_path / path).is_file(), path
    assert all(len(items[id]["evidence"]) >= 2 for id in implemented)
    assert items["secure_accelerator_access"]["status"] == "Not Implemented"
    assert items["high_performance_networking"]["status"] == "N/A"
    assert items["ai_inference"]["status"] != "Implemented"
    assert code == 0, printed
    product = (tmp_path / "PRODUCT.yaml").read_text()
    assert "MUST 'secure_accelerator_access' is 'Not Implemented'" in product
    assert "vendorName: '[placeholder]'" in product
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").iter("testcase")}
    assert set(cases) == set(items) | {"dra_resource_claims"}
    assert cases["dra_resource_claims"].find("failure") is None, ET.tostring(
        cases["dra_resource_claims"], "unicode")
    assert (tmp_path / "evidence/dra_resource_claims/resourceclaim.yaml").is_file()
    scaled_on_the_queue(tmp_path / "evidence/pod_autoscaling")
    served_from_prometheus(tmp_path / "evidence/ai_service_metrics")


def scaled_on_the_queue(evidence: Path) -> None:
    """The HPA is of type Pods on the queue, and its controller rescaled to 2 and back to 1."""
    hpa = yaml.safe_load((evidence / "hpa.yaml").read_text())
    assert [(m["type"], m["pods"]["metric"]["name"]) for m in hpa["spec"]["metrics"]] == [
        ("Pods", METRIC)], hpa["spec"]
    rescales = [e["message"] for e in yaml.safe_load((evidence / "events.yaml").read_text())
                if e["reason"] == "SuccessfulRescale"]
    assert sorted(m.split(";")[0] for m in rescales) == ["New size: 1", "New size: 2"], rescales
    up = next(m for m in rescales if m.startswith("New size: 2"))
    assert f"{METRIC} above target" in up, rescales


def served_from_prometheus(evidence: Path) -> None:
    """custom.metrics.k8s.io answered the serving pods' queue as they report it (7): the
    adapter answers only what Prometheus collected."""
    prometheus = yaml.safe_load((evidence / "PrometheusReady.yaml").read_text())
    assert (prometheus["status"], prometheus["reason"]) == ("True", "Running"), prometheus
    found = yaml.safe_load((evidence / "custom-metrics.yaml").read_text())
    assert found["items"], found
    for item in found["items"]:
        assert (item["metric"]["name"], item["value"]) == (METRIC, "7"), item
        assert item["describedObject"]["kind"] == "Pod", item


def test_gang_scheduling_under_an_xid_79_is_reported_as_holding_or_not(
        fleet: Fleet, cluster: str, tmp_path: Path) -> None:
    """The static H100 node loses a GPU (Xid 79, its NoExecute taint) while the gangs run
    again: Karpenter makes nodes for them, so gang scheduling still holds; the plan is gone
    after it, and PRODUCT.yaml does not mention it."""
    code, items, printed = rehearse(fleet, cluster, tmp_path, "--only", "gang_scheduling",
                                    "--under-faults")
    assert code == 1  # --only: the other MUSTs were not checked
    assert items["gang_scheduling"]["status"] == "Implemented"
    assert "gang_scheduling-under-gpu-xid-79: holds (under Xid 79" in printed, printed
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").iter("testcase")}
    assert cases["gang_scheduling-under-gpu-xid-79"].find("failure") is None
    plan = yaml.safe_load((tmp_path / "evidence/gang_scheduling-under-gpu-xid-79/"
                                      "faultplan.yaml").read_text())
    assert plan["status"]["injections"][0]["state"] == "Injected"
    assert not fleet.get("fp", "-n", NAMESPACE)["items"], "the plan deleted after the check"
    assert "under-gpu-xid" not in (tmp_path / "PRODUCT.yaml").read_text()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_metrics_endpoint_off_fails_accelerator_metrics(fleet: Fleet, cluster: str,
                                                            tmp_path: Path) -> None:
    code, items, _ = rehearse(
        fleet, cluster, tmp_path, "--only", "accelerator_metrics", "--metrics-endpoint",
        f"http://127.0.0.1:{closed_port()}/metrics")
    assert code == 1
    found = items["accelerator_metrics"]
    assert found["status"] == "Not Implemented"
    assert "did not answer" in found["notes"], found


def test_custom_metrics_off_fails_pod_autoscaling(fleet: Fleet, cluster: str,
                                                  tmp_path: Path) -> None:
    kubectl(fleet.host, "-n", NAMESPACE, "patch", "fc", CLUSTER, "--type=merge",
            "-p", '{"spec":{"addons":{"customMetrics":{"enabled":false}}}}')
    eventually(lambda: "CustomMetricsReady" not in conditions(fleet), timeout=60,
               what="custom metrics stopped")
    code, items, _ = rehearse(fleet, cluster, tmp_path, "--only", "pod_autoscaling")
    assert code == 1
    assert items["pod_autoscaling"]["status"] == "Not Implemented"
    assert "spec.addons.customMetrics is not enabled" in items["pod_autoscaling"]["notes"]


def test_kueue_stopped_fails_gang_scheduling(fleet: Fleet, cluster: str,
                                             tmp_path: Path) -> None:
    kubectl(fleet.host, "-n", NAMESPACE, "patch", "fc", CLUSTER, "--type=merge",
            "-p", '{"spec":{"addons":{"kueue":{"enabled":false}}}}')
    eventually(lambda: "KueueReady" not in conditions(fleet), timeout=60,
               what="Kueue stopped")
    code, items, _ = rehearse(fleet, cluster, tmp_path, "--only", "gang_scheduling")
    assert code == 1
    assert items["gang_scheduling"]["status"] == "Not Implemented"
    assert "spec.addons.kueue is not enabled" in items["gang_scheduling"]["notes"]


def test_karpenter_absent_fails_cluster_autoscaling(fleet: Fleet, cluster: str,
                                                    tmp_path: Path) -> None:
    kubectl(fleet.host, "-n", NAMESPACE, "patch", "fc", CLUSTER, "--type=merge",
            "-p", '{"spec":{"addons":{"karpenter":{"enabled":false}}}}')
    eventually(lambda: "KarpenterReady" not in conditions(fleet), timeout=60,
               what="Karpenter stopped")
    code, items, _ = rehearse(fleet, cluster, tmp_path, "--only", "cluster_autoscaling")
    assert code == 1
    assert items["cluster_autoscaling"]["status"] == "Not Implemented"
    assert "spec.addons.karpenter is not enabled" in items["cluster_autoscaling"]["notes"]
