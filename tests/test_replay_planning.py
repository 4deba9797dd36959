"""The replay planner (operators/recording/planning.py): timeline scaling, what is left out for
the cluster or the controllers to make, and the recorded lives handed to controllers' pods."""

from __future__ import annotations

import json
from typing import Any

import pytest

from operators.recording import planning
from operators.recording.planning import Options, PlanError
from operators.recording.trace import Change, Owner, PodLife, Resource, Target, Trace
from primitives import keys

S = 1_000_000_000  # nanoseconds in a second
DEPLOYMENTS = Resource("apps", "v1", "deployments")
PODS = Resource("", "v1", "pods")
JOBS = Resource("batch", "v1", "jobs")


def obj(api_version: str, kind: str, name: str, namespace: str = "apps", *,
        owner: tuple[str, str] | None = None, **body: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                                "creationTimestamp": "2026-01-01T00:00:00Z"}
    if namespace:
        metadata["namespace"] = namespace
    if owner is not None:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0],
                                        "name": owner[1], "uid": "x", "controller": True}]
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **body,
            "status": {"recorded": True}}


def template(restart: str = "Always") -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}},
            "spec": {"restartPolicy": restart, "containers": [{"name": "c", "image": "i"}]}}


def deployment(name: str = "web") -> dict[str, Any]:
    return obj("apps/v1", "Deployment", name, spec={"replicas": 2, "template": template()})


def job(name: str = "batch") -> dict[str, Any]:
    found = obj("batch/v1", "Job", name, spec={
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "old"}},
        "template": {**template("Never"), "metadata": {"labels": {
            "batch.kubernetes.io/controller-uid": "old", "app": "x"}}}})
    found["metadata"]["labels"] = {"controller-uid": "old", "job-name": name}
    return found


def pod(name: str, owner: tuple[str, str] | None = None, node: str = "n1") -> dict[str, Any]:
    return obj("v1", "Pod", name, owner=owner, spec={"nodeName": node, **template()["spec"]})


def life(name: str, owner: Owner | None, ordinal: int, created: float, started: float | None,
         finished: float | None = None, code: int | None = None) -> PodLife:
    def ns(seconds: float | None) -> int | None:
        return None if seconds is None else int(seconds * S)
    return PodLife("c1", "apps", name, owner, ordinal, int(created * S), ns(started),
                   ns(finished), code)


def trace(initial: list[dict[str, Any]], changes: list[Change] = (),  # type: ignore[assignment]
          pods: list[PodLife] = (), clusters: tuple[str, ...] = ("c1",)) -> Trace:  # type: ignore[assignment]
    return Trace(clusters, "2026-01-01T00:00:00Z", 60 * S,
                 tuple(("c1", o) for o in initial), tuple(changes), tuple(pods))


def by_name(plan: planning.Plan) -> dict[str, planning.Write]:
    return {f"{w.method} {w.kind or w.resource} {w.name}": w for w in plan.writes}


def replayed(plan: planning.Plan) -> tuple[planning.Write, ...]:
    """The plan's writes of what the trace holds (not the namespaces it makes if missing)."""
    return tuple(w for w in plan.writes if not w.if_missing)


def test_changes_are_due_on_the_recorded_timeline_scaled_by_speed() -> None:
    changes = [Change(10 * S, "create", Target("c1", DEPLOYMENTS, "apps", "later"),
                      deployment("later")),
               Change(30 * S, "patch", Target("c1", DEPLOYMENTS, "apps", "later"),
                      {"spec": {"replicas": 5}}),
               Change(40 * S, "delete", Target("c1", DEPLOYMENTS, "apps", "later"))]
    plan = planning.plan(trace([deployment()], changes), Options(speed=10))
    writes = replayed(plan)
    assert [(w.method, w.name, w.due) for w in writes] == [
        ("create", "web", 0.0), ("create", "later", 1.0), ("patch", "later", 3.0),
        ("delete", "later", 4.0)]
    assert writes[2].body == {"spec": {"replicas": 5}}
    assert writes[2].kind == "Deployment", "the kind of a patch, learnt from its create"
    assert len({w.chain for w in writes[1:]}) == 1, "one object's writes go in order"


def test_speed_max_sends_every_change_at_once_in_the_recorded_order() -> None:
    changes = [Change(t * S, "patch", Target("c1", DEPLOYMENTS, "apps", "web"),
                      {"spec": {"replicas": t}}) for t in (5, 9)]
    plan = planning.plan(trace([deployment()], changes), Options(speed=0))
    assert [(w.due, (w.body or {}).get("spec")) for w in replayed(plan)] == [
        (0.0, {"replicas": 2, "template": template()}), (0.0, {"replicas": 5}),
        (0.0, {"replicas": 9})]
    assert any("as fast as" in note for note in plan.notes)


