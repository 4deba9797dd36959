"""A recorded run as what happened to each object: its *event sequence*, the ordered semantic
state changes that two runs of one scenario should share, with the object matched across runs
by what it is rather than by what it was called. What ``fakefleet diff`` compares.

An event is one fact of an object that changed (at most one event per fact per recorded change,
in a fixed order within one change), said as ``fact: value``:

- ``created`` and ``deleted``;
- a pod's ``node`` (its placement), its ``phase``, its ``condition Ready`` and
  ``condition DisruptionTarget`` (an eviction), each container's exits
  (``container C exit N: CODE (REASON)`` for its N-th run, read from ``state`` or from
  ``lastState`` after a restart, so that a restart the recorder saw at once and one it saw in
  two steps make the same events) and its ``restarts``;
- a workload's ``replicas``, a Job's or CronJob's ``suspended``, a node's ``unschedulable`` and
  ``taints``, any object's ``phase`` and ``condition T``;
- a FaultPlan's ``verdict`` and each injection's state (``step S#OCCURRENCE``).

A condition is an event when it becomes True and when it stops being True: a condition first
written False only says that nothing happened yet, and whether a run shows it at all depends
on how soon its controller synced.

Deliberately ignored, because two runs of one scenario differ there without behaving any
differently: UIDs and resourceVersions (new per object and per write); timestamps and
managedFields (a recording strips them); the names that controllers generate (a ReplicaSet's
pods ``web-7d9f8-x2k4q``, a Deployment's ReplicaSets, whose pod-template hash a replay changes
with the lives set it names, a CronJob's Jobs, a DaemonSet's pods); status counters that a
controller batches as its timing allows (``readyReplicas`` going 0, 1, 3 or 0, 3); an
object's spec and data beyond the facts above (the scenario's input, written alike by both
runs); and objects that only say how the run was made: Events (named by timestamps,
aggregated by count), Leases (heartbeats) and a replay's lives sets (named per replay).

Matching: an object is known by cluster, kind, namespace and name, except one that a
controller made (an ``ownerReferences`` entry with ``controller: true``), which is known by its
controller and its place in the order that controller made objects of its kind: a Deployment
``web``'s first ReplicaSet's third pod is ``Deployment/web/ReplicaSet#0/Pod#2`` in either run,
whatever suffixes the controllers drew; as replay matches recorded pod lives by owner and
ordinal. A DaemonSet's pods are counted per node. A StatefulSet's pods keep their names
(``web-0`` is ``web-0`` by design). The order is the order of the creates in the trace (the
watch's, which is the API server's); objects already there when the recording started are
ordered by their pods' creation times, then by name (a trace keeps no other creation time):
start recording before the run.

Times are nanoseconds since the run's *zero*: its first recorded change (the replay's first
write, when the recording started before it), so that two recordings need not have started at
the same moment. Pure: a trace in, sequences out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from operators.recording import patches
from operators.recording.planning import PLURALS
from operators.recording.trace import Change, Trace
from primitives import keys

#: Kinds left out: they say how a run was made, not what it did.
IGNORED_KINDS = frozenset({"Event", "Lease"})
#: Controllers whose objects keep their names: their names are their ordinals by design.
NAMING_CONTROLLERS = frozenset({"StatefulSet"})
#: A pod's conditions compared: the rest repeat its node, phase and containers
#: (PodScheduled, Initialized, ContainersReady, PodReadyToStartContainers), in an order of
#: writes that is the kubelet's business.
POD_CONDITIONS = frozenset({"Ready", "DisruptionTarget"})
#: A controller chain followed at most this deep (a cycle of owner references ends there).
DEEPEST = 16

CREATED = "created"
DELETED = "deleted"


@dataclasses.dataclass(frozen=True, order=True)
class Key:
    """An object as it is matched across runs; ``name`` is its name, or its controller's key
    and ordinal (``Deployment/web/ReplicaSet#0/Pod#2``) when a controller made it."""

    cluster: str
    kind: str
    namespace: str
    name: str

    def text(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.cluster} {self.kind} {where}{self.name}"


@dataclasses.dataclass(frozen=True)
class Event:
    """One semantic state change, ``at`` nanoseconds after the run's zero."""

    at: int
    what: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a pod ended up: its phase, the exit code of its last termination (the first
    non-zero of its containers; None if none ended), and its containers' restarts."""

    phase: str
    exit_code: int | None
    restarts: int

    def text(self) -> str:
        code = "-" if self.exit_code is None else str(self.exit_code)
        return f"{self.phase or '-'}, exit {code}, {self.restarts} restarts"


@dataclasses.dataclass
class History:
    """One object in one run: the names it had, its events, and its last recorded state."""

    key: Key
    names: list[str]
    events: list[Event] = dataclasses.field(default_factory=list)
    last: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def node(self) -> str:
        return str(_mapping(self.last.get("spec")).get("nodeName") or "")

    @property
    def verdict(self) -> str:
        return str(_mapping(self.last.get("status")).get("verdict") or "")

    def outcome(self) -> Outcome:
        status = _mapping(self.last.get("status"))
        code: int | None = None
        restarts = 0
        for container in _list(status.get("containerStatuses")):
            if not isinstance(container, dict):
                continue
            restarts += _count(container.get("restartCount"))
            ended = _mapping(container.get("state")).get("terminated") or \
                _mapping(container.get("lastState")).get("terminated")
            if isinstance(ended, dict):
                found = _count(ended.get("exitCode"))
                code = found if code in (None, 0) else code
        return Outcome(str(status.get("phase") or ""), code, restarts)


@dataclasses.dataclass(frozen=True)
class Run:
    """Every object of one recorded run, by key."""

    clusters: tuple[str, ...]
    #: The run's zero on the trace's clock (nanoseconds since the recording started).
    zero: int
    objects: Mapping[Key, History]


# -- facts -------------------------------------------------------------------------------------

def facts(obj: Mapping[str, Any]) -> dict[str, str]:
    """What is compared of ``obj``'s state, as ``{fact: value}`` in the order events say it."""
    kind = str(obj.get("kind", ""))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    found: dict[str, str] = {}
    if kind == "Pod" and spec.get("nodeName"):
        found["node"] = str(spec["nodeName"])
    replicas = spec.get("replicas")
    if isinstance(replicas, int) and not isinstance(replicas, bool):
        found["replicas"] = str(replicas)
    if kind in ("Job", "CronJob") and "suspend" in spec:
        found["suspended"] = str(bool(spec["suspend"])).lower()
    if kind == "Node":
        found["unschedulable"] = str(bool(spec.get("unschedulable"))).lower()
        found["taints"] = ",".join(sorted(
            f"{t.get('key', '')}={t.get('value', '')}:{t.get('effect', '')}"
            for t in _list(spec.get("taints")) if isinstance(t, dict))) or "none"
    if isinstance(status.get("phase"), str) and status["phase"]:
        found["phase"] = status["phase"]
    # In the list's order, which is the order they were added in (controllers append): a
    # Job's SuccessCriteriaMet and Complete say the same whether one write or two brought them.
    for condition in _list(status.get("conditions")):
        kept = _mapping(condition)
        if kept and (kind != "Pod" or str(kept.get("type")) in POD_CONDITIONS):
            found[f"condition {kept.get('type', '')}"] = str(kept.get("status", ""))
    if kind == "Pod":
        found.update(_containers(status))
    if kind == "FaultPlan":
        for injection in _list(status.get("injections")):
            if isinstance(injection, dict):
                found[f"step {injection.get('step', '')}#{injection.get('occurrence', 0)}"] = \
                    str(injection.get("state", ""))
        if status.get("verdict"):
            found["verdict"] = str(status["verdict"])
    return found


def _containers(status: Mapping[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    containers = [*_list(status.get("initContainerStatuses")),
                  *_list(status.get("containerStatuses"))]
    for container in sorted((c for c in containers if isinstance(c, dict)),
                            key=lambda c: str(c.get("name", ""))):
        name = str(container.get("name", ""))
        runs = _count(container.get("restartCount"))
        before = _mapping(container.get("lastState")).get("terminated")
        if runs and isinstance(before, dict):
            found[f"container {name} exit {runs - 1}"] = _ended(before)
        if runs:
            found[f"container {name} restarts"] = str(runs)
        now = _mapping(container.get("state")).get("terminated")
        if isinstance(now, dict):
            found[f"container {name} exit {runs}"] = _ended(now)
    return found


def _ended(terminated: Mapping[str, Any]) -> str:
    return f"{_count(terminated.get('exitCode'))} ({terminated.get('reason') or '-'})"


def _history(fact: str) -> bool:
    """Facts that stay true once seen: a container's N-th exit happened, whatever the
    status says later (``lastState`` keeps only the last)."""
    return fact.startswith("container ") and " exit " in fact


def changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The events between two states' facts."""
    said = []
    for fact, value in after.items():
        old = before.get(fact)
        if value == old:
            continue
        if fact.startswith("condition ") and value != "True" and old != "True":
            continue
        said.append(f"{fact}: {value}")
    for fact, old in before.items():
        if fact in after or _history(fact):
            continue
        if fact.startswith("condition ") and old != "True":
            continue
        said.append(f"{fact}: unset")
    return said


# -- a trace's histories -------------------------------------------------------------------------

_Live = tuple[str, str, str, str, str]  # (cluster, group, kind, namespace, name)


def _group(obj: Mapping[str, Any]) -> str:
    api_version = str(obj.get("apiVersion", ""))
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    """An integer the status gives (a hand-written recording may give anything: 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _mapping(obj.get("metadata"))


def _controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    for owner in _list(_meta(obj).get("ownerReferences")):
        if isinstance(owner, dict) and owner.get("controller"):
            return str(owner.get("kind", "")), str(owner.get("name", ""))
    return None


def _ignored(obj: Mapping[str, Any]) -> bool:
    return str(obj.get("kind", "")) in IGNORED_KINDS or \
        keys.LIVES in (_meta(obj).get("labels") or {})


def _daemon_node(obj: Mapping[str, Any]) -> str:
    """The node a DaemonSet's pod is made for (its node affinity's ``metadata.name``)."""
    spec = _mapping(obj.get("spec"))
    required = _mapping(_mapping(_mapping(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    for term in _list(required.get("nodeSelectorTerms")):
        for field in _list(_mapping(term).get("matchFields")):
            values = _mapping(field).get("values")
            if _mapping(field).get("key") == "metadata.name" and isinstance(values, list) \
                    and values:
                return str(values[0])
    return str(spec.get("nodeName") or "")


class _Builder:
    """Walks one trace's objects and changes in order, keeping each live object's state."""

    def __init__(self, clusters: Mapping[str, str], zero: int) -> None:
        self.clusters = clusters
        self.zero = zero
        self.histories: dict[Key, History] = {}
        self.live: dict[_Live, History | None] = {}  # None: an ignored object
        self.paths: dict[tuple[str, str, str, str], str] = {}  # (cluster, ns, kind, name)
        self.ordinals: dict[tuple[str, ...], int] = {}
        self.kinds: dict[tuple[str, str, str], str] = {
            (cluster, group, plural): kind for cluster in clusters.values()
            for (group, plural), kind in PLURALS.items()}

    def cluster(self, name: str) -> str:
        return self.clusters.get(name, name)

    def _path(self, cluster: str, obj: Mapping[str, Any]) -> tuple[str, str]:
        """The name ``obj`` is matched by, and what its own objects name it by (its owner's
        must be known already)."""
        metadata = _meta(obj)
        name, kind = str(metadata.get("name", "")), str(obj.get("kind", ""))
        owner = _controller(obj)
        if owner is None or owner[0] in NAMING_CONTROLLERS:
            return name, f"{kind}/{name}"
        namespace = str(metadata.get("namespace") or "")
        above = self.paths.get((cluster, namespace, *owner)) or \
            self.paths.get((cluster, "", *owner)) or f"{owner[0]}/{owner[1]}"
        node = _daemon_node(obj) if owner[0] == "DaemonSet" and kind == "Pod" else ""
        group = (cluster, namespace, kind, above, node)
        ordinal = self.ordinals.get(group, 0)
        self.ordinals[group] = ordinal + 1
        path = f"{above}/{kind}{'@' + node if node else ''}#{ordinal}"
        return path, path

    def create(self, cluster: str, obj: dict[str, Any], at: int, *, plural: str = "") -> None:
        cluster = self.cluster(cluster)
        metadata = _meta(obj)
        kind, group = str(obj.get("kind", "")), _group(obj)
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name", ""))
        if plural:
            self.kinds[(cluster, group, plural)] = kind
        if kind == "CustomResourceDefinition":
            spec = _mapping(obj.get("spec"))
            names = _mapping(spec.get("names"))
            if names.get("plural") and names.get("kind"):
                self.kinds[(cluster, str(spec.get("group", "")), str(names["plural"]))] = \
                    str(names["kind"])
        live = (cluster, group, kind, namespace, name)
        if self.live.get(live) is not None:
            self.update(live, obj, at)  # seen again without a delete: its new state
            return
        if _ignored(obj):
            self.live[live] = None
            return
        path, self.paths[(cluster, namespace, kind, name)] = self._path(cluster, obj)
        key = Key(cluster, kind, namespace, path)
        history = self.histories.get(key)
        if history is None:
            history = self.histories[key] = History(key, [name])
        elif name not in history.names:
            history.names.append(name)
        self.live[live] = history
        history.events.append(Event(at - self.zero, CREATED))
        self.update(live, obj, at)

    def update(self, live: _Live, obj: dict[str, Any], at: int) -> None:
        history = self.live.get(live)
        if history is None:
            return
        after = facts(obj)
        after = {**{f: v for f, v in history.facts.items() if _history(f)}, **after}
        history.events.extend(Event(at - self.zero, what)
                              for what in changes(history.facts, after))
        history.facts, history.last = after, obj

    def find(self, change: Change) -> _Live | None:
        """The live object a patch or delete names (its kind by the resource's plural, or,
        for a plural no create named, by the one object of that name and group)."""
        target = change.target
        cluster = self.cluster(target.cluster)
        group = target.resource.group
        kind = self.kinds.get((cluster, group, target.resource.resource))
        if kind is not None:
            live = (cluster, group, kind, target.namespace, target.name)
            return live if live in self.live else None
        found = [live for live in self.live
                 if live[:2] == (cluster, group) and live[3:] == (target.namespace, target.name)]
        if len(found) != 1:
            return None
        self.kinds[(cluster, group, target.resource.resource)] = found[0][2]
        return found[0]

    def apply(self, change: Change) -> None:
        if change.method == "create" and isinstance(change.template, dict):
            self.create(change.target.cluster, change.template, change.at,
                        plural=change.target.resource.resource)
            return
        live = self.find(change)
        if live is None:
            return  # an object the recording never showed: nothing to compare it with
        history = self.live[live]
        if change.method == "delete":
            del self.live[live]
            if history is not None:
                history.events.append(Event(change.at - self.zero, DELETED))
        elif history is not None and isinstance(change.template, dict):
            self.update(live, patches.merged(history.last, change.template), change.at)


def _ordered_start(trace: Trace) -> list[tuple[str, dict[str, Any]]]:
    """The objects at the start, each after its controller, siblings by creation."""
    created = {(p.cluster, p.namespace, p.name): p.created for p in trace.pods}
    index = {(cluster, str(_meta(obj).get("namespace") or ""), str(obj.get("kind", "")),
              str(_meta(obj).get("name", ""))): obj for cluster, obj in trace.initial}

    def depth(cluster: str, obj: Mapping[str, Any]) -> int:
        found = 0
        while found < DEEPEST and (owner := _controller(obj)) is not None:
            namespace = str(_meta(obj).get("namespace") or "")
            above = index.get((cluster, namespace, *owner)) or index.get((cluster, "", *owner))
            if above is None:
                break
            obj, found = above, found + 1
        return found

    def order(entry: tuple[str, dict[str, Any]]) -> tuple[int, int, str]:
        cluster, obj = entry
        metadata = _meta(obj)
        born = created.get((cluster, str(metadata.get("namespace") or ""),
                            str(metadata.get("name", "")))) if obj.get("kind") == "Pod" else 0
        return depth(cluster, obj), born or 0, str(metadata.get("name", ""))

    return sorted(trace.initial, key=order)


def zero_of(trace: Trace) -> int:
    """The run's zero: its first recorded change (0 when nothing changed)."""
    return min((change.at for change in trace.changes), default=0)


def histories(trace: Trace, *, clusters: Mapping[str, str] | None = None) -> Run:
    """Every object of ``trace`` with its events; ``clusters`` renames the trace's clusters
    (so that two runs recorded under different names are compared)."""
    renamed = {name: (clusters or {}).get(name, name) for name in trace.clusters}
    zero = zero_of(trace)
    builder = _Builder(renamed, zero)
    for cluster, obj in _ordered_start(trace):
        builder.create(cluster, obj, 0)
    for change in trace.changes:
        builder.apply(change)
    return Run(tuple(renamed.values()), zero, builder.histories)


def sequence(history: History) -> tuple[str, ...]:
    """What is compared of one object: its events without their times."""
    return tuple(event.what for event in history.events)

