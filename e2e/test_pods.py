"""Pods on fake nodes, end to end: the real scheduler binds them, the real controller-manager
runs Deployments and Jobs, the engine gives them a life."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import CLUSTER, KUBECTL, POOL, Fleet, eventually, kubectl, kubectl_json


@pytest.fixture(scope="module")
def beta(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(CLUSTER.format(name="beta"))
    fleet.apply(POOL.format(name="workers", cluster="beta", replicas=4,
                            extra="  pods: {terminationGracePeriodCap: 0s}"))
    fleet.wait_cluster_ready("beta")
    fleet.wait_pool("workers", 4)
    kubeconfig = fleet.member("beta")
    # The controller-manager makes the default ServiceAccount that pods need.
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield kubeconfig
    fleet.release("beta", "workers")


def create(kubeconfig: Path, manifest: dict[str, Any]) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "create", "-f", "-"],
                   input=json.dumps(manifest), text=True, check=True, capture_output=True,
                   timeout=60)


def pods(kubeconfig: Path, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl_json(kubeconfig, "get", "pods", "-l", selector)[
        "items"]
    return items


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def test_deployment_of_50_reaches_50_ready(beta: Path) -> None:
    kubectl(beta, "create", "deployment", "web", "--image=nginx:1.27", "--replicas=50")
    eventually(lambda: kubectl_json(beta, "get", "deployment", "web")["status"].get(
        "readyReplicas") == 50, timeout=120, what="50 ready replicas")
    running = pods(beta, "app=web")
    assert len(running) == 50
    assert all(p["status"]["phase"] == "Running" and is_ready(p) for p in running)
    ips = [p["status"]["podIP"] for p in running]
    assert len(set(ips)) == 50, "pod IPs are unique"
    for pod in running:
        node = kubectl_json(beta, "get", "node", pod["spec"]["nodeName"])
        cidr_prefix = node["spec"]["podCIDR"].rsplit(".", 1)[0]
        assert pod["status"]["podIP"].startswith(cidr_prefix + ".")
        assert pod["status"]["hostIP"] == node["status"]["addresses"][0]["address"]
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] is True
        assert status["state"]["running"]["startedAt"]
        assert status["containerID"].startswith("containerd://")
        kinds = {c["type"] for c in pod["status"]["conditions"]}
        assert kinds >= {"PodScheduled", "Initialized", "ContainersReady", "Ready",
                         "PodReadyToStartContainers"}


def test_job_of_20_completions_completes(beta: Path) -> None:
    create(beta, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "batch"},
        "spec": {"completions": 20, "parallelism": 10, "template": {
            "metadata": {"annotations": {"fakefleet.dev/run-time": "2s"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "work", "image": "busybox"}]}}}})
    eventually(lambda: kubectl_json(beta, "get", "job", "batch")["status"].get(
        "succeeded") == 20, timeout=120, what="20 successful completions")
    job = kubectl_json(beta, "get", "job", "batch")
    assert any(c["type"] == "Complete" and c["status"] == "True"
               for c in job["status"]["conditions"])
    finished = pods(beta, "batch.kubernetes.io/job-name=batch")
    for pod in finished:
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (pod["status"]["phase"], terminated["exitCode"], terminated["reason"]) == (
            "Succeeded", 0, "Completed")


def test_failing_container_with_restart_never_ends_failed(beta: Path) -> None:
    create(beta, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "fails", "annotations": {"fakefleet.dev/run-time": "1s",
                                                      "fakefleet.dev/exit-code": "42"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}})
    pod = eventually(lambda: (found := kubectl_json(beta, "get", "pod", "fails"))["status"].get(
        "phase") == "Failed" and found, what="the pod to fail")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 42
    assert terminated["reason"] == "Error"


def test_failing_container_with_restart_always_crash_loops(beta: Path) -> None:
    create(beta, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "crashes", "annotations": {"fakefleet.dev/run-time": "1s",
                                                        "fakefleet.dev/exit-code": "1"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})

    def looping() -> dict[str, Any] | None:
        status = kubectl_json(beta, "get", "pod", "crashes")["status"]
        container = (status.get("containerStatuses") or [{}])[0]
        waiting = container.get("state", {}).get("waiting", {})
        return container if waiting.get("reason") == "CrashLoopBackOff" else None

    container = eventually(looping, what="CrashLoopBackOff")
    assert container["restartCount"] >= 1
    assert container["lastState"]["terminated"]["exitCode"] == 1
    assert kubectl_json(beta, "get", "pod", "crashes")["status"]["phase"] == "Running"


def test_deleting_pods_removes_them(beta: Path) -> None:
    kubectl(beta, "scale", "deployment", "web", "--replicas=10")
    eventually(lambda: len(pods(beta, "app=web")) == 10, timeout=60,
               what="scale-down to 10 pods")
    kubectl(beta, "delete", "pod", "-l", "app=web", "--wait=false")
    kubectl(beta, "delete", "pod", "fails", "crashes", "--timeout=60s")
    eventually(lambda: kubectl_json(beta, "get", "deployment", "web")["status"].get(
        "readyReplicas") == 10, timeout=60, what="replacement pods Ready")
    names = {p["metadata"]["name"] for p in kubectl_json(beta, "get", "pods")["items"]}
    assert "fails" not in names
    assert "crashes" not in names


def test_bad_annotation_is_reported_as_a_warning_event_on_the_pod(beta: Path) -> None:
    create(beta, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "typo", "annotations": {"fakefleet.dev/run-time": "90 seconds"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})

    def warnings() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = kubectl_json(
            beta, "get", "events", "--field-selector",
            "involvedObject.name=typo,reason=InvalidAnnotation")["items"]
        return events

    event = eventually(warnings, what="a Warning event on the pod")[0]
    assert event["type"] == "Warning"
    assert "fakefleet.dev/run-time" in event["message"]
    assert "such as 90s" in event["message"]
    # The annotation is ignored, nothing else: the pod runs until deleted.
    eventually(lambda: kubectl_json(beta, "get", "pod", "typo")["status"].get(
        "phase") == "Running", what="the pod to run")
    kubectl(beta, "delete", "pod", "typo", "--timeout=60s")


def test_a_pod_larger_than_a_watch_line_limit_runs_and_the_engine_keeps_going(
        beta: Path) -> None:
    """A watch event is one line; a pod of 700 KiB ended the whole engine when lines were
    read with aiohttp's line reader."""
    create(beta, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "env": [
            {"name": "BLOB", "value": "x" * (700 * 1024)}]}]}})
    eventually(lambda: kubectl_json(beta, "get", "pod", "huge")["status"].get("phase")
               == "Running", what="the 700 KiB pod to run")
    create(beta, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after-huge"},
                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    eventually(lambda: kubectl_json(beta, "get", "pod", "after-huge")["status"].get("phase")
               == "Running", what="the next pod to run too")
    kubectl(beta, "delete", "pod", "huge", "after-huge", "--timeout=60s")
