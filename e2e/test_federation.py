"""The federation hub end to end: FakeClusters on real control planes join the hub that
``fakefleet up`` started, a fleet plan runs in both and is judged, a partition makes a member
Unreachable and then Ready and in sync, ``kill -9`` of the hub in the middle of a run
neither loses nor repeats a command, and workloads run, fail over and are cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.conftest import Fleet, eventually, fakefleet, kubectl_json
from operators.controlplane.state import StateDir, read_host
from primitives import keys

NAMESPACE = "federation"
MEMBERS = ("fed-a", "fed-b")
GPU_POOL = """
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: {cluster}-h100, namespace: federation}}
spec:
  clusterRef: {cluster}
  replicas: 2
  gpu: {{preset: H100-SXM5-80GB}}
"""


@pytest.fixture(scope="module")
def members(fleet: Fleet) -> Iterator[Fleet]:
    fleet.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n")
    for cluster in MEMBERS:
        fleet.apply(f"""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {cluster}, namespace: {NAMESPACE}}}
spec: {{labels: {{fleet: fed, name: {cluster}}}}}
""")
        fleet.apply(GPU_POOL.format(cluster=cluster))
    for cluster in MEMBERS:
        def ready(pool: str = f"{cluster}-h100") -> bool:
            found = fleet.get("-n", NAMESPACE, "fnp", pool)
            return bool(found.get("status", {}).get("readyReplicas") == 2)
        eventually(ready, timeout=180, what=f"{cluster}'s GPU nodes Ready")
    yield fleet
    subprocess.run([*_kubectl(fleet), "delete", "namespace", NAMESPACE, "--wait=false"],
                   capture_output=True, timeout=60)


def _kubectl(fleet: Fleet) -> list[str]:
    from e2e.conftest import KUBECTL
    return [str(KUBECTL), "--kubeconfig", str(fleet.host)]


def hub(fleet: Fleet, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``fakefleet fleet ARGS``; with ``check``, a failure shows what the command said."""
    done = fakefleet("fleet", *args, "--state-dir", str(fleet.state), check=False)
    assert not check or done.returncode == 0, (done.args, done.stdout, done.stderr)
    return done


def listed(fleet: Fleet) -> dict[str, dict[str, Any]]:
    found = json.loads(hub(fleet, "ls", "-l", "fleet=fed", "-o", "json").stdout)
    return {member["cluster"]["name"]: member for member in found}


def states(fleet: Fleet) -> dict[str, str]:
    return {name: member.get("state", "") for name, member in listed(fleet).items()}


def ready_with_gpus(fleet: Fleet) -> bool:
    """Both members Ready, and the hub knows their GPUs (inventory comes every few seconds
    after a member joins): placement sees every member's room."""
    found = listed(fleet)
    return set(found) == set(MEMBERS) and all(
        member.get("state") == "MEMBER_STATE_READY"
        and member.get("inventory", {}).get("allocatable", {}).get("nvidia.com/gpu") == "16"
        for member in found.values())


def hub_connected(fleet: Fleet, cluster: str) -> str:
    found = fleet.get("-n", NAMESPACE, "fc", cluster)
    return next((c["status"] for c in found.get("status", {}).get("conditions", [])
                 if c["type"] == "HubConnected"), "")


def plan_file(fleet: Fleet, steps: list[dict[str, Any]], name: str) -> str:
    path = fleet.state / f"{name}.yaml"
    path.write_text(json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
                                "metadata": {"name": name},
                                "spec": {"seed": 3, "steps": steps}}))
    return str(path)


XID_STEP = {
    "name": "xid",
    "target": {"nodes": {"selector": {"matchLabels": {"nvidia.com/gpu.present": "true"}}},
               "mode": "one"},
    "fault": {"type": "GPUXid", "xid": 79},
    "at": "1s", "duration": "10s",
    "expectations": [{"name": "tainted", "within": "30s",
                      "objects": {"kind": "Node", "victims": True},
                      "taint": {"key": "fakefleet.dev/gpu-xid"}}],
}


