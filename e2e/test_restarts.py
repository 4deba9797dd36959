"""kill -9 of the operator or of an engine, during a scale-up and during 200 running pods:
every node keeps its UID, every pod its phase, no node turns NotReady, no Job pod completes
early or twice; and under fakefleet up, a killed operator leaves the member's processes
running (a client polling its /readyz sees no failure). Real control planes, real engine
processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import threading
import time
import urllib.request
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
    kubectl,
    kubectl_json,
    processes_mentioning,
)
from operators.controlplane.health import client_tls
from operators.controlplane.pki import ClusterPKI
from operators.controlplane.state import StateDir
from operators.k8s.times import parse

RUN_TIME = 40  # seconds each Job pod runs
JOB_PODS = 100
DEPLOYMENT_PODS = 100


@pytest.fixture(scope="module")
def gamma(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(CLUSTER.format(name="gamma"))
    fleet.apply(POOL.format(name="g", cluster="gamma", replicas=10,
                            extra="  template: {capacity: {cpu: '64', memory: 256Gi, "
                                  "pods: '110'}}"))
    fleet.wait_cluster_ready("gamma")
    fleet.wait_pool("g", 10)
    kubeconfig = fleet.member("gamma")
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield kubeconfig
    fleet.release("gamma", "g")  # 100 nodes renewing Leases: some 0.05 cores more


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
    if victim == "engine":
        os.kill(engine_pid(fleet, "gamma"), signal.SIGKILL)
    else:
        old = fleet.operator_pid()
        os.kill(old, signal.SIGKILL)
        fleet.wait_member_served("gamma", old)
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
    if victim == "engine":
        os.kill(engine_pid(fleet, "gamma"), signal.SIGKILL)
    else:
        old = fleet.operator_pid()
        os.kill(old, signal.SIGKILL)
        fleet.wait_member_served("gamma", old)

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


class Poller(threading.Thread):
    """A client of the member that asks its API server's /readyz every 100 ms, each time on
    a new connection, and keeps every failure."""

    def __init__(self, url: str, tls: ssl.SSLContext) -> None:
        super().__init__(daemon=True)
        self.url, self.tls = url, tls
        self.polls = 0
        self.failures: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            self.polls += 1
            try:
                with urllib.request.urlopen(self.url, context=self.tls, timeout=2) as answer:
                    if answer.status != 200:
                        self.failures.append(f"{time.time():.1f}: HTTP {answer.status}")
            except OSError as error:
                self.failures.append(f"{time.time():.1f}: {error}")


def test_a_killed_operator_leaves_the_members_processes_running(fleet: Fleet,
                                                               gamma: Path) -> None:
    kubectl(gamma, "create", "deployment", "steady", "--image=nginx:1.27", "--replicas=20")
    eventually(lambda: len(running := pods(gamma, "app=steady")) == 20 and all(
        p["status"].get("phase") == "Running" for p in running.values()), timeout=120,
        what="20 pods Running")
    nodes_before, pods_before = nodes(gamma), pods(gamma, "app=steady")
    processes = fleet.member_processes("gamma")
    assert {"kube-apiserver", "kube-scheduler", "kube-controller-manager", "engine"} <= \
        set(processes)
    state = StateDir(fleet.state)
    pki = ClusterPKI(state.pki("default.gamma"))
    endpoint = fleet.get("fc", "gamma")["status"]["endpoint"]
    poller = Poller(f"{endpoint}/readyz", client_tls(
        pki.ca_cert, pki.client_cert("admin"), pki.client_key("admin")))
    poller.start()
    try:
        time.sleep(1)
        old = fleet.operator_pid()
        os.kill(old, signal.SIGKILL)
        adopted = fleet.wait_member_served("gamma", old, frozenset(processes))
        time.sleep(3)  # the new operator's first reconciles, and the polls go on
    finally:
        poller.stopping.set()
        poller.join()
    assert poller.failures == [], poller.failures
    assert poller.polls >= 30
    assert adopted == processes, "the same processes, adopted by the next operator"
    assert fleet.get("fc", "gamma")["status"]["phase"] == "Ready"
    after = nodes(gamma)
    assert {name: node["metadata"]["uid"] for name, node in after.items()} == \
        {name: node["metadata"]["uid"] for name, node in nodes_before.items()}
    for name, node in after.items():
        assert ready_since(node) == ready_since(nodes_before[name]), f"{name} went NotReady"
    pods_after = pods(gamma, "app=steady")
    assert {name: (pod["metadata"]["uid"], pod["status"]) for name, pod in pods_after.items()} \
        == {name: (pod["metadata"]["uid"], pod["status"]) for name, pod in pods_before.items()}
    no_node_went_not_ready(gamma)
    kubectl(gamma, "delete", "deployment", "steady", "--wait=false")
