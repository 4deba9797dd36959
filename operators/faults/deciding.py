"""What a running FaultPlan does next, and what each thing it did means for its status: pure.

:func:`decide` is one round of a plan, from its status and the time: the recoveries due, then
the injections due (an occurrence's victims are chosen from the fleet as it is when it is due),
then the confirmation of every recovery under way, then a look at every pending expectation.
:func:`wait` says how long until the next round; :func:`undo` is the finalizer's round, which
recovers whatever the plan injected. What an action found turns into the status and the Events
to send through :func:`skip_reason`, :func:`chosen`, :func:`injected`, :func:`recovering`,
:func:`recovered` and :func:`judged`; :func:`begun`, :func:`refused` and :func:`summarised`
give the status of a plan that starts, cannot run, or moved on.

No I/O, nothing async, no client and no clock: the runner (:mod:`operators.faults.running`)
observes, passes ``now`` in, carries out the actions and writes what these return. Progress
that must survive a restart is in the status these return, never in memory: a successor reads
it back and decides the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from operators.api import faultplans as api
from operators.api.base import Condition
from operators.api.durations import parse_duration
from operators.api.status import condition
from operators.faults import executing
from operators.faults import expectations as ex
from operators.faults.planning import Schedule
from operators.faults.targets import Victim
from operators.k8s.times import micro_time, parse, rfc3339

#: How often a plan with something under way looks again (s): a recovery to confirm, an
#: expectation to judge, an occurrence due but waiting for the steps it comes after.
TICK = 1.0
#: The longest a plan sleeps between two rounds (s).
LONGEST_WAIT = 30.0
#: How long after its moment a step waits for a member the operator cannot reach yet, before
#: it is judged without it (s).
MEMBER_WAIT = 60.0
#: Victims one injection may have, and all injections of a plan (each is written to).
MAX_VICTIMS = 5000
MAX_RECORDED = 20000
#: The status is bounded in bytes, not only in counts: etcd keeps an object to 1.5 MiB, and a
#: status PATCH beyond it would fail at every round. Victims are listed in the status while
#: all the plan's lists there take at most INLINE_TARGETS bytes; an occurrence's list beyond
#: that goes apart, into a ConfigMap of the plan (gzipped, at most LIST_BYTES of it; an
#: occurrence whose list does not fit even so is skipped, saying why). Counts stay exact
#: (targetCount). Every message in the status is cut to a length of its own.
INLINE_TARGETS = 64 << 10
LIST_BYTES = 768 << 10
MESSAGE_LENGTH = 512
EXPECTATION_MESSAGE_LENGTH = 256
CONDITION_MESSAGE_LENGTH = 1024
#: The most a status can take, what the limits above and the CRD's counts add up to (a test
#: builds the largest one), far under etcd's limit with the spec and kopf's annotations beside.
MAX_STATUS_BYTES = 640 << 10
#: Problems a status message names before it says how many more there are.
SHOWN = 5


# -- actions -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Inject:
    """Inject occurrence ``index``: choose its victims unless recorded, record them, write their
    entries, then record it Injected (Done for an instant fault)."""

    index: int


@dataclasses.dataclass(frozen=True)
class Recover:
    """Turn occurrence ``index``'s entries to their recovery (release its holds, remove its
    cluster entries), then record it Recovering."""

    index: int
    #: Why now: its duration is over, or the plan was deleted.
    cause: Literal["duration", "plan deleted"] = "duration"


@dataclasses.dataclass(frozen=True)
class Settle:
    """Confirm occurrence ``index`` recovered (every victim back, its entries removed), then
    record it Recovered."""

    index: int
    #: Only if its recovery was recorded (Recovering) by the time this runs: a recovery that
    #: could not be written is tried again by the next round. The finalizer settles whatever was
    #: injected.
    recovering_only: bool = True


@dataclasses.dataclass(frozen=True)
class Judge:
    """Look at the pending expectations of the occurrences ``indices`` that were injected by the
    time this runs, all at one moment."""

    indices: tuple[int, ...]


Action = Inject | Recover | Settle | Judge


@dataclasses.dataclass(frozen=True)
class PlanEvent:
    """An Event about the FaultPlan."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class VictimEvents:
    """An Event about each victim, in its own cluster."""

    victims: tuple[Victim, ...]
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