def fleet_plans(fleet: Fleet, run_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = fleet.get("-n", NAMESPACE, "fp", "-l",
                                            f"{keys.FLEET_RUN}={run_id}")["items"]
    return found


def test_members_join_the_hub_of_fakefleet_up(members: Fleet) -> None:
    host = read_host(StateDir(members.state))
    assert host is not None
    [component] = [c for c in host.components if c.name == "hub"]
    assert component.pid
    assert component.port
    status = fakefleet("status", "--state-dir", str(members.state)).stdout
    assert any(" hub " in line and f" {component.pid} " in line
               for line in status.splitlines())
    eventually(lambda: states(members) == dict.fromkeys(MEMBERS, "MEMBER_STATE_READY"),
               timeout=60, what="both members Ready in the hub")
    found = listed(members)["fed-a"]
    assert found["cluster"]["labels"] == {"fleet": "fed", "name": "fed-a"}

    def inventory() -> dict[str, Any] | None:  # pools are looked at every 5 s
        counted: dict[str, Any] = listed(members)["fed-a"].get("inventory", {})
        return counted if counted.get("nodesReady") == 2 else None

    counted = eventually(inventory, timeout=30, what="fed-a's 2 Ready nodes in the hub")
    assert counted["nodesTotal"] == 2
    assert counted["allocatable"]["nvidia.com/gpu"] == "16"
    eventually(lambda: hub_connected(members, "fed-a") == "True", timeout=30,
               what="HubConnected on fed-a")


def test_a_fleet_plan_runs_in_every_selected_member_and_is_judged(members: Fleet) -> None:
    eventually(lambda: set(states(members).values()) == {"MEMBER_STATE_READY"}, timeout=60)
    passed = hub(members, "run", plan_file(members, [XID_STEP], "xid"), "-l", "fleet=fed",
                 "-o", "json", "--start-delay", "1", "--timeout", "120", check=False)
    assert passed.returncode == 0, passed.stderr
    run = json.loads(passed.stdout)
    assert run["phase"] == "RUN_PHASE_SUCCEEDED"
    assert run["verdict"] == "Passed"
    # Members are known by namespace/name (--clusters fed-a names the only fed-a).
    assert {m["cluster"] for m in run["members"]} == {f"{NAMESPACE}/{c}" for c in MEMBERS}
    plans = fleet_plans(members, run["id"])
    assert sorted(p["metadata"]["name"] for p in plans) == sorted(
        f"{run['id']}-{cluster}" for cluster in MEMBERS)
    for found in plans:  # each member's copy hit only its own cluster, once
        assert found["spec"]["clusters"] == [found["metadata"]["labels"]
                                             ["fakefleet.dev/cluster"]]
        [injection] = found["status"]["injections"]
        assert len(injection["targets"]) == 1
        assert injection["targets"][0].startswith(found["spec"]["clusters"][0] + "/")
    # An expectation that cannot hold fails the run, with exit code 1.
    impossible = {**XID_STEP, "expectations": [
        {"name": "never", "within": "5s", "objects": {"kind": "Node", "victims": True},
         "taint": {"key": "example.com/never"}}]}
    failed = hub(members, "run", plan_file(members, [impossible], "impossible"),
                 "--clusters", "fed-a", "-o", "json", "--start-delay", "1", "--timeout", "120",
                 check=False)
    assert failed.returncode == 1, failed.stderr
    run = json.loads(failed.stdout)
    assert run["verdict"] == "Failed"
    assert [m["cluster"] for m in run["members"]] == [f"{NAMESPACE}/fed-a"]


def test_a_partition_makes_a_member_unreachable_then_ready_and_in_sync(
        members: Fleet) -> None:
    eventually(lambda: set(states(members).values()) == {"MEMBER_STATE_READY"}, timeout=60)
    partition = {"name": "cut", "target": {"clusters": {"names": ["fed-b"]}},
                 "fault": {"type": "HubPartition", "direction": "both"},
                 "at": "0s", "duration": "25s"}
    started = hub(members, "run", plan_file(members, [partition], "cut"), "--clusters", "fed-b",
                  "--no-watch", "-o", "json", "--start-delay", "0")
    cut = json.loads(started.stdout)
    eventually(lambda: states(members).get("fed-b") == "MEMBER_STATE_UNREACHABLE",
               timeout=30, what="fed-b Unreachable in the hub")
    assert states(members)["fed-a"] == "MEMBER_STATE_READY"
    eventually(lambda: hub_connected(members, "fed-b") == "False", timeout=15,
               what="HubConnected False on fed-b")
    # Commanded while cut off: delivered once the partition is over, once.
    during = hub(members, "run", plan_file(members, [XID_STEP], "during"), "--clusters", "fed-b",
                 "--no-watch", "-o", "json", "--start-delay", "1")
    later = json.loads(during.stdout)
    time.sleep(3)
    assert fleet_plans(members, later["id"]) == [], "delivered through a partition"
    eventually(lambda: states(members).get("fed-b") == "MEMBER_STATE_READY", timeout=60,
               what="fed-b Ready again")
    finished = json.loads(hub(members, "get", later["id"], "--watch", "--timeout", "120",
                              "-o", "json").stdout)
    assert finished["phase"] == "RUN_PHASE_SUCCEEDED"
    assert len(fleet_plans(members, later["id"])) == 1
    done = json.loads(hub(members, "get", cut["id"], "--watch", "--timeout", "60",
                          "-o", "json").stdout)
    assert done["phase"] == "RUN_PHASE_SUCCEEDED"
    eventually(lambda: hub_connected(members, "fed-b") == "True", timeout=15)


def test_kill_9_of_the_hub_mid_run_loses_and_repeats_nothing(members: Fleet) -> None:
    eventually(lambda: set(states(members).values()) == {"MEMBER_STATE_READY"}, timeout=60)
    long_xid = {**XID_STEP, "duration": "25s"}
    started = json.loads(hub(members, "run", plan_file(members, [long_xid], "survive"), "-l",
                             "fleet=fed", "--no-watch", "-o", "json",
                             "--start-delay", "1").stdout)
    run_id = started["id"]
    eventually(lambda: len(fleet_plans(members, run_id)) == 2, timeout=30,
               what="both members have the run's plan")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in fleet_plans(members, run_id)}
    host = read_host(StateDir(members.state))
    assert host is not None
    [old] = [c.pid for c in host.components if c.name == "hub"]
    assert old is not None
    os.kill(old, signal.SIGKILL)

    def restarted() -> bool:
        now = read_host(StateDir(members.state))
        return now is not None and any(c.name == "hub" and c.pid not in (None, old)
                                       for c in now.components)

    eventually(restarted, timeout=30, what="the hub restarted by the daemon")
    began = time.monotonic()
    eventually(lambda: set(states(members).values()) == {"MEMBER_STATE_READY"}, timeout=60,
               what="members back after the hub restart")
    back = time.monotonic() - began
    finished = json.loads(hub(members, "get", run_id, "--watch", "--timeout", "120",
                              "-o", "json").stdout)
    assert finished["phase"] == "RUN_PHASE_SUCCEEDED", finished
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in fleet_plans(members, run_id)}
    assert after == uids, "a command ran again after the hub restart"
    for found in fleet_plans(members, run_id):
        assert len(found["status"]["injections"]) == 1
    assert back < 30


