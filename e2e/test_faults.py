"""FaultPlans end to end: every fault type on real control planes, seen by real clients (kubectl,
the node-lifecycle controller, the Job controller), recovered, judged; and a plan that survives
kill -9 of the operator and of an engine in its middle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import (
    CLUSTER,
    KUBECTL,
    POOL,
    SHORT_GRACE,
    Fleet,
    eventually,
    fakefleet,
    kubectl,
    kubectl_json,
    processes_mentioning,
    with_short_grace,
)
from primitives import keys

NAMESPACE = "faults"


def plan(name: str, steps: list[dict[str, Any]], seed: int = 7) -> str:
    return json.dumps({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
                       "metadata": {"name": name, "namespace": NAMESPACE},
                       "spec": {"seed": seed, "steps": steps}})


def nodes(*names: str) -> dict[str, Any]:
    return {"clusters": {"names": ["delta"]}, "nodes": {"names": list(names)}}


def expect(name: str, within: str, objects: dict[str, Any], **matcher: Any) -> dict[str, Any]:
    return {"name": name, "within": within, "objects": objects, **matcher}


VICTIM_NODES = {"kind": "Node", "victims": True}


def run(fleet: Fleet, manifest: str, name: str, timeout: float = 180) -> dict[str, Any]:
    """Apply a plan and wait until it finished; the plan as it ended."""
    fleet.apply(manifest)
    return finished(fleet, name, timeout)


def finished(fleet: Fleet, name: str, timeout: float) -> dict[str, Any]:
    """The plan once it finished (Succeeded or Failed)."""
    def ended() -> dict[str, Any] | None:
        found: dict[str, Any] = fleet.get("fp", name, "-n", NAMESPACE)
        return found if (found.get("status") or {}).get("phase") in (
            "Succeeded", "Failed") else None
    result: dict[str, Any] = eventually(ended, timeout=timeout, what=f"plan {name} finished")
    return result


def deployment(name: str, replicas: int, image: str = "busybox") -> str:
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: work}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: main, image: {image}}}]
"""


def delete_plan(fleet: Fleet, name: str) -> None:
    kubectl(fleet.host, "-n", NAMESPACE, "delete", "fp", name, "--timeout=120s")


@pytest.fixture(scope="module")
def delta(fleet: Fleet) -> Iterator[Path]:
    """Cluster delta: 4 H100 nodes (short leases) and 3 CPU nodes, and the node-lifecycle
    controller's grace SHORT_GRACE; its member kubeconfig."""
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    fleet.apply(with_short_grace(CLUSTER.format(name="delta")).replace("metadata: {name: delta}",
                                                     f"metadata: {{name: delta, namespace: "
                                                     f"{NAMESPACE}}}"))
    for name, replicas, extra in (
            ("gpu", 4, "  gpu: {preset: H100-SXM5-80GB}\n  leaseDurationSeconds: 10"),
            ("cpu", 3, "")):
        fleet.apply(POOL.format(name=name, cluster="delta", replicas=replicas, extra=extra)
                    .replace(f"metadata: {{name: {name}}}",
                             f"metadata: {{name: {name}, namespace: {NAMESPACE}}}"))
    eventually(lambda: fleet.get("fc", "delta", "-n", NAMESPACE).get("status", {}).get(
        "phase") == "Ready", timeout=120, what="FakeCluster delta Ready")
    member = fleet.state / "delta.kubeconfig"
    member.write_text(fakefleet("kubeconfig", "--state-dir", str(fleet.state),
                                f"{NAMESPACE}/delta").stdout)
    eventually(lambda: len(ready(member)) == 7, timeout=120, what="7 Ready nodes in delta")
    kubectl(member, "create", "namespace", "work")
    # Pods need the namespace's default ServiceAccount, made by the controller-manager.
    eventually(lambda: kubectl(member, "-n", "work", "get", "serviceaccount", "default",
                               check=False).returncode == 0, timeout=60,
               what="ServiceAccount work/default")
    yield member
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


