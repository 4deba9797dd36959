"""KWOK's recording format: hand-written fixtures after KWOK v0.8.0's ResourcePatch type read
into a trace (strategic-merge patches turned into merge patches), written back, and the bad
input that each says what to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from operators.cli import main
from operators.recording import files, kwok, patches
from operators.recording.files import TraceError
from operators.recording.trace import Change, Owner, PodLife, Resource, Target, Trace

S = 1_000_000_000
PODS = Resource("", "v1", "pods")
WIDGETS = Resource("example.com", "v1", "widgets")

#: What ``kwokctl snapshot record`` writes: the objects, then ResourcePatch entries.
RECORDING = """\
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: default
  resourceVersion: ""
  uid: 0b9c
  finalizers: [example.com/keep]
spec:
  containers:
  - name: main
    image: nginx
  - name: sidecar
    image: envoy
status:
  phase: Pending
  conditions:
  - type: PodScheduled
    status: "True"
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource:
  version: v1
  resource: pods
target:
  name: web-0
  namespace: default
durationNanosecond: 1500000000
method: patch
template:
  $setElementOrder/conditions:
  - type: PodScheduled
  - type: Ready
  status:
    phase: Running
    conditions:
    - type: Ready
      status: "True"
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: web-0, namespace: default}
durationNanosecond: 2000000000
method: patch
template:
  metadata:
    $deleteFromPrimitiveList/finalizers: [example.com/keep]
  spec:
    containers:
    - name: sidecar
      $patch: delete
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {group: example.com, version: v1, resource: widgets}
target: {name: w}
durationNanosecond: 3000000000
method: create
template: {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
           "spec": {"size": 1, "parts": ["a", "b"]}}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {group: example.com, version: v1, resource: widgets}
