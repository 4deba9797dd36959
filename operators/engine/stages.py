"""The stage interpreter: which stage applies to a pod or node, when, and what it makes of it.
Pure: no I/O, no clock (``now`` comes in).

The stages themselves are data (:mod:`operators.api.stages`; the defaults in ``stages.yaml``).
This module compiles each selector into a predicate once, and applies effects by computing a
new, immutable life (:class:`~operators.engine.pods.PodLife`,
:class:`~operators.engine.nodes.NodeLife`) and, for nodes, the patches that write it; the
caller writes them and commits the life only after the writes succeeded.

An object's rules are the live stages of the fault entries the member's fault sets carry for
it (:mod:`operators.engine.faultsets`, :mod:`operators.api.injections`), in the order the sets
were made, then the defaults: :class:`Rulebook` compiles them once per distinct combination
(the thousands of targets of one set share it). A stage whose effect is ``hold`` stops the
search: nothing happens to the object while it matches.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import random
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Generic, Literal, TypeVar

from operators.api.durations import parse_duration
from operators.api.injections import EntryState, FaultEntry
from operators.api.stages import (
    Condition,
    Lifecycle,
    LogScript,
    NodeEffect,
    NodeStage,
    NodeTaint,
    PodEffect,
    PodStage,
    Requirement,
    Selector,
    load_lifecycle,
)
from operators.engine import pods as podlife
from operators.engine.logs import Script, compile_script
from operators.engine.nodes import (
    NodeFacts,
    NodeLife,
    apply_gpus,
    posted_again,
    render_conditions,
    set_conditions,
)
from operators.engine.pods import ExtraCondition, PodFacts, PodLife
from operators.k8s.times import parse
from primitives import selectors

#: Distinct combinations of fault entries whose rules are kept compiled (a plan's thousands of
#: victims share a handful: one per step and state).
RULEBOOK_SIZE = 512
#: Most stages one pod write applies (init containers and a start without delays).
MAX_STAGES_PER_WRITE = 16


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
#: ``field[KEY]`` views: the object, its life and the key in, the value (None: not set) out.
MapView = Callable[[Any, Any, str], str | None]

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
    "waiting": lambda _, life: life.waiting[0] if life.waiting else "",
    "restarts": lambda _, life: str(life.restarts),
    "claimsPrepared": lambda pod, _: None if pod.claims_prepared is None
    else _flag(pod.claims_prepared),
}
NODE_VIEWS: dict[str, NodeView] = {
    "name": lambda node, _: node.name,
    "pool": lambda node, _: node.pool,
    "ready": lambda node, _: node.ready or None,
    "heartbeat": lambda node, life: _flag(life.heartbeat),
    "unschedulable": lambda node, _: _flag(node.unschedulable),
}
POD_MAPS: dict[str, MapView] = {
    "labels": lambda obj, _, key: obj.labels.get(key),
    "annotations": lambda obj, _, key: obj.annotations.get(key),
}
NODE_MAPS: dict[str, MapView] = {
    **POD_MAPS,
    "conditions": lambda node, _, key: node.conditions.get(key),
    "taints": lambda node, _, key: node.taint_effect(key),
    "allocatable": lambda node, _, key: node.allocatable.get(key),
}


def _test(requirement: Requirement, views: Mapping[str, Callable[..., str | None]],
          maps: Mapping[str, MapView]) -> Callable[..., bool]:
    field = requirement.field()
    if field in maps and requirement.key != field:
        key = requirement.key[len(field) + 1:-1]
        mapped = maps[field]

        def view(obj: Any, life: Any) -> str | None:
            return mapped(obj, life, key)
    else:
        view = views[field]
    holds = selectors.test(requirement.operator, requirement.values)
    return lambda obj, life: holds(view(obj, life))


def _compile(selector: Selector, views: Mapping[str, Callable[..., str | None]],
             maps: Mapping[str, MapView]) -> Callable[..., bool]:
    tests = [_test(requirement, views, maps) for requirement in selector.matchExpressions]
    return lambda obj, life: all(test(obj, life) for test in tests)


StageT = TypeVar("StageT", PodStage, NodeStage)
FactsT = TypeVar("FactsT", PodFacts, NodeFacts)
LifeT = TypeVar("LifeT", PodLife, NodeLife)


@dataclasses.dataclass(frozen=True)
class Rule(Generic[StageT, FactsT, LifeT]):
    """A stage compiled for matching against an object's facts and its life."""

    stage: StageT
    holds: Callable[[FactsT, LifeT], bool]
    fixed: float  # the delay's fixed part and jitter, parsed once
    jitter: float
    entry: str = ""  # the id of the fault entry that carried the stage ("": a default stage)
    #: The state of the entry whose live stages it is (inject or recover; "": a default stage).
    state: EntryState | Literal[""] = ""
    #: The entry's trace context ("": untraced, as every default stage is): the engine's
    #: writes for the stage join the plan's trace (:mod:`~operators.engine.tracing`).
    traceparent: str = ""
    #: The pod phases the stage applies in (empty: any); nodes have no phases.
    phases: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return self.stage.name

    @property
    def is_hold(self) -> bool:
        return self.stage.effect.hold


