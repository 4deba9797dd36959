"""kill -9 of the operator or of an engine, during a scale-up and during 200 running pods:
every node keeps its UID, every pod its phase, no node turns NotReady, no Job pod completes
early or twice. Real control planes, real engine processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import (
    CLUSTER,
    KUBECTL,
    POOL,
    Fleet,
    eventually,
    kubectl,
    kubectl_json,
    processes_mentioning,
)
from operators.k8s.times import parse, rfc3339

RUN_TIME = 40  # seconds each Job pod runs
JOB_PODS = 100
DEPLOYMENT_PODS = 100


@pytest.fixture(scope="module")
def gamma(fleet: Fleet) -> Path:
    fleet.apply(CLUSTER.format(name="gamma"))
    fleet.apply(POOL.format(name="g", cluster="gamma", replicas=10,
                            extra="  template: {capacity: {cpu: '64', memory: 256Gi, "
                                  "pods: '110'}}"))
    fleet.wait_cluster_ready("gamma")
    fleet.wait_pool("g", 10)
    kubeconfig = fleet.member("gamma")
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    return kubeconfig


def engine_pid(fleet: Fleet, cluster: str) -> int:
    """The engine's process: its command line names operators.engine and the cluster."""
    pids = [pid for pid in processes_mentioning(f"--cluster default/{cluster}")
            if "operators.engine" in (command := Path(f"/proc/{pid}/cmdline").read_text())
            and str(fleet.state) in command]
    assert len(pids) == 1, f"one engine process for {cluster}, found {pids}"
    return pids[0]


def nodes(kubeconfig: Path) -> dict[str, dict[str, Any]]:
    items = kubectl_json(kubeconfig, "get", "nodes", "-l", "fakefleet.dev/pool")["items"]
    return {item["metadata"]["name"]: item for item in items}


def ready_since(node: dict[str, Any]) -> str:
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", f"{node['metadata']['name']} is not Ready: {ready}"
    return str(ready["lastTransitionTime"])


def no_node_went_not_ready(kubeconfig: Path) -> None:
    events = kubectl(kubeconfig, "get", "events", "-A", "--field-selector",
                     "reason=NodeNotReady", "-o", "name").stdout
    assert events.strip() == "", f"the node-lifecycle controller saw nodes NotReady: {events}"


@pytest.mark.parametrize("victim", ["engine", "operator"])
def test_kill_during_a_scale_up_recreates_no_node(fleet: Fleet, gamma: Path,
                                                  victim: str) -> None:
    target = 60 if victim == "engine" else 100
    before = {name: node["metadata"]["uid"] for name, node in nodes(gamma).items()}
    kubectl(fleet.host, "scale", "fnp/g", f"--replicas={target}")
    eventually(lambda: len(nodes(gamma)) >= len(before) + 10, timeout=60,
               what="the scale-up to be under way")
    midway = {name: node["metadata"]["uid"] for name, node in nodes(gamma).items()}
    killed = rfc3339()
    if victim == "engine":
        os.kill(engine_pid(fleet, "gamma"), signal.SIGKILL)
    else:
        old = fleet.operator_pid()
        os.kill(old, signal.SIGKILL)
        eventually(lambda: fleet.operator_restarted(old), timeout=60,
                   what="the daemon to restart the operator")
        fleet.wait_cluster_ready("gamma", since=killed)
    fleet.wait_pool("g", target, timeout=180)
    after = {name: node["metadata"]["uid"] for name, node in nodes(gamma).items()}
    assert len(after) == target
    changed = {name for name, uid in midway.items() if after.get(name) != uid}
    assert not changed, f"nodes made again after the kill: {sorted(changed)}"
    assert all(after[name] == uid for name, uid in before.items())
    for node in nodes(gamma).values():
        ready_since(node)
    no_node_went_not_ready(gamma)


def pods(kubeconfig: Path, selector: str) -> dict[str, dict[str, Any]]:
    items = kubectl_json(kubeconfig, "get", "pods", "-l", selector)["items"]
    return {item["metadata"]["name"]: item for item in items}