def ready(member: Path) -> list[str]:
    return sorted(n["metadata"]["name"] for n in kubectl_json(member, "get", "nodes")["items"]
                  if any(c["type"] == "Ready" and c["status"] == "True"
                         for c in n["status"]["conditions"]))


def fault_sets(member: Path) -> list[dict[str, Any]]:
    """The fault sets in the member (ConfigMaps of fakefleet-system)."""
    found: list[dict[str, Any]] = kubectl_json(member, "get", "configmaps", "-n",
                                               "fakefleet-system", "-l",
                                               "fakefleet.dev/fault-set")["items"]
    return found


def node(member: Path, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl_json(member, "get", "node", name)
    return found


def results(found: dict[str, Any]) -> dict[str, tuple[str, float | None]]:
    return {f"{i['step']}/{r['name']}": (r["outcome"], r.get("latencySeconds"))
            for i in found["status"]["injections"] for r in i.get("expectations", [])}


def test_node_faults_are_seen_by_real_clients_and_recovered(fleet: Fleet, delta: Path) -> None:
    steps = [
        {"name": "not-ready", "target": nodes("gpu-0"), "at": "1s", "duration": "25s",
         "fault": {"type": "NotReady", "reason": "KubeletNotReady", "message": "PLEG is not "
                                                                                "healthy"},
         "expectations": [expect("ready-false", "20s", VICTIM_NODES,
                                 condition={"type": "Ready", "status": "False"})]},
        {"name": "xid", "target": nodes("gpu-1"), "at": "1s", "duration": "25s",
         "fault": {"type": "GPUXid", "xid": 79, "gpus": 2},
         "expectations": [
             expect("tainted", "20s", VICTIM_NODES, taint={"key": keys.GPU_XID,
                                                           "effect": "NoExecute"}),
             expect("gpus-out", "20s", VICTIM_NODES,
                    field={"path": "status.allocatable['nvidia.com/gpu']", "equals": "6"})]},
        {"name": "deadlock", "target": nodes("cpu-0"), "at": "1s", "duration": "25s",
         "fault": {"type": "Condition", "condition": {"type": "KernelDeadlock",
                                                      "reason": "DockerHung"}},
         "expectations": [expect("condition", "20s", VICTIM_NODES,
                                 condition={"type": "KernelDeadlock", "status": "True"})]},
        {"name": "cordon", "target": nodes("cpu-1"), "at": "1s", "duration": "25s",
         "fault": {"type": "Cordon"},
         "expectations": [expect("cordoned", "20s", VICTIM_NODES,
                                 cel="has(self.spec.unschedulable) && self.spec.unschedulable")]},
        {"name": "taint", "target": nodes("cpu-2"), "at": "1s", "duration": "25s",
         "fault": {"type": "Taint", "taint": {"key": "example.com/maintenance",
                                               "effect": "NoSchedule"}},
         "expectations": [expect("tainted", "20s", VICTIM_NODES,
                                 taint={"key": "example.com/maintenance"})]},
        {"name": "delete", "target": nodes("gpu-2"), "at": "1s", "duration": "25s",
         "fault": {"type": "Delete"},
         "expectations": [expect("gone", "20s", {"kind": "Node", "name": "gpu-2"},
                                 count={"equals": 0})]},
        # The member's real node-lifecycle controller notices the silence and taints the node
        # once its grace (SHORT_GRACE, 20 s) has passed, then its next pass (every 5 s).
        {"name": "unreachable", "target": nodes("gpu-3"), "at": "1s", "duration": "45s",
         "fault": {"type": "Unreachable"},
         "expectations": [expect("unknown", "40s", VICTIM_NODES, taint={
             "key": "node.kubernetes.io/unreachable", "effect": "NoExecute"})]},
    ]
    found = run(fleet, plan("node-faults", steps), "node-faults", timeout=240)
    outcomes = results(found)
    assert found["status"]["verdict"] == "Passed", outcomes
    assert all(outcome == "Passed" and latency is not None and 0 <= latency < 40
               for outcome, latency in outcomes.values()), outcomes
    unknown = outcomes["unreachable/unknown"][1]
    assert unknown is not None
    assert unknown >= 15, f"not long before the grace ({SHORT_GRACE}) has passed: {outcomes}"
    assert {i["state"] for i in found["status"]["injections"]} == {"Recovered"}
    # Everything is back as it was.
    eventually(lambda: len(ready(delta)) == 7, timeout=60, what="every node Ready again")
    faulty = {keys.GPU_XID, "example.com/maintenance", "node.kubernetes.io/unreachable"}
    for name in ("gpu-0", "gpu-1", "gpu-2", "gpu-3", "cpu-0", "cpu-1", "cpu-2"):
        # The node-lifecycle controller lifts its taint on its next pass after Ready.
        eventually(lambda n=name: not {t["key"] for t in node(delta, n)["spec"].get("taints")
                                       or ()} & faulty, timeout=30, what=f"{name} untainted")
        current = node(delta, name)
        assert not current["spec"].get("unschedulable"), name
    assert fault_sets(delta) == [], "each recovered step's fault set is deleted"
    assert node(delta, "gpu-1")["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    deadlock = next(c for c in node(delta, "cpu-0")["status"]["conditions"]
                    if c["type"] == "KernelDeadlock")
    assert deadlock["status"] == "False"
    events = kubectl_json(delta, "get", "events", "-n", "default",
                          "--field-selector", "involvedObject.name=gpu-1")["items"]
    assert "GPUXid" in {e["reason"] for e in events}, "the stage's own Event, about the node"
    set_events = kubectl_json(delta, "get", "events", "-n", "fakefleet-system")["items"]
    about_gpu_1 = {e["reason"] for e in set_events if e["involvedObject"]["kind"] == "ConfigMap"
                   and "GPUXid" in e["message"] and "gpu-1" in e["message"]}
    assert about_gpu_1 == {"FaultInjected", "FaultRecovered"}, set_events
    plan_events = kubectl_json(fleet.host, "get", "events", "-n", NAMESPACE,
                               "--field-selector", "involvedObject.name=node-faults")["items"]
    assert {"FaultInjected", "FaultRecovered"} <= {e["reason"] for e in plan_events}
    delete_plan(fleet, "node-faults")


WORKLOADS = """
apiVersion: batch/v1
kind: Job
metadata: {name: nccl, namespace: work}
spec:
  parallelism: 2
  completions: 2
  backoffLimit: 6
  template:
    metadata:
      labels: {app: nccl}
      annotations: {fakefleet.dev/run-time: 10m}
    spec:
      restartPolicy: Never
      containers: [{name: allreduce, image: nccl-tests}]
---
apiVersion: v1
kind: Pod
metadata:
  name: slow
  namespace: work
  labels: {app: slow}
  annotations: {fakefleet.dev/start-delay: 20s}
spec:
  containers: [{name: main, image: registry.example/slow:1}]
"""


def pods(member: Path, selector: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kubectl_json(member, "-n", "work", "get", "pods", "-l",
                                               selector)["items"]
    return found


def apply_member(member: Path, manifest: str) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(member), "apply", "-f", "-"],
                   input=manifest, text=True, check=True, capture_output=True, timeout=60)