target: {name: w}
durationNanosecond: 4000000000
method: patch
template: {"spec": {"parts": ["c"], "size": null}}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: web-0, namespace: default}
durationNanosecond: 5000000000
method: delete
"""


def test_a_kwok_recording_reads_into_a_trace_with_merge_patches() -> None:
    trace = kwok.read(RECORDING, source="rec.yaml", cluster="kind")
    [(cluster, pod)] = trace.initial
    assert cluster == "kind"
    assert "uid" not in pod["metadata"]
    assert "resourceVersion" not in pod["metadata"]
    target = Target("kind", PODS, "default", "web-0")
    running, trimmed, created, patched, deleted = trace.changes
    assert running == Change(3 * S // 2, "patch", target, {"status": {
        "phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                           {"type": "Ready", "status": "True"}]}}), \
        "the condition merged by type, written as the whole list a merge patch replaces"
    assert trimmed.template == {"metadata": {"finalizers": []},
                                "spec": {"containers": [{"name": "main", "image": "nginx"}]}}
    assert created.method == "create"
    assert created.target == Target("kind", WIDGETS, "", "w")
    assert patched.template == {"spec": {"parts": ["c"], "size": None}}
    assert deleted == Change(5 * S, "delete", target)
    assert trace.duration == 5 * S
    assert trace.clusters == ("kind",)


def test_a_patch_of_an_object_never_shown_keeps_what_it_can_and_says_so() -> None:
    text = RECORDING.split("---\n", 1)[1]
    trace = kwok.read(text, source="rec.yaml", cluster="kind")
    assert trace.changes[0].template == {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}}
    assert any("directives dropped" in note for note in trace.notes)


@pytest.mark.parametrize(("entry", "message"), [
    ({"method": "replace"}, "method 'replace' is none of create, patch, delete"),
    ({"durationNanosecond": -1}, "durationNanosecond -1 is not a whole number"),
    ({"durationNanosecond": "1s"}, "durationNanosecond '1s' is not a whole number"),
    ({"target": {}}, "resource.version, resource.resource and target.name are required"),
    ({"template": None}, "a patch needs a template object"),
])
def test_a_bad_entry_names_the_document_and_the_field(entry: dict[str, Any],
                                                      message: str) -> None:
    good = {"apiVersion": kwok.API_VERSION, "kind": kwok.KIND,
            "resource": {"version": "v1", "resource": "pods"}, "target": {"name": "a"},
            "durationNanosecond": 1, "method": "patch", "template": {}}
    with pytest.raises(TraceError, match=rf"rec\.yaml, document 1: {message}"):
        kwok.read(yaml.safe_dump({**good, **entry}), source="rec.yaml", cluster="c")


def test_text_that_is_no_recording_says_which_files_are() -> None:
    with pytest.raises(TraceError, match="neither a fakefleet trace nor KWOK's YAML"):
        kwok.read("a: [", source="x", cluster="c")
    with pytest.raises(TraceError, match=r"document 1 lacks apiVersion, kind or metadata\.name"):
        kwok.read("kind: Pod\n", source="x", cluster="c")


def test_a_trace_written_as_kwok_reads_back_the_same() -> None:
    trace = kwok.read(RECORDING, source="rec.yaml", cluster="kind")
    again = kwok.read(kwok.write(trace, cluster="kind"), source="again", cluster="kind")
    assert again.initial == trace.initial
    assert again.changes == trace.changes


def test_writing_kwok_replaces_merge_keyed_lists_whole_and_says_what_is_lost() -> None:
    target = Target("west", PODS, "ns", "p")
    trace = Trace(
        clusters=("west", "east"), started_at="2026-01-01T00:00:00Z", duration=9 * S,
        changes=(
            Change(S, "create", target, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "p", "namespace": "ns", "finalizers": ["a", "b"]}}),
            Change(2 * S, "patch", target, {"metadata": {"finalizers": ["a"]}, "status": {
                "conditions": [{"type": "Ready", "status": "False"}]}}),
            Change(3 * S, "create", Target("east", PODS, "ns", "q"), {"kind": "Pod"})),
        pods=(PodLife("west", "ns", "p", Owner("Job", "j"), 0, S),))
    [created, patch] = list(yaml.safe_load_all(kwok.write(trace, cluster="west")))
    assert created["durationNanosecond"] == S
    assert "group" not in created["resource"]
    assert patch["template"] == {
        "metadata": {"finalizers": ["a"], "$deleteFromPrimitiveList/finalizers": ["b"]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {"$patch": "replace"}]}}
    assert patches.apply_strategic(created["template"], patch["template"])["metadata"] == {
        "name": "p", "namespace": "ns", "finalizers": ["a"]}
    lost = kwok.losses(trace, "west")
    assert lost[0].startswith("1 pod lives")
    assert lost[1] == "clusters east (KWOK's format holds one)"
    with pytest.raises(TraceError, match=r"no cluster 'north'.*name one with --cluster"):
        kwok.write(trace, cluster="north")


def test_strategic_directives_on_maps_and_retained_keys() -> None:
    before = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}},
                       "selector": {"a": 1}}}
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"},
                      "selector": {"$patch": "replace", "b": 2}}}
    assert patches.apply_strategic(before, patch) == {"spec": {
        "strategy": {"type": "Recreate"}, "selector": {"b": 2}}}
    assert patches.has_directives(patch)
    assert not patches.has_directives({"spec": {"replicas": 2, "args": ["x"]}})


def test_convert_goes_both_ways_and_fails_with_a_message(tmp_path: Path) -> None:
    recording = tmp_path / "rec.yaml"
    recording.write_text(RECORDING)
    runner = CliRunner()
    done = runner.invoke(main, ["convert", str(recording), "--to", "trace", "--cluster",
                                "west", "-o", str(tmp_path / "rec.trace")])
    assert done.exit_code == 0, done.output
    trace = files.read(tmp_path / "rec.trace")
    assert trace.clusters == ("west",)
    assert len(trace.changes) == 5
    back = runner.invoke(main, ["convert", str(tmp_path / "rec.trace"), "--to", "kwok",
                                "-o", str(tmp_path / "back.yaml")])
    assert back.exit_code == 0, back.output
    assert kwok.read((tmp_path / "back.yaml").read_text(), source="b",
                     cluster="west").changes == trace.changes
    missing = runner.invoke(main, ["convert", str(tmp_path / "none"), "--to", "kwok",
                                   "-o", str(tmp_path / "x")])
    assert missing.exit_code == 1
    assert "no trace at" in missing.output
    unreachable = runner.invoke(main, ["record", "--kubeconfig", f"a={tmp_path / 'none'}",
                                       "--for", "1s", "-o", str(tmp_path / "t")])
    assert unreachable.exit_code == 1
    assert "cluster a: cannot read the kubeconfig" in unreachable.output
    unnamed = runner.invoke(main, ["record", "-o", str(tmp_path / "t")])
    assert unnamed.exit_code == 1
    assert "name the clusters to record: --kubeconfig" in unnamed.output
    kubeconfig = tmp_path / "a.yaml"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {"
                          "server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
                          "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, "
                          "context: {cluster: c, user: u}}]\ncurrent-context: x\n")
    twice = runner.invoke(main, ["record", "--kubeconfig", str(kubeconfig), "--kubeconfig",
                                 f"a={kubeconfig}", "-o", str(tmp_path / "t")])
    assert twice.exit_code == 1
    assert "two clusters are named a: name each" in twice.output
    down = runner.invoke(main, ["record", "--kubeconfig", str(kubeconfig), "--for", "1s",
                                "-o", str(tmp_path / "t")])
    assert down.exit_code == 1
    assert "cluster a did not answer its discovery" in down.output
    assert not (tmp_path / "t").exists()


JOB_POD = """\
apiVersion: v1
kind: Namespace
metadata: {name: default, creationTimestamp: "2026-01-01T00:00:00Z"}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: job-abc, namespace: default}
durationNanosecond: 10500000000
method: create
template:
  apiVersion: v1
  kind: Pod
  metadata:
    name: job-abc
    namespace: default
    uid: u1
    creationTimestamp: "2026-01-01T00:01:10Z"
    ownerReferences: [{apiVersion: batch/v1, kind: Job, name: job, uid: j, controller: true}]
  spec: {nodeName: kwok-node-0, containers: [{name: main, image: busybox}]}
  status: {phase: Pending}
---
apiVersion: action.kwok.x-k8s.io/v1alpha1
kind: ResourcePatch
resource: {version: v1, resource: pods}
target: {name: job-abc, namespace: default}
durationNanosecond: 40000000000
method: patch
template:
  status:
    phase: Failed
    containerStatuses:
    - name: main
      state: {terminated: {exitCode: 2, startedAt: "2026-01-01T00:01:12Z",
                           finishedAt: "2026-01-01T00:01:39Z"}}
"""


def test_a_kwok_recording_s_start_and_pod_lives_come_from_its_stamps() -> None:
    trace = kwok.read(JOB_POD, source="job.yaml", cluster="kind")
    assert trace.started_at == "2026-01-01T00:00:59Z", \
        "created at 00:01:10 and seen 10.5 s in: the start was no earlier than 00:00:59.5"
    [life] = trace.pods
    assert life == PodLife(cluster="kind", namespace="default", name="job-abc",
                           owner=Owner("Job", "job"), ordinal=0, created=21 * S // 2,
                           started=25 * S // 2, finished=79 * S // 2, exit_code=2,
                           node="kwok-node-0")
    assert "start estimated" in trace.notes[0]
    assert kwok.read("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", source="x",
                     cluster="c").pods == ()