PodRule = Rule[PodStage, PodFacts, PodLife]
NodeRule = Rule[NodeStage, NodeFacts, NodeLife]


@dataclasses.dataclass(frozen=True)
class LogRule:
    """A log script compiled for matching against a pod's facts and its life."""

    name: str
    holds: Callable[[PodFacts, PodLife], bool]
    script: Script


@dataclasses.dataclass(frozen=True)
class Rules:
    """Stages compiled for matching: a lifecycle's, or an object's (its faults' first); and
    the lifecycle's log scripts."""

    pods: tuple[PodRule, ...]
    nodes: tuple[NodeRule, ...]
    logs: tuple[LogRule, ...] = ()


def _pod_rule(stage: PodStage, entry: FaultEntry | None = None) -> PodRule:
    return PodRule(stage, _compile(stage.selector, POD_VIEWS, POD_MAPS),
                   parse_duration(stage.delay.duration), parse_duration(stage.delay.jitter),
                   *_carrier(entry), frozenset(stage.selector.phases))


def _node_rule(stage: NodeStage, entry: FaultEntry | None = None) -> NodeRule:
    return NodeRule(stage, _compile(stage.selector, NODE_VIEWS, NODE_MAPS),
                    parse_duration(stage.delay.duration), parse_duration(stage.delay.jitter),
                    *_carrier(entry))


def _carrier(entry: FaultEntry | None) -> tuple[str, EntryState | Literal[""], str]:
    """What a rule keeps of the entry that carried its stage: id, state, trace context."""
    if entry is None:
        return "", "", ""
    return entry.id, entry.state, entry.traceparent or ""


def _log_rule(script: LogScript) -> LogRule:
    return LogRule(script.name, _compile(script.selector, POD_VIEWS, POD_MAPS),
                   compile_script(script))


def compile_lifecycle(lifecycle: Lifecycle) -> Rules:
    return Rules(pods=tuple(_pod_rule(stage) for stage in lifecycle.pods),
                 nodes=tuple(_node_rule(stage) for stage in lifecycle.nodes),
                 logs=tuple(_log_rule(script) for script in lifecycle.logs))


@functools.cache
def default_lifecycle() -> Lifecycle:
    """The default lifecycles (``stages.yaml`` next to this module)."""
    text = resources.files("operators.engine").joinpath("stages.yaml").read_text()
    return load_lifecycle(text, source="the default stages")


@functools.cache
def default_rules() -> Rules:
    return compile_lifecycle(default_lifecycle())


@dataclasses.dataclass(frozen=True)
class Carried:
    """A fault entry as a fault set carries it for one target, and what tells it apart from
    every other: the set's uid, the entry's place in it, and its state for the target (equal
    keys have equal stages, so their rules are compiled once)."""

    key: tuple[str, int, EntryState]
    entry: FaultEntry = dataclasses.field(compare=False)


#: The entries an object carries, in the order their sets were made.
Faults = tuple[Carried, ...]


class Rulebook:
    """The rules of each object: the live stages of its fault entries, then the defaults."""

    def __init__(self, defaults: Rules, *, size: int = RULEBOOK_SIZE) -> None:
        self.defaults = defaults
        self._size = size
        self._compiled: collections.OrderedDict[Faults, Rules] = collections.OrderedDict()

    def __call__(self, faults: Faults) -> Rules:
        """The rules of an object that carries ``faults`` (none: the defaults)."""
        if not faults:
            return self.defaults
        found = self._compiled.get(faults)
        if found is None:
            found = self._compile(faults)
            self._compiled[faults] = found
            if len(self._compiled) > self._size:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(faults)
        return found

    def _compile(self, faults: Faults) -> Rules:
        """Recoveries first, then the faults' own stages, then their holds, then the defaults:
        one fault's hold must not keep another fault from acting or recovering."""
        ordered = sorted(((carried.entry.state != "recover", stage.effect.hold, index,
                           carried.entry, stage)
                          for index, carried in enumerate(faults)
                          for stage in carried.entry.live),
                         key=lambda item: item[:3])
        pods: list[PodRule] = []
        nodes: list[NodeRule] = []
        for *_, entry, stage in ordered:
            if isinstance(stage, PodStage):
                pods.append(_pod_rule(stage, entry))
            else:
                nodes.append(_node_rule(stage, entry))
        return Rules((*pods, *self.defaults.pods), (*nodes, *self.defaults.nodes),
                     self.defaults.logs)


