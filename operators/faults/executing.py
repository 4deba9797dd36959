"""A running plan as data: from the FaultPlan's spec to the planner's steps, the schedule as the
status records it, what is due at a moment, and the phase and verdict. Pure: the runner
(:mod:`operators.faults.running`, through :mod:`operators.faults.deciding`) observes, calls
these, writes, and records progress in the plan's status only after the writes it stands for
succeeded.

Progress lives in ``status.injections`` (one per occurrence of each step): the planned times
(seconds from ``status.startedAt``), the victims once chosen, and the state. A restarted
operator reads it back and carries on: an occurrence whose victims were recorded is injected
into exactly those (its entries are idempotent by id), never chosen again; one already
Injected is not injected again; recovery is due as the times say.
"""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from operators.api import faultplans as api
from operators.api.durations import parse_duration
from operators.faults import expectations as ex
from operators.faults import planning, targets
from operators.faults.planning import PlanError
from operators.k8s.times import parse
from primitives.selectors import LabelSelector, Requirement

#: States after which an occurrence has nothing more to do (Injected is one for a fault that
#: stays until the plan is deleted).
SETTLED = frozenset({"Recovered", "Done", "Skipped"})


# -- from the API to the planner ---------------------------------------------------------------

def _selector(selector: api.LabelSelector | None) -> LabelSelector | None:
    if selector is None:
        return None
    return LabelSelector(
        dict(selector.matchLabels),
        tuple(Requirement(r.key, r.operator, tuple(r.values))
              for r in selector.matchExpressions))


def target_of(target: api.Target) -> targets.Target:
    nodes = target.nodes
    pods = target.pods
    return targets.Target(
        clusters=targets.Clusters(tuple(target.clusters.names),
                                  _selector(target.clusters.selector)),
        nodes=None if nodes is None else targets.Nodes(
            tuple(nodes.pools), _selector(nodes.selector), tuple(nodes.names)),
        pods=None if pods is None else targets.Pods(
            pods.namespace, _selector(pods.selector), pods.ownerKind, pods.ownerName,
            pods.container),
        mode=targets.Mode(target.mode), count=target.count, percent=target.percent,
        max_targets=target.maxTargets)


def step_of(step: api.Step) -> planning.Step:
    repeat = step.repeat
    return planning.Step(step.name, target_of(step.target), step.fault.type, planning.Timing(
        at=None if step.at is None else parse_duration(step.at),
        after=tuple(step.after),
        delay=parse_duration(step.delay),
        jitter=parse_duration(step.jitter),
        duration=None if step.duration is None else parse_duration(step.duration),
        every=None if repeat is None else parse_duration(repeat.every),
        times=1 if repeat is None else repeat.times))


def schedule(spec: api.FaultPlanSpec, fleet: targets.Fleet) -> planning.Schedule:
    """The plan's schedule over ``fleet`` narrowed to spec.clusters; PlanError (naming the step
    and field) otherwise."""
    return planning.plan([step_of(step) for step in spec.steps], fleet, spec.seed,
                         within=spec.clusters)


def time_zero(spec: api.FaultPlanSpec, now: str) -> str:
    """The plan's time zero as status.startedAt records it: spec.startAt, or ``now`` (the
    moment the operator first runs the plan); PlanError for a startAt that its pattern lets
    through but that is no time (30 February)."""
    if spec.startAt is None:
        return now
    try:
        parse(spec.startAt)
    except ValueError as error:
        raise PlanError(f"spec.startAt: {spec.startAt!r} is not a time ({error}): give an "
                        f"RFC 3339 time such as 2030-01-02T15:04:05Z") from error
    return spec.startAt


def initial_injections(plan: planning.Schedule) -> list[api.InjectionStatus]:
    """The status of a plan about to start: every occurrence Scheduled at its planned times,
    victims not yet chosen (they are chosen from the fleet as it is when each is due)."""
    return [api.InjectionStatus(step=i.step, occurrence=i.occurrence, injectAt=i.inject_at,
                                recoverAt=i.recover_at)
            for i in plan.injections]


