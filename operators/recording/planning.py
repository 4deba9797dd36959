"""What a replay writes, and when: a trace (:mod:`operators.recording.trace`) in, the timed
writes into one member cluster out. Pure: no client, no clock.

The rules, in the order they apply to each recorded object:

1. What the cluster makes itself is left out: nodes and Leases (the FakeNodePools' and the
   engine's), Events, Endpoints and EndpointSlices, ControllerRevisions, the system
   namespaces and what is in them, the ``default`` namespace (not what is in it, but for its
   ``kubernetes`` Service), each namespace's ``default`` ServiceAccount and
   ``kube-root-ca.crt`` ConfigMap.
2. What a replayed controller makes is left out, so that the member's real controllers make
   it: an object whose controller (``ownerReferences`` with ``controller: true``) is replayed
   too: a Deployment's ReplicaSets, a Job's or a ReplicaSet's pods. The recorded pods' lives
   go to the pods the controllers make instead: the owner's *lives set*
   (:mod:`operators.api.lives`) is written before the owner, and its pod template names it.
   With ``raw_pods`` it is the other way round: every recorded pod is replayed as a bare pod
   with its life in its annotations, and the controllers of pods (and theirs) are left out,
   so no pod runs twice.
3. Everything else is created as recorded, without what belonged to the recorded cluster
   (UIDs, resourceVersions, owner references, status, a pod's node, a Service's cluster IP,
   a Job's generated selector).
4. A namespace that a replayed object is created in, and that the trace does not create (a
   recording of some resources only, without namespaces), is created first, if missing: a
   namespace of that name in the cluster already is taken as it stands, never replaced, and
   the plan's notes say which namespaces these are.

Times: the initial objects are due at 0; a change recorded ``at`` nanoseconds after the
trace's start is due ``at / speed`` seconds after the replay's start; ``speed`` 0 means as
fast as the API server takes them, in the recorded order. Lives are scaled by the same
speed (at 0 they are kept as recorded: there is no timeline to scale them against).
A pod that restarts whatever its exit (``restartPolicy: Always``) takes only its start delay:
its recorded end was its deletion, which the replayed changes repeat, not an exit.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from operators.api import lives
from operators.recording.trace import Change, Method, PodLife, Trace
from primitives import keys

NANOS = 1e9
#: The writer a replay names on the lives sets it makes (``fakefleet.dev/owned-by``).
WRITER = "Replay"

#: Kinds the cluster makes and keeps itself, never replayed.
SYSTEM_KINDS = frozenset({"Node", "Lease", "Event", "Endpoints", "EndpointSlice",
                          "ControllerRevision", "ComponentStatus"})
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease",
                               lives.NAMESPACE})
#: Namespaces every cluster has: not replayed, though what users put in them is.
BUILT_IN_NAMESPACES = SYSTEM_NAMESPACES | {"default"}
#: Objects each namespace gets from the controller-manager: (kind, name).
PER_NAMESPACE = frozenset({("ServiceAccount", "default"), ("ConfigMap", "kube-root-ca.crt")})
#: Objects the API server keeps in ``default``: (kind, name).
IN_DEFAULT = frozenset({("Service", "kubernetes")})
#: Where each workload kind keeps its pod template.
TEMPLATES: Mapping[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"), "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"), "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"), "ReplicationController": ("spec", "template"),
}
#: The kinds the core and the built-in groups serve under a plural, so that a patch or a
#: delete recorded by plural finds the object its create named by kind.
PLURALS: Mapping[tuple[str, str], str] = {
    ("", "pods"): "Pod", ("", "services"): "Service", ("", "configmaps"): "ConfigMap",
    ("", "secrets"): "Secret", ("", "namespaces"): "Namespace", ("", "nodes"): "Node",
    ("", "events"): "Event", ("", "endpoints"): "Endpoints",
    ("", "serviceaccounts"): "ServiceAccount", ("", "replicationcontrollers"):
        "ReplicationController", ("", "persistentvolumeclaims"): "PersistentVolumeClaim",
    ("apps", "deployments"): "Deployment", ("apps", "replicasets"): "ReplicaSet",
    ("apps", "statefulsets"): "StatefulSet", ("apps", "daemonsets"): "DaemonSet",
    ("apps", "controllerrevisions"): "ControllerRevision", ("batch", "jobs"): "Job",
    ("batch", "cronjobs"): "CronJob", ("coordination.k8s.io", "leases"): "Lease",
    ("events.k8s.io", "events"): "Event", ("discovery.k8s.io", "endpointslices"):
        "EndpointSlice",
}
#: A ReplicaSet's name is its Deployment's and the pod template's hash.
_TEMPLATE_HASH = re.compile(r"^(?P<deployment>.+)-[a-z0-9]{1,10}$")
#: The first objects of a replay: what the others live in or are of.
_FIRST = {"Namespace": 0, "CustomResourceDefinition": 1}


def writer(run: str) -> str:
    """What a replay's run writes in ``fakefleet.dev/owned-by`` of what it makes."""
    return f"{WRITER}/{run}"


