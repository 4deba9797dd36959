"""A hand-built trace replayed into a FakeCluster: a Deployment of 3 and a Job whose recorded pods
ran for given times with given exit codes (one failed). The member's real controllers make the
pods, the engine gives each the recorded life it takes from its owner's lives set, and the
outcomes are the recorded ones; an object of a kind the member does not serve is refused and
the rest replayed. Then a KWOK-format recording, through ``fakefleet replay``, into the same
member: its objects, its strategic-merge patches and its pods' outcomes arrive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import CLUSTER, POOL, Fleet, eventually, fakefleet, kubectl, kubectl_json
from operators.api import lives
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.times import parse
from operators.recording import files, planning, replaying
from operators.recording.trace import Change, Owner, PodLife, Resource, Target, Trace
from primitives import keys
from primitives.clocks import SYSTEM_CLOCK

S = 1_000_000_000
SPEED = 2.0
#: The Job's recorded pods: (run time, exit code), in the order the Job controller made them;
#: the third failed, the fourth replaced it.
JOB_PODS = [(4, 0), (10, 0), (2, 2), (6, 0)]


def meta(name: str, owner: tuple[str, str, str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "namespace": "rp", "uid": f"recorded-{name}",
                             "resourceVersion": "42"}
    if owner is not None:
        found["ownerReferences"] = [{"apiVersion": owner[0], "kind": owner[1],
                                     "name": owner[2], "uid": "recorded", "controller": True}]
    return found


def pod_template(restart: str, app: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app}},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox"}]}}


def recorded() -> Trace:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("web"),
                  "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                           "template": pod_template("Always", "web")}}
    replica_set = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": meta("web-6b7f9c", ("apps/v1", "Deployment", "web")),
                   "spec": {"replicas": 3}}
    web_pods = [{"apiVersion": "v1", "kind": "Pod",
                 "metadata": meta(f"web-6b7f9c-{n}", ("apps/v1", "ReplicaSet", "web-6b7f9c")),
                 "spec": {**pod_template("Always", "web")["spec"], "nodeName": "old-node"}}
                for n in range(3)]
    widget = {"apiVersion": "widgets.example/v1", "kind": "Widget", "metadata": meta("w")}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("batch"),
           "spec": {"completions": 3, "parallelism": 3, "backoffLimit": 1,
                    "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "x"}},
                    "template": pod_template("Never", "batch")}}
    pods = [PodLife("east", "rp", f"web-6b7f9c-{n}", Owner("ReplicaSet", "web-6b7f9c"), n,
                    created=0, started=2 * S) for n in range(3)]
    made = [0, 0, 0, 3]  # the replacement was made after the failure (2 s + 2 s)
    pods += [PodLife("east", "rp", f"batch-{n}", Owner("Job", "batch"), n,
                     created=(10 + made[n]) * S, started=(11 + made[n]) * S,
                     finished=(11 + made[n] + run) * S, exit_code=code)
             for n, (run, code) in enumerate(JOB_PODS)]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rp"}}
    changes = (
        Change(10 * S, "create", Target("east", Resource("batch", "v1", "jobs"), "rp", "batch"),
               job),
        Change(12 * S, "patch", Target("east", Resource("apps", "v1", "deployments"), "rp",
                                       "web"), {"metadata": {"labels": {"replayed": "yes"}}}),
    )
    return Trace(("east",), "2026-01-01T00:00:00Z", 40 * S,
                 tuple(("east", o) for o in [namespace, deployment, replica_set, *web_pods,
                                             widget]), changes, tuple(pods))


@pytest.fixture(scope="module")
def member(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(CLUSTER.format(name="replayed"))
    fleet.apply(POOL.format(name="replayed-workers", cluster="replayed", replicas=3,
                            extra="  pods: {terminationGracePeriodCap: 0s}"))
    fleet.wait_cluster_ready("replayed")
    fleet.wait_pool("replayed-workers", 3)
    kubeconfig = fleet.member("replayed")
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield kubeconfig
    fleet.release("replayed", "replayed-workers")


async def replay(kubeconfig: Path) -> tuple[planning.Plan, replaying.Progress]:
    async with Client.connect(load_kubeconfig_file(kubeconfig)) as client:
        return await replaying.replay(recorded(), planning.Options(speed=SPEED, run="e2e",
                                                                   seed="1"),
                                      client, clock=SYSTEM_CLOCK)


def taken(kubeconfig: Path, owner: str) -> dict[str, int]:
    name = lives.set_name("e2e", "rp", *owner.split("/"))
    found = kubectl_json(kubeconfig, "get", "configmap", "-n", lives.NAMESPACE, name)
    result: dict[str, int] = json.loads(found["data"]["taken"])
    return result


def test_a_replayed_trace_gives_the_controllers_pods_the_recorded_lives(member: Path) -> None:
    plan, progress = asyncio.run(replay(member))
    assert [r.write.describe() for r in progress.refused] == ["create Widget rp/w"]
    assert "install its CustomResourceDefinition" in progress.refused[0].reason
    assert progress.applied == progress.total - 1
    assert plan.lives == (("rp/Deployment/web", 3), ("rp/Job/batch", 4))
    assert kubectl_json(member, "get", "deployment", "-n", "rp", "web")["metadata"][
        "labels"] == {"replayed": "yes"}

    def job_done() -> bool:
        status = kubectl_json(member, "get", "job", "-n", "rp", "batch").get("status") or {}
        return status.get("succeeded") == 3
    eventually(job_done, timeout=45, what="the replayed Job complete")
    job_pods = kubectl_json(member, "get", "pods", "-n", "rp", "-l", "app=batch")["items"]
    outcomes = []
    for pod in job_pods:
        ended = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        outcomes.append((ended["exitCode"],
                         parse(ended["finishedAt"]) - parse(ended["startedAt"])))
    expected = sorted((code, run / SPEED) for run, code in JOB_PODS)
    assert [code for code, _ in sorted(outcomes)] == [code for code, _ in expected]
    for (_, ran), (_, wanted) in zip(sorted(outcomes), expected, strict=True):
        assert abs(ran - wanted) <= 1, f"ran {ran}s for a recorded {wanted}s ({outcomes})"
    assert sorted(p["status"]["phase"] for p in job_pods) == [
        "Failed", "Succeeded", "Succeeded", "Succeeded"]
    assert sorted(taken(member, "Job/batch").values()) == [0, 1, 2, 3]
    assert {p["metadata"]["uid"] for p in job_pods} == set(taken(member, "Job/batch"))

    web = kubectl_json(member, "get", "pods", "-n", "rp", "-l", "app=web")["items"]
    assert len(web) == 3
    assert all(p["status"]["phase"] == "Running" for p in web)
    assert all(p["metadata"]["annotations"][keys.LIVES] for p in web)
    assert {p["metadata"]["uid"] for p in web} == set(taken(member, "Deployment/web"))


#: A recording as ``kwokctl snapshot record`` (KWOK v0.8.0) writes one: the objects at the
#: start, then ResourcePatch entries (``pkg/apis/action/v1alpha1/resource_patch_types.go``)
#: whose patches are strategic-merge patches. It holds no Namespace (``kw`` is made if
#: missing). Two Jobs' pods lived in it: ``batch``'s ran 4 s and exited 0, ``flaky``'s ran
#: 2 s and exited 2; the pods' times are their status stamps, the start 00:00:00 (the Jobs'
#: creation stamps less their offsets).
KWOK_RECORDING = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: kw, uid: 3f1c-01, resourceVersion: "811",
           creationTimestamp: "2025-12-31T23:58:00Z"}
data: {mode: slow, size: "3"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: old, namespace: kw, uid: 3f1c-02, resourceVersion: "812",
           creationTimestamp: "2025-12-31T23:58:00Z"}
data: {stale: "yes"}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: kw
  uid: 3f1c-03
  resourceVersion: "840"
  generation: 1
  creationTimestamp: "2025-12-31T23:58:30Z"
  annotations: {deployment.kubernetes.io/revision: "1"}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - {name: main, image: "busybox:1.36", args: [sleep, infinity]}
      - {name: side, image: "envoy:v1.30"}
status: {replicas: 1, readyReplicas: 1, availableReplicas: 1}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {group: batch, version: v1, resource: jobs}
target: {name: batch, namespace: kw}
durationNanosecond: 1000000000
method: create
template:
  apiVersion: batch/v1
  kind: Job
  metadata:
    name: batch
    namespace: kw
    uid: 7d2e-01
    resourceVersion: "901"
    creationTimestamp: "2026-01-01T00:00:01Z"
    labels: {batch.kubernetes.io/controller-uid: 7d2e-01, controller-uid: 7d2e-01,
             batch.kubernetes.io/job-name: batch, job-name: batch}
  spec:
    backoffLimit: 0
    selector: {matchLabels: {batch.kubernetes.io/controller-uid: 7d2e-01}}
    template:
      metadata:
        labels: {app: batch, batch.kubernetes.io/controller-uid: 7d2e-01,
                 controller-uid: 7d2e-01, batch.kubernetes.io/job-name: batch,
                 job-name: batch}
      spec:
        restartPolicy: Never
        terminationGracePeriodSeconds: 0
        containers: [{name: main, image: "busybox:1.36"}]
  status: {}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {group: batch, version: v1, resource: jobs}
target: {name: flaky, namespace: kw}
durationNanosecond: 1000000000
method: create
template:
  apiVersion: batch/v1
  kind: Job
  metadata: {name: flaky, namespace: kw, uid: 7d2e-02, resourceVersion: "902",
             creationTimestamp: "2026-01-01T00:00:01Z"}
  spec:
    backoffLimit: 0
    selector: {matchLabels: {batch.kubernetes.io/controller-uid: 7d2e-02}}
    template:
      metadata:
        labels: {app: flaky, batch.kubernetes.io/controller-uid: 7d2e-02,
                 controller-uid: 7d2e-02}
      spec:
        restartPolicy: Never
        terminationGracePeriodSeconds: 0
        containers: [{name: main, image: "busybox:1.36"}]
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: batch-x7k2p, namespace: kw}
durationNanosecond: 1200000000
method: create
template:
  apiVersion: v1
  kind: Pod
  metadata:
    name: batch-x7k2p
    namespace: kw
    uid: 9a1b-01
    creationTimestamp: "2026-01-01T00:00:01Z"
    ownerReferences: [{apiVersion: batch/v1, kind: Job, name: batch, uid: 7d2e-01,
                       controller: true, blockOwnerDeletion: true}]
  spec: {nodeName: kwok-node-0, restartPolicy: Never,
         containers: [{name: main, image: "busybox:1.36"}]}
  status: {phase: Pending}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: flaky-q9w4m, namespace: kw}
durationNanosecond: 1200000000
method: create
template:
  apiVersion: v1
  kind: Pod
  metadata:
    name: flaky-q9w4m
    namespace: kw
    uid: 9a1b-02
    creationTimestamp: "2026-01-01T00:00:01Z"
    ownerReferences: [{apiVersion: batch/v1, kind: Job, name: flaky, uid: 7d2e-02,
                       controller: true, blockOwnerDeletion: true}]
  spec: {nodeName: kwok-node-1, restartPolicy: Never,
         containers: [{name: main, image: "busybox:1.36"}]}
  status: {phase: Pending}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: batch-x7k2p, namespace: kw}
durationNanosecond: 2300000000
method: patch
template:
  status:
    phase: Running
    containerStatuses:
    - {name: main, ready: true, state: {running: {startedAt: "2026-01-01T00:00:02Z"}}}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: flaky-q9w4m, namespace: kw}
durationNanosecond: 2400000000
method: patch
template:
  status:
    phase: Running
    containerStatuses:
    - {name: main, ready: true, state: {running: {startedAt: "2026-01-01T00:00:02Z"}}}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {group: apps, version: v1, resource: deployments}
target: {name: web, namespace: kw}
durationNanosecond: 3000000000
method: patch
template:
  spec:
    replicas: 2
    template:
      spec:
        $setElementOrder/containers: [{name: main}, {name: side}]
        containers: [{name: main, image: "busybox:1.37"}]
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: flaky-q9w4m, namespace: kw}
durationNanosecond: 4100000000
method: patch
template:
  status:
    phase: Failed
    containerStatuses:
    - name: main
      ready: false
      state: {terminated: {exitCode: 2, reason: Error, startedAt: "2026-01-01T00:00:02Z",
                           finishedAt: "2026-01-01T00:00:04Z"}}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: configmaps}
target: {name: settings, namespace: kw}
durationNanosecond: 4500000000
method: patch
template: {data: {mode: fast}}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: configmaps}
target: {name: old, namespace: kw}
durationNanosecond: 5000000000
method: delete
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: batch-x7k2p, namespace: kw}
durationNanosecond: 6100000000
method: patch
template:
  status:
    phase: Succeeded
    containerStatuses:
    - name: main
      ready: false
      state: {terminated: {exitCode: 0, reason: Completed,
                           startedAt: "2026-01-01T00:00:02Z",
                           finishedAt: "2026-01-01T00:00:06Z"}}
"""
#: The KWOK recording's Jobs and what their one pod each did: (run time, exit code).
KWOK_JOBS = {"batch": (4, 0), "flaky": (2, 2)}
KWOK_SPEED = 2


