"""Which object of one recorded run is which of another, and what happened to each: a trace
walked change by change into every object's history (its names, its event sequence as
:mod:`~operators.recording.sequencing` defines it, its last state). What ``fakefleet diff``
compares (:mod:`~operators.recording.comparing`).

An object is known by cluster, kind, namespace and name, except one that a controller made
(an ``ownerReferences`` entry with ``controller: true``): its name was drawn at random in each
run (a ReplicaSet's pods ``web-7d9f8-x2k4q``; a Deployment's ReplicaSets, whose pod-template
hash a replay changes with the lives set it names; a CronJob's Jobs; a DaemonSet's pods). It is
known by its controller and its place in the order that controller made objects of its kind,
as replay matches recorded pod lives by owner and ordinal: a Deployment ``web``'s first
ReplicaSet's third pod is ``Deployment/web/ReplicaSet#0/Pod#2`` in either run. A DaemonSet's
pods are counted per node (``DaemonSet/agent/Pod@pool-3#0``); a StatefulSet's pods keep their
names (``web-0`` is ``web-0`` by design). The order is the order of the creates in the trace
(the watch's, which is the API server's); objects already there when the recording started are
ordered by their pods' creation times, then by name (a trace keeps no other creation time):
start recording before the run.

Times are nanoseconds since the run's *zero*: its first recorded change (the replay's first
write, when the recording started before it), so that two recordings need not have started at
the same moment. Pure: a trace in, histories out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from operators.recording import patches, sequencing
from operators.recording.planning import PLURALS
from operators.recording.sequencing import CREATED, DELETED, list_of, mapping_of
from operators.recording.trace import Change, Trace

#: Controllers whose objects keep their names: their names are their ordinals by design.
NAMING_CONTROLLERS = frozenset({"StatefulSet"})
#: A controller chain followed at most this deep (a cycle of owner references ends there).
DEEPEST = 16


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


@dataclasses.dataclass
class History:
    """One object in one run: the names it had, its events, and its last recorded state."""

    key: Key
    names: list[str]
    events: list[Event] = dataclasses.field(default_factory=list)
    last: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts: dict[str, str] = dataclasses.field(default_factory=dict)

    def sequence(self) -> tuple[str, ...]:
        """What is compared of the object: its events without their times."""
        return tuple(event.what for event in self.events)


@dataclasses.dataclass(frozen=True)
class Run:
    """Every object of one recorded run, by key."""

    clusters: tuple[str, ...]
    #: The run's zero on the trace's clock (nanoseconds since the recording started).
    zero: int
    objects: Mapping[Key, History]


_Live = tuple[str, str, str, str, str]  # (cluster, group, kind, namespace, name)


def _group(obj: Mapping[str, Any]) -> str:
    api_version = str(obj.get("apiVersion", ""))
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return mapping_of(obj.get("metadata"))


def _controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    for owner in list_of(_meta(obj).get("ownerReferences")):
        if isinstance(owner, dict) and owner.get("controller"):
            return str(owner.get("kind", "")), str(owner.get("name", ""))
    return None


def _daemon_node(obj: Mapping[str, Any]) -> str:
    """The node a DaemonSet's pod is made for (its node affinity's ``metadata.name``)."""
    spec = mapping_of(obj.get("spec"))
    required = mapping_of(mapping_of(mapping_of(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    for term in list_of(required.get("nodeSelectorTerms")):
        for field in list_of(mapping_of(term).get("matchFields")):
            values = mapping_of(field).get("values")
            if mapping_of(field).get("key") == "metadata.name" and isinstance(values, list) \
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
            spec = mapping_of(obj.get("spec"))
            names = mapping_of(spec.get("names"))
            if names.get("plural") and names.get("kind"):
                self.kinds[(cluster, str(spec.get("group", "")), str(names["plural"]))] = \
                    str(names["kind"])
        live = (cluster, group, kind, namespace, name)
        if self.live.get(live) is not None:
            self.update(live, obj, at)  # seen again without a delete: its new state
            return
        if sequencing.ignored(obj):
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
        history.facts, said = sequencing.step(history.facts, obj)
        history.events.extend(Event(at - self.zero, what) for what in said)
        history.last = obj

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
