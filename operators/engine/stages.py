"""The stage interpreter: which stage applies to a pod or node, when, and what it makes of it.
Pure: no I/O, no clock (``now`` comes in).

The stages themselves are data (:mod:`operators.api.stages`; the defaults in ``stages.yaml``).
This module compiles each selector into a predicate once, and applies effects by computing a
new, immutable life (:class:`~operators.engine.pods.PodLife`,
:class:`~operators.engine.nodes.NodeLife`); the caller writes it and commits it only after the
write succeeded.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Sequence
from importlib import resources

from operators.api.durations import parse_duration
from operators.api.stages import (
    Lifecycle,
    NodeEffect,
    NodeStage,
    PodEffect,
    PodStage,
    Requirement,
    Selector,
    load_lifecycle,
)
from operators.engine import pods as podlife
from operators.engine.nodes import NodeFacts, NodeLife, set_conditions
from operators.engine.pods import ExtraCondition, PodFacts, PodLife
from operators.k8s.times import parse


@dataclasses.dataclass(frozen=True)
class Timing:
    """A pool's defaults for the pod timers, in seconds."""

    start_delay: float = 0.0
    start_jitter: float = 0.0
    init_delay: float = 0.0
    job_run_time: float = 10.0
    job_run_jitter: float = 0.0
    grace_cap: float = 1.0


# -- field access -----------------------------------------------------------------------------

def _flag(value: bool) -> str:
    return "true" if value else "false"


PodView = Callable[[PodFacts, PodLife], str | None]
NodeView = Callable[[NodeFacts, NodeLife], str | None]

POD_VIEWS: dict[str, PodView] = {
    "name": lambda pod, _: pod.name,
    "namespace": lambda pod, _: pod.namespace,
    "deleting": lambda pod, _: _flag(pod.deleting),
    "initPending": lambda pod, life: _flag(life.init_done < len(pod.init_containers)),
    "finite": lambda pod, _: _flag(pod.finite),
    "job": lambda pod, _: _flag(pod.job),
    "ownerKind": lambda pod, _: pod.owner_kind,
    "exitCode": lambda pod, _: str(pod.exit_code),
    "restartPolicy": lambda pod, _: pod.restart_policy,
}
NODE_VIEWS: dict[str, NodeView] = {
    "name": lambda node, _: node.name,
    "pool": lambda node, _: node.pool,
    "ready": lambda node, _: node.ready or None,
    "heartbeat": lambda node, life: _flag(life.heartbeat),
}


def _map_view(field: str, key: str) -> Callable[[PodFacts | NodeFacts, object], str | None]:
    def view(obj: PodFacts | NodeFacts, _: object) -> str | None:
        found: str | None = getattr(obj, field).get(key)
        return found
    return view


def _test(requirement: Requirement, views: dict[str, Callable[..., str | None]]) -> Callable[
        ..., bool]:
    field = requirement.field()
    if field in ("labels", "annotations"):
        view: Callable[..., str | None] = _map_view(field, requirement.key[len(field) + 1:-1])
    else:
        view = views[field]
    values = frozenset(requirement.values)
    operator = requirement.operator
    if operator == "In":
        return lambda obj, life: view(obj, life) in values
    if operator == "NotIn":
        return lambda obj, life: view(obj, life) not in values
    if operator == "Exists":
        return lambda obj, life: view(obj, life) is not None
    return lambda obj, life: view(obj, life) is None


def _compile(selector: Selector, views: dict[str, Callable[..., str | None]]) -> Callable[
        ..., bool]:
    tests = [_test(requirement, views) for requirement in selector.matchExpressions]
    return lambda obj, life: all(test(obj, life) for test in tests)


@dataclasses.dataclass(frozen=True)
class PodRule:
    stage: PodStage
    phases: frozenset[str]
    holds: Callable[[PodFacts, PodLife], bool]
    fixed: float  # the delay's fixed part and jitter, parsed once
    jitter: float

    @property
    def name(self) -> str:
        return self.stage.name


@dataclasses.dataclass(frozen=True)
class NodeRule:
    stage: NodeStage
    holds: Callable[[NodeFacts, NodeLife], bool]
    fixed: float
    jitter: float

    @property
    def name(self) -> str:
        return self.stage.name


@dataclasses.dataclass(frozen=True)
class Rules:
    """A lifecycle compiled for matching."""

    pods: tuple[PodRule, ...]
    nodes: tuple[NodeRule, ...]


def compile_lifecycle(lifecycle: Lifecycle) -> Rules:
    return Rules(
        pods=tuple(PodRule(stage, frozenset(stage.selector.phases),
                           _compile(stage.selector, POD_VIEWS),
                           parse_duration(stage.delay.duration),
                           parse_duration(stage.delay.jitter)) for stage in lifecycle.pods),
        nodes=tuple(NodeRule(stage, _compile(stage.selector, NODE_VIEWS),
                             parse_duration(stage.delay.duration),
                             parse_duration(stage.delay.jitter)) for stage in lifecycle.nodes),
    )