def lives_taken(kubeconfig: Path, owner: str) -> dict[str, int]:
    """The ordinals the pods took from ``owner``'s lives set (``namespace/Kind/name``), by
    uid: the set of whichever replay wrote it (``fakefleet replay`` names its run itself)."""
    sets = kubectl_json(kubeconfig, "get", "configmaps", "-n", lives.NAMESPACE, "-l",
                        keys.LIVES)["items"]
    [found] = [s for s in sets if s["data"]["owner"] == owner]
    result: dict[str, int] = json.loads(found["data"]["taken"])
    return result


def test_a_kwok_recording_replays_with_its_objects_changes_and_pod_lives(
        fleet: Fleet, member: Path, tmp_path: Path) -> None:
    recording = tmp_path / "kw.yaml"
    recording.write_text(KWOK_RECORDING)
    done = fakefleet("replay", str(recording), "--into", "replayed", "--speed",
                     str(KWOK_SPEED), "--state-dir", str(fleet.state), check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "namespace kw is not in the trace" in said
    assert "kw/Job/batch: its pods take 1 recorded lives" in said

    namespace = kubectl_json(member, "get", "namespace", "kw")
    assert namespace["metadata"]["annotations"][keys.OWNED_BY].startswith("Replay/")
    settings = kubectl_json(member, "get", "configmap", "-n", "kw", "settings")
    assert settings["data"] == {"mode": "fast", "size": "3"}, "the patch, merged"
    assert kubectl(member, "get", "configmap", "-n", "kw", "old",
                   check=False).returncode != 0, "deleted as recorded"
    web = kubectl_json(member, "get", "deployment", "-n", "kw", "web")
    assert web["spec"]["replicas"] == 2
    # KWOK's strategic-merge patch named the container by its merge key: its args and the
    # other container are kept.
    assert [(c["name"], c["image"], c.get("args")) for c in web["spec"]["template"]["spec"][
        "containers"]] == [("main", "busybox:1.37", ["sleep", "infinity"]),
                           ("side", "envoy:v1.30", None)]

    def ended(job: str) -> dict[str, Any] | None:
        pods = kubectl_json(member, "get", "pods", "-n", "kw", "-l", f"job-name={job}")["items"]
        return pods[0] if len(pods) == 1 and pods[0]["status"].get("phase") in (
            "Succeeded", "Failed") else None
    for job, (run, code) in KWOK_JOBS.items():
        pod = eventually(lambda job=job: ended(job), timeout=45,
                         what=f"the replayed Job {job}'s pod ended")
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == code
        assert pod["status"]["phase"] == ("Succeeded" if code == 0 else "Failed")
        ran = parse(terminated["finishedAt"]) - parse(terminated["startedAt"])
        assert abs(ran - run / KWOK_SPEED) <= 1, f"{job} ran {ran}s for a recorded {run}s"
        assert lives_taken(member, f"kw/Job/{job}") == {pod["metadata"]["uid"]: 0}
    conditions = {c["type"]: c["status"] for c in kubectl_json(
        member, "get", "job", "-n", "kw", "flaky")["status"].get("conditions") or ()}
    assert conditions.get("Failed") == "True", conditions


#: The Replay kind's traces: what the member's API takes, and one with a kind it does not serve.
KIND_NAMESPACE = "rk-kind"
#: The Job's recorded pods: (run time, exit code).
KIND_JOB_PODS = [(3, 0), (5, 0)]


def kind_trace(*, widget: bool) -> Trace:
    """A namespace, a ConfigMap patched at 2 s, one deleted at 4 s, a Job created at 1 s whose
    two recorded pods ran 3 s and 5 s; with ``widget``, an object of a kind no cluster serves."""
    def obj(kind: str, name: str, **fields: Any) -> dict[str, Any]:
        api = {"ConfigMap": "v1", "Job": "batch/v1", "Widget": "widgets.example/v1"}[kind]
        return {"apiVersion": api, "kind": kind,
                "metadata": {"name": name, "namespace": KIND_NAMESPACE, "uid": f"u-{name}"},
                **fields}
    configmaps = Resource("", "v1", "configmaps")
    job = obj("Job", "batch", spec={"completions": 2, "parallelism": 2, "backoffLimit": 0,
                                    "template": pod_template("Never", "rk-batch")})
    initial = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KIND_NAMESPACE}},
               obj("ConfigMap", "settings", data={"mode": "a"}),
               obj("ConfigMap", "scratch", data={"x": "1"})]
    if widget:
        initial.append(obj("Widget", "w"))
    changes = (
        Change(1 * S, "create", Target("east", Resource("batch", "v1", "jobs"), KIND_NAMESPACE,
                                       "batch"), job),
        Change(2 * S, "patch", Target("east", configmaps, KIND_NAMESPACE, "settings"),
               {"data": {"mode": "b"}}),
        Change(4 * S, "delete", Target("east", configmaps, KIND_NAMESPACE, "scratch"), None),
    )
    pods = tuple(PodLife("east", KIND_NAMESPACE, f"batch-{n}", Owner("Job", "batch"), n,
                         created=1 * S, started=2 * S, finished=(2 + run) * S, exit_code=code)
                 for n, (run, code) in enumerate(KIND_JOB_PODS))
    return Trace(("east",), "2026-01-01T00:00:00Z", 10 * S,
                 tuple(("east", o) for o in initial), changes, pods)


