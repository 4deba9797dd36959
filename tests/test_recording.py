"""Recording: what a capture makes of lists and watch events (creates, merge patches, deletes,
no duplicates after a relist), pods' lives, sanitising, the trace file, and a whole recording
over the in-memory transport and the fake clock."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from operators.k8s.client import Client
from operators.recording import files, patches, podlives, watching
from operators.recording.capturing import Capture, Watched
from operators.recording.files import TraceError
from operators.recording.sanitizing import Rules, recorded
from operators.recording.trace import Change, Owner, PodLife, Resource, Target, Trace
from tests.fakes.clocks import FAKE_EPOCH, FakeClock
from tests.fakes.k8s import MemoryTransport

DEPLOYMENTS = Resource("apps", "v1", "deployments")
PODS = Resource("", "v1", "pods")
DEPLOYMENT = Watched("west", DEPLOYMENTS, "Deployment", True)
POD = Watched("west", PODS, "Pod", True)
S = 1_000_000_000


def deployment(name: str, replicas: int, *, uid: str = "u1", version: str = "1") -> dict[str,
                                                                                          Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version,
                         "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 3,
                         "managedFields": [{"manager": "kubectl"}], "labels": {"app": name}},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas}}


def pod(name: str, *, owner: str = "web-1", created: str = "2026-01-01T00:00:10Z",
        exit_code: int | None = None, uid: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if exit_code is not None:
        status = {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [
            {"name": "main", "state": {"terminated": {
                "exitCode": exit_code, "startedAt": "2026-01-01T00:00:12Z",
                "finishedAt": "2026-01-01T00:00:42Z"}}}]}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
                         "creationTimestamp": created, "ownerReferences": [{
                             "kind": "ReplicaSet", "name": owner, "uid": "rs",
                             "controller": True}]},
            "spec": {"nodeName": "n1"}, "status": status}


# -- capture -----------------------------------------------------------------------------------

def test_the_first_list_is_the_start_and_events_are_creates_patches_and_deletes() -> None:
    capture = Capture(start=FAKE_EPOCH, rules=Rules())
    listing = capture.listed(DEPLOYMENT, [deployment("web", 1)], FAKE_EPOCH)
    assert listing.changes == []
    [start] = listing.initial
    assert start["apiVersion"] == "apps/v1"
    assert start["kind"] == "Deployment"
    assert start["metadata"] == {"name": "web", "namespace": "ns", "labels": {"app": "web"}}, \
        "metadata trimmed to what a create takes"

    [patch] = capture.event(DEPLOYMENT, "MODIFIED", deployment("web", 3, version="2"),
                            FAKE_EPOCH + 2)
    target = Target("west", DEPLOYMENTS, "ns", "web")
    assert patch == Change(2 * S, "patch", target,
                           {"spec": {"replicas": 3}, "status": {"replicas": 3}})
    assert capture.event(DEPLOYMENT, "MODIFIED", deployment("web", 3, version="3"),
                         FAKE_EPOCH + 3) == [], "a new resourceVersion alone is no change"
    [created] = capture.event(DEPLOYMENT, "ADDED", deployment("api", 1, uid="u2"), FAKE_EPOCH + 4)
    assert created.method == "create"
    assert created.template is not None
    assert created.template["spec"] == {"replicas": 1}
    [deleted] = capture.event(DEPLOYMENT, "DELETED", deployment("web", 3), FAKE_EPOCH + 5)
    assert deleted == Change(5 * S, "delete", target)


def test_a_relist_says_what_the_watch_missed_once() -> None:
    capture = Capture(start=FAKE_EPOCH, rules=Rules())
    capture.listed(DEPLOYMENT, [deployment("web", 1), deployment("old", 1, uid="u0")], FAKE_EPOCH)
    capture.event(DEPLOYMENT, "MODIFIED", deployment("web", 2, version="5"), FAKE_EPOCH + 1)
    relisted = capture.listed(DEPLOYMENT, [
        deployment("web", 2, version="9"),             # seen already: nothing
        deployment("api", 1, uid="u2"),                # made meanwhile: a create
        deployment("old", 1, uid="u3")], FAKE_EPOCH + 7)  # made again: a delete and a create
    assert relisted.initial == []
    assert [(c.method, c.target.name) for c in relisted.changes] == [
        ("create", "api"), ("delete", "old"), ("create", "old")]
    gone = capture.listed(DEPLOYMENT, [deployment("web", 2)], FAKE_EPOCH + 8)
    assert sorted((c.method, c.target.name) for c in gone.changes) == [
        ("delete", "api"), ("delete", "old")]


def test_times_are_one_clock_that_never_goes_back() -> None:
    capture = Capture(start=FAKE_EPOCH, rules=Rules())
    assert capture.at(FAKE_EPOCH + 1.5) == 1_500_000_000
    assert capture.at(FAKE_EPOCH + 1.0) == 1_500_000_000


def test_pod_lives_have_owner_ordinal_times_and_exit_code() -> None:
    capture = Capture(start=FAKE_EPOCH, rules=Rules())
    capture.listed(POD, [pod("b", created="2026-01-01T00:00:05Z")], FAKE_EPOCH)
    capture.event(POD, "ADDED", pod("a"), FAKE_EPOCH + 10)
    capture.event(POD, "MODIFIED", pod("a", exit_code=3), FAKE_EPOCH + 43)
    capture.event(POD, "DELETED", {**pod("a"), "status": {}}, FAKE_EPOCH + 44)
    capture.event(POD, "ADDED", pod("c", owner="other"), FAKE_EPOCH + 50)
    lives = {life.name: life for life in capture.lives()}
    assert lives["b"].ordinal == 0
    assert lives["a"].ordinal == 1
    assert lives["c"].ordinal == 0
    assert lives["a"] == PodLife(cluster="west", namespace="ns", name="a",
                                 owner=Owner("ReplicaSet", "web-1"), ordinal=1, created=10 * S,
                                 started=12 * S, finished=42 * S, exit_code=3, node="n1"), \
        "what the pod said before its deletion emptied its status is kept"
    assert lives["b"].exit_code is None
    assert lives["b"].started is None


def test_a_pod_that_exited_zero_after_an_init_container() -> None:
    found = pod("a", exit_code=0)
    found["status"]["initContainerStatuses"] = [{"name": "init", "state": {"terminated": {
        "exitCode": 0, "startedAt": "2026-01-01T00:00:11Z",
        "finishedAt": "2026-01-01T00:00:11Z"}}}]
    life = podlives.life("west", found, start=FAKE_EPOCH)
    assert (life.started, life.finished, life.exit_code) == (11 * S, 42 * S, 0)
    assert podlives.life("west", {**found, "metadata": {"name": "bare"}},
                         start=FAKE_EPOCH).owner is None


# -- sanitising --------------------------------------------------------------------------------

SECRET = {"metadata": {"name": "s", "annotations": {
    "kubectl.kubernetes.io/last-applied-configuration": "{...}", "team": "ml"}},
    "data": {"password": "aHVudGVyMg=="}, "type": "Opaque"}
TEMPLATED: dict[str, Any] = {"metadata": {"name": "web"}, "spec": {"template": {"spec": {
    "containers": [
    {"name": "main", "env": [{"name": "DB_PASSWORD", "value": "hunter2"},
                             {"name": "MODE", "value": "fast"},
                             {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {}}}]}]}}}}


def test_secrets_env_values_and_annotations_are_dropped_by_default() -> None:
    secret = recorded(SECRET, kind="Secret", api_version="v1", rules=Rules())
    assert secret["data"] == {"password": ""}, "the key stays, so a mount still works"
    assert secret["metadata"]["annotations"] == {"team": "ml"}
    kept = recorded(TEMPLATED, kind="Deployment", api_version="apps/v1", rules=Rules())
    env = kept["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "DB_PASSWORD"}, {"name": "MODE", "value": "fast"},
                   {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {}}}]
    assert TEMPLATED["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == \
        "hunter2", "the object given is not changed"


def test_hashing_keeps_a_stable_stand_in_and_rules_are_chosen() -> None:
    rules = Rules(mode="hash", env=(re.compile("^MODE$"),),
                  annotations=(re.compile("^team$"),))
    kept = recorded(TEMPLATED, kind="Deployment", api_version="apps/v1", rules=rules)
    env = kept["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["value"] == "hunter2"
    assert env[1]["value"].startswith("sha256:")
    secret = recorded(SECRET, kind="Secret", api_version="v1", rules=rules)
    assert secret["metadata"]["annotations"]["team"].startswith("sha256:")
    assert secret["data"]["password"] != "aHVudGVyMg=="
    assert recorded(SECRET, kind="Secret", api_version="v1",
                    rules=Rules(keep_secret_data=True))["data"] == SECRET["data"]
    assert "Secrets' data values hashed (sha256:)" in rules.notes()


# -- merge patches -----------------------------------------------------------------------------

def test_a_merge_patch_turns_one_state_into_the_other() -> None:
    before = {"spec": {"replicas": 1, "paused": True, "template": {"x": [1, 2]}}, "a": 1}
    after = {"spec": {"replicas": 2, "template": {"x": [1]}}, "a": 1, "b": {"c": None}}
    patch = patches.diff(before, after)
    assert patch == {"spec": {"replicas": 2, "paused": None, "template": {"x": [1]}},
                     "b": {"c": None}}
    assert patches.apply(before, patch) == {"spec": {"replicas": 2, "template": {"x": [1]}},
                                            "a": 1, "b": {}}
    assert patches.diff(after, after) is None


def test_a_merge_patch_merged_without_copies_gives_what_apply_gives_and_changes_neither(
        ) -> None:
    before = {"spec": {"replicas": 1, "paused": True, "template": {"x": [1, 2]}}, "a": 1}
    patch = {"spec": {"replicas": 2, "paused": None, "template": {"x": [1]}}, "b": {"c": None}}
    kept = json.dumps([before, patch], sort_keys=True)
    result = patches.merged(before, patch)
    assert result == patches.apply(before, patch)
    assert json.dumps([before, patch], sort_keys=True) == kept
    assert patches.merged(before, {"spec": {"replicas": 3}})["spec"]["template"] is \
        before["spec"]["template"], "what the patch leaves alone is shared"


# -- the file ----------------------------------------------------------------------------------

TRACE = Trace(
    clusters=("west", "east"), started_at="2026-01-01T00:00:00Z", duration=60 * S,
    initial=(("west", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}),),
    changes=(Change(S, "create", Target("east", DEPLOYMENTS, "ns", "web"), {"kind": "Deployment"}),
             Change(2 * S, "patch", Target("west", DEPLOYMENTS, "ns", "web"),
                    {"spec": {"replicas": 2}}),
             Change(3 * S, "delete", Target("west", DEPLOYMENTS, "ns", "web"))),
    pods=(PodLife("west", "ns", "web-a", Owner("ReplicaSet", "web-1"), 0, -S, 0, 30 * S, 1, "n"),
          PodLife("east", "ns", "bare", None, 0, 5 * S)),
    notes=("Secrets' data values dropped",))


def test_a_trace_reads_back_as_it_was_written(tmp_path: Path) -> None:
    path = tmp_path / "run.trace"
    files.write(path, TRACE)
    assert files.read(path) == TRACE
    assert path.stat().st_mode & 0o777 == 0o600
    assert files.read_summary(path).changes == 3
    assert files.encode(TRACE) == path.read_bytes(), "the same trace, the same bytes"


def test_a_later_format_a_truncated_and_a_corrupted_trace_say_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "run.trace"
    data = files.encode(TRACE)
    end = data.index(b"\n", len(files.MAGIC))
    header = json.loads(data[len(files.MAGIC):end])
    path.write_bytes(files.MAGIC + json.dumps({**header, "format": 2, "writtenBy": "9.9"}).encode()
                     + data[end:])
    with pytest.raises(TraceError, match=rf"trace {path} has format 2, written by fakefleet 9\.9"
                                         r".*replay it with that fakefleet or a later one"):
        files.read(path)
    path.write_bytes(data[:-7])
    with pytest.raises(TraceError, match=rf"trace {path} is truncated.*copy the whole file"):
        files.read(path)
    path.write_bytes(data[:-3] + bytes(b ^ 0xFF for b in data[-3:]))
    with pytest.raises(TraceError, match=rf"trace {path} is corrupted"):
        files.read(path)
    with pytest.raises(TraceError, match="is not a fakefleet trace"):
        files.read(Path(__file__))
    with pytest.raises(TraceError, match="no trace at"):
        files.read(tmp_path / "missing.trace")


# -- a whole recording -------------------------------------------------------------------------

def served(api: MemoryTransport) -> None:
    api.discover("v1", [{"name": "pods", "kind": "Pod", "namespaced": True},
                        {"name": "pods/status", "kind": "Pod", "namespaced": True},
                        {"name": "namespaces", "kind": "Namespace", "namespaced": False}])
    api.discover("apps/v1", [{"name": "deployments", "kind": "Deployment", "namespaced": True}])


async def test_resources_resolve_by_discovery_and_an_unknown_one_names_the_fix() -> None:
    api = MemoryTransport(FakeClock())
    served(api)
    source = watching.Source("west", Client(api))
    [deployments, pods] = await watching.resolve(source, ["deployments.apps", "pods"])
    assert deployments == Watched("west", DEPLOYMENTS, "Deployment", True)
    assert pods.kind == "Pod"
    with pytest.raises(TraceError, match="cluster west serves no resource jobs in batch/v1"):
        await watching.resolve(source, ["jobs.batch"])
    with pytest.raises(TraceError, match="'Pods!' is not a plural resource name"):
        await watching.resolve(source, ["Pods!"])


async def test_two_clusters_recorded_on_one_clock_through_a_410(tmp_path: Path) -> None:
    clock = FakeClock()
    west, east = MemoryTransport(clock), MemoryTransport(clock)
    for api in (west, east):
        served(api)
    west.put("/apis/apps/v1/namespaces/ns/deployments", deployment("web", 1))
    sources = [watching.Source("west", Client(west, clock=clock)),
               watching.Source("east", Client(east, clock=clock))]
    resources = {s.cluster: await watching.resolve(s, ["deployments.apps", "pods"])
                 for s in sources}
    path = tmp_path / "fleet.trace"
    listed: list[float] = []
    task = asyncio.create_task(watching.record(sources, resources, output=path, duration=30,
                                               rules=Rules(), clock=clock,
                                               on_listed=lambda: listed.append(clock.now())))
    await clock.advance(2)
    assert listed == [FAKE_EPOCH], "told once, when every resource of both is listed"
    client = Client(west, clock=clock)
    await client.patch("/apis/apps/v1/namespaces/ns/deployments/web", {"spec": {"replicas": 2}})
    east.put("/api/v1/namespaces/ns/pods", pod("job-a", owner="job"))
    await clock.advance(3)
    west.break_watches()
    await clock.settle()
    await client.patch("/apis/apps/v1/namespaces/ns/deployments/web", {"spec": {"replicas": 3}})
    west.compact()  # the watch's version is gone: relist, and the patch is seen once
    await clock.advance(6)
    await client.delete("/apis/apps/v1/namespaces/ns/deployments/web")
    await clock.advance(30)
    summary = await task
    trace = files.read(path)
    assert trace.clusters == ("west", "east")
    assert [(cluster, obj["metadata"]["name"]) for cluster, obj in trace.initial] == [
        ("west", "web")]
    assert [(c.target.cluster, c.method, c.template) for c in trace.changes] == [
        ("west", "patch", {"spec": {"replicas": 2}}),
        ("east", "create", trace.changes[1].template),
        ("west", "patch", {"spec": {"replicas": 3}}),
        ("west", "delete", None)]
    assert [c.at for c in trace.changes] == sorted(c.at for c in trace.changes)
    assert trace.changes[0].at == 2 * S
    assert trace.changes[-1].at == 11 * S
    [life] = trace.pods
    assert (life.cluster, life.owner, life.ordinal) == ("east", Owner("ReplicaSet", "job"), 0)
    assert summary.changes == 4
    assert trace.duration >= 30 * S
    assert not list(tmp_path.glob(".*")), "no temporary file left beside the trace"


def test_a_trace_that_cannot_be_written_says_where_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=rf"cannot write trace {tmp_path}/none/x\.trace: .*"
                                         r"give -o a path in a writable directory"):
        files.write(tmp_path / "none" / "x.trace", TRACE)
    assert list(tmp_path.iterdir()) == []