def running(member: Path, selector: str, count: int) -> bool:
    return sum(p["status"].get("phase") == "Running" for p in pods(member, selector)) >= count


def test_pod_faults_reach_the_workloads_controllers(fleet: Fleet, delta: Path) -> None:
    apply_member(delta, WORKLOADS + "---" + deployment("web", 4, image="nginx"))
    eventually(lambda: running(delta, "app=nccl", 2) and running(delta, "app=web", 4),
               timeout=60, what="the Job's and the Deployment's pods Running")

    def work(**pods_target: Any) -> dict[str, Any]:
        return {"clusters": {"names": ["delta"]}, "pods": {"namespace": "work", **pods_target}}
    steps = [
        # The talk's scenario: the NCCL test exits with code 3; the Job controller counts the
        # failures and starts new pods.
        {"name": "nccl-abort", "target": work(ownerKind="Job", ownerName="nccl"), "at": "1s",
         "jitter": "2s", "fault": {"type": "ContainerExit", "exitCode": 3,
                                   "message": "NCCL communicator aborted"},
         "expectations": [
             expect("job-counts-failures", "30s", {"apiVersion": "batch/v1", "kind": "Job",
                                                   "namespace": "work", "name": "nccl"},
                    cel="has(self.status.failed) && self.status.failed >= 2"),
             expect("exit-code-3", "30s", {"kind": "Pod", "victims": True}, field={
                 "path": "status.containerStatuses[0].state.terminated.exitCode",
                 "equals": "3"})]},
        {"name": "evict", "target": {**work(selector={"matchLabels": {"app": "web"}}),
                                     "mode": "one"},
         "at": "1s", "fault": {"type": "Evict"},
         "expectations": [expect("evicted", "20s", {"kind": "Pod", "victims": True},
                                 field={"path": "status.reason", "equals": "Evicted"})]},
        {"name": "oom", "target": {**work(selector={"matchLabels": {"app": "web"}}),
                                   "mode": "fixed", "count": 1},
         "after": ["evict"], "fault": {"type": "OOMKilled"},
         "expectations": [expect("oom", "20s", {"kind": "Pod", "victims": True}, field={
             "path": "status.containerStatuses[0].lastState.terminated.reason",
             "equals": "OOMKilled"})]},
        {"name": "crash", "target": {**work(selector={"matchLabels": {"app": "web"}}),
                                     "mode": "fixed", "count": 1},
         "after": ["oom"], "duration": "15s", "fault": {"type": "CrashLoop"},
         "expectations": [expect("restarts", "20s", {"kind": "Pod", "victims": True},
                                 cel="self.status.containerStatuses[0].restartCount >= 1")]},
        {"name": "stuck", "target": work(selector={"matchLabels": {"app": "slow"}}),
         "at": "1s", "duration": "10s",
         "fault": {"type": "StuckPending", "reason": "ImagePullBackOff"},
         "expectations": [expect("image-pull", "10s", {"kind": "Pod", "victims": True}, field={
             "path": "status.containerStatuses[0].state.waiting.reason",
             "equals": "ImagePullBackOff"})]},
    ]
    found = run(fleet, plan("pod-faults", steps), "pod-faults", timeout=180)
    assert found["status"]["verdict"] == "Passed", results(found)
    # The Job went on: new pods replace the failed ones.
    eventually(lambda: running(delta, "app=nccl", 2), timeout=60, what="the Job's new pods")
    # Recovered: the stuck pod starts once the fault is gone.
    eventually(lambda: running(delta, "app=slow", 1), timeout=60, what="pod slow Running")
    crashed = next(i for i in found["status"]["injections"] if i["step"] == "crash")
    assert crashed["state"] == "Recovered"
    delete_plan(fleet, "pod-faults")