def entry_id(namespace: str, name: str, uid: str, step: str, occurrence: int) -> str:
    """The id of a plan's entries: a plan deleted and applied again under the same name has a
    new uid, so its entries never pass for the old one's."""
    return f"{namespace}/{name}-{uid[:8]}/{step}/{occurrence}"


# -- victims as the status records them --------------------------------------------------------

def victim_text(victim: targets.Victim) -> str:
    parts = [victim.cluster, victim.kind, victim.namespace, victim.name]
    text = "/".join(parts)
    return f"{text}:{victim.container}" if victim.container else text


def recorded(injection: api.InjectionStatus) -> bool:
    """Whether the occurrence's victims were chosen and recorded (in the status or apart)."""
    return bool(injection.targets or injection.targetsRef)


def target_count(injection: api.InjectionStatus) -> int:
    """How many victims the occurrence has (a status written before targetCount existed
    lists them all)."""
    return injection.targetCount or len(injection.targets)


def targets_name(uid: str, step: str, occurrence: int) -> str:
    """The ConfigMap that lists an occurrence's victims apart: the plan's uid in it, so a plan
    applied again under the same name never reads its predecessor's."""
    return f"faultplan-targets-{uid[:8]}-{step}-{occurrence}"


def pack_targets(texts: Sequence[str]) -> bytes:
    """Victims' texts as a ConfigMap holds them: gzipped lines, the same bytes every time."""
    return gzip.compress("\n".join(texts).encode(), mtime=0)


def unpack_targets(packed: bytes) -> list[str]:
    text = gzip.decompress(packed).decode()
    return text.split("\n") if text else []


def victim_of(text: str) -> targets.Victim:
    place, _, container = text.partition(":")
    cluster, kind, namespace, name = place.split("/", 3)
    if kind not in ("Cluster", "Node", "Pod"):
        raise ValueError(f"{text!r} names no cluster, node or pod")
    return targets.Victim(cluster, kind, name, namespace, container)  # type: ignore[arg-type]


# -- what is due -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Due:
    index: int
    action: Literal["inject", "recover", "judge"]


def step_finished(injections: Sequence[api.InjectionStatus], step: str) -> bool:
    """Whether every occurrence of ``step`` has finished: recovered, done, skipped, or injected
    when it has no recovery."""
    mine = [i for i in injections if i.step == step]
    return bool(mine) and all(
        i.state in SETTLED or (i.state == "Injected" and i.recoverAt is None) for i in mine)


def finished_at(injections: Sequence[api.InjectionStatus], step: str,
                started: float) -> float:
    """When ``step`` actually finished, in seconds from the start (0 if it never had to)."""
    moments = [parse(i.recoveredAt or i.injectedAt) - started for i in injections
               if i.step == step and (i.recoveredAt or i.injectedAt)]
    return max(moments, default=0.0)


def due(spec: api.FaultPlanSpec, injections: Sequence[api.InjectionStatus],
        elapsed: float, started: float = 0.0) -> list[Due]:
    """What to do ``elapsed`` seconds after the start (``started``, seconds since the epoch):
    recoveries first (an occurrence that starts as the previous one ends finds it undone),
    then injections whose time came and whose after-steps have finished, their delay counted
    from when those actually finished (a recovery can take longer than planned)."""
    steps = {step.name: step for step in spec.steps}
    recover = [Due(n, "recover") for n, i in enumerate(injections)
               if i.state == "Injected" and i.recoverAt is not None
               and elapsed >= i.recoverAt]
    inject = []
    for n, i in enumerate(injections):
        if i.state != "Scheduled" or i.injectAt is None or elapsed < i.injectAt:
            continue
        after = steps[i.step].after if i.step in steps else []
        if not all(step_finished(injections, name) for name in after):
            continue
        if after and elapsed < max(finished_at(injections, name, started) for name in after) \
                + parse_duration(steps[i.step].delay) + i.occurrence * _every(steps[i.step]):
            continue
        inject.append(Due(n, "inject"))
    return recover + inject


