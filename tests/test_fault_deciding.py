"""What a running plan does next, decided from plain data: the round's actions in order (what
is due, what to confirm and judge), how long to sleep, the finalizer's round, and what each
action's findings make of the status (skips, injections, recoveries, expectations) and the
Events they send. No I/O, no asyncio, no clock: ``now`` is a number."""

from __future__ import annotations

from typing import Any

import pytest

from operators.api.faultplans import (
    ExpectationStatus,
    FaultPlan,
    FaultPlanStatus,
    InjectionStatus,
)
from operators.faults import deciding, executing
from operators.faults.deciding import (
    Inject,
    Judge,
    Look,
    PlanEvent,
    Recover,
    Settle,
    VictimEvents,
)
from operators.faults.targets import ClusterView, Fleet, NodeView, Victim
from operators.k8s.times import micro_time, parse

#: Time zero of every plan here, and its status stamp.
T0 = 1_767_225_600.0
STARTED = micro_time(T0)
NODES = {"nodes": {}, "mode": "fixed", "count": 2}
CORDON = {"name": "cordon", "target": NODES, "fault": {"type": "Cordon"}, "at": "0s",
          "duration": "10s"}
SEEN = {"name": "seen", "within": "30s", "count": {"atLeast": 1},
        "objects": {"kind": "Node", "victims": True}}
VICTIMS = (Victim("west", "Node", "n-0"), Victim("west", "Node", "n-1"))


def plan(*steps: dict[str, Any], **spec: Any) -> FaultPlan:
    return FaultPlan.model_validate({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": "p", "namespace": "default", "uid": "0123456789abcdef",
                     "generation": 3},
        "spec": {"seed": 1, "steps": list(steps or [CORDON]), **spec}})


def running(*injections: InjectionStatus) -> FaultPlanStatus:
    return FaultPlanStatus(phase="Running", startedAt=STARTED, injections=list(injections))


def occurrence(step: str = "cordon", **fields: Any) -> InjectionStatus:
    return InjectionStatus(step=step, **{"injectAt": 0.0, "recoverAt": 10.0, **fields})


TARGETS = [executing.victim_text(v) for v in VICTIMS]


# -- rounds ------------------------------------------------------------------------------------

def test_a_round_recovers_first_then_injects_then_confirms_then_judges() -> None:
    spec = plan({**CORDON, "name": "a"}, {**CORDON, "name": "b", "at": "5s"},
                {**CORDON, "name": "c", "expectations": [SEEN]}, {**CORDON, "name": "d"}).spec
    status = running(
        occurrence("a", state="Injected", targets=TARGETS, injectedAt=STARTED),
        occurrence("b", injectAt=5.0, recoverAt=15.0),
        occurrence("c", injectAt=20.0, recoverAt=30.0),
        occurrence("d", state="Recovering", targets=TARGETS, injectedAt=STARTED))
    assert deciding.decide(spec, status, T0 + 12) == [
        Recover(0), Inject(1), Settle(0), Settle(3)]
    assert deciding.decide(spec, status, T0 + 20) == [
        Recover(0), Inject(1), Inject(2), Settle(0), Settle(3), Judge((2,))], \
        "an occurrence injected this round is judged in it"


def test_pending_expectations_are_judged_and_nothing_else_is_due() -> None:
    spec = plan({**CORDON, "expectations": [SEEN]}).spec
    status = running(occurrence(state="Injected", targets=TARGETS, injectedAt=STARTED,
                                expectations=[ExpectationStatus(name="seen")]))
    assert deciding.decide(spec, status, T0 + 1) == [Judge((0,))]
    judged = status.model_copy(update={"injections": [status.injections[0].model_copy(
        update={"expectations": [ExpectationStatus(name="seen", outcome="Passed")]})]})
    assert deciding.decide(spec, judged, T0 + 1) == []


def test_a_step_after_another_waits_for_it_to_finish() -> None:
    spec = plan(CORDON, {**CORDON, "name": "then", "at": None, "after": ["cordon"]}).spec
    status = running(occurrence(state="Injected", targets=TARGETS, injectedAt=STARTED),
                     occurrence("then", injectAt=None, recoverAt=None))
    assert deciding.decide(spec, status, T0 + 5) == []