# -- pods -------------------------------------------------------------------------------------

def log_script(rules: Sequence[LogRule], pod: PodFacts, life: PodLife,
               container: str) -> Script | None:
    """The script of the container's log: the pod's own (its annotation) if it covers the
    container, else the first of ``rules`` that matches the pod and covers it (None: an empty
    log)."""
    if pod.logs is not None and pod.logs.covers(container):
        return pod.logs
    for rule in rules:
        if rule.script.covers(container) and rule.holds(pod, life):
            return rule.script
    return None


def match_pod(rules: Sequence[PodRule], pod: PodFacts, life: PodLife) -> PodRule | None:
    """The first stage that applies to the pod (None: nothing more happens to it; a hold:
    nothing happens while it applies)."""
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
        seconds += life.backoff
    elif source == "gracePeriod":
        seconds += min(pod.grace if pod.grace is not None else 0.0, timing.grace_cap)
    if delay.since == "deletion":
        return pod.deletion_asked + seconds
    return (parse(life.changed_at) if life.changed_at else 0.0) + seconds


def apply_pod(effect: PodEffect, pod: PodFacts, life: PodLife, now: str, *,
              allocate: Callable[[PodFacts], str]) -> PodLife:
    """The life after ``effect`` (``life`` itself is left as it was). An effect that only ends
    its fault leaves the life as it is: nothing of the pod changes."""
    if effect.endFault and not (effect.initContainerDone or effect.phase or effect.exit
                                or effect.wait or effect.evict or effect.conditions
                                or effect.events):
        return life
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
        if effect.phase == podlife.RUNNING and life.phase == podlife.BACKOFF:
            changes.update(backoff=podlife.next_backoff(life.backoff), restarted_at=now)
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
            changes.update(phase=podlife.BACKOFF, last_exit=ended, restarts=life.restarts + 1,
                           backoff=podlife.crash_wait(
                               life.backoff, parse(life.restarted_at) if life.restarted_at
                               else None, parse(now)))
    conditions = list(effect.conditions)
    if effect.evict is not None:
        # As the kubelet's eviction manager: Failed whatever the restartPolicy, the pod's
        # reason and message, and the containers it removed reported as it then shows them.
        changes.update(phase=podlife.FAILED, exit=podlife.UNLOCATED, waiting=None,
                       reason=effect.evict.reason, message=effect.evict.message)
        if not any(condition.type == podlife.DISRUPTION_TARGET for condition in conditions):
            conditions.insert(0, Condition(type=podlife.DISRUPTION_TARGET, status="True",
                                           reason="TerminationByKubelet",
                                           message=effect.evict.message))
    if conditions:
        kept = {c.type: c for c in life.conditions}
        for condition in conditions:
            old = kept.get(condition.type)
            since = old.since if old is not None and old.status == condition.status else now
            kept[condition.type] = ExtraCondition(condition.type, condition.status,
                                                  condition.reason, condition.message, since)
        changes["conditions"] = tuple(kept.values())
    return dataclasses.replace(life, **changes)  # type: ignore[arg-type]


def advance_pod(rule: PodRule, pod: PodFacts, life: PodLife, rules: Sequence[PodRule],
                timing: Timing, draws: Callable[[], random.Random], *, now: float, stamp: str,
                allocate: Callable[[PodFacts], str]) -> tuple[PodLife, list[PodRule]]:
    """The life after ``rule``, and after every stage of ``rules`` that falls due by ``now``
    with it (init containers and a start without delays): one write for all of them, each
    stamped ``stamp``. Also the stages applied, in order. ``draws``: the pod's own random
    draws, afresh for each stage (:func:`pod_due`)."""
    applied = [rule]
    life = apply_pod(rule.stage.effect, pod, life, stamp, allocate=allocate)
    if rule.stage.effect.endFault:
        return life, applied  # the stages after it are the ones of its entry done
    for _ in range(MAX_STAGES_PER_WRITE - 1):
        following = match_pod(rules, pod, life)
        if following is None or following.is_hold or following.stage.effect.delete or \
                following.stage.effect.endFault:
            break
        if pod_due(following, pod, life, timing, draws()) > now:
            break
        life = apply_pod(following.stage.effect, pod, life, stamp, allocate=allocate)
        applied.append(following)
    return life, applied


