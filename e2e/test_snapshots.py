"""Snapshots on a real member: save a cluster with a running Deployment, a pod part way through
its run time and a FaultPlan step still to come; change it; restore; and find the same objects
(names, UIDs), pods Ready, no node NotReady, and every time moved by the time in between."""

from __future__ import annotations

import json
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import CLUSTER, KUBECTL, POOL, Fleet, eventually, fakefleet, kubectl, kubectl_json
from operators.controlplane.state import StateDir
from operators.k8s.times import parse

NAME = "snap"
#: The second cluster of the fleet snapshot.
OTHER = "snap-b"
#: The plan's step is due this long after the plan starts: long after the restore.
STEP_AT = 600


def create(kubeconfig: Path, body: dict[str, Any]) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "create", "-f", "-"],
                   input=json.dumps(body), text=True, check=True, capture_output=True,
                   timeout=60)


def objects(kubeconfig: Path, kind: str) -> dict[str, dict[str, Any]]:
    items = kubectl_json(kubeconfig, "get", kind, "-A")["items"]
    return {f"{item['metadata'].get('namespace', '')}/{item['metadata']['name']}": item
            for item in items}


def ready_condition(node: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


@pytest.fixture(scope="module")
def member(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(CLUSTER.format(name=NAME))
    fleet.apply(POOL.format(name=f"{NAME}-pool", cluster=NAME, replicas=3, extra=""))
    fleet.wait_cluster_ready(NAME)
    fleet.wait_pool(f"{NAME}-pool", 3)
    kubeconfig = fleet.member(NAME)
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield kubeconfig
    kubectl(fleet.host, "delete", "fp", f"{NAME}-later", "--wait=false", check=False)
    fleet.release(OTHER, f"{OTHER}-pool")
    fleet.release(NAME, f"{NAME}-pool")


def test_save_change_restore(fleet: Fleet, member: Path) -> None:
    kubectl(member, "create", "deployment", "web", "--image=nginx:1.27", "--replicas=3")
    create(member, {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "batch", "annotations": {
                        "fakefleet.dev/run-time": "900s"}},
                    "spec": {"restartPolicy": "Never",
                             "containers": [{"name": "work", "image": "busybox"}]}})
    fleet.apply(json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": f"{NAME}-later", "namespace": "default"},
        "spec": {"clusters": [NAME], "steps": [{
            "name": "cordon", "target": {"clusters": {"names": [NAME]},
                                         "nodes": {"pools": [f"{NAME}-pool"]},
                                         "mode": "one"},
            "at": f"{STEP_AT}s", "duration": "10s", "fault": {"type": "Cordon"}}]}}))

    def settled() -> bool:
        pods = objects(member, "pods")
        ready = [p for p in pods.values() if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", []))]
        plan = fleet.get("fp", f"{NAME}-later").get("status", {})
        return len([p for p in pods if p.startswith("default/")]) == 4 and \
            len(ready) >= 4 and bool(plan.get("startedAt"))

    eventually(settled, timeout=120, what="the pods Ready and the plan started")
    before_pods = objects(member, "pods")
    before_nodes = objects(member, "nodes")
    before_deployments = objects(member, "deployments")
    before_plan = fleet.get("fp", f"{NAME}-later")["status"]

    state = str(fleet.state)
    saved = fakefleet("snapshot", "save", "before", "--cluster", NAME, "--state-dir", state)
    assert "mode 0600" in saved.stderr
    path = StateDir(fleet.state).snapshots / "before.snapshot"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    listed = fakefleet("snapshot", "ls", "--state-dir", state).stderr
    assert "before" in listed
    assert "default/snap" in listed

    # Change it: the Deployment goes, a ConfigMap comes, time passes.
    kubectl(member, "delete", "deployment", "web")
    kubectl(member, "create", "configmap", "after-save", "--from-literal=a=b")
    time.sleep(5)

    restored = fakefleet("snapshot", "restore", str(path), "--state-dir", state)
    assert "restored default/snap" in restored.stderr, restored.stderr
    shifted = int(restored.stderr.split("times shifted by ")[1].split("s")[0])
    assert shifted >= 5

    # Same objects, same UIDs; what was made after the save is gone.
    deployments = objects(member, "deployments")
    assert deployments["default/web"]["metadata"]["uid"] == \
        before_deployments["default/web"]["metadata"]["uid"]
    assert kubectl(member, "get", "configmap", "after-save", check=False).returncode != 0
    after_nodes = objects(member, "nodes")
    assert {name: node["metadata"]["uid"] for name, node in after_nodes.items()} == \
        {name: node["metadata"]["uid"] for name, node in before_nodes.items()}

    def pods_back() -> dict[str, dict[str, Any]] | None:
        pods = objects(member, "pods")
        return pods if all(ready_condition(p)["status"] == "True" for p in pods.values()
                           if p["metadata"]["namespace"] == "default") else None

    after_pods = eventually(pods_back, timeout=60, what="the restored pods Ready")
    for name, pod in before_pods.items():
        if not name.startswith("default/"):
            continue
        assert after_pods[name]["metadata"]["uid"] == pod["metadata"]["uid"], name
        # Time shifted, not lost: the run time left is what it was at the save.
        before_start = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        after_start = after_pods[name]["status"]["containerStatuses"][0]["state"]["running"][
            "startedAt"]
        assert parse(after_start) - parse(before_start) == shifted, name

    # No node went NotReady: its Ready condition never changed (its time only shifted).
    time.sleep(10)
    for name, node in objects(member, "nodes").items():
        ready = ready_condition(node)
        assert ready["status"] == "True", name
        assert parse(ready["lastTransitionTime"]) == \
            parse(ready_condition(before_nodes[name])["lastTransitionTime"]) + shifted, name
    events = kubectl(member, "get", "events", "-A", "--field-selector",
                     "reason=NodeNotReady", "-o", "name").stdout
    assert events.strip() == ""

    # The plan's step is still to come, as far after the restore as it was after the save.
    plan = fleet.get("fp", f"{NAME}-later")["status"]
    assert parse(plan["startedAt"]) == parse(before_plan["startedAt"]) + shifted
    assert [i["state"] for i in plan["injections"]] == ["Scheduled"]
    fleet.wait_cluster_ready(NAME)


def test_bad_input_is_refused_with_the_file_and_the_fix(fleet: Fleet, tmp_path: Path) -> None:
    broken = tmp_path / "broken.snapshot"
    broken.write_bytes(b"fakefleet-snapshot\n{\"format\": 1}")
    result = fakefleet("snapshot", "restore", str(broken), "--state-dir", str(fleet.state),
                       check=False)
    assert result.returncode != 0
    assert str(broken) in result.stderr
    assert "copy" in result.stderr


def test_a_fleet_snapshot_restores_into_a_fresh_fakefleet(fleet: Fleet, member: Path,
                                                         cli_state: Path,
                                                         tmp_path: Path) -> None:
    """Two clusters and the hub, with a workload whose second Job is due 600 s after its
    start, copied to another state directory: a fresh 'fakefleet up' gets the clusters (same
    UIDs, nodes Ready, no NodeNotReady) and the hub's workload, its arrival as far off as at
    the save."""
    fleet.apply(CLUSTER.format(name=OTHER))
    fleet.apply(POOL.format(name=f"{OTHER}-pool", cluster=OTHER, replicas=1, extra=""))
    fleet.wait_cluster_ready(OTHER)
    fleet.wait_pool(f"{OTHER}-pool", 1)
    workload_file = tmp_path / "workload.yaml"
    workload_file.write_text(json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "Workload",
        "metadata": {"name": "snap-later"},
        "spec": {"jobs": 2, "pods_per_job": 1, "resources": {"cpu": "100m"},
                 "run_time": {"distribution": "fixed", "seconds": 900},
                 "arrivals": {"process": "times", "times": [0, STEP_AT]}, "seed": 3,
                 "namespace": "default",
                 "target": {"placement": "spread", "clusters": {"names": [NAME, OTHER]}}}}))
    submitted = json.loads(fakefleet("fleet", "submit", str(workload_file), "--start-delay",
                                     "1", "-o", "json", "--state-dir", str(fleet.state)).stdout)

    def running(state: Path) -> dict[str, Any] | None:
        found: dict[str, Any] = json.loads(fakefleet(
            "fleet", "workload", submitted["id"], "--jobs", "-o", "json",
            "--state-dir", str(state)).stdout)
        return found if found["report"]["counts"].get("running") == 1 else None

    before = eventually(lambda: running(fleet.state), timeout=120,
                        what="the workload's first Job running")
    [job] = [j for j in before["jobs"] if j.get("state") == "Running"]
    job_kubeconfig = fleet.member(job["cluster"])
    job_uid = kubectl_json(job_kubeconfig, "get", "job", job["name"])["metadata"]["uid"]
    node_uids = {cluster: {name: node["metadata"]["uid"] for name, node in
                           objects(fleet.member(cluster), "nodes").items()}
                 for cluster in (NAME, OTHER)}
    saved = fakefleet("snapshot", "save", "fleet", "--force", "--cluster", NAME, "--cluster",
                      OTHER, "--hub", "--state-dir", str(fleet.state))
    assert "the hub's" in saved.stderr, saved.stderr
    copy = tmp_path / "elsewhere" / "fleet.snapshot"
    copy.parent.mkdir()
    copy.write_bytes((StateDir(fleet.state).snapshots / "fleet.snapshot").read_bytes())

    fakefleet("up", "--state-dir", str(cli_state), "--unsafe-no-fsync", "--no-collector")
    restored = fakefleet("snapshot", "restore", str(copy), "--state-dir", str(cli_state),
                         check=False)
    assert restored.returncode == 0, restored.stderr
    assert f"restored default/{NAME}" in restored.stderr
    assert f"restored default/{OTHER}" in restored.stderr
    assert "restored the hub's" in restored.stderr
    fresh = Fleet(cli_state)
    for cluster in (NAME, OTHER):
        fresh.wait_cluster_ready(cluster)
        kubeconfig = fresh.member(cluster)
        nodes = objects(kubeconfig, "nodes")
        assert {name: node["metadata"]["uid"] for name, node in nodes.items()} == \
            node_uids[cluster]
        assert all(ready_condition(node)["status"] == "True" for node in nodes.values())
        assert kubectl(kubeconfig, "get", "events", "-A", "--field-selector",
                       "reason=NodeNotReady", "-o", "name").stdout.strip() == ""
    assert kubectl_json(fresh.member(job["cluster"]), "get", "job", job["name"])[
        "metadata"]["uid"] == job_uid

    # The hub's workload is back, its Job still to arrive as far after the restore as it was
    # after the save: every time moved by the same amount.
    after = eventually(lambda: running(cli_state), timeout=90,
                       what="the restored workload with its Job running")
    shifted = parse(after["startAt"]) - parse(before["startAt"])
    assert shifted > 0
    [waiting_before] = [j for j in before["jobs"] if j.get("state") == "Waiting"]
    [waiting_after] = [j for j in after["jobs"] if j.get("state") == "Waiting"]
    assert abs(parse(waiting_after["arriveAt"]) - parse(waiting_before["arriveAt"])
               - shifted) < 0.01
    assert after["phase"] == "WORKLOAD_PHASE_RUNNING"