def test_a_plan_sleeps_a_tick_while_something_is_under_way_else_until_its_next_moment() -> None:
    later = running(occurrence(injectAt=100.0, recoverAt=110.0))
    assert deciding.wait(later, T0 + 90) == pytest.approx(10.0)
    assert deciding.wait(later, T0) == deciding.LONGEST_WAIT, "never longer than that"
    recovering = running(occurrence(state="Recovering", targets=TARGETS))
    assert deciding.wait(recovering, T0 + 50) == deciding.TICK
    due_but_waiting = running(occurrence(injectAt=5.0))
    assert deciding.wait(due_but_waiting, T0 + 6) == deciding.TICK
    judging = running(occurrence(state="Injected", recoverAt=None, injectedAt=STARTED,
                                 expectations=[ExpectationStatus(name="seen")]))
    assert deciding.wait(judging, T0 + 50) == deciding.TICK
    nothing_planned = running(occurrence(state="Injected", recoverAt=None))
    assert deciding.wait(nothing_planned, T0 + 50) == deciding.TICK


def test_the_finalizer_recovers_what_is_injected_and_settles_what_recovers() -> None:
    status = running(
        occurrence(state="Injected", targets=TARGETS),
        occurrence(state="Recovering", targets=TARGETS, occurrence=1),
        occurrence(state="Recovered", targets=TARGETS, occurrence=2),
        occurrence(state="Skipped", occurrence=3),
        occurrence(state="Scheduled", occurrence=4),
        occurrence(state="Scheduled", targets=TARGETS, occurrence=5),
        occurrence(state="Done", targets=TARGETS, occurrence=6))
    assert deciding.undo(status) == [
        Recover(0, "plan deleted"), Settle(0, recovering_only=False),
        Settle(1, recovering_only=False),
        Recover(5, "plan deleted"), Settle(5, recovering_only=False),
        Recover(6, "plan deleted"), Settle(6, recovering_only=False)]
    left = deciding.unrecovered(status)
    assert [i.occurrence for i in left] == [0, 1, 5, 6]
    assert deciding.still_injected(left) == \
        "waiting for 4 injection(s) to be recovered: cordon#0, cordon#1, cordon#5, cordon#6"
    assert deciding.aborted(status).phase == "Aborted"
    assert deciding.aborted(status.model_copy(update={"phase": "Succeeded"})).phase == \
        "Succeeded", "a plan that ended stays as it ended"


# -- the plan's status -------------------------------------------------------------------------

def test_a_plan_begins_with_every_occurrence_scheduled_and_says_which_clusters_are_missing() -> \
        None:
    fault_plan = plan({**CORDON, "target": {**NODES, "clusters": {"names": ["east"]}}},
                      {**CORDON, "name": "here"})
    fleet = Fleet((ClusterView("west", nodes=(NodeView("n-0", "p"),)),))
    status = deciding.begun(fault_plan, executing.schedule(fault_plan.spec, fleet), STARTED,
                            trace_id="0af7651916cd43dd8448eb211c80319c", traceparent="",
                            previous=[], now=T0)
    assert (status.phase, status.startedAt, status.traceId, status.stepsDone) == (
        "Running", STARTED, "0af7651916cd43dd8448eb211c80319c", "0/2")
    first, second = status.injections
    assert first.message == "step cordon: no FakeCluster named east in namespace default"
    assert second.message == ""
    ready = next(c for c in status.conditions if c.type == "Reconciling")
    assert (ready.status, ready.observedGeneration) == ("True", 3)


def test_a_plan_that_cannot_run_is_stalled_without_a_verdict() -> None:
    status = deciding.refused(plan(), "a cycle", trace_id="", traceparent="", previous=[],
                              now=T0)
    assert (status.phase, status.verdict, status.startedAt) == ("Failed", "", STARTED)
    stalled = next(c for c in status.conditions if c.type == "Stalled")
    assert (stalled.status, stalled.reason, stalled.message) == (
        "True", "PlanInvalid", "the plan cannot run: a cycle")