def test_a_created_object_leaves_the_recorded_clusters_identity_behind() -> None:
    plan = planning.plan(trace([job(), obj("v1", "Service", "svc", spec={
        "clusterIP": "10.0.0.9", "clusterIPs": ["10.0.0.9"], "ports": [{"port": 80}]})]),
        Options(speed=1))
    made = by_name(plan)
    body = made["create Job batch"].body or {}
    assert set(body["metadata"]) == {"name", "namespace", "labels"}
    assert body["metadata"]["labels"] == {"job-name": "batch"}, "the recorded Job's UID gone"
    assert "status" not in body
    assert "selector" not in body["spec"]
    assert body["spec"]["template"]["metadata"]["labels"] == {"app": "x"}
    assert (made["create Service svc"].body or {})["spec"] == {"ports": [{"port": 80}]}


def test_what_the_cluster_or_a_replayed_controller_makes_is_left_out() -> None:
    initial = [
        obj("v1", "Namespace", "apps", namespace=""), obj("v1", "Namespace", "default",
                                                          namespace=""),
        obj("v1", "Node", "n1", namespace=""), obj("v1", "ServiceAccount", "default"),
        obj("v1", "ConfigMap", "coredns", namespace="kube-system"),
        deployment(),
        obj("apps/v1", "ReplicaSet", "web-5d4f8c7b9", owner=("Deployment", "web")),
        pod("web-5d4f8c7b9-abcde", owner=("ReplicaSet", "web-5d4f8c7b9")),
        pod("bare"),
    ]
    changes = [Change(2 * S, "patch", Target("c1", PODS, "apps", "web-5d4f8c7b9-abcde"),
                      {"metadata": {"labels": {"x": "y"}}})]
    plan = planning.plan(trace(initial, changes), Options(speed=1))
    assert sorted(by_name(plan)) == ["create Deployment web", "create Namespace apps",
                                     "create Pod bare"]
    reasons = {s.what: s.reason for s in plan.skipped}
    assert reasons["ReplicaSet apps/web-5d4f8c7b9"] == \
        "its controller Deployment apps/web is replayed and makes it"
    assert "ReplicaSet apps/web-5d4f8c7b9 is replayed" in \
        reasons["Pod apps/web-5d4f8c7b9-abcde"]
    assert reasons["patch Pod apps/web-5d4f8c7b9-abcde"] == \
        reasons["Pod apps/web-5d4f8c7b9-abcde"]
    assert reasons["Node n1"] == reasons["Namespace default"] == \
        reasons["ConfigMap kube-system/coredns"] == "the cluster makes it itself"
    assert "nodeName" not in (by_name(plan)["create Pod bare"].body or {})["spec"]


def test_the_nth_recorded_pod_of_a_workload_is_the_nth_life_in_its_lives_set() -> None:
    """Deployment pods owned by a ReplicaSet the trace does not hold: matched by name; a Job's
    pods by the Job; lives scaled by speed and ordered by creation."""
    rs = Owner("ReplicaSet", "web-5d4f8c7b9")
    pods = [
        life("web-b", rs, 1, created=2, started=5),
        life("web-a", rs, 0, created=1, started=2, finished=9, code=137),
        life("batch-1", Owner("Job", "batch"), 1, created=3, started=4, finished=24, code=1),
        life("batch-0", Owner("Job", "batch"), 0, created=1, started=3, finished=13, code=0),
        life("batch-2", Owner("Job", "batch"), 2, created=5, started=None),
    ]
    plan = planning.plan(trace([deployment(), job()], pods=pods),
                         Options(speed=2, run="r1", seed="7"))
    writes = replayed(plan)
    assert [(w.kind, w.name) for w in writes] == [
        ("ConfigMap", writes[0].name), ("Deployment", "web"),
        ("ConfigMap", writes[2].name), ("Job", "batch")]
    assert writes[0].chain == writes[1].chain, "the set is written before its owner"
    sets = {w.name: json.loads((w.body or {})["data"]["lives"]) for w in writes
            if w.kind == "ConfigMap"}
    # Deployment pods restart whatever their exit: only their start delay.
    assert sets[writes[0].name] == [{"startDelay": 0.5}, {"startDelay": 1.5}]
    assert sets[writes[2].name] == [{"startDelay": 1.0, "runTime": 5.0, "exitCode": 0},
                                    {"startDelay": 0.5, "runTime": 10.0, "exitCode": 1}, {}]
    job_template = (writes[3].body or {})["spec"]["template"]["metadata"]["annotations"]
    assert job_template[keys.LIVES] == writes[2].name
    assert job_template[keys.SEED] == "7/apps/Job/batch"
    assert plan.lives == (("apps/Deployment/web", 2), ("apps/Job/batch", 3))
    other_run = planning.plan(trace([job()], pods=pods), Options(speed=2, run="r2"))
    assert replayed(other_run)[0].name != writes[2].name, "each replay its own sets"


def test_a_replicaset_in_the_trace_names_its_deployment_by_its_owner_reference() -> None:
    initial = [deployment("front"),
               obj("apps/v1", "ReplicaSet", "rs-unusual", owner=("Deployment", "front"))]
    pods = [life("p", Owner("ReplicaSet", "rs-unusual"), 0, created=0, started=1)]
    plan = planning.plan(trace(initial, pods=pods), Options(speed=1))
    assert plan.lives == (("apps/Deployment/front", 1),)