def apply_replay(fleet: Fleet, name: str, trace: Trace, directory: Path) -> None:
    """The trace in a ConfigMap of the host (binaryData, as kubectl puts a binary file) and a
    Replay of it into the member ``replayed``, twice as fast as recorded."""
    path = directory / f"{name}.trace"
    files.write(path, trace)
    kubectl(fleet.host, "create", "configmap", f"{name}-trace", f"--from-file=trace={path}")
    fleet.apply(f"""
apiVersion: fakefleet.dev/v1alpha1
kind: Replay
metadata: {{name: {name}}}
spec:
  clusterRef: replayed
  trace:
    configMapRef: {{name: {name}-trace, key: trace}}
  speed: 2
  seed: "1"
""")


def finished(fleet: Fleet, name: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        status: dict[str, Any] = fleet.get("replay", name).get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None
    result: dict[str, Any] = eventually(ended, timeout=60, what=f"Replay {name} to end")
    return result


def test_a_replay_object_replays_a_trace_from_a_configmap_and_says_how_far_it_got(
        fleet: Fleet, member: Path, tmp_path: Path) -> None:
    apply_replay(fleet, "rk-ok", kind_trace(widget=False), tmp_path)
    status = finished(fleet, "rk-ok")
    assert status["phase"] == "Succeeded", status
    total = status["total"]
    assert total == 7, "namespace, 2 ConfigMaps, the Job's lives set, the Job, patch, delete"
    assert (status["applied"], status.get("refusedCount", 0)) == (total, 0)
    assert status["progress"] == f"{total}/{total}"
    assert status["resumeFrom"] == total
    assert 0 <= status["maxLagSeconds"] < 5
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Replayed")
    settings = kubectl_json(member, "get", "configmap", "-n", KIND_NAMESPACE, "settings")
    assert settings["data"] == {"mode": "b"}
    assert settings["metadata"]["annotations"][keys.OWNED_BY] == \
        planning.writer(status["run"])
    assert kubectl(member, "get", "configmap", "-n", KIND_NAMESPACE, "scratch",
                   check=False).returncode != 0, "deleted as recorded"

    def job_done() -> bool:
        found = kubectl_json(member, "get", "job", "-n", KIND_NAMESPACE, "batch")
        return (found.get("status") or {}).get("succeeded") == 2
    eventually(job_done, timeout=45, what="the replayed Job complete")
    pods = kubectl_json(member, "get", "pods", "-n", KIND_NAMESPACE, "-l", "app=rk-batch")[
        "items"]
    ran = sorted(parse(p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])
                 - parse(p["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"])
                 for p in pods)
    for took, recorded_run in zip(ran, sorted(run / 2 for run, _ in KIND_JOB_PODS), strict=True):
        assert abs(took - recorded_run) <= 1, f"ran {ran} for recorded {KIND_JOB_PODS} at 2x"
    lives_set = lives.set_name(status["run"], KIND_NAMESPACE, "Job", "batch")
    taken_lives = json.loads(kubectl_json(member, "get", "configmap", "-n", lives.NAMESPACE,
                                          lives_set)["data"]["taken"])
    assert sorted(taken_lives.values()) == [0, 1]

    # What the member refuses fails the Replay, named with the reason; the rest is replayed.
    apply_replay(fleet, "rk-refused", Trace(
        ("east",), "2026-01-01T00:00:00Z", S,
        (("east", {"apiVersion": "widgets.example/v1", "kind": "Widget",
                   "metadata": {"name": "w", "namespace": KIND_NAMESPACE}}),
         ("east", {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "after-widget", "namespace": KIND_NAMESPACE}})),
        ()), tmp_path)
    status = finished(fleet, "rk-refused")
    # Applied: the namespace (there already, so left as it stands) and the ConfigMap.
    assert (status["phase"], status["applied"], status["refusedCount"]) == ("Failed", 2, 1)
    assert status["refused"][0]["write"] == f"create Widget {KIND_NAMESPACE}/w"
    assert "install its CustomResourceDefinition" in status["refused"][0]["reason"]
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "WritesRefused")
    assert kubectl(member, "get", "configmap", "-n", KIND_NAMESPACE, "after-widget",
                   check=False).returncode == 0

    # Deleting a Replay is not held up (its daemon has ended); what it wrote stays.
    kubectl(fleet.host, "delete", "replay", "rk-ok", "rk-refused", "--timeout=30s")
    assert kubectl(member, "get", "job", "-n", KIND_NAMESPACE, "batch",
                   check=False).returncode == 0