class PlanError(ValueError):
    """The trace cannot be replayed as asked: says which option or entry, and the fix."""


@dataclasses.dataclass(frozen=True)
class Options:
    #: Changes per recorded second (10: ten times as fast); 0 as fast as the API takes them.
    speed: float
    #: Which of the trace's clusters to replay ("": its only one).
    cluster: str = ""
    raw_pods: bool = False
    #: Names this replay's lives sets apart from another replay's into the same member.
    run: str = "0"
    #: The seed of the replayed pods' random draws (jitter), None for their own.
    seed: str | None = None
    #: Mark every object created with this run's writer (:func:`writer`) in
    #: ``fakefleet.dev/owned-by``, as its lives sets are: a replay carried on after a restart
    #: tells its own objects from others of the same name by it.
    mark: bool = False


@dataclasses.dataclass(frozen=True)
class Write:
    """One request the replay makes, due ``due`` seconds after it starts."""

    due: float
    method: Method
    api_version: str
    #: The kind (from the object) and the plural (from the recorded change); either may be
    #: "" when the trace does not say it, and the API's discovery finds the other.
    kind: str
    resource: str
    namespace: str
    name: str
    #: The object (create), the merge patch (patch), None (delete).
    body: dict[str, Any] | None
    #: When it was recorded (nanoseconds since the trace's start; -1: at the start).
    recorded: int = -1
    #: The object whose writes go in order with this one (a lives set's: its owner's).
    chain: str = ""
    #: A create that an object of that name in the cluster already satisfies (it is left as
    #: it stands): a namespace the replayed objects need and the trace does not hold.
    if_missing: bool = False

    @property
    def identity(self) -> str:
        """The object it writes, as :attr:`chain` names objects."""
        return f"{self.namespace}/{self.kind or self.resource}/{self.name}"

    def describe(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.method} {self.kind or self.resource} {where}{self.name}"


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A recorded object, or change of one, that the replay leaves out, and why."""

    what: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Plan:
    writes: tuple[Write, ...]
    skipped: tuple[Skipped, ...]
    #: The lives sets written, as ``namespace/Kind/name`` of their owners, with how many
    #: recorded lives each holds.
    lives: tuple[tuple[str, int], ...]
    notes: tuple[str, ...]


# -- objects -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Ref:
    """An object of the trace: its namespace, kind and name (UIDs differ per run)."""

    namespace: str
    kind: str
    name: str

    def text(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"

    def chain(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


def namespace_chain(name: str) -> str:
    """The :attr:`Write.chain` of namespace ``name``'s writes."""
    return _Ref("", "Namespace", name).chain()


def _ref(obj: Mapping[str, Any]) -> _Ref:
    metadata = obj.get("metadata") or {}
    return _Ref(str(metadata.get("namespace", "")), str(obj.get("kind", "")),
                str(metadata.get("name", "")))


def _controller(obj: Mapping[str, Any]) -> _Ref | None:
    """The object's controller, as its owner reference names it."""
    metadata = obj.get("metadata") or {}
    for owner in metadata.get("ownerReferences") or ():
        if owner.get("controller"):
            return _Ref(str(metadata.get("namespace", "")), str(owner.get("kind", "")),
                        str(owner.get("name", "")))
    return None


def _system(ref: _Ref) -> bool:
    return ref.kind in SYSTEM_KINDS or ref.namespace in SYSTEM_NAMESPACES or \
        (ref.kind == "Namespace" and ref.name in BUILT_IN_NAMESPACES) or \
        (ref.kind, ref.name) in PER_NAMESPACE or \
        (ref.namespace == "default" and (ref.kind, ref.name) in IN_DEFAULT)