def test_a_workload_spread_by_the_hub_completes_and_matches_the_members_jobs(
        members: Fleet) -> None:
    eventually(lambda: ready_with_gpus(members), timeout=60, what="both members' GPUs known")
    spec = {"jobs": 50, "pods_per_job": 2, "resources": {"cpu": "1", "nvidia.com/gpu": "2"},
            "run_time": {"distribution": "uniform", "low": 2, "high": 4},
            "arrivals": {"process": "poisson", "rate": 10}, "seed": 5, "namespace": "train",
            "target": {"placement": "spread", "clusters": {"match_labels": {"fleet": "fed"}}}}
    path = members.state / "spread.yaml"
    path.write_text(json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "Workload",
                                "metadata": {"name": "e2e-spread"}, "spec": spec}))
    report_file = members.state / "spread-report.json"
    done = hub(members, "submit", str(path), "--watch", "--timeout", "240", "--start-delay",
               "1", "--report", str(report_file), "-o", "json")
    workload = json.loads(done.stdout)
    assert workload["phase"] == "WORKLOAD_PHASE_SUCCEEDED", workload["report"]
    report = workload["report"]
    assert report["counts"]["succeeded"] == 50
    by_cluster = {c["cluster"].removeprefix(f"{NAMESPACE}/"): c["counts"]
                  for c in report["clusters"]}
    assert set(by_cluster) == set(MEMBERS)
    for cluster in MEMBERS:  # the report's counts are the members' own Job objects
        kubeconfig = members.state / f"{cluster}.kubeconfig"
        kubeconfig.write_text(fakefleet("kubeconfig", "--state-dir", str(members.state),
                                        f"{NAMESPACE}/{cluster}").stdout)
        listed_jobs = kubectl_json(kubeconfig, "get", "jobs", "-n", "train", "-l",
                                   f"fakefleet.dev/workload={workload['id']}")["items"]
        complete = [j for j in listed_jobs if any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in j["status"].get("conditions", []))]
        assert len(listed_jobs) == len(complete) == by_cluster[cluster]["succeeded"]
        for job in listed_jobs:
            assert job["spec"]["parallelism"] == 2
            assert job["status"]["succeeded"] == 2
    # Spread takes turns, but a turn whose cluster is full (4 Jobs of 4 GPUs fill its 16) goes
    # to the other: how even it comes out depends on when Jobs finish (27/23 on a busy machine).
    assert min(counts["succeeded"] for counts in by_cluster.values()) >= 20, by_cluster
    for timing in ("toAdmission", "toRunning", "toCompletion"):
        assert report[timing]["count"] == 50, timing
        assert report[timing]["p50"] <= report[timing]["p99"]
    assert report["toCompletion"]["p50"] >= 2.0  # at least the run time
    assert 0 < report["gpuUtilisationPeak"] <= 1
    full = json.loads(report_file.read_text())
    assert len(full["jobs"]) == 50


