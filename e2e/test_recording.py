"""Recording a real member: while ``fakefleet record`` runs, a Deployment scales, a Job's pods
run to the end and a FaultPlan makes another Job's pod exit 3; the trace holds the changes and
each pod's life (exit code, owner, ordinal), and converts to KWOK's format and back. Then
``fakefleet replay`` plays it into a fresh FakeCluster, faster, where the controllers' pods
end as the recorded ones did, owner by owner and ordinal by ordinal."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import (
    CLUSTER,
    FAKEFLEET,
    POOL,
    Fleet,
    eventually,
    fakefleet,
    kubectl,
    kubectl_json,
)
from operators.api import lives
from operators.recording import files, kwok
from operators.recording.trace import Owner, PodLife
from primitives import keys

NAME = "rec"
#: The fresh FakeCluster the recording is replayed into, and how much faster.
REPLAYED = f"{NAME}-again"
SPEED = 4
#: Where the workloads run: a namespace the recording does not hold (it records no
#: namespaces), so the replay makes it.
NAMESPACE = "shop"
#: How long the recording runs: the workloads below are done well within it.
RECORD_FOR = 40

JOBS = """
apiVersion: batch/v1
kind: Job
metadata: {name: batch, namespace: shop}
spec:
  parallelism: 2
  completions: 2
  template:
    metadata: {annotations: {fakefleet.dev/run-time: 3s}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: victim, namespace: shop}
spec:
  backoffLimit: 0
  template:
    metadata: {labels: {app: victim}, annotations: {fakefleet.dev/run-time: 10m}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox, env: [{name: API_TOKEN, value: hunter2}]}]