Event = PlanEvent | VictimEvents


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The status after an action, and what to do about it: write it, then send ``events``;
    or, while ``unfinished`` says what is missing, write nothing yet (the next round tries
    again) and mark the action's span as failed with it."""

    status: api.FaultPlanStatus
    unfinished: str = ""
    events: tuple[Event, ...] = ()


# -- rounds ------------------------------------------------------------------------------------

def decide(spec: api.FaultPlanSpec, status: api.FaultPlanStatus, now: float) -> list[Action]:
    """One round of a running plan at ``now`` (seconds since the epoch): recoveries first (an
    occurrence that starts as the previous one ends finds it undone), then the injections due,
    then every recovery to confirm (those this round recovers too), then the expectations to
    judge (those of occurrences this round injects too)."""
    started = parse(status.startedAt)
    due = executing.due(spec, status.injections, now - started, started)
    recovers = [Recover(d.index) for d in due if d.action == "recover"]
    injects = [Inject(d.index) for d in due if d.action == "inject"]
    recovered_now = {action.index for action in recovers}
    injected_now = {action.index for action in injects}
    steps = {step.name: step for step in spec.steps}
    settles = [Settle(index) for index, injection in enumerate(status.injections)
               if injection.state == "Recovering" or index in recovered_now]
    judged = tuple(index for index, injection in enumerate(status.injections)
                   if judging(injection) or (index in injected_now
                                             and steps[injection.step].expectations))
    return [*recovers, *injects, *settles, *([Judge(judged)] if judged else [])]


def judging(injection: api.InjectionStatus) -> bool:
    """Whether the occurrence has expectations to look at now: injected, some still pending."""
    return bool(injection.injectedAt) and any(r.outcome == "Pending"
                                              for r in injection.expectations)


def wait(status: api.FaultPlanStatus, now: float) -> float:
    """Seconds from ``now`` until the next round: a TICK while something is under way, else
    until the next planned moment, at most LONGEST_WAIT."""
    elapsed = now - parse(status.startedAt)
    upcoming = executing.next_time(status.injections, elapsed)
    pending = any(i.state == "Recovering"
                  or any(r.outcome == "Pending" for r in i.expectations)
                  # due, but waiting for steps it comes after, or for an entry to write
                  or (i.state == "Scheduled" and (i.injectAt or 0.0) <= elapsed)
                  for i in status.injections)
    waited = TICK if pending or upcoming is None else max(0.0, upcoming - elapsed)
    return min(waited, LONGEST_WAIT)


def undo(status: api.FaultPlanStatus) -> list[Action]:
    """The finalizer's round: recover every occurrence that has victims and is not recovered
    yet (those still recovering are only settled), and settle each."""
    actions: list[Action] = []
    for index, injection in enumerate(status.injections):
        if not executing.recorded(injection) or injection.state in ("Recovered", "Skipped"):
            continue
        if injection.state in ("Injected", "Done", "Scheduled"):
            actions.append(Recover(index, cause="plan deleted"))
        actions.append(Settle(index, recovering_only=False))
    return actions


def unrecovered(status: api.FaultPlanStatus) -> list[api.InjectionStatus]:
    """The occurrences whose victims are not all back yet."""
    return [i for i in status.injections
            if executing.recorded(i) and i.state not in ("Recovered", "Skipped")]


def still_injected(left: Sequence[api.InjectionStatus]) -> str:
    """What the finalizer waits for."""
    return (f"waiting for {len(left)} injection(s) to be recovered: "
            + ", ".join(f"{i.step}#{i.occurrence}" for i in left[:SHOWN]))


def aborted(status: api.FaultPlanStatus) -> api.FaultPlanStatus:
    """The status of a plan deleted before it ended."""
    if status.phase in ("Running", "Pending"):
        return status.model_copy(update={"phase": "Aborted"})
    return status


# -- the plan's status -------------------------------------------------------------------------

