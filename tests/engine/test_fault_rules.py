"""Fault entries as rules, pure: which stages an object gets from the entries its fault sets
carry, what an eviction looks like and reads back as, and the node patches a fault stage
makes."""

from __future__ import annotations

from typing import Any

import pytest

from operators.api.injections import FaultEntry
from operators.api.stages import NodeStage, StageError, load_lifecycle
from operators.engine import stages
from operators.engine.nodes import NodeFacts, NodeLife
from operators.engine.pods import PodFacts, PodLife, life_from_status, render_status
from operators.engine.stages import Carried, Faults, Rulebook
from tests.engine.harness import entry

NOW = "2026-01-01T00:10:00Z"


def faults(*entries: dict[str, Any] | FaultEntry, uid: str = "set") -> Faults:
    """The entries as fault sets carry them for one object (each its own set, in order)."""
    made = [e if isinstance(e, FaultEntry) else FaultEntry.model_validate(e) for e in entries]
    return tuple(Carried((f"{uid}-{e.id}", 0, e.state), e) for e in made)


def manifest(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u",
                         "annotations": annotations},
            "spec": {"nodeName": "cpu-0", "restartPolicy": "Always",
                     "containers": [{"name": "main", "image": "app:1"}],
                     "initContainers": [{"name": "setup", "image": "busybox"}]},
            "status": {}}


def pod_stage(name: str, **effect: Any) -> dict[str, Any]:
    return {"name": name, "resource": "Pod", "effect": effect}


def node_stage(name: str, **effect: Any) -> dict[str, Any]:
    return {"name": name, "resource": "Node", "effect": effect}


def test_an_object_s_rules_are_its_live_fault_stages_then_the_defaults() -> None:
    book = Rulebook(stages.default_rules())
    text = faults(
        entry("a", [pod_stage("a-inject", hold=True)], [pod_stage("a-recover", endFault=True)]),
        entry("b", [pod_stage("b-inject", hold=True), node_stage("b-node", hold=True)],
              [pod_stage("b-recover", endFault=True)], state="recover"),
        entry("c", [pod_stage("c-inject", hold=True)], state="done"))
    rules = book(text)
    defaults = [rule.name for rule in stages.default_rules().pods]
    # Recoveries first, then the faults' stages (holds last): one fault's hold must not keep
    # another from recovering.
    assert [(rule.name, rule.entry) for rule in rules.pods[:2]] == [
        ("b-recover", "b"), ("a-inject", "a")]
    assert [rule.name for rule in rules.pods[2:]] == defaults
    assert [rule.name for rule in rules.nodes][:1] == [stages.default_rules().nodes[0].name]
    assert (rules.pods[0].state, rules.pods[1].state) == ("recover", "inject")
    assert book(text) is rules, "compiled once per combination of entries"
    assert book(()) is stages.default_rules()


def test_targets_of_one_set_share_their_rules_and_a_new_state_compiles_anew() -> None:
    book = Rulebook(stages.default_rules())
    one = faults(entry("a", [pod_stage("a-inject", hold=True)]))
    # The same set's entry as another target carries it: a copy, with the same key.
    again = faults(FaultEntry.model_validate(entry("a", [pod_stage("a-inject", hold=True)])))
    assert book(again) is book(one)
    turned = faults(entry("a", [pod_stage("a-inject", hold=True)],
                          [pod_stage("a-recover", endFault=True)], state="recover"))
    assert book(turned).pods[0].name == "a-recover"


def test_the_rulebook_keeps_a_bounded_number_of_combinations() -> None:
    book = Rulebook(stages.default_rules(), size=2)
    texts = [faults(entry(str(n), [pod_stage("s", hold=True)])) for n in range(3)]
    first = book(texts[0])
    book(texts[1])
    book(texts[2])
    again = book(texts[0])
    assert again is not first, "compiled again once forgotten"
    assert [(r.name, r.entry) for r in again.pods] == [(r.name, r.entry) for r in first.pods]


def test_a_hold_is_the_first_match_and_waiting_reads_the_life() -> None:
    rules = Rulebook(stages.default_rules())(faults(entry("a", [
        {"name": "stuck", "resource": "Pod", "effect": {"hold": True}, "selector": {
            "matchExpressions": [{"key": "waiting", "operator": "In",
                                  "values": ["ImagePullBackOff"]}]}}])))
    facts = PodFacts(manifest())
    waiting = PodLife(waiting=("ImagePullBackOff", "pulling"), init_finished=("t",))
    found = stages.match_pod(rules.pods, facts, waiting)
    assert found is not None
    assert found.is_hold
    started = stages.match_pod(rules.pods, facts, PodLife(init_finished=("t",)))
    assert started is not None
    assert started.name == "pod-ready"