def test_a_summary_keeps_when_a_condition_turned_and_an_ended_plan_as_it_ended() -> None:
    fault_plan = plan()
    status = running(occurrence(state="Recovered", targets=TARGETS, injectedAt=STARTED,
                                recoveredAt=micro_time(T0 + 11)))
    earlier = deciding.conditions(fault_plan, [], T0, phase="Running")
    summed = deciding.summarised(fault_plan, status, earlier, T0 + 20)
    assert (summed.phase, summed.verdict, summed.stepsDone) == ("Succeeded", "Passed", "1/1")
    ready = next(c for c in summed.conditions if c.type == "Ready")
    assert (ready.status, ready.lastTransitionTime) == ("True", micro_time(T0 + 20)[:19] + "Z")
    stalled = next(c for c in summed.conditions if c.type == "Stalled")
    assert stalled.lastTransitionTime == micro_time(T0)[:19] + "Z", "still False since then"
    over = status.model_copy(update={"phase": "Aborted"})
    assert deciding.summarised(fault_plan, over, [], T0) == over


# -- injecting ---------------------------------------------------------------------------------

def test_a_member_not_reachable_is_waited_for_until_member_wait() -> None:
    status = running(occurrence(injectAt=5.0))
    assert deciding.patient(status, status.injections[0], T0 + 5 + deciding.MEMBER_WAIT - 1)
    assert not deciding.patient(status, status.injections[0], T0 + 5 + deciding.MEMBER_WAIT)


def test_victims_are_skipped_when_nothing_matched_or_too_many_to_record() -> None:
    status = running(occurrence())
    injection = status.injections[0]
    assert deciding.skip_reason(status, injection, VICTIMS) == ""
    assert deciding.skip_reason(status, injection, ()) == \
        "nothing matched the target when the step was due"
    unknown = injection.model_copy(update={"message": "step cordon: no FakeCluster named east"})
    assert deciding.skip_reason(status, unknown, ()) == unknown.message
    many = [Victim("west", "Node", f"n-{i}") for i in range(deciding.MAX_VICTIMS + 1)]
    assert "more than 5000 in one injection" in deciding.skip_reason(status, injection, many)
    full = running(occurrence(targets=["x"] * (deciding.MAX_RECORDED - 1)), occurrence())
    assert "would make 20001 in the plan" in \
        deciding.skip_reason(full, full.injections[1], VICTIMS)


def test_victims_are_recorded_before_anything_is_written() -> None:
    status = deciding.chosen(running(occurrence()), 0, VICTIMS)
    assert status.injections[0].targets == ["west/Node//n-0", "west/Node//n-1"]
    assert status.injections[0].state == "Scheduled"


def test_an_occurrence_is_injected_only_once_every_victim_has_its_entry() -> None:
    fault_plan = plan({**CORDON, "expectations": [SEEN]})
    status = running(occurrence(targets=TARGETS))
    failed = [f"west/Node//n-{i}: 500 InternalError: boom" for i in range(7)]
    outcome = deciding.injected(fault_plan, status, 0, VICTIMS, problems=[], failed=failed,
                                now=T0 + 3)
    assert outcome.unfinished == "7 of 2 entries not written yet, trying again"
    assert outcome.status.injections[0].state == "Scheduled"
    assert outcome.status.injections[0].message.endswith("boom (and 2 more)")
    assert outcome.events == ()

    outcome = deciding.injected(fault_plan, status, 0, VICTIMS,
                                problems=["west/Pod/a/b: not found"], failed=[], now=T0 + 3)
    injection = outcome.status.injections[0]
    assert (injection.state, injection.injectedAt) == ("Injected", micro_time(T0 + 3))
    assert injection.recoverAt == pytest.approx(13.0), "its duration counts from now"
    assert injection.message == "west/Pod/a/b: not found"
    assert [(r.name, r.outcome) for r in injection.expectations] == [("seen", "Pending")]
    assert outcome.events == (
        PlanEvent("Normal", "FaultInjected",
                  "step cordon #0: Cordon on 2 target(s) (west/Pod/a/b: not found)"),
        VictimEvents(VICTIMS, "Warning", "FaultInjected",
                     "Cordon injected by FaultPlan default/p (step cordon)"))