def conditions(plan: api.FaultPlan, previous: Sequence[Condition], now: float, *,
               stalled: str = "", phase: str = "Running") -> list[Condition]:
    """Ready, Reconciling and Stalled of a plan in ``phase`` (``stalled``: why it cannot run),
    each keeping its lastTransitionTime from ``previous`` while its status holds."""
    generation = int(plan.metadata.get("generation", 0))
    stamp = rfc3339(now)
    finished = phase in ("Succeeded", "Failed", "Aborted")
    message = stalled or ("the plan finished" if finished else "the plan is running")
    return [
        condition("Ready", finished and not stalled, reason=phase, message=message,
                  generation=generation, now=stamp, previous=previous),
        condition("Reconciling", not finished and not stalled, reason=phase,
                  message="" if finished else message, generation=generation, now=stamp,
                  previous=previous),
        condition("Stalled", bool(stalled), reason="PlanInvalid" if stalled else "",
                  message=stalled, generation=generation, now=stamp, previous=previous),
    ]


def summarised(plan: api.FaultPlan, status: api.FaultPlanStatus,
               previous: Sequence[Condition], now: float) -> api.FaultPlanStatus:
    """``status`` with the phase, verdict and steps done its injections stand for (a plan that
    ended stays as it ended)."""
    phase, verdict, steps = executing.summary(plan.spec, status.injections)
    if status.phase not in ("Running", "Pending"):
        return status
    return status.model_copy(update={
        "phase": phase, "verdict": verdict, "stepsDone": steps,
        "conditions": conditions(plan, previous, now, phase=phase)})


def begun(plan: api.FaultPlan, schedule: Schedule, started: str, *, trace_id: str,
          traceparent: str, previous: Sequence[Condition],
          now: float) -> api.FaultPlanStatus:
    """The status that starts a plan at time zero ``started``: every occurrence Scheduled, a
    step naming FakeClusters that do not exist saying which."""
    namespace = plan.metadata["namespace"]
    unknown = "; ".join(f"step {step}: no FakeCluster named {', '.join(names)} in "
                        f"namespace {namespace}"
                        for step, names in schedule.unknown_clusters.items())
    injections = [i.model_copy(update={"message": unknown})
                  if i.step in schedule.unknown_clusters else i
                  for i in executing.initial_injections(schedule)]
    return summarised(plan, api.FaultPlanStatus(
        phase="Running", startedAt=started, injections=injections, traceId=trace_id,
        traceparent=traceparent), previous, now)


def refused(plan: api.FaultPlan, why: str, *, trace_id: str, traceparent: str,
            previous: Sequence[Condition], now: float) -> api.FaultPlanStatus:
    """The status of a plan that cannot run: Failed and Stalled, with no verdict (it says
    nothing about the system under test)."""
    return api.FaultPlanStatus(
        phase="Failed", startedAt=micro_time(now),
        conditions=conditions(plan, previous, now, stalled=f"the plan cannot run: {why}"),
        traceId=trace_id, traceparent=traceparent)


def replaced(status: api.FaultPlanStatus, index: int, **changes: Any) -> api.FaultPlanStatus:
    """``status`` with occurrence ``index`` changed."""
    injections = list(status.injections)
    injections[index] = injections[index].model_copy(update=changes)
    return status.model_copy(update={"injections": injections})


def bounded(status: api.FaultPlanStatus) -> api.FaultPlanStatus:
    """``status`` with every message cut to its length (whatever an API error or an
    expression said); cut to a quarter of it when even so the status would take more than
    MAX_STATUS_BYTES (a plan at the CRD's limits: 200 occurrences of 10 expectations, each
    with a long message)."""
    cut = _cut(status, 1)
    if len(cut.model_dump_json().encode()) > MAX_STATUS_BYTES:
        cut = _cut(cut, 4)
    return cut


def _cut(status: api.FaultPlanStatus, tighter: int) -> api.FaultPlanStatus:
    def short(text: str, length: int) -> str:
        length //= tighter
        return text if len(text) <= length else text[:length - 3] + "..."

    injections = [i if len(i.message) <= MESSAGE_LENGTH // tighter and all(
        len(r.message) <= EXPECTATION_MESSAGE_LENGTH // tighter for r in i.expectations) else
        i.model_copy(update={
            "message": short(i.message, MESSAGE_LENGTH),
            "expectations": [r.model_copy(update={
                "message": short(r.message, EXPECTATION_MESSAGE_LENGTH)})
                for r in i.expectations]})
        for i in status.injections]
    conditions = [c if len(c.message) <= CONDITION_MESSAGE_LENGTH // tighter else
                  c.model_copy(update={"message": short(c.message, CONDITION_MESSAGE_LENGTH)})
                  for c in status.conditions]
    return status.model_copy(update={"injections": injections, "conditions": conditions})


