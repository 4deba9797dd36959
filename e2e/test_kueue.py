"""Real, unmodified Kueue v0.17.0 with MultiKueue on FakeClusters: a manager without nodes and
two GPU workers, each running Kueue as its spec.addons.kueue asks. Jobs submitted to the manager
are dispatched by MultiKueue to a worker, run there on fake H100 nodes, and finish on the
manager; with one worker's API server down (a FaultPlan), new Jobs go to the other worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import (
    KUBECTL,
    Fleet,
    eventually,
    fakefleet,
    kubectl,
    kubectl_json,
    processes_mentioning,
)
from operators.addons.kueue.running import Kueue
from operators.controlplane.state import StateDir

NAMESPACE = "mk"
WORKERS = ("mk-worker-a", "mk-worker-b")
NODES = 2
GPUS_PER_NODE = 8
EXAMPLES = Path(__file__).parent.parent / "examples" / "multikueue"


def clusters() -> str:
    docs: list[dict[str, Any]] = [{
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
        "metadata": {"name": "mk-manager", "namespace": NAMESPACE},
        "spec": {"addons": {"kueue": {"multiKueue": {"workers": list(WORKERS),
                                                     "workerLostTimeout": "30s"}}}}}]
    for worker in WORKERS:
        docs.append({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                     "metadata": {"name": worker, "namespace": NAMESPACE},
                     "spec": {"addons": {"kueue": {}}}})
        docs.append({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
                     "metadata": {"name": f"{worker}-h100", "namespace": NAMESPACE},
                     "spec": {"clusterRef": worker, "replicas": NODES,
                              "gpu": {"preset": "H100-SXM5-80GB"},
                              "template": {"capacity": {"cpu": "224", "memory": "2Ti",
                                                        "pods": "110"}}}})
    return "\n---\n".join(json.dumps(doc) for doc in docs)


def job(name: str, pods: int, run_time: str = "5s") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
        "spec": {"parallelism": pods, "completions": pods, "suspend": True, "template": {
            "metadata": {"annotations": {"fakefleet.dev/run-time": run_time}},
            "spec": {"restartPolicy": "Never",
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                      "effect": "NoSchedule"}],
                     "containers": [{"name": "train", "image": "pytorch",
                                     "resources": {"requests": {"cpu": "16",
                                                                "memory": "128Gi"},
                                                   "limits": {"nvidia.com/gpu": "8"}}}]}}},
    }


def submit(manager: Path, *jobs: dict[str, Any]) -> None:
    manifest = "\n---\n".join(json.dumps(j) for j in jobs)
    subprocess.run([str(KUBECTL), "--kubeconfig", str(manager), "create", "-f", "-"],
                   input=manifest, text=True, check=True, capture_output=True, timeout=60)


def workloads(manager: Path) -> dict[str, dict[str, Any]]:
    """The manager's Workloads by the name of their Job."""
    found = kubectl_json(manager, "get", "workloads.kueue.x-k8s.io", "-n", "default")["items"]
    return {w["metadata"]["ownerReferences"][0]["name"]: w for w in found}