# -- nodes ------------------------------------------------------------------------------------

def match_node(rules: Sequence[NodeRule], node: NodeFacts, life: NodeLife) -> NodeRule | None:
    for rule in rules:
        if rule.holds(node, life):
            return rule
    return None


def node_due(rule: NodeRule, life: NodeLife, rng: random.Random) -> float:
    seconds = rule.fixed + (rng.uniform(0, rule.jitter) if rule.jitter else 0.0)
    return (parse(life.changed_at) if life.changed_at else 0.0) + seconds


def apply_node(effect: NodeEffect, life: NodeLife, now: str,
               observed: Mapping[str, str] | None = None) -> NodeLife:
    """The node's life after ``effect``; ``observed``: the node's conditions as the API shows
    them (type → status). A heartbeating node that posts its conditions posts every one the
    API shows otherwise anew, as a kubelet does coming back from Unknown."""
    observed = observed or {}
    conditions = set_conditions(life.conditions, effect.conditions, now, observed)
    if effect.reportStatus:
        conditions = tuple(dataclasses.replace(c, heartbeat=now) for c in conditions)
    heartbeat = life.heartbeat if effect.heartbeat is None else effect.heartbeat
    if heartbeat and (effect.conditions or effect.reportStatus):
        conditions = posted_again(conditions, observed, now)
    return dataclasses.replace(
        life, changed_at=now, conditions=conditions, heartbeat=heartbeat,
        gpus=apply_gpus(life.gpus, effect.gpus) if effect.gpus is not None else life.gpus)


def node_status(effect: NodeEffect, node: NodeFacts, before: NodeLife,
                after: NodeLife) -> dict[str, Any] | None:
    """The status a node stage writes (a strategic merge patch's ``status``: conditions whole,
    allocatable per resource), None when it changes nothing there."""
    status: dict[str, Any] = {}
    if after.conditions != before.conditions:
        status["conditions"] = render_conditions(after)
    allocatable = {}
    for resource, amount in effect.allocatable.items():
        wanted = amount if amount is not None else node.capacity.get(resource)
        if node.allocatable.get(resource) != wanted:
            allocatable[resource] = wanted
    if allocatable:
        status["allocatable"] = allocatable
    return status or None


def writes_node(effect: NodeEffect) -> bool:
    """Whether a node stage writes the Node itself (its spec), not only its status."""
    return bool(effect.taints or effect.removeTaints or effect.unschedulable is not None)


def node_object(rule: NodeRule, node: NodeFacts, now: str) -> dict[str, Any] | None:
    """The merge patch of the Node a stage writes, computed from the node as observed (its
    taints, spec.unschedulable) and conditional on its resourceVersion: a list of taints is
    replaced whole, so a change someone made meanwhile must fail it (409) rather than be
    undone. None when nothing changes."""
    effect = rule.stage.effect
    spec: dict[str, Any] = {}
    if effect.taints or effect.removeTaints:
        taints = _taints(node.taints, effect.taints, effect.removeTaints, now)
        if taints != list(node.taints):
            spec["taints"] = taints
    if effect.unschedulable is not None and effect.unschedulable != node.unschedulable:
        spec["unschedulable"] = True if effect.unschedulable else None  # as kubectl uncordon
    if not spec:
        return None
    return {"metadata": {"resourceVersion": node.resource_version}, "spec": spec}


def _taints(current: Sequence[Mapping[str, Any]], add: Sequence[NodeTaint],
            remove: Sequence[str], now: str) -> list[Mapping[str, Any]]:
    """``current`` without the keys in ``remove``, with ``add`` replacing a taint of the same
    key and effect; one already there as asked is kept as it is (with its timeAdded)."""
    taints = [taint for taint in current if taint.get("key") not in remove]
    for wanted in add:
        same = [taint for taint in taints
                if (taint.get("key"), taint.get("effect")) == (wanted.key, wanted.effect)]
        if same and same[0].get("value", "") == wanted.value:
            continue
        taints = [taint for taint in taints if taint not in same]
        rendered: dict[str, Any] = {"key": wanted.key, "effect": wanted.effect}
        if wanted.value:
            rendered["value"] = wanted.value
        if wanted.effect == "NoExecute":  # as the node-lifecycle controller stamps its own
            rendered["timeAdded"] = now
        taints.append(rendered)
    return taints