# -- injecting ---------------------------------------------------------------------------------

def patient(status: api.FaultPlanStatus, injection: api.InjectionStatus, now: float) -> bool:
    """Whether the occurrence still waits for members the operator cannot reach yet (their
    control planes adopted a moment after an operator restart): a step is not skipped for want
    of a look, until MEMBER_WAIT after its moment."""
    return now - parse(status.startedAt) - (injection.injectAt or 0.0) < MEMBER_WAIT


def victims_in(schedule: Schedule, injection: api.InjectionStatus) -> tuple[Victim, ...]:
    """The occurrence's victims in ``schedule`` (planned over the fleet as it is now)."""
    mine = next(i for i in schedule.injections
                if i.step == injection.step and i.occurrence == injection.occurrence)
    return tuple(mine.victims)


def skip_reason(status: api.FaultPlanStatus, injection: api.InjectionStatus,
                victims: Sequence[Victim]) -> str:
    """Why an occurrence whose victims were just chosen is not injected ("" if it is): nothing
    matched, or more victims than the status can record."""
    if not victims:
        return injection.message or "nothing matched the target when the step was due"
    recorded = sum(executing.target_count(i) for i in status.injections)
    if len(victims) > MAX_VICTIMS:
        return (f"{len(victims)} victims, more than {MAX_VICTIMS} in one injection: set "
                f"target.maxTargets (or a smaller percent)")
    if recorded + len(victims) > MAX_RECORDED:
        return (f"{len(victims)} more victims would make {recorded + len(victims)} in the plan, "
                f"more than {MAX_RECORDED}: set target.maxTargets or use fewer occurrences")
    if apart(status, victims):
        packed = len(executing.pack_targets(texts(victims)))
        if packed > LIST_BYTES:
            return (f"the names of {len(victims)} victims take {packed} bytes even "
                    f"compressed, more than {LIST_BYTES} a list of them may: set "
                    f"target.maxTargets")
    return ""


def texts(victims: Sequence[Victim]) -> list[str]:
    return [executing.victim_text(v) for v in victims]


def _size(names: Sequence[str]) -> int:
    return sum(len(name.encode()) + 3 for name in names)  # quoted, and a comma


def apart(status: api.FaultPlanStatus, victims: Sequence[Victim]) -> bool:
    """Whether these victims are listed apart (a ConfigMap) rather than in the status: when
    the lists in the status would take more than INLINE_TARGETS bytes with them."""
    listed = sum(_size(i.targets) for i in status.injections)
    return listed + _size(texts(victims)) > INLINE_TARGETS


def chosen(status: api.FaultPlanStatus, index: int, victims: Sequence[Victim], *,
           listed_in: str = "") -> api.FaultPlanStatus:
    """The victims recorded, before anything is written to them: a successor injects into
    exactly these. ``listed_in``: the ConfigMap that lists them, already written (see
    :func:`apart`)."""
    if listed_in:
        return replaced(status, index, targets=[], targetsRef=listed_in,
                        targetCount=len(victims))
    return replaced(status, index, targets=texts(victims), targetsRef="",
                    targetCount=len(victims))


def injected(plan: api.FaultPlan, status: api.FaultPlanStatus, index: int,
             victims: Sequence[Victim], *, problems: Sequence[str], failed: Sequence[str],
             now: float) -> Outcome:
    """After the entries were written: Injected (Done for an instant fault) once every victim
    has its entry (``problems``: victims that cannot take it, for good), its duration counted
    from ``now``, however late that is; still Scheduled while writes ``failed``."""
    injection = status.injections[index]
    if failed:
        # Entries already written are not written twice: the next round writes the rest.
        message = f"{len(failed)} of {len(victims)} entries not written yet, trying again"
        return Outcome(replaced(status, index, message=listed(message, failed)), message)
    step = _step(plan, injection)
    stamp = micro_time(now)
    recover_at = None if step.duration is None else \
        parse(stamp) - parse(status.startedAt) + parse_duration(step.duration)
    status = replaced(
        status, index, state="Done" if step.fault.type in api.INSTANT_FAULTS else "Injected",
        injectedAt=stamp, recoverAt=recover_at,
        message=listed("", problems) or injection.message,
        expectations=[api.ExpectationStatus(name=e.name) for e in step.expectations])
    said = f" ({listed('', problems)})" if problems else ""
    return Outcome(status, events=(
        PlanEvent("Normal", "FaultInjected",
                  f"step {step.name} #{injection.occurrence}: {step.fault.type} on "
                  f"{len(victims)} target(s){said}"),
        VictimEvents(tuple(victims), "Warning", "FaultInjected",
                     f"{step.fault.type} injected by {_by(plan, step)}")))