def finished(workload: dict[str, Any]) -> bool:
    return any(c["type"] == "Finished" and c["status"] == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


def condition(fleet: Fleet, name: str, kind: str) -> dict[str, Any]:
    found = fleet.get("fc", name, "-n", NAMESPACE)
    return next((c for c in (found.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})


def worker_queues(gpus: int) -> str:
    """examples/multikueue/worker-queues.yaml with the quota of this test's nodes."""
    return (EXAMPLES / "worker-queues.yaml").read_text().replace(
        'nvidia.com/gpu, nominalQuota: "32"', f'nvidia.com/gpu, nominalQuota: "{gpus}"')


def apply(kubeconfig: Path, manifest: str) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
                   input=manifest, text=True, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def members(fleet: Fleet) -> Iterator[dict[str, Path]]:
    """The manager and both workers Ready with Kueue running and the queues applied; each
    member's kubeconfig."""
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    fleet.apply(clusters())
    for name in ("mk-manager", *WORKERS):
        # Ready includes Kueue running (and, on the manager, its workers known).
        eventually(lambda name=name: fleet.get("fc", name, "-n", NAMESPACE).get(
            "status", {}).get("phase") == "Ready", timeout=300, what=f"{name} Ready")
    paths = {name: member(fleet, name) for name in ("mk-manager", *WORKERS)}
    apply(paths["mk-manager"], (EXAMPLES / "manager-queues.yaml").read_text().replace(
        'nvidia.com/gpu, nominalQuota: "64"',
        f'nvidia.com/gpu, nominalQuota: "{len(WORKERS) * NODES * GPUS_PER_NODE}"'))
    for worker in WORKERS:
        apply(paths[worker], worker_queues(NODES * GPUS_PER_NODE))
    eventually(lambda: "mk-worker-a Active, mk-worker-b Active" in condition(
        fleet, "mk-manager", "KueueReady").get("message", ""), timeout=60,
               what="both MultiKueue workers Active")
    yield paths
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


def member(fleet: Fleet, name: str) -> Path:
    path = fleet.state / f"{NAMESPACE}.{name}.kubeconfig"
    path.write_text(fakefleet("kubeconfig", "--state-dir", str(fleet.state),
                              f"{NAMESPACE}/{name}").stdout)
    return path


def test_invalid_addons_are_refused_naming_the_field(fleet: Fleet) -> None:
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    own = json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                      "metadata": {"name": "selfish", "namespace": NAMESPACE},
                      "spec": {"addons": {"kueue": {"multiKueue": {"workers": ["selfish"]}}}}})
    refused = subprocess.run([str(KUBECTL), "--kubeconfig", str(fleet.host), "apply", "-f", "-"],
                             input=own, text=True, capture_output=True, timeout=60)
    assert refused.returncode != 0
    assert "spec.addons.kueue.multiKueue.workers lists this cluster itself" in refused.stderr
    external = json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
        "metadata": {"name": "adopted", "namespace": NAMESPACE},
        "spec": {"controlPlane": {"backend": "external", "kubeconfigSecretRef": {"name": "x"}},
                 "addons": {"kueue": {}}}})
    refused = subprocess.run([str(KUBECTL), "--kubeconfig", str(fleet.host), "apply", "-f", "-"],
                             input=external, text=True, capture_output=True, timeout=60)
    assert refused.returncode != 0
    assert "spec.addons.kueue needs controlPlane.backend 'local'" in refused.stderr


