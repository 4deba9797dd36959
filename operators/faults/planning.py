"""A fault plan's schedule: when each step injects, into which objects, and when it recovers.

``plan(steps, fleet, seed)`` is pure. The fleet is a snapshot taken when the plan starts; times
are seconds from the plan's start. The same steps, fleet and seed always give the same schedule
(victims and times), whatever order the snapshot lists things in, and each random choice has a
source of its own (seed, step, occurrence, cluster), so adding a step or a cluster leaves the
victims and times of the others as they were.

Timing, per step: ``at`` (an offset) or ``after`` (steps that must have finished: a step
finishes when its last occurrence recovered, or was injected if it has no duration), then
``delay`` plus a uniform ``jitter``; ``repeat`` as ``times`` occurrences ``every`` seconds
apart, each with new victims and its own jitter; ``duration`` then recovery.

A plan may be narrowed to some clusters (``within``, a FaultPlan's ``spec.clusters``): no step
hits any other, as if the fleet had no others.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

from operators.faults.targets import Fleet, Target, Victim, choose, unknown_names


class PlanError(ValueError):
    """Steps that cannot be planned; the message names the step, the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Timing:
    at: float | None = None
    after: tuple[str, ...] = ()
    delay: float = 0.0
    jitter: float = 0.0
    #: Seconds until recovery; None: the fault stays until the plan is deleted.
    duration: float | None = None
    every: float | None = None
    times: int = 1

    def problems(self) -> list[str]:
        found = []
        if (self.at is None) == (not self.after):
            found.append("give exactly one of at (an offset from the plan's start) and after "
                         "(steps that must have finished)")
        for field in ("at", "delay", "jitter", "duration", "every"):
            value = getattr(self, field)
            if value is not None and value < 0:
                found.append(f"{field} must not be negative")
        if self.times < 1:
            found.append("repeat.times must be at least 1")
        elif self.times > 1 and not self.every:
            found.append("repeat.times above 1 needs repeat.every, the time between occurrences")
        elif self.times > 1 and self.every and (self.duration or 0.0) + self.jitter > self.every:
            found.append("duration plus jitter is longer than repeat.every: an occurrence could "
                         "start before the previous one recovered (or before it started); "
                         "shorten them or lengthen every")
        return found


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    target: Target
    #: The fault's kind (NotReady, GPUXid, ContainerExit, ...): the planner only carries it.
    fault: str
    timing: Timing


@dataclasses.dataclass(frozen=True)
class Injection:
    """One occurrence of one step: its victims, when it injects and when it recovers."""

    step: str
    occurrence: int
    fault: str
    victims: tuple[Victim, ...]
    inject_at: float
    recover_at: float | None

    @property
    def finished_at(self) -> float:
        return self.inject_at if self.recover_at is None else self.recover_at


@dataclasses.dataclass(frozen=True)
class Action:
    at: float
    kind: Literal["recover", "inject"]
    injection: Injection


@dataclasses.dataclass(frozen=True)
class Schedule:
    injections: tuple[Injection, ...]
    #: When each step finished (its last occurrence recovered, or was injected).
    finished: Mapping[str, float]
    #: Cluster names a step's target gives (or the plan is narrowed to) that the fleet does not
    #: have, per step.
    unknown_clusters: Mapping[str, tuple[str, ...]]

    def actions(self) -> list[Action]:
        """Every injection and recovery in time order; at the same moment recoveries come
        first, so an occurrence that starts as the previous one ends finds it undone."""
        actions = [Action(i.inject_at, "inject", i) for i in self.injections]
        actions += [Action(i.recover_at, "recover", i)
                    for i in self.injections if i.recover_at is not None]
        return sorted(actions, key=lambda a: (a.at, a.kind != "recover",
                                              a.injection.step, a.injection.occurrence))

    def of(self, step: str) -> list[Injection]:
        return [injection for injection in self.injections if injection.step == step]


def plan(steps: Sequence[Step], fleet: Fleet, seed: int | str, *,
         within: Collection[str] = ()) -> Schedule:
    """The schedule of ``steps`` over ``fleet``; PlanError naming each problem otherwise.
    ``within``: the only clusters any step may hit (empty: all of them)."""
    order = _order(steps)
    fleet = fleet.within(within)
    finished: dict[str, float] = {}
    injections: list[Injection] = []
    for step in order:
        timing = step.timing
        base = timing.at if timing.at is not None else max(finished[n] for n in timing.after)
        for occurrence in range(timing.times):
            start = base + timing.delay + occurrence * (timing.every or 0.0)
            if timing.jitter:
                start += _rng(seed, step.name, occurrence, "jitter").uniform(0, timing.jitter)
            victims = choose(step.target, fleet, _sources(seed, step.name, occurrence))
            recover = None if timing.duration is None else start + timing.duration
            injections.append(Injection(step.name, occurrence, step.fault, victims, start,
                                        recover))
        finished[step.name] = max(i.finished_at for i in injections if i.step == step.name)
    injections.sort(key=lambda i: (i.inject_at, i.step, i.occurrence))
    unknown = {step.name: tuple(names) for step in steps
               if (names := unknown_names(step.target, fleet.clusters, within))}
    return Schedule(tuple(injections), finished, unknown)


def _order(steps: Sequence[Step]) -> list[Step]:
    """The steps checked, in an order where each comes after the steps it waits for."""
    problems: list[str] = []
    by_name: dict[str, Step] = {}
    names = {step.name for step in steps}
    for index, step in enumerate(steps):
        where = f"steps[{index}] ({step.name!r})"
        if not step.name:
            problems.append(f"steps[{index}].name: every step needs a name")
        elif step.name in by_name:
            problems.append(f"{where}.name: {step.name!r} is used by an earlier step; "
                            f"step names must be unique")
        by_name.setdefault(step.name, step)
        problems += [f"{where}.timing: {problem}" for problem in step.timing.problems()]
        problems += [f"{where}.after: no step is named {name!r}"
                     for name in step.timing.after if name not in names]
        if step.name in step.timing.after:
            problems.append(f"{where}.after: a step cannot wait for itself")
    if problems:
        raise PlanError("; ".join(problems))
    ordered: list[Step] = []
    state: dict[str, Literal["visiting", "done"]] = {}

    def visit(step: Step, path: list[str]) -> None:
        if state.get(step.name) == "done":
            return
        if state.get(step.name) == "visiting":
            cycle = [*path[path.index(step.name):], step.name]
            raise PlanError(f"steps wait for each other in a cycle: {' → '.join(cycle)}; "
                            f"remove one of these names from the after of the step before it")
        state[step.name] = "visiting"
        for name in step.timing.after:
            visit(by_name[name], [*path, step.name])
        state[step.name] = "done"
        ordered.append(step)

    for step in steps:
        visit(step, [])
    return ordered


def _sources(seed: int | str, step: str, occurrence: int) -> Callable[[str], random.Random]:
    """The random source of each part of one occurrence's choice of victims."""
    return lambda part: _rng(seed, step, occurrence, part)


def _rng(seed: int | str, *parts: object) -> random.Random:
    # Seeding with a string hashes it (SHA-512): the same parts give the same numbers on every
    # machine and Python run, unlike hash(); JSON keeps ("a/b", "c") apart from ("a", "b/c").
    return random.Random(json.dumps([seed, *parts]))