def test_raw_pods_replays_pods_bare_with_their_lives_and_no_controllers() -> None:
    initial = [deployment(), obj("apps/v1", "ReplicaSet", "web-5d4f8c7b9",
                                 owner=("Deployment", "web")),
               {**pod("web-5d4f8c7b9-abcde", owner=("ReplicaSet", "web-5d4f8c7b9")),
                "spec": {**pod("x")["spec"], "restartPolicy": "Never"}}]
    pods = [life("web-5d4f8c7b9-abcde", Owner("ReplicaSet", "web-5d4f8c7b9"), 0, created=0,
                 started=2, finished=12, code=3)]
    plan = planning.plan(trace(initial, pods=pods), Options(speed=1, raw_pods=True))
    [bare] = replayed(plan)
    assert (bare.kind, bare.name) == ("Pod", "web-5d4f8c7b9-abcde")
    body = bare.body or {}
    assert "ownerReferences" not in body["metadata"]
    assert body["metadata"]["annotations"] == {keys.START_DELAY: "2.000s",
                                               keys.RUN_TIME: "10.000s", keys.EXIT_CODE: "3"}
    assert {s.reason for s in plan.skipped} == {"its pods are replayed raw (--raw-pods)"}


def test_a_trace_of_several_clusters_needs_the_one_to_replay() -> None:
    two = trace([deployment()], clusters=("c1", "c2"))
    with pytest.raises(PlanError, match=r"holds 2 clusters \(c1, c2\): name the one"):
        planning.plan(two, Options(speed=1))
    with pytest.raises(PlanError, match="no cluster 'c9'; it has c1, c2"):
        planning.plan(two, Options(speed=1, cluster="c9"))
    assert planning.plan(two, Options(speed=1, cluster="c1")).writes


def test_what_users_put_in_the_default_namespace_is_replayed() -> None:
    """A recording of workloads in ``default`` (what ``kubectl create`` makes without -n)
    replays them: only the namespace itself and its ``kubernetes`` Service are the
    cluster's. Before, everything in ``default`` was left out as the cluster's own."""
    initial = [obj("v1", "Namespace", "default", namespace=""),
               obj("v1", "Service", "kubernetes", namespace="default"),
               obj("apps/v1", "Deployment", "web", namespace="default",
                   spec={"replicas": 1, "template": template()})]
    changes = [Change(S, "create", Target("c1", JOBS, "default", "batch"),
                      {**job(), "metadata": {"name": "batch", "namespace": "default"}})]
    plan = planning.plan(trace(initial, changes), Options(speed=1))
    assert sorted(by_name(plan)) == ["create Deployment web", "create Job batch"]
    reasons = {s.what: s.reason for s in plan.skipped}
    assert reasons == {"Namespace default": "the cluster makes it itself",
                       "Service default/kubernetes": "the cluster makes it itself"}


def test_a_namespace_the_trace_lacks_is_made_first_if_missing_and_the_notes_say_so() -> None:
    """A recording of some resources only holds no namespaces: the replay makes those its
    objects go into, but not one the trace holds nor one every cluster has."""
    configmaps = Resource("", "v1", "configmaps")
    initial = [deployment(), obj("v1", "ConfigMap", "cfg", namespace="team"),
               obj("v1", "ConfigMap", "mine", namespace="default"),
               obj("v1", "Namespace", "recorded", namespace=""),
               obj("v1", "ConfigMap", "there", namespace="recorded")]
    changes = [Change(5 * S, "create", Target("c1", configmaps, "later", "l"),
                      obj("v1", "ConfigMap", "l", namespace="later")),
               Change(6 * S, "patch", Target("c1", configmaps, "elsewhere", "p"),
                      {"data": {"a": "b"}})]
    pods = [life("web-a", Owner("ReplicaSet", "web-5d4f8c7b9"), 0, created=0, started=1)]
    plan = planning.plan(trace(initial, changes, pods), Options(speed=1, run="r1"))
    made = [(w.name, w.due, w.if_missing) for w in plan.writes if w.kind == "Namespace"]
    assert made == [("apps", 0.0, True), ("later", 0.0, True), ("team", 0.0, True),
                    ("recorded", 0.0, False)], \
        "first, before the lives sets (fakefleet-system is there) and what goes in them"
    assert plan.writes[0].body == {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "apps", "annotations": {keys.OWNED_BY: "Replay/r1"}}}
    assert plan.writes[0].chain == planning.namespace_chain("apps")
    assert by_name(plan)["create Namespace recorded"].chain == planning.namespace_chain(
        "recorded"), "a recorded namespace is in the same chain as one made if missing"
    assert [n for n in plan.notes if "not in the trace" in n] == [
        "namespaces apps, later, team are not in the trace: created first where the cluster "
        "has none, and left as it stands where it has one"]
    whole = planning.plan(trace([obj("v1", "Namespace", "apps", namespace=""), deployment()]),
                          Options(speed=1))
    assert not any(w.if_missing for w in whole.writes)
    assert not any("not in the trace" in note for note in whole.notes)