def test_apiserver_outage_stops_the_member_and_recovery_restarts_it(
        fleet: Fleet, delta: Path) -> None:
    steps = [{"name": "outage", "target": {"clusters": {"names": ["delta"]}}, "at": "1s",
              "duration": "15s", "fault": {"type": "APIServerDown"},
              "expectations": [
                  expect("cluster-not-ready", "30s", {
                      "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                      "name": "delta", "cluster": "host"},
                         condition={"type": "Ready", "status": "False"})]}]
    found = run(fleet, plan("outage", steps), "outage", timeout=120)
    assert found["status"]["verdict"] == "Passed", results(found)
    injection = found["status"]["injections"][0]
    assert injection["state"] == "Recovered"
    assert injection["recoveredAt"]
    kubectl(delta, "get", "nodes")  # the member answers again
    eventually(lambda: fleet.get("fc", "delta", "-n", NAMESPACE)["status"]["phase"] == "Ready",
               timeout=60, what="delta Ready again")
    delete_plan(fleet, "outage")


def test_an_expectation_that_cannot_hold_fails_at_its_deadline(fleet: Fleet,
                                                              delta: Path) -> None:
    steps = [{"name": "cordon", "target": nodes("cpu-0"), "at": "0s", "duration": "5s",
              "fault": {"type": "Cordon"},
              "expectations": [
                  expect("cordoned", "20s", VICTIM_NODES, field={"path": "spec.unschedulable",
                                                                 "equals": "true"}),
                  expect("impossible", "3s", {"kind": "Node"}, count={"equals": 99})]}]
    found = run(fleet, plan("impossible", steps), "impossible", timeout=60)
    assert found["status"]["phase"] == "Failed"
    assert found["status"]["verdict"] == "Failed"
    outcomes = results(found)
    assert outcomes["cordon/cordoned"][0] == "Passed"
    assert outcomes["cordon/impossible"] == ("Failed", 3.0)
    events = kubectl_json(fleet.host, "get", "events", "-n", NAMESPACE,
                          "--field-selector", "involvedObject.name=impossible")["items"]
    assert "ExpectationFailed" in {e["reason"] for e in events}
    delete_plan(fleet, "impossible")




def engine_pid(cluster: str) -> int:
    """The pid of the cluster's engine process (0: none runs)."""
    pids = [pid for pid in processes_mentioning(f"--cluster {NAMESPACE}/{cluster}")
            if "operators.engine" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(pids) <= 1, pids
    return pids[0] if pids else 0


def test_kill_9_of_operator_and_engine_mid_plan(fleet: Fleet, delta: Path) -> None:
    """Five steps; the operator and then the engine are killed between them. Container exits
    (one restart each if injected once) and cordons (recovered) tell that every step happened
    exactly once and every recovery was done."""
    apply_member(delta, deployment("kill", 3))
    eventually(lambda: running(delta, "app=kill", 3), timeout=60, what="3 pods app=kill")
    names = sorted(p["metadata"]["name"] for p in pods(delta, "app=kill"))
    kill_pods = {"clusters": {"names": ["delta"]}, "mode": "one",
                 "pods": {"namespace": "work", "selector": {"matchLabels": {"app": "kill"}}}}
    steps: list[dict[str, Any]] = []
    for index, at in enumerate(("0s", "4s", "8s", "12s", "16s")):
        if index % 2 == 0:
            steps.append({"name": f"exit-{index}", "at": at, "target": kill_pods,
                          "fault": {"type": "ContainerExit", "exitCode": 3}})
        else:
            steps.append({"name": f"cordon-{index}", "at": at, "duration": "6s",
                          "fault": {"type": "Cordon"}, "target": nodes(f"cpu-{index // 2}")})
    fleet.apply(plan("survivor", steps, seed=3))
    time.sleep(5)
    old = fleet.operator_pid()
    os.kill(old, signal.SIGKILL)
    eventually(lambda: fleet.operator_restarted(old), timeout=60, what="operator restarted")
    # The new operator starts the member's engine again; kill that one too, mid-plan.
    engine = eventually(lambda: engine_pid("delta"), timeout=60, what="delta's engine")
    os.kill(engine, signal.SIGKILL)
    found = finished(fleet, "survivor", timeout=120)
    injections = found["status"]["injections"]
    assert [i["state"] for i in injections] == ["Done", "Recovered", "Done", "Recovered",
                                                "Done"], injections
    # Each exit happened once: the victims restarted once per step that hit them.
    hits: dict[str, int] = {}
    for injection in injections:
        if injection["step"].startswith("exit"):
            (target,) = injection["targets"]
            hits[target.rsplit("/", 1)[-1]] = hits.get(target.rsplit("/", 1)[-1], 0) + 1

    def restarts() -> dict[str, int]:
        return {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
                for p in pods(delta, "app=kill") if p["metadata"]["name"] in hits}
    deadline = time.monotonic() + 60
    while (counts := restarts()) != hits and time.monotonic() < deadline:
        time.sleep(1)
    assert counts == hits, (f"restart counts {counts}, expected one per injection: {hits}; "
                            f"injections: {injections}")
    assert set(hits) <= set(names)
    for index in (0, 1):
        assert not node(delta, f"cpu-{index}")["spec"].get("unschedulable")
    delete_plan(fleet, "survivor")


def test_deleting_a_plan_recovers_what_it_injected(fleet: Fleet, delta: Path) -> None:
    steps = [{"name": "forever", "target": nodes("cpu-2"), "at": "0s",
              "fault": {"type": "Taint", "taint": {"key": "example.com/forever",
                                                    "effect": "NoSchedule"}}}]
    found = run(fleet, plan("forever", steps), "forever", timeout=60)
    assert found["status"]["injections"][0]["state"] == "Injected"
    eventually(lambda: any(t["key"] == "example.com/forever"
                           for t in node(delta, "cpu-2")["spec"].get("taints") or ()),
               timeout=20, what="the taint on cpu-2")
    delete_plan(fleet, "forever")
    assert not any(t["key"] == "example.com/forever"
                   for t in node(delta, "cpu-2")["spec"].get("taints") or ())


def test_scheduler_and_controller_manager_outages(fleet: Fleet, delta: Path) -> None:
    """While the scheduler is down a new pod stays unscheduled; while the controller-manager
    is down a new Deployment gets no pods; each catches up once started again."""
    cluster = {"clusters": {"names": ["delta"]}}
    steps = [
        {"name": "no-scheduler", "target": cluster, "at": "0s", "duration": "12s",
         "fault": {"type": "SchedulerDown"}},
        {"name": "no-controllers", "target": cluster, "after": ["no-scheduler"],
         "duration": "12s", "fault": {"type": "ControllerManagerDown"}},
    ]
    fleet.apply(plan("components", steps))

    def state(step: str) -> str:
        found = fleet.get("fp", "components", "-n", NAMESPACE)
        return next((i["state"] for i in (found.get("status") or {}).get("injections", [])
                     if i["step"] == step), "")
    eventually(lambda: state("no-scheduler") == "Injected", timeout=30, what="scheduler down")
    apply_member(delta, "apiVersion: v1\nkind: Pod\nmetadata: {name: waits, namespace: work}\n"
                        "spec:\n  containers: [{name: main, image: busybox}]\n")
    time.sleep(5)
    assert not kubectl_json(delta, "-n", "work", "get", "pod", "waits")["spec"].get("nodeName")
    eventually(lambda: state("no-controllers") == "Injected", timeout=60,
               what="controller-manager down")
    # Scheduled once the scheduler is back (the controller-manager plays no part in that).
    eventually(lambda: kubectl_json(delta, "-n", "work", "get", "pod", "waits")["spec"].get(
        "nodeName"), timeout=30, what="pod waits scheduled after the scheduler came back")
    apply_member(delta, deployment("later", 3))
    time.sleep(5)
    assert pods(delta, "app=later") == [], "no ReplicaSet controller while it is down"
    eventually(lambda: running(delta, "app=later", 3), timeout=90,
               what="the Deployment's pods once the controller-manager is back")
    eventually(lambda: fleet.get("fp", "components", "-n", NAMESPACE)["status"]["phase"]
               == "Succeeded", timeout=60, what="plan components Succeeded")
    assert {state("no-scheduler"), state("no-controllers")} == {"Recovered"}
    delete_plan(fleet, "components")


def test_a_slow_api_server_delays_the_engines_writes(fleet: Fleet, delta: Path) -> None:
    """APIServerSlow: every write of delta's engine waits 3 s, so a NotReady injected meanwhile
    shows up no sooner than that; afterwards writes are prompt again."""
    steps = [
        {"name": "slow", "target": {"clusters": {"names": ["delta"]}}, "at": "0s",
         "duration": "20s", "fault": {"type": "APIServerSlow", "latency": "3s"}},
        {"name": "not-ready", "target": nodes("cpu-2"), "at": "3s", "duration": "8s",
         "fault": {"type": "NotReady"},
         "expectations": [expect("slowly", "20s", VICTIM_NODES,
                                 condition={"type": "Ready", "status": "False"})]},
        {"name": "not-ready-after", "target": nodes("cpu-2"), "after": ["slow"],
         "duration": "5s", "fault": {"type": "NotReady"},
         "expectations": [expect("promptly", "20s", VICTIM_NODES,
                                 condition={"type": "Ready", "status": "False"})]},
    ]
    found = run(fleet, plan("slow", steps), "slow", timeout=120)
    outcomes = results(found)
    assert found["status"]["verdict"] == "Passed", outcomes
    slowly = outcomes["not-ready/slowly"][1]
    promptly = outcomes["not-ready-after/promptly"][1]
    assert slowly is not None
    assert promptly is not None
    assert slowly >= 3.0, outcomes
    assert promptly < 3.0, outcomes
    delete_plan(fleet, "slow")


def test_a_plan_s_trace_holds_the_operator_the_engine_and_the_member_apiserver(
        fleet: Fleet, delta: Path) -> None:
    """The embedded collector gets one trace per plan: the operator's step spans, the engine's
    batch carrying the fault out under them, and delta's kube-apiserver handling its writes
    (service "apiserver", as it names itself) under the engine's."""
    from e2e.test_tracing import trace_cli

    steps = [{"name": "xid", "target": nodes("gpu-1"), "at": "0s", "duration": "4s",
              "fault": {"type": "GPUXid", "xid": 79},
              "expectations": [expect("tainted", "20s", VICTIM_NODES,
                                      taint={"key": keys.GPU_XID, "effect": "NoExecute"})]}]
    found = run(fleet, plan("traced", steps), "traced", timeout=90)
    assert found["status"]["verdict"] == "Passed", found["status"]
    trace_id = found["status"]["traceId"]
    assert len(trace_id) == 32, found["status"]

    wanted_names = {"faultplan.start", "faultplan.inject", "faultplan.expectation",
                    "faultplan.recover", "faultplan.finish", "engine.fault_batch"}

    def under_engine(span: dict[str, Any], by_id: dict[str, dict[str, Any]],
                     engine_ids: set[str]) -> bool:
        while span["parentSpanId"] in by_id:
            if span["parentSpanId"] in engine_ids:
                return True
            span = by_id[span["parentSpanId"]]
        return False

    def complete(found: list[dict[str, Any]]) -> bool:
        # Each process exports on its own timer (the SDK's batch delay is 5 s), so a span that
        # ended a round later may arrive an export later: wait for all that is asserted below.
        by_id = {span["spanId"]: span for span in found}
        batches = {s["spanId"] for s in found if s["name"] == "engine.fault_batch"}
        return (wanted_names <= {span["name"] for span in found}
                and any(s["name"] == "engine.fault_batch" and s["cluster"] == "delta"
                        for s in found)
                and any(under_engine(s, by_id, batches)
                        for s in found if s["service"] == "apiserver"))

    last: list[list[dict[str, Any]]] = [[]]

    def spans() -> list[dict[str, Any]] | None:
        shown = json.loads(trace_cli(fleet.state, "show", trace_id, "-o", "json"))
        last[0] = shown["spans"]
        return shown["spans"] if complete(shown["spans"]) else None
    try:
        found_spans: list[dict[str, Any]] = eventually(
            spans, timeout=60, what="the plan's spans, the engine's and delta's apiserver's")
    except pytest.fail.Exception:
        pytest.fail(f"the trace holds only {sorted({(s['service'], s['name']) for s in last[0]})}")
    by_id = {span["spanId"]: span for span in found_spans}
    batches = [s for s in found_spans if s["name"] == "engine.fault_batch"]
    assert all(by_id[b["parentSpanId"]]["name"] in ("faultplan.inject", "faultplan.recover")
               for b in batches if b["parentSpanId"] in by_id), batches
    listed = json.loads(trace_cli(fleet.state, "ls", "-o", "json"))
    assert trace_id in [t["traceId"] for t in listed]
    delete_plan(fleet, "traced")