@functools.cache
def default_rules() -> Rules:
    """The default lifecycles (``stages.yaml`` next to this module)."""
    text = resources.files("operators.engine").joinpath("stages.yaml").read_text()
    return compile_lifecycle(load_lifecycle(text, source="the default stages"))


# -- pods -------------------------------------------------------------------------------------

def match_pod(rules: Sequence[PodRule], pod: PodFacts, life: PodLife) -> PodRule | None:
    """The first stage that applies to the pod (None: nothing more happens to it)."""
    for rule in rules:
        if (not rule.phases or life.phase in rule.phases) and rule.holds(pod, life):
            return rule
    return None


def pod_due(rule: PodRule, pod: PodFacts, life: PodLife, timing: Timing,
            rng: random.Random) -> float:
    """When (seconds since the epoch) the stage fires: its delay after the pod's last
    transition, or after its deletion was asked; draws from ``rng`` only where jitter is."""
    delay = rule.stage.delay
    seconds = rule.fixed + (rng.uniform(0, rule.jitter) if rule.jitter else 0.0)
    source = delay.source
    if source == "startDelay":
        seconds += pod.start_delay if pod.start_delay is not None else timing.start_delay
        seconds += rng.uniform(0, timing.start_jitter) if timing.start_jitter else 0.0
    elif source == "initDelay":
        seconds += timing.init_delay
    elif source == "runTime":
        if pod.run_time is not None:
            seconds += pod.run_time
        else:
            seconds += timing.job_run_time + (rng.uniform(0, timing.job_run_jitter)
                                              if timing.job_run_jitter else 0.0)
    elif source == "crashLoopBackOff":
        seconds += podlife.backoff(life.restarts)
    elif source == "gracePeriod":
        seconds += min(pod.grace if pod.grace is not None else 0.0, timing.grace_cap)
    if delay.since == "deletion":
        return pod.deletion_asked + seconds
    return (parse(life.changed_at) if life.changed_at else 0.0) + seconds


def apply_pod(effect: PodEffect, pod: PodFacts, life: PodLife, now: str, *,
              allocate: Callable[[PodFacts], str]) -> PodLife:
    """The life after ``effect`` (``life`` itself is left as it was)."""
    changes: dict[str, object] = {"changed_at": now}
    if effect.initContainerDone:
        changes["init_finished"] = (*life.init_finished, now)
        changes["start_time"] = life.start_time or now
    if effect.phase is not None:
        changes["phase"] = effect.phase
        changes["waiting"] = None
        if effect.phase == podlife.RUNNING and life.phase != podlife.RUNNING:
            changes.update(ip=life.ip or allocate(pod), start_time=life.start_time or now,
                           started_at=now, ready_since=now)
    if effect.wait is not None:
        changes["waiting"] = (effect.wait.reason, effect.wait.message)
    if effect.exit is not None:
        code = effect.exit.exitCode if effect.exit.exitCode is not None else pod.exit_code
        ended = podlife.Exit(code, effect.exit.reason, effect.exit.message,
                             life.started_at or now, now)
        if code == 0:
            changes.update(phase=podlife.SUCCEEDED, exit=ended)
        elif pod.restart_policy == "Never":
            changes.update(phase=podlife.FAILED, exit=ended)
        else:
            changes.update(phase=podlife.BACKOFF, last_exit=ended, restarts=life.restarts + 1)
    if effect.conditions:
        kept = {c.type: c for c in life.conditions}
        for condition in effect.conditions:
            old = kept.get(condition.type)
            since = old.since if old is not None and old.status == condition.status else now
            kept[condition.type] = ExtraCondition(condition.type, condition.status,
                                                  condition.reason, condition.message, since)
        changes["conditions"] = tuple(kept.values())
    return dataclasses.replace(life, **changes)  # type: ignore[arg-type]


# -- nodes ------------------------------------------------------------------------------------

def match_node(rules: Sequence[NodeRule], node: NodeFacts, life: NodeLife) -> NodeRule | None:
    for rule in rules:
        if rule.holds(node, life):
            return rule
    return None


def node_due(rule: NodeRule, life: NodeLife, rng: random.Random) -> float:
    seconds = rule.fixed + (rng.uniform(0, rule.jitter) if rule.jitter else 0.0)
    return (parse(life.changed_at) if life.changed_at else 0.0) + seconds


def apply_node(effect: NodeEffect, life: NodeLife, now: str) -> NodeLife:
    """The node's life after ``effect``."""
    conditions = set_conditions(life.conditions, effect.conditions, now)
    if effect.reportStatus:
        conditions = tuple(dataclasses.replace(c, heartbeat=now) for c in conditions)
    return dataclasses.replace(
        life, changed_at=now, conditions=conditions,
        heartbeat=life.heartbeat if effect.heartbeat is None else effect.heartbeat)
