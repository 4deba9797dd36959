"""``fakefleet diff``: event sequences of recorded objects (operators/recording/sequencing.py),
objects matched across runs (matching.py), two runs compared (comparing.py), and the command
(operators/cli/diffs.py), on small traces built by hand as ``fakefleet record`` writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.cli import main
from operators.recording import comparing, files, matching, sequencing
from operators.recording.matching import Key
from operators.recording.trace import Change, Resource, Target, Trace

S = 1_000_000_000
NS = "rp"
DEPLOYMENTS = Resource("apps", "v1", "deployments")
REPLICASETS = Resource("apps", "v1", "replicasets")
JOBS = Resource("batch", "v1", "jobs")
PODS = Resource("", "v1", "pods")
PLANS = Resource("fakefleet.dev", "v1alpha1", "faultplans")


def owned(kind: str, name: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "apps/v1" if kind != "Job" else "batch/v1", "kind": kind,
             "name": name, "uid": f"uid-{name}", "controller": True}]


class Run:
    """A run's trace, written change by change; what is due from 3 s on comes ``late``."""

    def __init__(self, cluster: str = "west", *, late: float = 0.0) -> None:
        self.cluster = cluster
        self.late = late
        self.changes: list[Change] = []

    def _at(self, at: float) -> int:
        return round((at + (self.late if at >= 3 else 0)) * S)

    def _target(self, resource: Resource, name: str, namespace: str = NS) -> Target:
        return Target(self.cluster, resource, namespace, name)

    def create(self, at: float, resource: Resource, obj: dict[str, Any]) -> None:
        metadata = obj["metadata"]
        self.changes.append(Change(self._at(at), "create", self._target(
            resource, metadata["name"], metadata.get("namespace", "")), obj))

    def patch(self, at: float, resource: Resource, name: str, patch: dict[str, Any]) -> None:
        self.changes.append(Change(self._at(at), "patch",
                                   self._target(resource, name), patch))

    def delete(self, at: float, resource: Resource, name: str) -> None:
        self.changes.append(Change(self._at(at), "delete",
                                   self._target(resource, name)))

    def trace(self) -> Trace:
        changes = tuple(sorted(self.changes, key=lambda c: c.at))
        return Trace((self.cluster,), "2026-12-03T12:00:00Z", changes[-1].at + S,
                     changes=changes)

    # -- what a scenario's objects do --------------------------------------------------------

    def pod(self, at: float, name: str, owner: list[dict[str, Any]], *, node: str,
            exit_code: int | None = None, restarted: int | None = None) -> None:
        """A pod made by a controller, scheduled, running and ready; ``exit_code``: its
        container then ends; ``restarted``: it ended with that code and was restarted."""
        self.create(at, PODS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": name, "namespace": NS, "generateName": name[:-5],
                "ownerReferences": owner}, "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": "Pending"}})
        self.patch(at + 0.1, PODS, name, {"spec": {"nodeName": node}, "status": {
            "conditions": [{"type": "PodScheduled", "status": "True"}]}})
        self.patch(at + 1, PODS, name, {"status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "main", "restartCount": 0,
                                   "state": {"running": {}}}]}})
        self.patch(at + 1.5, PODS, name, {"status": {
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Ready", "status": "True"}]}})
        if restarted is not None:
            self.patch(at + 3, PODS, name, {"status": {"containerStatuses": [{
                "name": "main", "restartCount": 1, "state": {"running": {}},
                "lastState": {"terminated": {"exitCode": restarted, "reason": "Error"}}}]}})
        if exit_code is not None:
            self.patch(at + 5, PODS, name, {"status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": [{"type": "PodScheduled", "status": "True"},
                               {"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "main", "restartCount": 0, "state": {
                    "terminated": {"exitCode": exit_code,
                                   "reason": "Completed" if exit_code == 0 else "Error"}}}]}})


def scenario(*, cluster: str = "west", template_hash: str = "6b7f9c",
             suffixes: tuple[str, ...] = ("x2k4q", "b9z7d", "hh3ks"),
             nodes: tuple[str, ...] = ("pool-0", "pool-1"), exit_code: int = 2,
             verdict: str = "Passed", late: float = 0.0) -> Trace:
    """A Deployment of two replicas, a Job whose pod fails and is replaced, and a FaultPlan;
    the names the controllers generate are given."""
    run = Run(cluster, late=late)
    run.create(0, DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": "web", "namespace": NS},
                                "spec": {"replicas": 2}})
    replica_set = f"web-{template_hash}"
    run.create(0.2, REPLICASETS, {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
        "name": replica_set, "namespace": NS, "ownerReferences": owned("Deployment", "web")},
        "spec": {"replicas": 2}})
    for index, node in enumerate(nodes):
        run.pod(0.3 + index * 0.01, f"{replica_set}-{suffixes[index]}",
                owned("ReplicaSet", replica_set), node=node)
    run.patch(2, DEPLOYMENTS, "web", {"status": {"conditions": [
        {"type": "Available", "status": "True"}], "readyReplicas": 2}})
    run.create(3, JOBS, {"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": "batch", "namespace": NS}, "spec": {}})
    run.pod(3.1, f"batch-{suffixes[2]}", owned("Job", "batch"), node=nodes[0],
            exit_code=exit_code)
    run.pod(9, f"batch-{suffixes[2][::-1]}", owned("Job", "batch"), node=nodes[-1],
            exit_code=0)
    run.patch(15, JOBS, "batch", {"status": {"failed": 1, "succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True"}]}})
    run.create(1, PLANS, {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
                          "metadata": {"name": "xid", "namespace": NS}, "spec": {}})
    run.patch(4, PLANS, "xid", {"status": {"phase": "Running", "injections": [
        {"step": "xid", "occurrence": 0, "state": "Injected"}]}})
    run.patch(16, PLANS, "xid", {"status": {"phase": "Succeeded", "verdict": verdict,
                                            "injections": [{"step": "xid", "occurrence": 0,
                                                            "state": "Recovered"}]}})
    return run.trace()