# -- recovering --------------------------------------------------------------------------------

def recovering(status: api.FaultPlanStatus, index: int, victims: Sequence[Victim], *,
               failed: Sequence[str]) -> Outcome:
    """After the recoveries were written: Recovering until the engines wrote everything back;
    still as it was while writes ``failed``."""
    if failed:
        message = f"recovery of {len(failed)} of {len(victims)} not written yet, trying again"
        return Outcome(replaced(status, index, message=listed(message, failed)), message)
    return Outcome(replaced(status, index, state="Recovering"))


def recovered(plan: api.FaultPlan, status: api.FaultPlanStatus, index: int,
              victims: Sequence[Victim], now: float) -> Outcome:
    """Every victim back at ``now``: Recovered."""
    injection = status.injections[index]
    step = _step(plan, injection)
    return Outcome(replaced(status, index, state="Recovered", recoveredAt=micro_time(now)),
                   events=(
        PlanEvent("Normal", "FaultRecovered",
                  f"step {step.name} #{injection.occurrence}: {step.fault.type} recovered on "
                  f"{len(victims)} target(s)"),
        VictimEvents(tuple(victims), "Normal", "FaultRecovered",
                     f"{step.fault.type} recovered by {_by(plan, step)}")))


# -- judging -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Look:
    """One look at an expectation's objects."""

    holds: bool = False
    #: Why it cannot be judged at all (a bad path or expression, a kind no API serves): it fails.
    invalid: str = ""
    #: Why the objects could not be looked at this time (an API error): it stays pending.
    unseen: str = ""


def judged(plan: api.FaultPlan, injection: api.InjectionStatus, spec: api.Expectation,
           result: api.ExpectationStatus, expectation: ex.Expectation | None, look: Look,
           now: float) -> tuple[api.ExpectationStatus, tuple[Event, ...]]:
    """The expectation's result after ``look`` at ``now`` (``expectation``: ``spec`` as it is
    judged; None when it cannot be), and the Events its failure sends. Still Pending until it
    held (Passed, with the latency since the injection) or its deadline passed (Failed)."""
    if look.invalid or expectation is None:
        return result.model_copy(update={
            "outcome": "Failed", "latencySeconds": 0.0,
            "message": f"expectation {spec.name} cannot be judged: {look.invalid}"}), ()
    if look.unseen:
        result = result.model_copy(update={"message": f"could not look: {look.unseen}"})
    outcome = ex.Deadline(expectation, parse(injection.injectedAt)).observe(now, look.holds)
    if outcome is None:
        return result, ()
    decided = result.model_copy(update={
        "outcome": outcome.outcome, "latencySeconds": round(outcome.latency, 3),
        "message": "" if outcome.outcome == "Passed" else f"did not hold within {spec.within}"})
    if outcome.outcome == "Passed":
        return decided, ()
    return decided, (PlanEvent("Warning", "ExpectationFailed",
                               f"step {injection.step} #{injection.occurrence}: expectation "
                               f"{spec.name} did not hold within {spec.within}"),)


# -- helpers -----------------------------------------------------------------------------------

def listed(head: str, problems: Sequence[str], shown: int = SHOWN) -> str:
    """``head``, then the first few problems and how many more (status messages stay short)."""
    if not problems:
        return head
    named = "; ".join(problems[:shown])
    more = f" (and {len(problems) - shown} more)" if len(problems) > shown else ""
    return f"{head}: {named}{more}" if head else f"{named}{more}"


def _step(plan: api.FaultPlan, injection: api.InjectionStatus) -> api.Step:
    return next(step for step in plan.spec.steps if step.name == injection.step)


def _by(plan: api.FaultPlan, step: api.Step) -> str:
    return f"FaultPlan {plan.metadata['namespace']}/{plan.metadata['name']} (step {step.name})"