def test_a_job_a_fault_plan_fails_is_dispatched_again_and_the_report_says_how_fast(
        members: Fleet) -> None:
    """A FaultPlan makes one running pod of fed-a exit 1: its Job fails (backoffLimit 0), the
    hub sends it again (max_attempts 2), and the report counts the re-dispatch and the time
    from the failure to the new attempt running."""
    eventually(lambda: ready_with_gpus(members), timeout=60, what="both members' GPUs known")
    spec = {"jobs": 4, "pods_per_job": 1, "resources": {"nvidia.com/gpu": "1"},
            "run_time": {"distribution": "fixed", "seconds": 12},
            "arrivals": {"process": "times", "times": [0, 0, 0, 0]}, "seed": 9,
            "namespace": "redispatch", "max_attempts": 2,
            "target": {"placement": "spread", "clusters": {"match_labels": {"fleet": "fed"}}}}
    path = members.state / "redispatch.yaml"
    path.write_text(json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "Workload",
                                "metadata": {"name": "e2e-redispatch"}, "spec": spec}))
    submitted = json.loads(hub(members, "submit", str(path), "--start-delay", "1",
                               "-o", "json").stdout)
    members.apply(json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": "fail-one-job", "namespace": NAMESPACE},
        "spec": {"seed": 4, "steps": [{
            "name": "exit", "at": "6s", "fault": {"type": "ContainerExit", "exitCode": 1},
            "target": {"clusters": {"names": ["fed-a"]}, "mode": "one",
                       "pods": {"namespace": "redispatch", "ownerKind": "Job"}}}]}}))
    done = hub(members, "workload", submitted["id"], "--watch", "--timeout", "120", "-o",
               "json", check=False)
    workload = json.loads(done.stdout)
    assert done.returncode == 0, workload
    report = workload["report"]
    plan = members.get("-n", NAMESPACE, "fp", "fail-one-job")
    assert report["counts"]["succeeded"] == 4, report
    assert report.get("redispatched") == 1, (report, plan["status"])
    assert report["recovery"]["count"] == 1, report
    assert 0 < report["recovery"]["p50"] < 30, report
    jobs = json.loads(hub(members, "workload", submitted["id"], "--jobs", "-o",
                          "json").stdout)["jobs"]
    assert sorted(job.get("attempt", 1) for job in jobs) == [1, 1, 1, 2], jobs
    [injection] = plan["status"]["injections"]
    assert len(injection["targets"]) == 1, injection
    subprocess.run([*_kubectl(members), "-n", NAMESPACE, "delete", "fp", "fail-one-job"],
                   capture_output=True, timeout=120, check=True)