# -- event sequences -------------------------------------------------------------------------

def test_a_pods_sequence_is_its_semantic_changes_matched_by_owner_and_order() -> None:
    run = matching.histories(scenario())
    key = Key("west", "Pod", NS, "Job/batch/Pod#0")
    history = run.objects[key]
    assert history.names == ["batch-hh3ks"]
    assert history.sequence() == (
        "created", "phase: Pending", "node: pool-0", "phase: Running", "condition Ready: True",
        "phase: Failed", "condition Ready: False", "container main exit 0: 2 (Error)")
    assert [event.at for event in history.events][:3] == [int(3.1 * S)] * 2 + [int(3.2 * S)]
    replica_set = Key("west", "ReplicaSet", NS, "Deployment/web/ReplicaSet#0")
    assert run.objects[replica_set].names == ["web-6b7f9c"]
    assert Key("west", "Pod", NS, "Deployment/web/ReplicaSet#0/Pod#1") in run.objects
    assert Key("west", "Deployment", NS, "web") in run.objects


def test_a_condition_first_written_false_is_no_event_but_falling_from_true_is() -> None:
    assert sequencing.changes({}, {"condition Ready": "False"}) == []
    assert sequencing.changes({"condition Ready": "False"}, {"condition Ready": "True"}) == \
        ["condition Ready: True"]
    assert sequencing.changes({"condition Ready": "True"}, {"condition Ready": "Unknown"}) == \
        ["condition Ready: Unknown"]
    assert sequencing.changes({"condition Ready": "True"}, {}) == ["condition Ready: unset"]


