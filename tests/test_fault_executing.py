"""The running plan as data: schedule in status, what is due, phase and verdict, and the
stages each fault becomes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from operators.api.faultplans import (
    ExpectationStatus,
    Fault,
    FaultPlanSpec,
    InjectionStatus,
)
from operators.api.injections import (
    FaultEntry,
    HubLink,
    HubLinkFaults,
    hub_link_faults,
    read_entries,
    render_entries,
    write_latency,
)
from operators.faults import catalogue, executing
from operators.faults.cel import CelMatcher
from operators.faults.expectations import ExpectationError
from operators.faults.planning import PlanError
from operators.faults.targets import ClusterView, Fleet, NodeView, Victim
from operators.k8s.times import micro_time
from primitives import keys


def spec(*steps: dict[str, Any], seed: int = 1) -> FaultPlanSpec:
    return FaultPlanSpec.model_validate({"seed": seed, "steps": list(steps)})


NODES = {"nodes": {}, "mode": "one"}
FLEET = Fleet((ClusterView("west", nodes=tuple(NodeView(f"n-{i}", "p") for i in range(10))),))


def test_initial_injections_carry_the_planned_times_of_every_occurrence() -> None:
    plan = spec(
        {"name": "a", "target": NODES, "fault": {"type": "NotReady"}, "at": "10s",
         "duration": "20s", "repeat": {"every": "30s", "times": 2}},
        {"name": "b", "target": NODES, "fault": {"type": "Cordon"}, "after": ["a"],
         "delay": "5s"})
    injections = executing.initial_injections(executing.schedule(plan, FLEET))
    assert [(i.step, i.occurrence, i.injectAt, i.recoverAt) for i in injections] == [
        ("a", 0, 10.0, 30.0), ("a", 1, 40.0, 60.0), ("b", 0, 65.0, None)]
    assert all(i.state == "Scheduled" and not i.targets for i in injections)


def test_due_injects_at_its_time_and_waits_for_the_steps_it_comes_after() -> None:
    plan = spec(
        {"name": "a", "target": NODES, "fault": {"type": "NotReady"}, "at": "0s",
         "duration": "10s"},
        {"name": "b", "target": NODES, "fault": {"type": "Cordon"}, "after": ["a"]})
    injections = [InjectionStatus(step="a", injectAt=0, recoverAt=10),
                  InjectionStatus(step="b", injectAt=10)]
    assert executing.due(plan, injections, 0.0) == [executing.Due(0, "inject")]
    injections[0] = injections[0].model_copy(update={"state": "Injected"})
    assert executing.due(plan, injections, 5.0) == []
    # b's time came, but a is still recovering: b waits for a to have finished.
    injections[0] = injections[0].model_copy(update={"state": "Recovering"})
    assert executing.due(plan, injections, 11.0) == []
    injections[0] = injections[0].model_copy(update={"state": "Recovered"})
    assert executing.due(plan, injections, 11.0) == [executing.Due(1, "inject")]


def test_recovery_comes_before_an_injection_due_at_the_same_moment() -> None:
    plan = spec({"name": "a", "target": NODES, "fault": {"type": "NotReady"}, "at": "0s",
                 "duration": "10s", "repeat": {"every": "10s", "times": 2}})
    injections = [InjectionStatus(step="a", state="Injected", injectAt=0, recoverAt=10),
                  InjectionStatus(step="a", occurrence=1, injectAt=10, recoverAt=20)]
    assert [d.action for d in executing.due(plan, injections, 10.0)] == ["recover", "inject"]


def test_a_fault_without_duration_has_finished_once_injected() -> None:
    injections = [InjectionStatus(step="a", state="Injected", injectAt=0)]
    assert executing.step_finished(injections, "a")
    assert executing.next_time(injections, 5.0) is None


def test_summary_passes_only_when_every_expectation_of_every_occurrence_passed() -> None:
    plan = spec({"name": "a", "target": NODES, "fault": {"type": "NotReady"}, "at": "0s",
                 "expectations": [{"name": "tainted", "within": "60s",
                                   "objects": {"kind": "Node", "victims": True},
                                   "taint": {"key": "node.kubernetes.io/not-ready"}}]})
    pending = [InjectionStatus(step="a", state="Injected", injectAt=0,
                               expectations=[ExpectationStatus(name="tainted")])]
    assert executing.summary(plan, pending) == ("Running", "", "1/1")
    passed = [pending[0].model_copy(update={"expectations": [
        ExpectationStatus(name="tainted", outcome="Passed", latencySeconds=3.0)]})]
    assert executing.summary(plan, passed) == ("Succeeded", "Passed", "1/1")
    failed = [pending[0].model_copy(update={"expectations": [
        ExpectationStatus(name="tainted", outcome="Failed", latencySeconds=60.0)]})]
    assert executing.summary(plan, failed) == ("Failed", "Failed", "1/1")


def test_a_failed_expectation_fails_the_verdict_before_the_plan_is_over() -> None:
    plan = spec(
        {"name": "a", "target": NODES, "fault": {"type": "NotReady"}, "at": "0s",
         "expectations": [{"name": "x", "within": "1s", "objects": {"kind": "Node"},
                           "count": {"equals": 0}}]},
        {"name": "b", "target": NODES, "fault": {"type": "Cordon"}, "at": "1h"})
    injections = [
        InjectionStatus(step="a", state="Injected", injectAt=0, expectations=[
            ExpectationStatus(name="x", outcome="Failed", latencySeconds=1.0)]),
        InjectionStatus(step="b", injectAt=3600)]
    assert executing.summary(plan, injections) == ("Running", "Failed", "1/2")


def test_a_skipped_occurrence_expects_nothing() -> None:
    plan = spec({"name": "a", "target": NODES, "fault": {"type": "NotReady"}, "at": "0s",
                 "expectations": [{"name": "x", "within": "1s", "objects": {"kind": "Node"},
                                   "count": {"equals": 0}}]})
    assert executing.summary(plan, [InjectionStatus(step="a", state="Skipped")]) == (
        "Succeeded", "Passed", "1/1")


@pytest.mark.parametrize("victim", [
    Victim("west", "Node", "gpu-3"),
    Victim("west", "Pod", "train-0", "ml", "nccl"),
    Victim("east", "Cluster", "east"),
])
def test_victims_survive_the_round_trip_through_the_status(victim: Victim) -> None:
    assert executing.victim_of(executing.victim_text(victim)) == victim


def test_entry_ids_tell_plans_of_the_same_name_apart() -> None:
    first = executing.entry_id("ns", "plan", "0123456789", "a", 0)
    again = executing.entry_id("ns", "plan", "abcdef0123", "a", 0)
    assert first != again
    assert first.endswith("/a/0")


def test_fault_entries_survive_the_annotation() -> None:
    entries = [catalogue.node_entry("x", Fault(type="GPUXid", xid=79), gpus=8),
               catalogue.pod_entry("y", Fault(type="ContainerExit", exitCode=3,
                                                message="NCCL communicator aborted"))]
    read, problem = read_entries({"fakefleet.dev/faults": render_entries(entries) or ""})
    assert (read, problem) == (entries, "")
    assert render_entries([]) is None


def test_an_unreadable_annotation_carries_nothing_and_says_why() -> None:
    entries, problem = read_entries({"fakefleet.dev/faults": "{not json"})
    assert entries == []
    assert "fakefleet.dev/faults" in problem


def test_a_fatal_xid_takes_gpus_out_and_taints_and_its_recovery_restores_them() -> None:
    entry = catalogue.node_entry("x", Fault(type="GPUXid", xid=79, gpus=2), gpus=8)
    effect = entry.stages[0].effect
    assert effect.model_dump()["allocatable"] == {"nvidia.com/gpu": "6"}
    assert [t.key for t in effect.taints] == [keys.GPU_XID]  # type: ignore[union-attr]
    recovery = entry.recovery[-1].effect
    assert recovery.endFault
    assert recovery.model_dump()["allocatable"] == {"nvidia.com/gpu": None}


def test_a_fatal_xid_takes_the_first_gpus_by_index_out_of_dra_too() -> None:
    both = catalogue.node_entry("x", Fault(type="GPUXid", xid=79, gpus=3), gpus=8)
    hit = both.stages[0].effect.gpus  # type: ignore[union-attr]
    assert hit is not None
    assert (hit.indices, hit.healthy, hit.xid) == ([0, 1, 2], False, 79)
    back = both.recovery[-1].effect.gpus  # type: ignore[union-attr]
    assert back is not None
    assert (back.indices, back.reset) == ([0, 1, 2], True)
    # Offered only as devices: nothing of the extended resource to lower or restore.
    dra = catalogue.node_entry("x", Fault(type="GPUXid", xid=79, gpus=2), gpus=4,
                               extended=False)
    assert not dra.stages[0].effect.model_dump()["allocatable"]
    assert not dra.recovery[-1].effect.model_dump()["allocatable"]
    assert dra.stages[0].effect.gpus.indices == [0, 1]  # type: ignore[union-attr]
    # More GPUs asked for than the node has: all of them.
    assert catalogue.node_entry("x", Fault(type="GPUXid", xid=79, gpus=9), gpus=4).stages[
        0].effect.gpus.indices == [0, 1, 2, 3]  # type: ignore[union-attr]


def test_a_node_s_gpus_are_counted_from_its_capacity_or_its_labels() -> None:
    extended = {"status": {"capacity": {"nvidia.com/gpu": "8"}},
                "metadata": {"labels": {"nvidia.com/gpu.count": "8"}}}
    dra = {"status": {"capacity": {"cpu": "32"}},
           "metadata": {"labels": {"nvidia.com/gpu.count": "4"}}}
    assert catalogue.node_gpus(extended) == (8, True)
    assert catalogue.node_gpus(dra) == (4, False)
    assert catalogue.node_gpus({"status": {}, "metadata": {}}) == (0, False)
    assert catalogue.node_entry("x", Fault(type="GPUXid", xid=79), gpus=0).stages[
        0].effect.gpus is None  # type: ignore[union-attr]


def test_a_non_fatal_xid_only_signals_once() -> None:
    entry = catalogue.node_entry("x", Fault(type="GPUXid", xid=13), gpus=8)
    effect = entry.stages[0].effect.model_dump()
    assert effect["events"][0]["reason"] == "GPUXid"
    assert effect["endFault"]
    assert not effect["taints"]
    assert not effect["allocatable"]


@pytest.mark.parametrize("fault", ["ContainerExit", "OOMKilled", "Evict"])
def test_one_shot_pod_faults_end_themselves(fault: str) -> None:
    entry = catalogue.pod_entry("x", Fault(type=fault, exitCode=3 if fault == "ContainerExit"
                                           else None))  # type: ignore[arg-type]
    assert entry.stages[-1].effect.endFault


def test_faults_that_last_hold_the_object_where_they_put_it() -> None:
    for entry in (catalogue.node_entry("x", Fault(type="NotReady")),
                  catalogue.pod_entry("y", Fault(type="StuckPending"))):
        assert entry.stages[-1].effect.hold
        assert entry.recovery[-1].effect.endFault


def test_cluster_faults_name_the_component_they_stop() -> None:
    assert catalogue.cluster_entry("x", Fault(type="APIServerDown")) == FaultEntry(
        id="x", stop=["kube-apiserver"])


def test_cel_matches_objects_and_refuses_what_does_not_parse() -> None:
    matcher = CelMatcher("self.status.phase == 'Running'")
    assert matcher.matches({"status": {"phase": "Running"}})
    assert not matcher.matches({"status": {}})  # a missing field: does not hold
    with pytest.raises(ExpectationError, match="not a CEL expression"):
        CelMatcher("self.(")


def test_the_phase_ends_only_once_every_expectation_is_judged() -> None:
    plan = spec({"name": "a", "target": NODES, "fault": {"type": "Cordon"}, "at": "0s",
                 "duration": "5s", "expectations": [
                     {"name": "slow", "within": "60s", "objects": {"kind": "Node"},
                      "count": {"atLeast": 1}},
                     {"name": "fast", "within": "1s", "objects": {"kind": "Node"},
                      "count": {"equals": 99}}]})
    injections = [InjectionStatus(step="a", state="Recovered", injectAt=0, recoverAt=5,
                                  expectations=[
                                      ExpectationStatus(name="slow"),
                                      ExpectationStatus(name="fast", outcome="Failed",
                                                        latencySeconds=1.0)])]
    assert executing.summary(plan, injections) == ("Running", "Failed", "1/1")


def test_a_slowdown_is_an_entry_with_a_latency_the_engine_reads() -> None:
    entry = catalogue.cluster_entry("x", Fault(type="APIServerSlow", latency="750ms"))
    assert entry == FaultEntry(id="x", latency="750ms")
    annotations = {"fakefleet.dev/faults": render_entries([
        entry, FaultEntry(id="y", latency="2s", state="recover")]) or ""}
    assert write_latency(annotations) == 0.75, "entries being recovered slow nothing"
    assert write_latency({}) == 0.0


def test_a_cel_expression_that_cannot_be_evaluated_is_an_expectation_error() -> None:
    matcher = CelMatcher("self.items.exists(1, true)")  # parses; refused when evaluated
    with pytest.raises(ExpectationError, match="not a CEL expression"):
        matcher.matches({"items": [1]})
    deep = CelMatcher("(" * 300 + "1" + ")" * 300)
    assert not deep.matches({})


def test_a_step_after_another_counts_its_delay_from_when_that_one_really_finished() -> None:
    plan = spec(
        {"name": "a", "target": NODES, "fault": {"type": "NotReady"}, "at": "0s",
         "duration": "10s"},
        {"name": "b", "target": NODES, "fault": {"type": "Cordon"}, "after": ["a"],
         "delay": "5s"})
    started = 1_000_000.0
    # a was planned to end at 10 s but its recovery was confirmed at 14 s.
    injections = [InjectionStatus(step="a", state="Recovered", injectAt=0, recoverAt=10,
                                  injectedAt=micro_time(started), recoveredAt=micro_time(
                                      started + 14)),
                  InjectionStatus(step="b", injectAt=15)]
    assert executing.due(plan, injections, 16.0, started) == []
    assert executing.due(plan, injections, 19.5, started) == [executing.Due(1, "inject")]


# -- the plan's clock and its clusters ---------------------------------------------------------

CORDON = {"name": "a", "target": NODES, "fault": {"type": "Cordon"}, "at": "0s"}
TWO = Fleet((*FLEET.clusters, ClusterView("east", nodes=(NodeView("e-0", "p"),))))


def test_time_zero_is_start_at_or_now() -> None:
    assert executing.time_zero(spec(CORDON), "2030-01-01T00:00:00.000000Z") == \
        "2030-01-01T00:00:00.000000Z"
    timed = FaultPlanSpec.model_validate({"steps": [CORDON],
                                          "startAt": "2030-01-02T15:04:05+02:00"})
    assert executing.time_zero(timed, "2030-01-01T00:00:00Z") == "2030-01-02T15:04:05+02:00"
    impossible = FaultPlanSpec.model_validate({"steps": [CORDON],
                                               "startAt": "2030-02-30T00:00:00Z"})
    with pytest.raises(PlanError, match=r"spec.startAt: '2030-02-30T00:00:00Z' is not a time"):
        executing.time_zero(impossible, "2030-01-01T00:00:00Z")


@pytest.mark.parametrize("text", ["tomorrow", "2030-01-02", "2030-01-02 15:04:05Z",
                                  "2030-01-02T15:04:05", "2030-13-02T15:04:05Z"])
def test_start_at_is_an_rfc_3339_time(text: str) -> None:
    with pytest.raises(ValidationError, match="startAt"):
        FaultPlanSpec.model_validate({"steps": [CORDON], "startAt": text})


def test_a_step_due_long_ago_is_due_at_once() -> None:
    plan = spec({**CORDON, "at": "10s", "duration": "5s", "repeat": {"every": "1m", "times": 2}})
    injections = executing.initial_injections(executing.schedule(plan, FLEET))
    # startAt lay two minutes back when the operator first ran the plan: both are due.
    assert executing.due(plan, injections, 120.0) == [executing.Due(0, "inject"),
                                                      executing.Due(1, "inject")]


def test_the_schedule_keeps_to_spec_clusters() -> None:
    plan = FaultPlanSpec.model_validate({
        "seed": 1, "clusters": ["east"],
        "steps": [{**CORDON, "target": {"nodes": {}}},
                  {**CORDON, "name": "b", "target": {"clusters": {"names": ["west"]},
                                                     "nodes": {}}}]})
    schedule = executing.schedule(plan, TWO)
    assert schedule.of("a")[0].victims == (Victim("east", "Node", "e-0"),)
    assert schedule.of("b")[0].victims == ()
    assert schedule.unknown_clusters == {}
    everywhere = executing.schedule(plan.model_copy(update={"clusters": []}), TWO)
    assert {v.cluster for v in everywhere.of("a")[0].victims} == {"east", "west"}


# -- hub-link faults ---------------------------------------------------------------------------

@pytest.mark.parametrize(("fault", "link"), [
    (Fault(type="HubPartition"), HubLink(partition="both")),
    (Fault(type="HubPartition", direction="toHub"), HubLink(partition="toHub")),
    (Fault(type="HubPartition", direction="fromHub"), HubLink(partition="fromHub")),
    (Fault(type="HubLatency", latency="300ms"), HubLink(latency="300ms")),
])
def test_hub_faults_are_cluster_entries_for_the_hub_link(fault: Fault, link: HubLink) -> None:
    entry = catalogue.cluster_entry("x", fault)
    assert entry == FaultEntry(id="x", hub=link)
    assert (len(entry.stages), len(entry.recovery), len(entry.stop)) == (0, 0, 0), \
        "nothing for the engine to run"
    assert entry.latency is None, "the engine's writes are not slowed"
    assert read_entries({keys.FAULTS: render_entries([entry]) or ""}) == ([entry], "")


def carrying(*entries: FaultEntry) -> dict[str, str]:
    """A FakeCluster's annotations with ``entries``."""
    return {keys.FAULTS: render_entries(list(entries)) or ""}