def test_jobs_on_the_manager_run_on_the_workers_and_finish(fleet: Fleet,
                                                          members: dict[str, Path]) -> None:
    manager = members["mk-manager"]
    ready = condition(fleet, "mk-manager", "KueueReady")
    assert ready["status"] == "True"
    assert ready["reason"] == "Running"
    # Each Job takes a whole worker (2 pods x 8 GPUs): four Jobs are two rounds on two workers.
    names = [f"train-{i}" for i in range(4)]
    ran: dict[str, set[tuple[str, str]]] = {worker: set() for worker in WORKERS}

    def all_finished() -> dict[str, dict[str, Any]] | None:
        # MultiKueue deletes a worker's copy once it finished: note where pods ran meanwhile.
        for worker in WORKERS:
            for pod in kubectl_json(members[worker], "get", "pods", "-n", "default")["items"]:
                if pod["status"].get("phase") in ("Running", "Succeeded"):
                    ran[worker].add((pod["metadata"]["labels"].get("job-name", ""),
                                     pod["spec"]["nodeName"]))
        found = workloads(manager)
        return found if len(found) == len(names) and all(
            finished(w) for w in found.values()) else None

    submitted = time.monotonic()
    submit(manager, *(job(name, pods=NODES) for name in names))
    done: dict[str, dict[str, Any]] = eventually(all_finished, timeout=180,
                                                 what="every Workload Finished on the manager")
    elapsed = time.monotonic() - submitted
    print(f"\n4 Jobs from submission to every Workload Finished: {elapsed:.1f}s")
    placed = {name: done[name]["status"]["clusterName"] for name in names}
    assert set(placed.values()) == set(WORKERS), placed
    for name, worker in placed.items():
        nodes = {node for job_name, node in ran[worker] if job_name == name}
        assert nodes, f"no pod of {name} seen running in {worker}: {ran}"
        assert all(node.startswith(f"{worker}-h100-") for node in nodes), nodes
        # The manager's copy is managed by MultiKueue, and its status mirrors the worker's.
        local = kubectl_json(manager, "get", "job", name, "-n", "default")
        assert local["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
        assert local["status"].get("succeeded") == NODES
    assert not kubectl_json(manager, "get", "pods", "-A")["items"], "nothing runs on the manager"


def test_a_workload_through_the_hub_reports_kueues_admission_and_the_workers_runs(
        fleet: Fleet, members: dict[str, Path]) -> None:
    """The hub sends a workload's Jobs to the manager; Kueue admits them and MultiKueue places
    them. The report's times come from Kueue's Workloads (admitted) and the copies in the
    workers (running, released), not from the manager's Job, whose status Kueue copies over
    only when it gets to it: each Job is admitted before its pods run, and runs its time."""
    run_seconds = 6.0
    spec = {"jobs": 4, "pods_per_job": NODES,
            "resources": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": str(GPUS_PER_NODE)},
            "run_time": {"distribution": "fixed", "seconds": run_seconds},
            "arrivals": {"process": "rate", "rate": 4}, "seed": 1, "namespace": "default",
            "target": {"placement": "manager", "manager": "mk-manager", "queue": "gpu"}}
    path = fleet.state / "mk-workload.json"
    path.write_text(json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "Workload",
                                "metadata": {"name": "e2e-multikueue"}, "spec": spec}))
    report_file = fleet.state / "mk-report.json"
    done = fakefleet("fleet", "submit", str(path), "--watch", "--timeout", "240",
                     "--report", str(report_file), "-o", "json", "--state-dir",
                     str(fleet.state), check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    workload = json.loads(done.stdout)
    assert workload["phase"] == "WORKLOAD_PHASE_SUCCEEDED", workload["report"]
    jobs = json.loads(report_file.read_text())["jobs"]
    assert len(jobs) == 4
    for record in jobs:
        # Members are known by namespace/name, the workers a manager placed Jobs on too.
        assert record["cluster"] == f"{NAMESPACE}/mk-manager"
        assert record["placedOn"] in {f"{NAMESPACE}/{w}" for w in WORKERS}, record
        at = {step: datetime.fromisoformat(record[step].replace("Z", "+00:00")).timestamp()
              for step in ("arriveAt", "admittedAt", "runningAt", "finishedAt")}
        # Released (the copy's end) is seen before the manager shows it, unless the manager
        # was quicker; either way the pods ran their time after all of them were running.
        ended = datetime.fromisoformat(record.get("releasedAt", record["finishedAt"]).replace(
            "Z", "+00:00")).timestamp()
        assert at["arriveAt"] <= at["admittedAt"] <= at["runningAt"] < ended <= at["finishedAt"], \
            record
        assert ended - at["runningAt"] >= run_seconds - 1.0, record


def test_a_worker_whose_apiserver_is_down_gets_no_new_jobs(fleet: Fleet,
                                                          members: dict[str, Path]) -> None:
    manager = members["mk-manager"]
    fleet.apply(json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": "worker-a-down", "namespace": NAMESPACE},
        "spec": {"steps": [{"name": "down", "target": {"clusters": {"names": ["mk-worker-a"]}},
                            "fault": {"type": "APIServerDown"}, "at": "0s",
                            "duration": "90s"}]}}))
    eventually(lambda: "mk-worker-a Inactive" in condition(fleet, "mk-manager", "KueueReady")
               .get("message", ""), timeout=60, what="MultiKueue sees mk-worker-a Inactive")
    names = ["after-outage-0", "after-outage-1"]
    submit(manager, *(job(name, pods=1) for name in names))
    done = eventually(lambda: (lambda found: found if all(
        name in found and finished(found[name]) for name in names) else None)(
            workloads(manager)), timeout=120, what="the new Workloads Finished")
    assert {done[name]["status"]["clusterName"] for name in names} == {"mk-worker-b"}
    kubectl(fleet.host, "-n", NAMESPACE, "delete", "fp", "worker-a-down", "--timeout=150s")
    eventually(lambda: "mk-worker-a Active" in condition(fleet, "mk-manager", "KueueReady")
               .get("message", ""), timeout=90, what="mk-worker-a Active again")