def _cleaned(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as a create into another cluster takes it."""
    made = copy.deepcopy(dict(obj))
    made.pop("status", None)
    metadata = made.setdefault("metadata", {})
    for field in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields",
                  "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "ownerReferences"):
        metadata.pop(field, None)
    spec = made.get("spec")
    if not isinstance(spec, dict):
        return made
    kind = made.get("kind")
    if kind == "Pod":
        spec.pop("nodeName", None)  # the recorded cluster's node: the scheduler places it
    elif kind == "Service":
        spec.pop("clusterIP", None)
        spec.pop("clusterIPs", None)
    elif kind == "Job" and not spec.get("manualSelector"):
        # The API server generates the selector from the new Job's UID, and refuses one that
        # names the recorded Job's.
        spec.pop("selector", None)
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get(
            "labels") or {}
        for labels in (template_labels, metadata.get("labels") or {}):  # the Job's own too
            for label in ("controller-uid", "batch.kubernetes.io/controller-uid"):
                labels.pop(label, None)
    elif kind == "PersistentVolumeClaim":
        spec.pop("volumeName", None)
    return made


# -- lives ---------------------------------------------------------------------------------

def _seconds(nanos: int, speed: float) -> float:
    return round(nanos / NANOS / (speed or 1.0), 3)


def life_of(pod: PodLife, speed: float, *, restarts: bool) -> lives.Life:
    """What ``pod`` did, on the replay's timeline; ``restarts``: its containers restart
    whatever their exit (only its start delay is taken)."""
    start = run = code = None
    if pod.started is not None:
        start = _seconds(max(pod.started - pod.created, 0), speed)
        if pod.finished is not None and not restarts:
            run = _seconds(max(pod.finished - pod.started, 0), speed)
            code = pod.exit_code
    return lives.Life(start, run, code)


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def life_annotations(life: lives.Life) -> dict[str, str]:
    """A bare pod's life as the engine reads it from its own annotations."""
    found: dict[str, str] = {}
    if life.start_delay is not None:
        found[keys.START_DELAY] = _duration(life.start_delay)
    if life.run_time is not None:
        found[keys.RUN_TIME] = _duration(life.run_time)
    if life.exit_code is not None:
        found[keys.EXIT_CODE] = str(life.exit_code)
    return found


def _restarts(pod_spec: Mapping[str, Any]) -> bool:
    return bool(pod_spec.get("restartPolicy", "Always") == "Always")


def _template(obj: dict[str, Any]) -> dict[str, Any] | None:
    path = TEMPLATES.get(str(obj.get("kind", "")))
    node: Any = obj
    for part in path or ():
        node = node.get(part) if isinstance(node, dict) else None
    return node if path and isinstance(node, dict) else None


# -- the plan ------------------------------------------------------------------------------

def _chosen_cluster(trace: Trace, wanted: str) -> str:
    if wanted:
        if wanted not in trace.clusters:
            raise PlanError(f"the trace has no cluster {wanted!r}; it has "
                            f"{', '.join(trace.clusters) or 'none'}")
        return wanted
    if len(trace.clusters) != 1:
        raise PlanError(f"the trace holds {len(trace.clusters)} clusters "
                        f"({', '.join(trace.clusters) or 'none'}): name the one to replay (--from)")
    return trace.clusters[0]


def _kind_of(change: Change, learnt: Mapping[tuple[str, str], str]) -> str:
    resource = change.target.resource
    if change.template is not None and change.method == "create" and \
            change.template.get("kind"):
        return str(change.template["kind"])
    return learnt.get((resource.group, resource.resource), "")


def plan(trace: Trace, options: Options) -> Plan:
    """The writes of a replay of ``trace``'s cluster, in the order they are due."""
    if not options.speed >= 0:
        raise PlanError(f"speed {options.speed} is not a number from 0 up")
    cluster = _chosen_cluster(trace, options.cluster)
    initial = [obj for name, obj in trace.initial if name == cluster]
    changes = [c for c in trace.changes if c.target.cluster == cluster]
    recorded_pods = [p for p in trace.pods if p.cluster == cluster]
    learnt = dict(PLURALS)
    for change in changes:
        if change.method == "create" and change.template and change.template.get("kind"):
            resource = change.target.resource
            learnt[(resource.group, resource.resource)] = str(change.template["kind"])

    # Every object the trace creates, by reference: at the start, then by its changes.
    created: dict[_Ref, dict[str, Any]] = {}
    for obj in initial:
        created.setdefault(_ref(obj), obj)
    for change in changes:
        if change.method == "create" and change.template is not None:
            created.setdefault(_ref(change.template), change.template)

    # The controllers of pods, and theirs (a ReplicaSet's Deployment: by its owner
    # reference, else by the ReplicaSet's name).
    owners_of_pods: set[_Ref] = set()
    for ref, obj in created.items():
        owner = _controller(obj)
        if ref.kind == "Pod" and owner is not None:
            owners_of_pods.add(owner)
    for pod in recorded_pods:
        if pod.owner is not None:
            owners_of_pods.add(_Ref(pod.namespace, pod.owner.kind, pod.owner.name))
    for owner in list(owners_of_pods):
        above = _controller(created.get(owner) or {})
        if above is None and owner.kind == "ReplicaSet" and _deployment_of(owner.name):
            above = _Ref(owner.namespace, "Deployment", _deployment_of(owner.name))
        if above is not None:
            owners_of_pods.add(above)

    def left_out(ref: _Ref, obj: Mapping[str, Any]) -> str:
        """Why the replay leaves the object out, or ""."""
        if _system(ref):
            return "the cluster makes it itself"
        if options.raw_pods:
            if ref.kind == "Pod":
                return ""
            if ref in owners_of_pods:
                return "its pods are replayed raw (--raw-pods)"
        owner = _controller(obj)
        if owner is not None and owner.kind == "ReplicaSet" and owner not in created and \
                _Ref(owner.namespace, "Deployment", _deployment_of(owner.name)) in created:
            owner = _Ref(owner.namespace, "Deployment", _deployment_of(owner.name))
        if owner is not None and owner in created:
            return f"its controller {owner.text()} is replayed and makes it"
        return ""

    skipped: list[Skipped] = []
    out: dict[_Ref, str] = {}
    for ref, obj in created.items():
        reason = left_out(ref, obj)
        if reason:
            out[ref] = reason
            skipped.append(Skipped(ref.text(), reason))

    # The recorded lives of each replayed workload, in the order its controller made them.
    by_owner: dict[_Ref, list[PodLife]] = {}
    by_name = {(p.namespace, p.name): p for p in recorded_pods}
    if not options.raw_pods:
        replayed = {ref for ref in created if ref not in out}
        for pod in recorded_pods:
            owner = _workload_of(pod, created, replayed)
            if owner is not None:
                by_owner.setdefault(owner, []).append(pod)

    writes: list[Write] = []
    lives_written: list[tuple[str, int]] = []

    def creates(obj: dict[str, Any], due: float, recorded: int, resource: str) -> None:
        ref = _ref(obj)
        made = _cleaned(obj)
        if options.mark:
            made["metadata"].setdefault("annotations", {})[keys.OWNED_BY] = writer(options.run)
        api_version = str(obj.get("apiVersion", ""))
        template = _template(made)
        annotations = made["metadata"].setdefault("annotations", {}) if ref.kind == "Pod" \
            else None
        if template is not None and options.seed is not None:
            template.setdefault("metadata", {}).setdefault("annotations", {})[keys.SEED] = \
                f"{options.seed}/{ref.namespace}/{ref.kind}/{ref.name}"
        if annotations is not None:
            recorded_life = by_name.get((ref.namespace, ref.name))
            if recorded_life is not None:
                annotations.update(life_annotations(life_of(
                    recorded_life, options.speed, restarts=_restarts(made.get("spec") or {}))))
            if options.seed is not None:
                annotations[keys.SEED] = f"{options.seed}/{ref.namespace}/{ref.name}"
        pods = by_owner.get(ref)
        if template is not None and pods:
            name = lives.set_name(options.run, ref.namespace, ref.kind, ref.name)
            restarts = _restarts(template.get("spec") or {})
            ordered = sorted(pods, key=lambda p: (p.created, p.ordinal, p.name))
            owner_text = f"{ref.namespace}/{ref.kind}/{ref.name}"
            writes.append(Write(
                due, "create", "v1", "ConfigMap", "configmaps", lives.NAMESPACE, name,
                lives.render(name, owner=owner_text, writer=writer(options.run),
                             lives=[life_of(p, options.speed, restarts=restarts)
                                    for p in ordered]), recorded, ref.chain()))
            lives_written.append((owner_text, len(ordered)))
            template.setdefault("metadata", {}).setdefault("annotations", {})[keys.LIVES] = name
        writes.append(Write(due, "create", api_version, ref.kind, resource, ref.namespace,
                            ref.name, made, recorded, ref.chain()))

    for obj in sorted(initial, key=lambda o: _FIRST.get(str(o.get("kind")), 2)):
        if _ref(obj) not in out:
            creates(obj, 0.0, -1, "")
    for change in changes:
        target = change.target
        due = change.at / NANOS / options.speed if options.speed else 0.0
        kind = _kind_of(change, learnt)
        ref = _Ref(target.namespace, kind or target.resource.resource, target.name)
        if change.method == "create" and change.template is not None:
            if _ref(change.template) not in out:
                creates(change.template, due, change.at, target.resource.resource)
            continue
        reason = out.get(ref) or (
            "the cluster makes it itself" if _system(ref) or kind in SYSTEM_KINDS else "")
        if reason:
            skipped.append(Skipped(f"{change.method} {ref.text()}", reason))
            continue
        writes.append(Write(due, change.method, target.resource.api_version, kind,
                            target.resource.resource, target.namespace, target.name,
                            change.template, change.at, ref.chain()))

    needed = _missing_namespaces(writes)
    if needed:
        writes[:0] = [Write(0.0, "create", "v1", "Namespace", "namespaces", "", name, {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": name, "annotations": {keys.OWNED_BY: writer(options.run)}}},
            chain=namespace_chain(name), if_missing=True) for name in needed]
    notes = list(trace.notes)
    if needed:
        notes.append(f"namespace{'s' if len(needed) > 1 else ''} {', '.join(needed)} "
                     f"{'are' if len(needed) > 1 else 'is'} not in the trace: created first "
                     f"where the cluster has none, and left as it stands where it has one")
    if options.speed == 0:
        notes.append("speed max: the changes go as fast as the API server takes them, in the "
                     "recorded order; the pods' lives are as recorded")
    return Plan(tuple(writes), tuple(skipped), tuple(lives_written), tuple(notes))


def _missing_namespaces(writes: Iterable[Write]) -> list[str]:
    """The namespaces the creates of ``writes`` go into that no write creates, but for
    those every cluster has."""
    made, wanted = set(), set()
    for write in writes:
        if write.method != "create":
            continue
        if write.kind == "Namespace" and not write.namespace:
            made.add(write.name)
        elif write.namespace:
            wanted.add(write.namespace)
    return sorted(wanted - made - BUILT_IN_NAMESPACES)


def _deployment_of(replica_set: str) -> str:
    found = _TEMPLATE_HASH.match(replica_set)
    return found["deployment"] if found else ""


def _workload_of(pod: PodLife, created: Mapping[_Ref, dict[str, Any]],
                 replayed: Iterable[_Ref]) -> _Ref | None:
    """The replayed workload whose controller makes pods like ``pod``: its owner, or its
    owner's own controller (a ReplicaSet's Deployment: by its owner reference when the trace
    holds the ReplicaSet, else by the ReplicaSet's name)."""
    if pod.owner is None:
        return None
    live = {(r.namespace, r.kind, r.name): r for r in replayed}
    direct = live.get((pod.namespace, pod.owner.kind, pod.owner.name))
    if direct is not None:
        return direct
    if pod.owner.kind != "ReplicaSet":
        return None
    recorded = next((obj for ref, obj in created.items() if ref.kind == "ReplicaSet" and
                     ref.namespace == pod.namespace and ref.name == pod.owner.name), None)
    owner = _controller(recorded) if recorded is not None else None
    deployment = owner.name if owner is not None and owner.kind == "Deployment" else \
        _deployment_of(pod.owner.name)
    return live.get((pod.namespace, "Deployment", deployment))