def test_end_fault_belongs_to_fault_entries_not_to_a_lifecycle() -> None:
    with pytest.raises(StageError, match="only a fault entry's stages may set"):
        load_lifecycle("apiVersion: fakefleet.dev/v1alpha1\nkind: Lifecycle\nstages:\n"
                       "- {name: a, resource: Pod, effect: {exit: {}, endFault: true}}")


# -- eviction ---------------------------------------------------------------------------------

def test_an_eviction_renders_as_the_kubelet_reports_it_and_reads_back_the_same() -> None:
    facts = PodFacts(manifest())
    facts.host_ip = "172.16.0.1"
    running = PodLife(phase="Running", changed_at="2026-01-01T00:01:00Z", ip="10.128.0.2",
                      start_time="2026-01-01T00:00:00Z", started_at="2026-01-01T00:01:00Z",
                      ready_since="2026-01-01T00:01:00Z",
                      init_finished=("2026-01-01T00:00:30Z",))
    evict = stages.Rulebook(stages.default_rules())(faults(entry("e", [
        pod_stage("evict", evict={"message": "The node was low on resource: memory."},
                  endFault=True)]))).pods[0]
    life = stages.apply_pod(evict.stage.effect, facts, running, NOW,
                            allocate=lambda _: "unused")
    status = render_status(facts, life, NOW)
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed", "Evicted", "The node was low on resource: memory.")
    main = status["containerStatuses"][0]
    assert main["state"]["terminated"]["exitCode"] == 137
    assert main["state"]["terminated"]["reason"] == "ContainerStatusUnknown"
    assert "containerID" not in main
    assert status["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["DisruptionTarget"]["reason"] == "TerminationByKubelet"
    assert conditions["Ready"]["status"] == "False"
    again = life_from_status(facts, status)
    assert (again.phase, again.reason, again.message, again.exit, again.conditions,
            again.changed_at) == (life.phase, life.reason, life.message, life.exit,
                                  life.conditions, NOW)
    assert render_status(facts, again, "2026-01-01T01:00:00Z") == status, "a restart keeps it"


def test_an_evicted_pending_pod_reports_its_init_containers_unlocated_too() -> None:
    facts = PodFacts(manifest())
    evicted = stages.apply_pod(
        stages.Rulebook(stages.default_rules())(faults(entry("e", [
            pod_stage("evict", evict={}, endFault=True)]))).pods[0].stage.effect,
        facts, PodLife(changed_at="2026-01-01T00:00:00Z"), NOW, allocate=lambda _: "")
    status = render_status(facts, evicted, NOW)
    assert status["initContainerStatuses"][0]["state"]["terminated"]["reason"] == \
        "ContainerStatusUnknown"
    again = life_from_status(facts, status)
    assert (again.init_done, again.exit, again.reason) == (0, evicted.exit, "Evicted")
    assert render_status(facts, again, "2026-01-01T01:00:00Z") == status


# -- node patches -----------------------------------------------------------------------------

def node_rule(entry_id: str = "e", **effect: Any) -> stages.NodeRule:
    return stages.NodeRule(NodeStage.model_validate(node_stage("s", **effect)),
                           lambda *_: True, 0.0, 0.0, entry_id)


def node_facts(**fields: Any) -> NodeFacts:
    return NodeFacts("gpu-0", "gpu", "", 0, resource_version="7", **fields)


def test_a_node_stage_adds_and_removes_its_taints_and_keeps_everyone_else_s() -> None:
    controller = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                  "timeAdded": "2026-01-01T00:00:00Z"}
    ours = {"key": "fakefleet.dev/gpu-xid", "value": "79", "effect": "NoExecute",
            "timeAdded": NOW}
    add = node_rule(taints=[{"key": "fakefleet.dev/gpu-xid", "value": "79",
                             "effect": "NoExecute"}])
    patch = stages.node_object(add, node_facts(taints=(controller,)), NOW)
    assert patch == {"metadata": {"resourceVersion": "7"}, "spec": {"taints": [
        controller, ours]}}
    assert stages.node_object(add, node_facts(taints=(controller, ours)), "later") is None, \
        "there already"
    changed = node_rule(taints=[{"key": "fakefleet.dev/gpu-xid", "value": "48",
                                 "effect": "NoExecute"}])
    patch = stages.node_object(changed, node_facts(taints=(ours, controller)), NOW)
    assert patch is not None
    assert [t.get("value") for t in patch["spec"]["taints"]] == [None, "48"]
    remove = node_rule(removeTaints=["fakefleet.dev/gpu-xid"])
    patch = stages.node_object(remove, node_facts(taints=(ours, controller)), NOW)
    assert patch is not None
    assert patch["spec"]["taints"] == [controller]