def _every(step: api.Step) -> float:
    return parse_duration(step.repeat.every) if step.repeat is not None else 0.0


def next_time(injections: Sequence[api.InjectionStatus], elapsed: float) -> float | None:
    """The next planned moment (seconds from the start) after ``elapsed``, if any."""
    times = [i.injectAt for i in injections if i.state == "Scheduled" and i.injectAt is not None]
    times += [i.recoverAt for i in injections
              if i.state == "Injected" and i.recoverAt is not None]
    upcoming = [t for t in times if t > elapsed]
    return min(upcoming) if upcoming else None


# -- expectations ------------------------------------------------------------------------------

def expectation_of(spec: api.Expectation) -> ex.Expectation:
    """The expectation to judge (a CEL expression is compiled where it is judged, in a worker
    process: one that does not parse fails there)."""
    objects = spec.objects
    ref = ex.Objects(objects.apiVersion, objects.kind, objects.namespace, objects.name,
                     _selector(objects.selector), objects.victims, objects.onVictimNodes,
                     objects.cluster, objects.offVictimNodes)
    matcher: ex.PerObject | ex.Count
    if spec.count is not None:
        where = spec.count.where
        matcher = ex.Count(None if where is None else _matcher(where), spec.count.equals,
                           spec.count.atLeast, spec.count.atMost)
    else:
        matcher = _matcher(spec)
    return ex.Expectation(spec.name, parse_duration(spec.within), ref, matcher)


def _matcher(spec: api.Expectation | api.Where) -> ex.PerObject:
    if spec.field is not None:
        return ex.Field(spec.field.path, spec.field.equals)
    if spec.condition is not None:
        return ex.Condition(spec.condition.type, spec.condition.status, spec.condition.reason)
    if spec.taint is not None:
        return ex.Taint(spec.taint.key, spec.taint.effect)
    if spec.cel is not None:
        return ex.Cel(spec.cel)
    raise ex.ExpectationError("the expectation has no matcher")


def judge(results: Iterable[api.ExpectationStatus]) -> Literal["Passed", "Failed"] | None:
    return ex.verdict(None if r.outcome == "Pending" else ex.Result(r.name, r.outcome,
                                                                       r.latencySeconds or 0.0)
                      for r in results)


# -- phase and verdict -------------------------------------------------------------------------

def summary(spec: api.FaultPlanSpec, injections: Sequence[api.InjectionStatus]) -> tuple[
        api.Phase, Literal["", "Passed", "Failed"], str]:
    """(phase, verdict, steps done / steps) of a started plan."""
    results = [r for i in injections for r in i.expectations]
    scheduled_expectations = sum(len(step.expectations) * sum(
        1 for i in injections if i.step == step.name and i.state != "Skipped")
        for step in spec.steps)
    verdict = judge(results)
    done = sum(1 for step in spec.steps if step_finished(injections, step.name))
    steps = f"{done}/{len(spec.steps)}"
    pending = any(r.outcome == "Pending" for r in results)
    judged = len(results) >= scheduled_expectations and not pending
    over = done == len(spec.steps) and judged
    if verdict == "Failed":
        # Said at once (a CI job can stop waiting); the phase ends once all is judged.
        return ("Failed" if over else "Running"), "Failed", steps
    if over:
        return "Succeeded", "Passed", steps
    return "Running", "", steps


def by_cluster(victims: Iterable[targets.Victim]) -> Mapping[str, list[targets.Victim]]:
    grouped: dict[str, list[targets.Victim]] = {}
    for victim in victims:
        grouped.setdefault(victim.cluster, []).append(victim)
    return grouped