def test_a_cancelled_workload_leaves_no_job_nor_pod_it_made_in_the_members(
        members: Fleet) -> None:
    """Cancelled with Jobs running on both members and more waiting at the hub: the members
    delete the Jobs the hub had them create, their pods with them, and nothing else; the
    waiting ones are never created, and the report keeps what ran."""
    eventually(lambda: ready_with_gpus(members), timeout=60, what="both members' GPUs known")
    spec = {"jobs": 8, "pods_per_job": 1, "resources": {"nvidia.com/gpu": "8"},
            "run_time": {"distribution": "fixed", "seconds": 600},
            "arrivals": {"process": "times", "times": [0] * 8}, "seed": 2,
            "namespace": "cancelled",
            "target": {"placement": "spread", "clusters": {"match_labels": {"fleet": "fed"}}}}
    path = members.state / "cancelled.yaml"
    path.write_text(json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "Workload",
                                "metadata": {"name": "e2e-cancelled"}, "spec": spec}))
    submitted = json.loads(hub(members, "submit", str(path), "--start-delay", "1",
                               "-o", "json").stdout)

    def counts() -> dict[str, int]:
        shown = json.loads(hub(members, "workload", submitted["id"], "-o", "json").stdout)
        return dict(shown["report"]["counts"])

    # 16 GPUs a member, 8 a Job: two Jobs run on each, four wait at the hub.
    eventually(lambda: counts().get("running") == 4, timeout=120, what="four Jobs running")
    kubeconfigs = {}
    for cluster in MEMBERS:
        kubeconfigs[cluster] = members.state / f"{cluster}.kubeconfig"
        kubeconfigs[cluster].write_text(fakefleet("kubeconfig", "--state-dir",
                                                  str(members.state),
                                                  f"{NAMESPACE}/{cluster}").stdout)
    # Someone else's Job with the workload's label: not the hub's to delete.
    foreign = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "foreign", "namespace": "cancelled",
                            "labels": {keys.WORKLOAD: submitted["id"]}},
               "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                   {"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}}}
    from e2e.conftest import KUBECTL
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfigs["fed-a"]), "apply", "-f",
                    "-"], input=json.dumps(foreign), text=True, capture_output=True, timeout=60,
                   check=True)
    cancelled = hub(members, "cancel-workload", submitted["id"])
    assert "cancelled; members deleting its Jobs: federation/fed-a, federation/fed-b" in \
        cancelled.stdout + cancelled.stderr

    def left(cluster: str, kind: str) -> list[str]:
        found = kubectl_json(kubeconfigs[cluster], "get", kind, "-n", "cancelled")["items"]
        return sorted(item["metadata"]["name"] for item in found
                      if not item["metadata"].get("name", "").startswith("foreign"))

    for cluster in MEMBERS:
        eventually(lambda c=cluster: left(c, "jobs") == [] and left(c, "pods") == [],
                   timeout=120, what=f"{cluster}'s Jobs and their pods gone")
    assert [job["metadata"]["name"] for job in kubectl_json(
        kubeconfigs["fed-a"], "get", "jobs", "-n", "cancelled")["items"]] == ["foreign"]
    shown = json.loads(hub(members, "workload", submitted["id"], "-o", "json").stdout)
    assert shown["phase"] == "WORKLOAD_PHASE_CANCELLED"
    assert shown["report"]["counts"]["cancelled"] == 8
    assert shown["report"]["toRunning"]["count"] == 4  # what ran is still in the report
    assert not shown.get("deleting"), shown