"""


def test_record_a_member_while_workloads_run_and_a_plan_fails_a_pod(
        fleet: Fleet, tmp_path: Path) -> None:
    fleet.apply(CLUSTER.format(name=NAME))
    fleet.apply(POOL.format(name=f"{NAME}-pool", cluster=NAME, replicas=2, extra=""))
    fleet.wait_cluster_ready(NAME)
    fleet.wait_pool(f"{NAME}-pool", 2)
    member = fleet.member(NAME)  # through 'fakefleet kubeconfig', as 'record --fleet' reads it
    kubectl(member, "create", "namespace", NAMESPACE)
    eventually(lambda: kubectl(member, "get", "serviceaccount", "default", "-n", NAMESPACE,
                               check=False).returncode == 0, what="the default ServiceAccount")
    kubectl(member, "create", "deployment", "web", "-n", NAMESPACE, "--image=nginx:1.27",
            "--replicas=1")
    trace_path = tmp_path / "rec.trace"
    recorder = subprocess.Popen(
        [str(FAKEFLEET), "record", "--fleet", "--state-dir", str(fleet.state), "--for",
         f"{RECORD_FOR}s", "--resources", "deployments.apps,replicasets.apps,jobs.batch,pods",
         "-o", str(trace_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert recorder.stderr is not None
        said = ""
        while "recording changes" not in said:  # the lists are taken: what follows is a change
            line = recorder.stderr.readline()
            assert line, f"fakefleet record ended early: {said}"
            said += line
        # The cluster to replay into starts meanwhile ('--fleet' listed the clusters already).
        fleet.apply(CLUSTER.format(name=REPLAYED))
        fleet.apply(POOL.format(name=f"{REPLAYED}-pool", cluster=REPLAYED, replicas=2,
                                extra=""))
        kubectl(member, "scale", "deployment", "web", "-n", NAMESPACE, "--replicas=3")
        kubectl(member, "apply", "-f", str(_file(tmp_path, "jobs.yaml", JOBS)))
        eventually(lambda: kubectl(member, "get", "pods", "-n", NAMESPACE, "-l", "app=victim",
                                   "-o", "name").stdout.strip(), timeout=60,
                   what="the victim pod")
        fleet.apply(json.dumps({
            "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": f"{NAME}-exit", "namespace": "default"},
            "spec": {"seed": 1, "steps": [{
                "name": "exit", "at": "1s", "fault": {"type": "ContainerExit", "exitCode": 3},
                "target": {"clusters": {"names": [NAME]},
                           "pods": {"namespace": NAMESPACE, "ownerKind": "Job",
                                    "ownerName": "victim"}}}]}}))
        _, err = recorder.communicate(timeout=RECORD_FOR + 60)
    finally:
        recorder.kill()
    assert recorder.returncode == 0, said + err
    # The session's fleet may hold other files' clusters too: --fleet records them all.
    assert re.search(rf"recorded (\S+, )*{NAME}(, \S+)* for", err), err

    whole = files.read(trace_path)
    assert NAME in whole.clusters, "--fleet records every FakeCluster, this one too"
    trace = dataclasses.replace(  # the test's cluster (others of the session's fleet are in)
        whole, initial=tuple(i for i in whole.initial if i[0] == NAME),
        changes=tuple(c for c in whole.changes if c.target.cluster == NAME),
        pods=tuple(p for p in whole.pods if p.cluster == NAME))
    assert [obj["metadata"]["name"] for _, obj in trace.initial
            if obj["kind"] == "Deployment"] == ["web"]
    scaled = [c for c in trace.changes if c.target.resource.resource == "deployments"
              and c.method == "patch" and (c.template or {}).get("spec", {}).get("replicas")]
    assert scaled[0].template is not None
    assert scaled[0].template["spec"]["replicas"] == 3
    created = {c.target.name for c in trace.changes if c.method == "create"
               and c.target.resource.resource == "jobs"}
    assert created == {"batch", "victim"}
    assert [c.at for c in trace.changes] == sorted(c.at for c in trace.changes)
    victim_job = next(c for c in trace.changes if c.target.name == "victim"
                      and c.method == "create")
    assert victim_job.template is not None
    [env] = victim_job.template["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == {"name": "API_TOKEN"}, "the token's value is sanitised by default"

    lives = {(life.owner, life.ordinal): life for life in trace.pods}
    batch = [lives[(Owner("Job", "batch"), n)] for n in (0, 1)]
    assert [life.exit_code for life in batch] == [0, 0]
    assert all(life.started is not None and life.finished is not None
               and life.finished > life.started for life in batch)
    victim = lives[(Owner("Job", "victim"), 0)]
    assert victim.exit_code == 3
    web = [life for life in trace.pods if life.owner is not None
           and life.owner.kind == "ReplicaSet" and life.owner.name.startswith("web-")]
    assert sorted(life.ordinal for life in web) == [0, 1, 2]
    assert all(life.node.startswith(f"{NAME}-pool") for life in web)

    kwok_path = tmp_path / "rec.yaml"
    fakefleet("convert", str(trace_path), "--to", "kwok", "--cluster", NAME, "-o",
              str(kwok_path))
    again = kwok.read(kwok_path.read_text(), source=str(kwok_path), cluster=NAME)
    assert again.changes == trace.changes, "KWOK's format holds every change"

    fleet.wait_cluster_ready(REPLAYED)
    fleet.wait_pool(f"{REPLAYED}-pool", 2)
    into = fleet.member(REPLAYED)
    # Its controller-manager makes the replayed namespace's ServiceAccount, without which no
    # pod is admitted: wait until it made the first one.
    eventually(lambda: kubectl(into, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    replayed = fakefleet("replay", str(trace_path), "--into", REPLAYED, "--from", NAME,
                         "--speed", str(SPEED), "--state-dir", str(fleet.state), check=False)
    said = replayed.stdout + replayed.stderr
    assert replayed.returncode == 0, said
    assert f"namespace {NAMESPACE} is not in the trace" in said
    expected = _recorded_outcomes(p for p in trace.pods if p.namespace == NAMESPACE)
    assert {owner for owner, _ in expected} == {
        f"{NAMESPACE}/Deployment/web", f"{NAMESPACE}/Job/batch", f"{NAMESPACE}/Job/victim"}
    assert expected[(f"{NAMESPACE}/Job/victim", 0)] == ("Failed", 3)
    seen: list[dict[tuple[str, int], Outcome]] = [{}]

    def settled() -> bool:
        """Each recorded pod's replayed one took its life and ended, or runs if the recorded
        one ran to the end of the recording."""
        seen[0] = found = _replayed_outcomes(into)
        return found.keys() == expected.keys() and all(
            phase in ("Succeeded", "Failed") or phase == expected[key][0] == "Running"
            for key, (phase, _) in found.items())
    try:
        eventually(settled, timeout=60, what="the replayed pods")
    except pytest.fail.Exception:
        pytest.fail(f"the replayed pods did not end as the recorded ones: {seen[0]}, "
                    f"recorded {expected}")
    assert seen[0] == expected
    kubectl(fleet.host, "delete", "fc", REPLAYED, "--wait=false", check=False)


Outcome = tuple[str, int | None]  # (phase, exit code)


def _workload(life: PodLife) -> str:
    """The replayed workload whose controller makes pods like ``life``'s, as its lives set
    names it: a ReplicaSet's pods are its Deployment's."""
    assert life.owner is not None, life
    kind, name = life.owner.kind, life.owner.name
    if kind == "ReplicaSet":
        kind, name = "Deployment", name.rsplit("-", 1)[0]
    return f"{life.namespace}/{kind}/{name}"


def _recorded_outcomes(recorded: Iterable[PodLife]) -> dict[tuple[str, int], Outcome]:
    """How each recorded pod ended, by its workload and its place among the workload's pods
    (the order of its lives set: by creation)."""
    by_workload: dict[str, list[PodLife]] = {}
    for life in recorded:
        by_workload.setdefault(_workload(life), []).append(life)
    found = {}
    for workload, pods in by_workload.items():
        for ordinal, life in enumerate(sorted(pods, key=lambda p: (p.created, p.ordinal,
                                                                   p.name))):
            found[(workload, ordinal)] = ("Running", None) if life.finished is None else (
                "Succeeded" if life.exit_code == 0 else "Failed", life.exit_code)
    return found


def _replayed_outcomes(kubeconfig: Path) -> dict[tuple[str, int], Outcome]:
    """How the replayed pods are, by workload and the ordinal each took from its lives set."""
    sets = kubectl_json(kubeconfig, "get", "configmaps", "-n", lives.NAMESPACE, "-l",
                        keys.LIVES)["items"]
    pods = {p["metadata"]["uid"]: p for p in kubectl_json(
        kubeconfig, "get", "pods", "-n", NAMESPACE)["items"]}
    found: dict[tuple[str, int], Outcome] = {}
    for entry in sets:
        for uid, ordinal in json.loads(entry["data"]["taken"]).items():
            if uid in pods:
                found[(entry["data"]["owner"], ordinal)] = _outcome(pods[uid])
    return found


def _outcome(pod: dict[str, Any]) -> Outcome:
    phase = str(pod["status"].get("phase"))
    statuses = pod["status"].get("containerStatuses") or [{}]
    terminated = (statuses[0].get("state") or {}).get("terminated") or {}
    return phase, terminated.get("exitCode")


def _file(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path