def test_a_restart_seen_at_once_makes_the_events_of_one_seen_in_two_steps() -> None:
    running = {"kind": "Pod", "status": {"containerStatuses": [
        {"name": "main", "restartCount": 0, "state": {"running": {}}}]}}
    ended = {"kind": "Pod", "status": {"containerStatuses": [
        {"name": "main", "restartCount": 0,
         "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    again = {"kind": "Pod", "status": {"containerStatuses": [
        {"name": "main", "restartCount": 1, "state": {"running": {}},
         "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    forgot = {"kind": "Pod", "status": {"containerStatuses": [
        {"name": "main", "restartCount": 1, "state": {"running": {}}}]}}

    def events(*states: dict[str, Any]) -> list[str]:
        said: list[str] = []
        facts: dict[str, str] = {}
        for state in states:
            facts, now = sequencing.step(facts, state)
            said += now
        return said

    assert events(running, ended, again) == events(running, again) == [
        "container main exit 0: 137 (OOMKilled)", "container main restarts: 1"]
    assert events(running, again, forgot) == events(running, again), \
        "an exit happened, whatever the status says later"


def test_conditions_come_in_the_order_they_were_added_however_many_writes_brought_them(
        ) -> None:
    met = {"type": "SuccessCriteriaMet", "status": "True"}
    complete = {"type": "Complete", "status": "True"}
    at_once = sequencing.changes({}, sequencing.facts(
        {"kind": "Job", "status": {"conditions": [met, complete]}}))
    first = sequencing.facts({"kind": "Job", "status": {"conditions": [met]}})
    in_two = sequencing.changes({}, first) + sequencing.changes(first, sequencing.facts(
        {"kind": "Job", "status": {"conditions": [met, complete]}}))
    assert at_once == in_two == ["condition SuccessCriteriaMet: True",
                                 "condition Complete: True"]


def test_a_daemonsets_pods_are_matched_by_the_node_they_are_made_for() -> None:
    def run(order: tuple[str, ...], suffixes: str) -> Trace:
        made = Run()
        for index, node in enumerate(order):
            made.create(index, PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"agent-{suffixes[index]}", "namespace": NS,
                "ownerReferences": owned("DaemonSet", "agent")}, "spec": {"affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchFields": [{
                            "key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}})
            made.patch(index + 0.5, PODS, f"agent-{suffixes[index]}",
                       {"spec": {"nodeName": node}})
        return made.trace()

    found = comparing.compare(run(("n1", "n2"), "ab"), run(("n2", "n1"), "cd"))
    assert found.identical(), "made in another order, each pod is still its node's"
    assert {key.name for key in matching.histories(run(("n1",), "a")).objects} == \
        {"DaemonSet/agent/Pod@n1#0"}


def test_identifiers_timestamps_and_spec_are_not_events() -> None:
    before = {"kind": "Pod", "metadata": {"uid": "a", "resourceVersion": "1"},
              "spec": {"containers": [{"image": "a"}]}, "status": {"phase": "Running"}}
    after = {"kind": "Pod", "metadata": {"uid": "b", "resourceVersion": "9",
                                         "annotations": {"fakefleet.dev/lives": "lives-1"}},
             "spec": {"containers": [{"image": "b"}]}, "status": {
                 "phase": "Running", "startTime": "2026-12-03T12:00:09Z"}}
    assert sequencing.changes(sequencing.facts(before), sequencing.facts(after)) == []


def test_events_leases_and_lives_sets_are_left_out() -> None:
    run = Run()
    run.create(0, Resource("", "v1", "events"), {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1879f", "namespace": NS}})
    run.create(0, Resource("", "v1", "configmaps"), {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "lives-5f0c2a", "namespace": "fakefleet-system",
            "labels": {"fakefleet.dev/lives": ""}}})
    run.patch(1, Resource("", "v1", "configmaps"), "lives-5f0c2a", {"data": {"taken": "{}"}})
    assert matching.histories(run.trace()).objects == {}


def test_objects_at_the_start_are_matched_after_their_controllers() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web-6b7f9c-x2k4q", "namespace": NS,
        "ownerReferences": owned("ReplicaSet", "web-6b7f9c")}, "spec": {"nodeName": "n"}}
    replica_set = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
        "name": "web-6b7f9c", "namespace": NS, "ownerReferences": owned("Deployment", "web")}}
    trace = Trace(("west",), "2026-12-03T12:00:00Z", S,
                  initial=(("west", pod), ("west", replica_set)))
    keys = set(matching.histories(trace).objects)
    assert Key("west", "Pod", NS, "Deployment/web/ReplicaSet#0/Pod#0") in keys


LEAF = st.none() | st.booleans() | st.integers() | st.text(max_size=3) | st.just([])


def shaped(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with ``fields``, each as the API writes it or anything else in its place."""
    return st.fixed_dictionaries({key: value | LEAF for key, value in fields.items()})


ENDED = shaped(terminated=shaped(exitCode=LEAF, reason=LEAF))
CONTAINERS = st.lists(shaped(name=LEAF, restartCount=LEAF, state=ENDED, lastState=ENDED),
                      max_size=2)
CONDITIONS = st.lists(shaped(type=st.sampled_from(["Ready", "Complete"]), status=LEAF),
                      max_size=2)
STATUS = shaped(phase=LEAF, conditions=CONDITIONS, containerStatuses=CONTAINERS,
                initContainerStatuses=CONTAINERS, verdict=LEAF, injections=st.lists(
                    shaped(step=LEAF, occurrence=LEAF, state=LEAF), max_size=2))
SPEC = shaped(nodeName=LEAF, replicas=LEAF, suspend=LEAF, unschedulable=LEAF,
              taints=st.lists(shaped(key=LEAF, value=LEAF, effect=LEAF), max_size=2),
              affinity=shaped(nodeAffinity=shaped(
                  requiredDuringSchedulingIgnoredDuringExecution=shaped(
                      nodeSelectorTerms=st.lists(shaped(matchFields=st.lists(
                          shaped(key=st.just("metadata.name"), values=LEAF | st.lists(LEAF)),
                          max_size=1)), max_size=1)))))
CONTENT = shaped(spec=SPEC, status=STATUS)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["Pod", "Node", "Job", "FaultPlan", "Widget"]),
       owners=st.lists(shaped(kind=st.sampled_from(["Job", "DaemonSet", "StatefulSet"]),
                              name=LEAF, controller=st.booleans()), max_size=2) | LEAF,
       created=CONTENT, patches=st.lists(CONTENT, max_size=3))
def test_any_recorded_content_makes_sequences_and_a_run_is_identical_to_itself(
        kind: str, owners: Any, created: dict[str, Any],
        patches: list[dict[str, Any]]) -> None:
    run = Run()
    resource = Resource("", "v1", kind.lower() + "s")
    run.create(0, resource, {**created, "apiVersion": "v1", "kind": kind, "metadata": {
        "name": "w", "namespace": NS, "ownerReferences": owners}})
    for index, patch in enumerate(patches):
        run.patch(index + 1, resource, "w", patch)
    trace = run.trace()
    assert matching.histories(trace).objects
    found = comparing.compare(trace, trace)
    assert found.identical()
    assert found.sequences.ratio == 1.0


# -- two runs compared -----------------------------------------------------------------------

def test_runs_that_differ_only_in_generated_names_and_timing_are_identical() -> None:
    a = scenario()
    b = scenario(template_hash="59d4c8", suffixes=("q7w2e", "mm3rt", "zz8pl"), late=0.25)
    found = comparing.compare(a, b)
    assert found.identical()
    assert found.sequences == comparing.Share(8, 8)
    assert found.placements == comparing.Share(4, 4)
    assert found.outcomes == comparing.Share(4, 4)
    assert [(v.a, v.b) for v in found.verdict_pairs] == [("Passed", "Passed")]
    assert found.times.count == 8
    assert found.times.max == round(0.25 * S)
    assert found.times.worst is not None
    late = found.times.worst
    assert late.kind in ("Job", "FaultPlan") or late.name.startswith("Job/batch/"), \
        "one of those whose final state came late"
    assert not found.identical(tolerance=0.1), "a tolerance tighter than the lag fails it"
    assert found.identical(tolerance=0.5)


def test_a_changed_exit_code_is_the_first_divergence() -> None:
    found = comparing.compare(scenario(exit_code=2), scenario(exit_code=3,
                                                              suffixes=("a", "b", "c1234")))
    assert not found.identical()
    first = found.first
    assert first is not None
    assert first.key == Key("west", "Pod", NS, "Job/batch/Pod#0")
    assert (first.index, first.a, first.b) == (
        7, "container main exit 0: 2 (Error)", "container main exit 0: 3 (Error)")
    assert first.at == round(8.1 * S)
    assert first.names_a == ("batch-hh3ks",)
    assert first.names_b == ("batch-c1234",)
    assert found.sequences == comparing.Share(7, 8)
    assert [(d.a, d.b) for d in found.outcome_differences] == [
        ("Failed, exit 2, 0 restarts", "Failed, exit 3, 0 restarts")]
    assert found.placements.ratio == 1.0


def test_the_earliest_divergence_is_first_and_placements_and_verdicts_are_counted() -> None:
    found = comparing.compare(scenario(verdict="Passed"),
                              scenario(nodes=("pool-1", "pool-0"), verdict="Failed"))
    assert found.first is not None
    assert found.first.key.name == "Deployment/web/ReplicaSet#0/Pod#0"
    assert (found.first.a, found.first.b) == ("node: pool-0", "node: pool-1")
    assert found.placements == comparing.Share(0, 4)
    assert found.verdicts == comparing.Share(0, 1)
    assert found.divergences[-1].key.kind == "FaultPlan"
    assert found.divergences[-1].b == "verdict: Failed"


def test_an_object_in_one_run_only_diverges_at_its_first_event() -> None:
    a = Run()
    b = Run()
    for run in (a, b):
        run.create(0, DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "metadata": {"name": "web", "namespace": NS}})
    b.create(2, DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"name": "extra", "namespace": NS}})
    found = comparing.compare(a.trace(), b.trace())
    assert found.first is not None
    assert (found.first.key.name, found.first.index, found.first.a, found.first.b) == (
        "extra", 0, None, "created")
    assert found.sequences == comparing.Share(1, 2)


def test_single_cluster_runs_are_paired_whatever_their_names_but_fleets_by_name() -> None:
    assert comparing.compare(scenario(cluster="west"), scenario(cluster="west-2")).identical()
    fleet_a = Trace(("west", "east"), "2026-12-03T12:00:00Z", 0)
    fleet_b = Trace(("west", "north"), "2026-12-03T12:00:00Z", 0)
    with pytest.raises(comparing.CompareError, match=r"record the same clusters"):
        comparing.compare(fleet_a, fleet_b)


# -- the command -----------------------------------------------------------------------------

def written(path: Path, trace: Trace) -> str:
    files.write(path, trace)
    return str(path)


def test_diff_exits_0_for_identical_runs_and_prints_the_summary(tmp_path: Path) -> None:
    a = written(tmp_path / "a.trace", scenario())
    b = written(tmp_path / "b.trace", scenario(suffixes=("q7w2e", "mm3rt", "zz8pl")))
    done = CliRunner().invoke(main, ["diff", a, b])
    assert done.exit_code == 0, done.output
    assert "event sequences" in done.output
    assert "the runs are identical" in done.output


def test_diff_exits_1_naming_the_first_divergence(tmp_path: Path) -> None:
    a = written(tmp_path / "a.trace", scenario())
    b = written(tmp_path / "b.trace", scenario(exit_code=3))
    done = CliRunner().invoke(main, ["diff", a, b])
    assert done.exit_code == 1, done.output
    assert "first divergence: west Pod rp/Job/batch/Pod#0 (batch-hh3ks in A, batch-hh3ks in " \
        "B), event 7 at +8.100s" in done.output
    assert "A: container main exit 0: 2 (Error)" in done.output
    assert "the runs differ" in done.output


def test_diff_json_says_the_same_for_machines(tmp_path: Path) -> None:
    a = written(tmp_path / "a.trace", scenario())
    b = written(tmp_path / "b.trace", scenario(exit_code=3, late=1.0))
    done = CliRunner().invoke(main, ["diff", a, b, "--json"])
    assert done.exit_code == 1
    report = json.loads(done.output)
    assert report["identical"] is False
    assert report["sequences"] == {"same": 7, "total": 8, "share": 0.875}
    assert report["firstDivergence"]["matchedAs"] == "Job/batch/Pod#0"
    assert report["firstDivergence"]["b"] == "container main exit 0: 3 (Error)"
    assert report["firstDivergence"]["secondsB"] == pytest.approx(9.1)
    assert report["outcomes"]["differ"][0]["a"] == "Failed, exit 2, 0 restarts"
    assert report["times"]["differenceMaxSeconds"] == pytest.approx(1.0)
    assert report["verdicts"]["plans"] == [
        {"object": "west FaultPlan rp/xid", "a": "Passed", "b": "Passed"}]


def test_diff_of_a_missing_or_truncated_file_exits_2_naming_it_and_the_fix(
        tmp_path: Path) -> None:
    a = written(tmp_path / "a.trace", scenario())
    done = CliRunner().invoke(main, ["diff", a, str(tmp_path / "nothing.trace")])
    assert done.exit_code == 2
    assert f"RUN-B: no trace at {tmp_path / 'nothing.trace'}: give the file that " \
        "'fakefleet record -o'" in done.output

    (tmp_path / "cut.trace").write_bytes((tmp_path / "a.trace").read_bytes()[:-9])
    done = CliRunner().invoke(main, ["diff", str(tmp_path / "cut.trace"), a])
    assert done.exit_code == 2
    assert "RUN-A:" in done.output
    assert "cut.trace is truncated" in done.output


def test_diff_of_an_empty_file_exits_2(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("")
    a = written(tmp_path / "a.trace", scenario())
    done = CliRunner().invoke(main, ["diff", a, str(tmp_path / "empty.yaml")])
    assert done.exit_code == 2
    assert "empty.yaml holds no recorded object: give the file that 'fakefleet record -o' " \
        "wrote" in done.output


def test_diff_of_runs_of_different_clusters_exits_2(tmp_path: Path) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    a = written(tmp_path / "a.trace", Trace(("west", "east"), "2026-12-03T12:00:00Z", 0,
                                            initial=(("west", namespace),)))
    b = written(tmp_path / "b.trace", Trace(("west", "north"), "2026-12-03T12:00:00Z", 0,
                                            initial=(("west", namespace),)))
    done = CliRunner().invoke(main, ["diff", a, b])
    assert done.exit_code == 2
    assert "recorded different clusters (west, east against west, north)" in done.output


def test_diff_reads_kwoks_recordings_too(tmp_path: Path) -> None:
    recording = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: rp}\n"
        "spec: {nodeName: n1}\nstatus: {phase: Running}\n---\n"
        "apiVersion: action.kwok.x-k8s.io/v1alpha1\nkind: ResourcePatch\n"
        "resource: {group: '', version: v1, resource: pods}\n"
        "target: {name: p, namespace: rp}\ndurationNanosecond: 2000000000\nmethod: patch\n"
        "template: {status: {phase: %s}}\n")
    (tmp_path / "a.yaml").write_text(recording % "Succeeded")
    (tmp_path / "b.yaml").write_text(recording % "Failed")
    done = CliRunner().invoke(main, ["diff", str(tmp_path / "a.yaml"),
                                     str(tmp_path / "a.yaml")])
    assert done.exit_code == 0, done.output
    done = CliRunner().invoke(main, ["diff", str(tmp_path / "a.yaml"),
                                     str(tmp_path / "b.yaml"), "--json"])
    assert done.exit_code == 1, done.output
    assert json.loads(done.output)["firstDivergence"]["a"] == "phase: Succeeded"