def test_hub_link_faults_add_up_the_entries_being_injected() -> None:
    to_hub = FaultEntry(id="a", hub=HubLink(partition="toHub"))
    from_hub = FaultEntry(id="b", hub=HubLink(partition="fromHub"))
    slow = FaultEntry(id="c", hub=HubLink(latency="250ms"))
    slower = FaultEntry(id="d", hub=HubLink(latency="1.5s"))
    assert hub_link_faults(carrying(to_hub)) == HubLinkFaults(to_hub_dropped=True)
    assert hub_link_faults(carrying(from_hub, slow)) == HubLinkFaults(
        from_hub_dropped=True, latency=0.25)
    assert hub_link_faults(carrying(to_hub, from_hub, slow, slower)) == HubLinkFaults(
        to_hub_dropped=True, from_hub_dropped=True, latency=1.5), "the largest latency"
    both = FaultEntry(id="e", hub=HubLink(partition="both"))
    assert hub_link_faults(carrying(both)) == HubLinkFaults(True, True)


def test_hub_link_faults_ignore_everything_but_hub_entries_being_injected() -> None:
    others = carrying(
        FaultEntry(id="a", hub=HubLink(partition="both"), state="recover"),
        FaultEntry(id="b", hub=HubLink(latency="2s"), state="done"),
        FaultEntry(id="c", latency="3s"),
        FaultEntry.model_validate({"id": "d", "stop": ["kube-apiserver"]}))
    assert hub_link_faults(others) == HubLinkFaults()
    assert hub_link_faults({keys.FAULTS: "not json"}) == HubLinkFaults()
    assert hub_link_faults({}) == hub_link_faults(None) == HubLinkFaults()
    assert write_latency(carrying(FaultEntry(id="e", hub=HubLink(latency="2s")))) == 0.0


@pytest.mark.parametrize(("fault", "field"), [
    ({"type": "HubPartition", "direction": "sideways"}, "direction"),
    ({"type": "HubLatency", "latency": "soon"}, "latency"),
])
def test_hub_fault_parameters_are_checked(fault: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Fault.model_validate(fault)