def started_at(pod: dict[str, Any]) -> float:
    state = pod["status"]["containerStatuses"][0]["state"]
    return parse((state.get("running") or state.get("terminated"))["startedAt"])


@pytest.mark.parametrize("victim", ["engine", "operator"])
def test_kill_during_200_running_pods_changes_no_pod(fleet: Fleet, gamma: Path,
                                                     victim: str) -> None:
    name = f"batch-{victim}"
    kubectl(gamma, "create", "deployment", f"web-{victim}", "--image=nginx:1.27",
            f"--replicas={DEPLOYMENT_PODS}")
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"completions": JOB_PODS, "parallelism": JOB_PODS, "backoffLimit": 0,
                 "template": {
                     "metadata": {"annotations": {"fakefleet.dev/run-time": f"{RUN_TIME}s"}},
                     "spec": {"restartPolicy": "Never",
                              "containers": [{"name": "work", "image": "busybox"}]}}}}
    subprocess.run([str(KUBECTL), "--kubeconfig", str(gamma), "create", "-f", "-"],
                   input=json.dumps(job), text=True, check=True, capture_output=True,
                   timeout=60)
    selector = f"app=web-{victim}"
    job_selector = f"batch.kubernetes.io/job-name={name}"

    def all_running() -> bool:
        found = {**pods(gamma, selector), **pods(gamma, job_selector)}
        return len(found) == DEPLOYMENT_PODS + JOB_PODS and all(
            p["status"].get("phase") == "Running" for p in found.values())

    eventually(all_running, timeout=120, what="200 pods Running")
    running = {**pods(gamma, selector), **pods(gamma, job_selector)}
    first_start = min(started_at(p) for p in pods(gamma, job_selector).values())
    # Kill halfway through the Jobs' run time.
    time.sleep(max(0.0, first_start + RUN_TIME / 2 - time.time()))
    killed = rfc3339()
    if victim == "engine":
        os.kill(engine_pid(fleet, "gamma"), signal.SIGKILL)
    else:
        old = fleet.operator_pid()
        os.kill(old, signal.SIGKILL)
        eventually(lambda: fleet.operator_restarted(old), timeout=60,
                   what="the daemon to restart the operator")
        fleet.wait_cluster_ready("gamma", since=killed)

    eventually(lambda: kubectl_json(gamma, "get", "job", name)["status"].get("succeeded")
               == JOB_PODS, timeout=180, what=f"{JOB_PODS} Job pods succeeded")
    finished = pods(gamma, job_selector)
    assert set(finished) == {n for n in running if n.startswith(name)}, "no pod made again"
    for pod_name, pod in finished.items():
        container = pod["status"]["containerStatuses"][0]
        terminated = container["state"]["terminated"]
        ran = parse(terminated["finishedAt"]) - parse(terminated["startedAt"])
        assert pod["status"]["phase"] == "Succeeded"
        assert container["restartCount"] == 0
        assert ran >= RUN_TIME, f"{pod_name} completed early, after {ran:.0f}s"
        assert started_at(pod) == started_at(running[pod_name]), f"{pod_name} started again"
    job_status = kubectl_json(gamma, "get", "job", name)["status"]
    assert job_status.get("failed", 0) == 0
    deployment = pods(gamma, selector)
    assert set(deployment) == {n for n in running if n.startswith("web-")}
    for pod_name, pod in deployment.items():
        assert pod["metadata"]["uid"] == running[pod_name]["metadata"]["uid"]
        assert pod["status"]["phase"] == "Running"
        assert pod["status"]["podIP"] == running[pod_name]["status"]["podIP"]
        assert started_at(pod) == started_at(running[pod_name])
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    for node in nodes(gamma).values():
        ready_since(node)
    no_node_went_not_ready(gamma)
    kubectl(gamma, "delete", "deployment", f"web-{victim}", "--wait=false")
    kubectl(gamma, "delete", "job", name, "--wait=false")