def test_an_instant_fault_is_done_once_injected() -> None:
    fault_plan = plan({"name": "exit", "target": {"pods": {}}, "at": "0s",
                       "fault": {"type": "ContainerExit", "exitCode": 1}})
    status = running(occurrence("exit", recoverAt=None, targets=TARGETS))
    outcome = deciding.injected(fault_plan, status, 0, VICTIMS, problems=[], failed=[],
                                now=T0)
    assert (outcome.status.injections[0].state, outcome.status.injections[0].recoverAt) == \
        ("Done", None)


# -- recovering --------------------------------------------------------------------------------

def test_a_recovery_is_recovering_once_written_and_recovered_once_confirmed() -> None:
    fault_plan = plan()
    status = running(occurrence(state="Injected", targets=TARGETS, injectedAt=STARTED))
    stuck = deciding.recovering(status, 0, VICTIMS, failed=["west/Node//n-1: 503"])
    assert stuck.unfinished == "recovery of 1 of 2 not written yet, trying again"
    assert stuck.status.injections[0].state == "Injected"
    written = deciding.recovering(status, 0, VICTIMS, failed=[])
    assert (written.unfinished, written.status.injections[0].state) == ("", "Recovering")
    back = deciding.recovered(fault_plan, written.status, 0, VICTIMS, T0 + 12)
    assert back.status.injections[0].state == "Recovered"
    assert back.status.injections[0].recoveredAt == micro_time(T0 + 12)
    assert back.events == (
        PlanEvent("Normal", "FaultRecovered", "step cordon #0: Cordon recovered on 2 target(s)"),
        VictimEvents(VICTIMS, "Normal", "FaultRecovered",
                     "Cordon recovered by FaultPlan default/p (step cordon)"))


# -- judging -----------------------------------------------------------------------------------

def judge_at(seconds: float, look: Look) -> tuple[ExpectationStatus, tuple[Any, ...]]:
    fault_plan = plan({**CORDON, "expectations": [SEEN]})
    spec = fault_plan.spec.steps[0].expectations[0]
    injection = occurrence(state="Injected", targets=TARGETS, injectedAt=STARTED,
                           expectations=[ExpectationStatus(name="seen")])
    return deciding.judged(fault_plan, injection, spec, injection.expectations[0],
                           executing.expectation_of(spec), look, T0 + seconds)


def test_an_expectation_passes_at_the_first_look_that_holds_with_its_latency() -> None:
    result, events = judge_at(2.5, Look(holds=True))
    assert (result.outcome, result.latencySeconds, result.message) == ("Passed", 2.5, "")
    assert events == ()


def test_an_expectation_stays_pending_until_its_deadline_then_fails_with_an_event() -> None:
    result, _ = judge_at(10, Look(holds=False))
    assert result.outcome == "Pending"
    result, _ = judge_at(10, Look(unseen="503 ServiceUnavailable: later"))
    assert (result.outcome, result.message) == (
        "Pending", "could not look: 503 ServiceUnavailable: later")
    result, events = judge_at(30, Look(unseen="503"))
    assert (result.outcome, result.latencySeconds, result.message) == (
        "Failed", 30.0, "did not hold within 30s")
    assert events == (PlanEvent("Warning", "ExpectationFailed",
                                "step cordon #0: expectation seen did not hold within 30s"),)


def test_an_expectation_that_cannot_be_judged_fails_at_once_without_an_event() -> None:
    result, events = judge_at(1, Look(invalid="objects: the API has no kind Widget in v1"))
    assert (result.outcome, result.latencySeconds) == ("Failed", 0.0)
    assert result.message == \
        "expectation seen cannot be judged: objects: the API has no kind Widget in v1"
    assert events == ()


def test_an_occurrence_is_judged_once_injected_with_something_pending() -> None:
    assert not deciding.judging(occurrence(expectations=[ExpectationStatus(name="seen")]))
    assert deciding.judging(occurrence(injectedAt=STARTED,
                                       expectations=[ExpectationStatus(name="seen")]))
    assert not deciding.judging(occurrence(injectedAt=STARTED, expectations=[
        ExpectationStatus(name="seen", outcome="Failed")]))


def test_a_message_names_a_few_problems_and_counts_the_rest() -> None:
    assert deciding.listed("head", []) == "head"
    assert deciding.listed("", ["a", "b"]) == "a; b"
    assert deciding.listed("head", list("abcdefg")) == "head: a; b; c; d; e (and 2 more)"
    assert parse(STARTED) == T0