def test_a_node_stage_uncordons_in_one_conditional_patch_and_writes_no_end_of_fault() -> None:
    rule = node_rule(unschedulable=False, endFault=True)
    patch = stages.node_object(rule, node_facts(unschedulable=True), NOW)
    assert patch == {"metadata": {"resourceVersion": "7"}, "spec": {"unschedulable": None}}
    assert stages.node_object(node_rule(unschedulable=True),
                              node_facts(unschedulable=True), NOW) is None
    assert stages.node_object(node_rule(endFault=True), node_facts(), NOW) is None, \
        "an entry done is the fault set's, not the node's"
    assert not stages.writes_node(node_rule(endFault=True).stage.effect)


def test_allocatable_goes_back_to_the_capacity_observed() -> None:
    facts = node_facts(capacity={"nvidia.com/gpu": "8"}, allocatable={"nvidia.com/gpu": "7"})
    life = NodeLife()
    back = node_rule(allocatable={"nvidia.com/gpu": None}).stage.effect
    assert stages.node_status(back, facts, life, life) == {
        "allocatable": {"nvidia.com/gpu": "8"}}
    same = node_rule(allocatable={"nvidia.com/gpu": "7"}).stage.effect
    assert stages.node_status(same, facts, life, life) is None


def test_one_fault_s_hold_lets_another_fault_act() -> None:
    """A NotReady (its change, then a hold) on a node that also gets a Taint: the taint still
    comes, whichever entry was written first."""
    book = Rulebook(stages.default_rules())
    not_ready = entry("a", [node_stage("a-not-ready", heartbeat=True), node_stage("a-hold",
                                                                                  hold=True)])
    taint = entry("b", [node_stage("b-taint", taints=[{"key": "x", "effect": "NoSchedule"}])])
    names = [rule.name for rule in book(faults(not_ready, taint)).nodes[:3]]
    assert names == ["a-not-ready", "b-taint", "a-hold"]


def test_a_one_shot_exit_fires_only_at_the_restart_count_it_was_written_for() -> None:
    """An engine killed after writing the exit and before marking the entry done finds the
    entry still live: the pod restarted since, so the exit does not come again."""
    from operators.api.faultplans import Fault
    from operators.faults.catalogue import pod_entry

    book = Rulebook(stages.default_rules())
    written = pod_entry("ns/plan/exit/0", Fault(type="ContainerExit", exitCode=3), restarts=2)
    facts = PodFacts(manifest())
    rules = book(faults(written)).pods
    before = stages.match_pod(rules, facts, PodLife(phase="Running", restarts=2))
    after = stages.match_pod(rules, facts, PodLife(phase="Running", restarts=3))
    assert before is not None
    assert before.name == "fault-exit"
    assert after is None or after.name != "fault-exit"


def test_two_one_shot_exits_waiting_on_one_pod_make_two_restarts() -> None:
    """The second exit is written while the first has not fired yet (its engine was down, or
    the pod was in back-off): it is written for the count after the first's, so the pod exits
    twice, not once for both."""
    from operators.api.faultplans import Fault
    from operators.faults.catalogue import one_shot_restarts, pod_entry

    exit_fault = Fault(type="ContainerExit", exitCode=3)
    first = pod_entry("ns/plan/exit-2/0", exit_fault, restarts=one_shot_restarts([], 0))
    second = pod_entry("ns/plan/exit-4/0", exit_fault,
                       restarts=one_shot_restarts([first], 0))
    book = Rulebook(stages.default_rules())

    def firing(entries: list[FaultEntry], restarts: int) -> str | None:
        rule = stages.match_pod(book(faults(*entries)).pods, PodFacts(manifest()),
                                PodLife(phase="Running", restarts=restarts))
        return rule.entry if rule is not None and rule.name == "fault-exit" else None

    assert firing([first, second], 0) == first.id
    first_done = first.model_copy(update={"state": "done"})
    assert firing([first_done, second], 1) == second.id
    assert firing([first_done, second.model_copy(update={"state": "done"})], 2) is None
    # A leftover entry for a count the pod has passed (its engine died before marking it done)
    # does not push a new exit further out; one already done does not either.
    assert one_shot_restarts([first], 5) == 5
    assert one_shot_restarts([first_done], 0) == 0
    assert one_shot_restarts([first, second], 0) == 2