def test_kill_of_the_operator_brings_kueue_back_as_it_was(fleet: Fleet,
                                                         members: dict[str, Path]) -> None:
    manager = members["mk-manager"]
    before = condition(fleet, "mk-manager", "KueueReady")["message"]
    finished_before = {name for name, w in workloads(manager).items() if finished(w)}
    clusters = ("mk-manager", *WORKERS)
    processes = {name: fleet.member_processes(name, NAMESPACE) for name in clusters}
    old = fleet.operator_pid()
    os.kill(old, signal.SIGKILL)  # the members' processes, Kueue's too, run on
    for name in clusters:
        adopted = fleet.wait_member_served(name, old, frozenset(processes[name]), timeout=180,
                                           namespace=NAMESPACE)
        assert adopted == processes[name], f"{name}'s processes adopted, none started again"
        eventually(lambda name=name: condition(fleet, name, "Ready").get("status") == "True",
                   timeout=180, what=f"{name} Ready after the restart")
    after = condition(fleet, "mk-manager", "KueueReady")["message"]
    # The same webhook port: the webhook configurations in the member stayed valid.
    assert after.split(";")[0] == before.split(";")[0]
    submit(manager, job("after-restart", pods=1))
    done = eventually(lambda: (lambda found: found if "after-restart" in found and finished(
        found["after-restart"]) else None)(workloads(manager)), timeout=120,
                      what="a Job submitted after the restart Finished")
    assert done["after-restart"]["status"]["clusterName"] in WORKERS
    assert finished_before <= {name for name, w in done.items() if finished(w)}


def test_removing_the_addon_stops_kueue_and_its_webhooks(fleet: Fleet,
                                                         members: dict[str, Path]) -> None:
    worker = members["mk-worker-b"]
    config = str(Kueue().files(StateDir(fleet.state), f"{NAMESPACE}.mk-worker-b").config)
    assert processes_mentioning(config)
    kubectl(fleet.host, "-n", NAMESPACE, "patch", "fc", "mk-worker-b", "--type=merge",
            "-p", '{"spec":{"addons":{"kueue":{"enabled":false}}}}')
    eventually(lambda: not condition(fleet, "mk-worker-b", "KueueReady"), timeout=60,
               what="KueueReady gone from mk-worker-b")
    assert not processes_mentioning(config)
    hooks = kubectl(worker, "get", "validatingwebhookconfigurations,mutatingwebhookconfigurations",
                    "-o", "name").stdout
    assert "kueue" not in hooks
    # The member's own Jobs run without Kueue now.
    kubectl(worker, "create", "job", "plain", "--image=busybox", "-n", "default")


def test_kueue_install_turns_it_on_and_waits(fleet: Fleet, members: dict[str, Path]) -> None:
    installed = fakefleet("kueue", "install", "mk-worker-b", "-n", NAMESPACE, "--state-dir",
                          str(fleet.state), "--timeout", "120")
    assert "Kueue is running on mk/mk-worker-b" in installed.stderr
    assert condition(fleet, "mk-worker-b", "KueueReady")["status"] == "True"
    hooks = kubectl(members["mk-worker-b"], "get", "validatingwebhookconfigurations",
                    "-o", "name").stdout
    assert "kueue-validating-webhook-configuration" in hooks
    missing = fakefleet("kueue", "install", "nowhere", "-n", NAMESPACE, "--state-dir",
                        str(fleet.state), check=False)
    assert missing.returncode == 1
    assert "FakeCluster mk/nowhere does not exist" in missing.stderr
